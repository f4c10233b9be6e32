"""page_faults' exact counts through a real `kernmlops collect`: the manifest's
counters against the workload's own getrusage, sampled or not, and the graph's
legend and the report's figures against the manifest."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kernmlops.data import Collection
from kernmlops.graphs import figure, load
from kernmlops.graphs._report import table_summary
from kernmlops.hooks.page_faults import COUNTER_ALL, KINDS, kind_counter
from tests.e2e.conftest import run_collect
from tests.hooks.conftest import build_c
from tests.hooks.test_page_faults import AFTER_LAST, KERNEL_PAGES, PAGES, WORKLOAD

pytestmark = pytest.mark.bpf

#: faults the workload's task makes before it is traced: the gate opens once the
#: probes are attached and the benchmark is in its cgroup, but the forked child's
#: first faults before its exec may land before that (rusage keeps them across exec)
BEFORE_TRACED = 200


def collect_workload(
    tmp_path: Path, workload: Path, every: int
) -> tuple[subprocess.CompletedProcess[str], Collection]:
    """`kernmlops collect` of the fault workload (tests/hooks/test_page_faults.py), the
    page_faults hook keeping 1 fault in ``every``; the run must succeed."""
    overrides = tmp_path / "o.yaml"
    overrides.write_text(f"hooks:\n  page_faults:\n    sample_every: {every}\n")
    argv = [str(workload), str(PAGES), str(KERNEL_PAGES), "ungated"]
    proc, col = run_collect(
        tmp_path / "out", "-c", str(overrides), "--hooks", "page_faults,process_trace", "--", *argv
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert col is not None
    return proc, col


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "pfw", WORKLOAD)


@pytest.mark.parametrize("every", [1, 10])
def test_manifest_counts_every_fault_sampled_or_not(
    tmp_path: Path, workload: Path, every: int
) -> None:
    proc, col = collect_workload(tmp_path, workload, every)
    window, _, _, lifetime = map(int, proc.stdout.split()[-4:])
    hook = col.manifest["hooks"]["page_faults"]
    counters = hook["counters"]
    total = counters[COUNTER_ALL]
    # the workload's whole life, less what it made before it was traced, plus its exit
    assert lifetime - BEFORE_TRACED <= total <= lifetime + AFTER_LAST, (counters, lifetime)
    assert window <= total
    assert total == sum(counters[kind_counter(k)] for k in KINDS)
    assert counters[kind_counter("user")] >= PAGES
    assert KERNEL_PAGES <= counters[kind_counter("kernel")] <= 1.05 * KERNEL_PAGES
    rows = col["page_faults"].height
    ncpu = col.manifest["system"]["logical_cpus"]
    if every == 1:
        assert rows == total - hook["drops"]  # unsampled: a row per fault
    else:
        assert total // every - ncpu <= rows <= total // every + ncpu

    # the graph's legend and the report: the manifest's counts, not rows × N
    data = load(col)
    labels = {ln.get_label() for ln in figure(data, "page_fault_rate").axes[0].lines}
    for kind in KINDS:
        assert f"{kind}: {counters[kind_counter(kind)]:,} faults" in labels, labels
    (entry,) = [t for t in table_summary(data) if t["table"] == "page_faults"]
    stats = dict(entry["stats"])
    assert stats["faults"] == f"{total:,} (exact, counted in the kernel)"
    user, kernel = (counters[kind_counter(k)] for k in KINDS)
    assert stats["by kind"] == f"user {user:,} · kernel {kernel:,}"
    span_s = entry["span_s"]
    assert stats["rate"].startswith(f"{round(total / span_s):,} faults/s over ")
