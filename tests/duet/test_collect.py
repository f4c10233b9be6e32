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

from kernmlops.duet.collect import descendants, kernel_stats
from kernmlops.duet.config import load_duet_config
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
    }
    assert st["B"]["cpu_time_ms"] == 0.5 and st["B"]["page_faults"] == 3
    assert st["B"]["migrations"] == 1 and st["B"]["processes"] == 1


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
