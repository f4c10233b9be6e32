"""--collect: attributing kernel rows to each side's process tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest

from kernmlops.duet.collect import descendants, kernel_stats, kernel_stats_for_suite
from kernmlops.duet.config import load_duet_config
from kernmlops.duet.report import _kernel_value, kernel_summary
from kernmlops.hooks.page_faults import COUNTER_ALL
from tests.duet.conftest import swapping_config, write_config


def _trace(rows):
    return pl.DataFrame(rows, schema=["pid", "tgid", "ppid", "kind"], orient="row")


def test_descendants_follow_forks_not_threads_or_strangers():
    pt = _trace([
        (100, 100, 1, "fork"),  # the side's root, forked by the runner (pid 1 here)
        (101, 101, 100, "fork"), (102, 102, 101, "fork"),  # child, grandchild
        (103, 100, 100, "fork"),  # a thread of the root: pid != tgid
        (200, 200, 1, "fork"), (201, 201, 200, "fork"),  # the other side
        (101, 101, 100, "exec"),
    ])  # fmt: skip
    assert descendants(pt, 100) == {100, 101, 102}
    assert descendants(pt, 200) == {200, 201}
    assert descendants(pt, 999) == {999}


def test_kernel_stats_per_side():
    pt = _trace([(10, 10, 1, "fork"), (11, 11, 10, "fork"), (20, 20, 1, "fork")])
    tables = {
        "process_trace": pt,
        "quanta_runtime": pl.DataFrame(
            {"tgid": [10, 11, 11, 20, 99], "quanta_run_length_us": [1000, 2000, 3000, 500, 7]}
        ),
        "quanta_queued_time": pl.DataFrame(
            {"tgid": [10, 11, 20, 20], "quanta_queued_time_us": [10, 30, 5, 7]}
        ),
        "sched_migrate": pl.DataFrame({"tgid": [11, 11, 20], "orig_cpu": [0, 1, 0]}),
        "page_faults": pl.DataFrame({"tgid": [10, 20, 20, 20, 99], "address": [1, 2, 3, 4, 5]}),
    }
    st = kernel_stats(tables, {"A": 10, "B": 20})
    assert st["A"] == {
        "processes": 2,
        "cpu_time_ms": 6.0,
        "runq_latency_mean_us": 20.0,
        "runq_latency_p99_us": 30.0,  # the larger of two waits: a value that occurred
        "migrations": 2,
        "context_switches": 3,
        "page_faults": 1,
        "page_faults_estimated": False,
    }
    assert st["B"]["cpu_time_ms"] == 0.5 and st["B"]["page_faults"] == 3
    assert st["B"]["migrations"] == 1 and st["B"]["processes"] == 1


def test_page_faults_counted_per_process_or_rows_times_n():
    """A side's faults: its processes' counts in page_fault_counts (exact, whatever
    the rows), else its rows × the hook's sample_every, then marked an estimate."""
    pt = _trace([(10, 10, 1, "fork"), (11, 11, 10, "fork"), (20, 20, 1, "fork")])
    rows = pl.DataFrame({"tgid": [10, 11, 20, 99], "address": [1, 2, 3, 4]})
    counts = pl.DataFrame(
        {"tgid": [10, 11, 20, 99], "faults_user": [95, 7, 12, 1000], "faults_kernel": [5, 0, 3, 1]}
    )
    tables = {"process_trace": pt, "page_faults": rows, "page_fault_counts": counts}
    st = kernel_stats(tables, {"A": 10, "B": 20}, fault_every=10)
    assert (st["A"]["page_faults"], st["B"]["page_faults"]) == (95 + 7 + 5, 12 + 3)
    assert not st["A"]["page_faults_estimated"] and not st["B"]["page_faults_estimated"]
    del tables["page_fault_counts"]  # a collection made before: rows x N
    st = kernel_stats(tables, {"A": 10, "B": 20}, fault_every=10)
    assert (st["A"]["page_faults"], st["B"]["page_faults"]) == (20, 10)
    assert st["A"]["page_faults_estimated"] and st["B"]["page_faults_estimated"]
    assert not kernel_stats(tables, {"A": 10})["A"]["page_faults_estimated"]  # 1 in 1


def test_the_report_marks_estimated_page_faults():
    kernel = pl.DataFrame({
        "suite": ["s"] * 4, "benchmark": ["b"] * 4, "kind": ["duet"] * 4,
        "pair": ["A", "A", "B", "B"], "page_faults": [100, 300, 50, 70],
        "page_faults_estimated": [False, True, False, False],
    })  # fmt: skip
    rows = {r["pair"]: r for r in kernel_summary(kernel).iter_rows(named=True)}
    assert _kernel_value(rows["A"], "page_faults") == "≈200.0"  # one run estimated
    assert _kernel_value(rows["B"], "page_faults") == "60.0"


@pytest.mark.bpf
@pytest.mark.parametrize("by_tgid", [True, False])
def test_a_sampled_collections_side_faults(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, by_tgid: bool
) -> None:
    """A real collection that kept 1 fault in 10, the workload as one side: with the
    per-process counts (as duet run --collect makes them) the side's faults are the
    kernel's count (within the workload's own getrusage); without (a collection made
    before) its rows × 10, marked an estimate."""
    from tests.e2e.conftest import run_collect
    from tests.e2e.test_page_fault_counts import BEFORE_TRACED
    from tests.hooks.conftest import build_c
    from tests.hooks.test_page_faults import AFTER_LAST, KERNEL_PAGES, PAGES, WORKLOAD

    every = 10
    workload = build_c(tmp_path_factory, "pfw", WORKLOAD)
    overrides = tmp_path / "o.yaml"
    overrides.write_text(
        f"hooks:\n  page_faults:\n    sample_every: {every}\n"
        f"    count_by_tgid: {str(by_tgid).lower()}\n"
    )
    argv = [str(workload), str(PAGES), str(KERNEL_PAGES), "ungated"]
    folder = tmp_path / "suite"
    proc, col = run_collect(
        folder, "-c", str(overrides), "--hooks", "page_faults,process_trace", "--", *argv
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert col is not None
    lifetime = int(proc.stdout.split()[-1])
    trace = col["process_trace"]
    [pid] = trace.filter(pl.col("comm") == "pfw")["tgid"].unique().to_list()
    index = {"trials": [{
        "suite": "s", "benchmark": "b", "kind": "duet", "runid": 0, "order": "AB",
        "sides": {"A": {"pid": pid}},
        "collection": {"path": str(col.path.relative_to(folder)),
                       "collection_id": col.collection_id,
                       "hooks": {"page_faults": "attached", "process_trace": "attached"}},
    }]}  # fmt: skip
    [side] = kernel_stats_for_suite(folder, index).iter_rows(named=True)
    rows = col["page_faults"].filter(pl.col("tgid") == pid).height
    if by_tgid:
        counted = col.manifest["hooks"]["page_faults"]["counters"][COUNTER_ALL]
        assert lifetime - BEFORE_TRACED <= side["page_faults"] <= lifetime + AFTER_LAST
        assert side["page_faults"] <= counted  # the workload's part of what was traced
        assert side["page_faults_estimated"] is False
    else:
        assert side["page_faults"] == rows * every
        assert side["page_faults_estimated"] is True


@pytest.mark.bpf
def test_collect_attributes_each_side(tmp_path: Path, loop_bin: Path):
    from kernmlops.duet.process import process_dirs
    from kernmlops.duet.runner import read_index

    cfg = write_config(tmp_path / "duet.yml", f"""
duetbench:
  suite: collect-{os.getpid()}
  duet_repetitions: 2
  harness: {{iterations: 10}}
  duets: [d]
d:
  A: {{run: {loop_bin} 20000000}}
  B: {{run: {loop_bin} 100000000}}
""")  # fmt: skip
    # the real command line, in a process of its own (as a user runs it)
    cli = "from kernmlops.duet.cli import duet_group; duet_group()"
    proc = subprocess.run(
        [sys.executable, "-c", cli, "run", str(cfg), "-o", str(tmp_path / "out"), "--collect"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "out" / load_duet_config(cfg).suite
    trials = read_index(folder)["trials"]
    assert len(trials) == 2
    for t in trials:
        assert t["collection"]["ended_by"] == "completed"
        assert (folder / t["collection"]["path"] / "manifest.json").exists()
    processed = process_dirs([folder])
    assert processed.errors == []
    k = processed.kernel.sort("runid", "pair")
    assert k.height == 4
    # the harness process and its 10 loop processes: exactly one tree per side
    assert k["processes"].to_list() == [11, 11, 11, 11]
    for run in (0, 1):
        a = k.filter((pl.col("runid") == run) & (pl.col("pair") == "A")).row(0, named=True)
        b = k.filter((pl.col("runid") == run) & (pl.col("pair") == "B")).row(0, named=True)
        assert b["cpu_time_ms"] > 1.5 * a["cpu_time_ms"]  # B's loop does 5x the work
        for side in (a, b):
            assert side["context_switches"] >= 11 and side["page_faults"] > 11
            assert side["page_faults_estimated"] is False  # counted per process
            assert side["runq_latency_mean_us"] is not None and side["migrations"] is not None


@pytest.mark.bpf
def test_collect_writes_each_trials_collection_in_the_held_suite_folder(tmp_path: Path):
    """``duet run --collect``: side A moves the suite's folder away in the first trial
    and makes another under its name. Every trial's collection (the collector holds
    its folder by /proc/<pid>/fd/N, followed to the open folder, never by the name
    it shows) lands in the folder the run made; nothing in the one now so named."""
    from kernmlops.duet.runner import read_index

    out = Path(tempfile.mkdtemp(prefix="kmo-duet-swap-"))
    try:
        out.chmod(0o755)
        os.chown(out, 65534, 65534)  # the user's output folder
        cfg = swapping_config(tmp_path, out)
        cli = "from kernmlops.duet.cli import duet_group; duet_group()"
        proc = subprocess.run(
            [sys.executable, "-c", cli, "run", str(cfg), "-o", str(out), "--collect"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (out / "moved").is_dir(), "the swap did not run"
        assert list((out / load_duet_config(cfg).suite).iterdir()) == []
        trials = read_index(out / "moved")["trials"]
        assert len(trials) == 2
        for t in trials:
            assert t["collection"]["ended_by"] == "completed"
            assert (out / "moved" / t["collection"]["path"] / "manifest.json").exists()
    finally:
        shutil.rmtree(out, ignore_errors=True)
