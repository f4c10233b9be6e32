"""Does the model run the machine as well as the kernel? MLLB's measurement.

MLLB's evaluation ran stress-ng scenarios under the stock scheduler and under
the model and compared their throughput. The reproduction notes of MLLB give
the commands for a 56-vCPU machine of two NUMA nodes; ``SCENARIOS`` keeps each
one beside its form here, scaled to a smaller machine (worker counts in
proportion to the CPUs) and made exact where the notes name options stress-ng
does not have (``--numa-cpu``/``--numa-dom``, ``--cpu-affinity``,
``--hdd-method``) or one the stressor ignores (``--matrix-size`` applies to
the matrix stressor, not to ``--cpu-method matrixprod``).

Stock and model cannot run at the same time in one kernel, so each scenario
runs in blocks of one stock and one model run, in random order, the blocks
of all scenarios shuffled together (``schedule``). The throughput of a run is
stress-ng's own bogo-ops/s (real time; the geometric mean over the run's
stressors when there are several). Each block is one sequential run of the
duet statistics (``kernmlops.duet.analysis.compare``): the geometric-mean
ratio model/stock over blocks with its interval over runs (the default's:
sign-flip randomization; the blocks' random order makes stock and model
exchangeable).

Everything here is pure (no kernel, no lab); ``bench/lb_effect.py`` runs it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

#: The machine of MLLB's reproduction notes: 56 vCPUs on 2 NUMA nodes.
MLLB_CPUS = 56
#: Parity: the ratio's whole interval within ±2 %.
PARITY = 0.02
SIDES = ("stock", "model")
#: kmo_lb's mode for each side.
MODE = {"stock": "off", "model": "replace"}

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


# --- the order of the runs -------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    index: int
    block: int
    scenario: str
    side: str  # stock | model
    order: str  # the block's order: "stock-model" or "model-stock"

    @property
    def mode(self) -> str:
        return MODE[self.side]


def schedule(scenarios: list[str], reps: int, seed: int = 0) -> list[Step]:
    """``reps`` blocks of each scenario, each block one stock and one model run.
    Per scenario, half the blocks run stock first and half model first (which
    half at random); the blocks of all scenarios run in one random order, so a
    drift of the machine falls on both sides and on every scenario alike."""
    if reps < 1:
        raise ValueError("reps must be at least 1")
    rng = random.Random(seed)
    blocks = []
    for name in scenarios:
        both = [SIDES, SIDES[::-1]]
        orders = both * (reps // 2) + [rng.choice(both)] * (reps % 2)
        rng.shuffle(orders)
        blocks += [(name, b, o) for b, o in enumerate(orders)]
    rng.shuffle(blocks)
    steps: list[Step] = []
    for name, b, order in blocks:
        for side in order:
            steps.append(Step(len(steps), b, name, side, "-".join(order)))
    return steps


# --- one run's throughput ----------------------------------------------------------------


def throughput(yaml_text: str) -> tuple[float | None, dict[str, float]]:
    """A run's bogo-ops/s (real time) from stress-ng's ``--yaml`` file: per
    stressor, and their geometric mean (None when a stressor reported none)."""
    from kernmlops.benchmarks.stress_ng import parse_metrics_yaml

    per = {s: v for s, m, v, _u in parse_metrics_yaml(yaml_text) if m == "bogo_ops_per_s_real"}
    if not per or min(per.values()) <= 0:
        return None, per
    return math.exp(sum(math.log(v) for v in per.values()) / len(per)), per


# --- the verdict -----------------------------------------------------------------------------


def verdict(ratio: float | None, ci: tuple[float, float] | None, tol: float = PARITY) -> str:
    """Parity when the interval of model/stock lies within 1 ± tol; a difference
    when it excludes 1; otherwise inconclusive (the interval is too wide)."""
    if ratio is None or ci is None:
        return "inconclusive (too few runs for an interval)"
    lo, hi = ci
    pct = f"{(ratio - 1) * 100:+.1f}% [{(lo - 1) * 100:+.1f}%, {(hi - 1) * 100:+.1f}%]"
    if 1 - tol <= lo and hi <= 1 + tol:
        return f"parity within ±{tol * 100:.0f}% ({pct})"
    if lo > 1:
        return f"model faster: {pct}"
    if hi < 1:
        return f"model slower: {pct}"
    return f"inconclusive: {pct}"


def compare_scenario(
    stock: dict[Hashable, float], model: dict[Hashable, float], seed: int = 0
) -> dict[str, Any]:
    """Model against stock for one scenario (or several pooled, blocks keyed
    by (scenario, block)): ``{block: ops/s}`` of each side.
    Blocks with both sides are the duet statistics' sequential runs (A = stock,
    B = model, the "time" being seconds per bogo-op, so B/A < 1 is faster);
    the result is turned back into throughput: model/stock and its interval."""
    import numpy as np

    from kernmlops.duet.analysis import Options, Run, compare

    blocks = sorted(set(stock) & set(model), key=str)
    runs = []
    for i, b in enumerate(blocks):
        a_t, b_t = np.array([1 / stock[b]]), np.array([1 / model[b]])
        zero = np.zeros(1)
        runs.append(Run(("lb", "effect", "sequential", i, ""), zero, zero, a_t, zero, zero, b_t))
    gmean = lambda side: float(np.exp(np.mean(np.log([side[b] for b in blocks]))))  # noqa: E731
    out: dict[str, Any] = {
        "blocks": len(blocks),
        "stock_ops_s": gmean(stock) if blocks else None,
        "model_ops_s": gmean(model) if blocks else None,
        "ratio": None,
        "ci": None,
        "unit": None,
    }
    if len(blocks) >= 2:
        cmp = compare(runs, "sequential", False, Options(mds=False, seed=seed))
        out["unit"] = cmp.unit
        if cmp.gm_ratio is not None:
            out["ratio"] = 1 / cmp.gm_ratio
        if cmp.ratio_ci is not None:
            out["ci"] = [1 / cmp.ratio_ci.high, 1 / cmp.ratio_ci.low]
    ci = tuple(out["ci"]) if out["ci"] else None
    out["verdict"] = verdict(out["ratio"], ci)  # type: ignore[arg-type]
    return out


def schedstat_balance(text: str) -> tuple[int, int]:
    """(lb_gained, alb_pushed) summed over every domain (and idle type) of
    /proc/schedstat version 15: per domain, 8 fields per idle type with
    lb_gained the 5th, then alb_count, alb_failed, alb_pushed. lb_gained
    counts active balancing's pushes too (detach_one_task), so the tasks
    load_balance() itself pulled are lb_gained - alb_pushed."""
    gained = pushed = 0
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "version" and f[1:] not in (["15"], ["16"]):
            # later versions lay the domain line out differently
            raise ValueError(f"/proc/schedstat version {' '.join(f[1:])}: 15 or 16 is read")
        if f and f[0].startswith("domain"):
            if len(f) < 2 + 8 * 3 + 3:
                raise ValueError(f"/proc/schedstat: a domain line of {len(f)} fields")
            gained += sum(int(f[2 + 8 * i + 4]) for i in range(3))
            pushed += int(f[2 + 8 * 3 + 2])
    return gained, pushed


def schedstat_lb_gained(text: str) -> int:
    """Tasks the balancer moved (load_balance's pulls and active balancing's
    pushes), from /proc/schedstat: the kernel's own count of its visible work."""
    return schedstat_balance(text)[0]
