"""MLLB's stress-ng scenarios: its evaluation's commands, made exact and scaled.

MLLB's evaluation ran stress-ng scenarios under the stock scheduler and under
the model. The reproduction notes of MLLB give the commands for a 56-vCPU
machine of two NUMA nodes; ``SCENARIOS`` keeps each one beside its form here,
scaled to a smaller machine (worker counts in proportion to the CPUs) and made
exact where the notes name options stress-ng does not have
(``--numa-cpu``/``--numa-dom``, ``--cpu-affinity``, ``--hdd-method``) or one the
stressor ignores (``--matrix-size`` applies to the matrix stressor, not to
``--cpu-method matrixprod``).

One definition for the two that run them: the stress-ng benchmark
(``kernmlops.benchmarks.stress_ng``, scenarios ``numa`` ... ``mllb-mixed``) and
MLLB's measurement (``kernmlops.lb.effect``). It sits below both and imports
nothing of kernmlops: data and argv only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: The machine of MLLB's reproduction notes: 56 vCPUs on 2 NUMA nodes.
MLLB_CPUS = 56

Nodes = dict[int, list[int]]


def scaled(workers: int, cpus: int) -> int:
    """MLLB's worker count on 56 vCPUs, in proportion on ``cpus`` (at least 1)."""
    return max(1, round(workers * cpus / MLLB_CPUS))


def cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


@dataclass(frozen=True)
class Sizes:
    """Memory and file sizes: MLLB's, or smaller for an emulated machine."""

    vm_bytes: str = "1G"
    hdd_bytes: str = "10G"
    matrix_size: int = 512


#: Sizes for the kernel lab (QEMU without KVM, 4 GiB, /tmp in memory): every
#: guest instruction is emulated, so a 512 x 512 product is seconds per op.
LAB_SIZES = Sizes(vm_bytes="64M", hdd_bytes="32M", matrix_size=128)


@dataclass(frozen=True)
class Scenario:
    name: str
    #: MLLB's command as its reproduction notes give it (56 vCPUs, 2 nodes).
    mllb: str
    #: what was changed to make it exact, and why
    note: str
    args: Callable[[Nodes, Sizes], list[str]]

    def argv(self, nodes: Nodes, sizes: Sizes | None = None) -> list[str]:
        """The stressors for a machine of ``nodes`` ({node: CPUs})."""
        return self.args(nodes, sizes or Sizes())


def _n(nodes: Nodes) -> int:
    return sum(len(c) for c in nodes.values())


def _first(nodes: Nodes) -> list[int]:
    return nodes[min(nodes)]


def _numa(nodes: Nodes, s: Sizes) -> list[str]:
    if len(nodes) < 2:
        raise ValueError("scenario numa needs two NUMA nodes (remote memory)")
    return [
        "--vm", str(scaled(1, _n(nodes))), "--vm-bytes", s.vm_bytes, "--vm-method", "rand-set",
        "--taskset", cpu_list(_first(nodes)), "--mbind", str(max(nodes)),
    ]  # fmt: skip


def _cpu_half(nodes: Nodes, s: Sizes) -> list[str]:
    first = _first(nodes) if len(nodes) > 1 else _first(nodes)[: max(1, _n(nodes) // 2)]
    return ["--cpu", str(scaled(28, _n(nodes))), "--cpu-method", "matrixprod",
            "--taskset", cpu_list(first)]  # fmt: skip


def _hdd_seek(nodes: Nodes, s: Sizes) -> list[str]:
    return ["--hdd", str(_n(nodes)), "--hdd-opts", "wr-rnd,rd-rnd", "--hdd-bytes", s.hdd_bytes]


def _matrixprod(nodes: Nodes, s: Sizes) -> list[str]:
    return ["--matrix", str(scaled(32, _n(nodes))), "--matrix-method", "prod",
            "--matrix-size", str(s.matrix_size)]  # fmt: skip


def _mixed(nodes: Nodes, s: Sizes) -> list[str]:
    n = _n(nodes)
    return ["--cpu", str(scaled(10, n)), "--vm", str(scaled(2, n)), "--vm-bytes", s.vm_bytes,
            "--hdd", str(scaled(1, n)), "--hdd-bytes", s.hdd_bytes]  # fmt: skip


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "numa",
        "stress-ng --numa 1 --numa-method malloc_rand --numa-cpu 0-27 --numa-dom 1 --timeout 60s",
        "stress-ng has no --numa-method malloc_rand, --numa-cpu or --numa-dom: one worker "
        "writing memory at random (vm rand-set) on the first node's CPUs (--taskset) with "
        "its memory bound to the last node (--mbind): every access is remote",
        _numa,
    ),
    Scenario(
        "cpu-half",
        "stress-ng --cpu 28 --cpu-method matrixprod --cpu-affinity 0-27 --timeout 60s",
        "--cpu-affinity does not exist: --taskset pins the workers to the first node",
        _cpu_half,
    ),
    Scenario(
        "cache",
        "stress-ng --cache 56 --cache-level 3 --cache-ops 1000000 --timeout 60s",
        "one worker per CPU on the last-level cache; no --cache-ops cap, the run is timed",
        lambda nodes, s: ["--cache", str(_n(nodes)), "--cache-level", "3"],
    ),
    Scenario(
        "oversubscribe",
        "stress-ng --cpu 112 --timeout 60s",
        "two workers per CPU",
        lambda nodes, s: ["--cpu", str(2 * _n(nodes))],
    ),
    Scenario(
        "hdd-seek",
        "stress-ng --hdd 56 --hdd-method seek --hdd-bytes 10G --timeout 60s",
        "--hdd-method does not exist: random writes and reads back (--hdd-opts wr-rnd,rd-rnd)",
        _hdd_seek,
    ),
    Scenario(
        "matrixprod",
        "stress-ng --cpu 32 --cpu-method matrixprod --matrix-size 512 --timeout 60s",
        "--matrix-size is the matrix stressor's: --matrix with --matrix-method prod",
        _matrixprod,
    ),
    Scenario(
        "fft",
        "stress-ng --cpu 48 --cpu-method fft --timeout 60s",
        "as given, workers in proportion",
        lambda nodes, s: ["--cpu", str(scaled(48, _n(nodes))), "--cpu-method", "fft"],
    ),
    Scenario(
        "mixed",
        "stress-ng --cpu 10 --vm 2 --vm-bytes 1G --hdd 1 --timeout 90s",
        "as given, workers in proportion",
        _mixed,
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}


def command(
    scenario: Scenario, nodes: Nodes, seconds: int, sizes: Sizes | None = None,
    temp: str = "/tmp",
) -> list[str]:  # fmt: skip
    """The whole stress-ng command of one run (the metrics file is added by the runner)."""
    return ["stress-ng", *scenario.argv(nodes, sizes), "--timeout", f"{int(seconds)}s",
            "--metrics-brief", "--temp-path", temp]  # fmt: skip
