"""`kernmlops collect -b ml-training` end to end: the job's epochs, steps and
checkpoints as results, its CPU time and its checkpoint writes as the kernel
saw them (root + BPF)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
import yaml

from kernmlops.benchmarks.ml_training import parse_job_output
from tests.e2e.conftest import KERNMLOPS, only_collection, run_collect

pytestmark = pytest.mark.bpf

EPOCHS = 4
SAMPLES, BATCH = 3000, 64


def test_ml_training_epochs_and_cpu_time(tmp_path: Path) -> None:
    overrides = tmp_path / "o.yaml"
    job = {"epochs": EPOCHS, "samples": SAMPLES, "test_samples": 500, "batch_size": BATCH,
           "threads": 1, "checkpoint_every": 20, "checkpoint_dir": str(tmp_path / "ck"),
           "keep_checkpoints": 3}  # fmt: skip
    overrides.write_text(yaml.safe_dump({"benchmark": {"name": "ml-training", "ml_training": job}}))
    hooks = "process_trace,quanta_runtime,block_io"
    proc, col = run_collect(tmp_path / "out", "-c", str(overrides), "--hooks", hooks)
    assert proc.returncode == 0, proc.stderr
    assert col is not None
    m = col.manifest
    assert m["benchmark"]["name"] == "ml-training" and m["filter"]["mode"] == "tree"
    tgid = m["benchmark"]["pid"]  # the gate execs python in place: same process

    res = col["benchmark_result"]
    seconds = res.filter((pl.col("metric") == "seconds") & pl.col("key").str.starts_with("epoch_"))
    assert seconds["key"].to_list() == [f"epoch_{i}" for i in range(1, EPOCHS + 1)]
    assert seconds["value"].min() > 0
    value = {(k, mt): v for k, mt, v in res.select("key", "metric", "value").iter_rows()}
    assert value[("total", "seconds")] == pytest.approx(seconds["value"].sum())
    assert value[("process", "threads")] == 1
    # The real framework ran (torch is installed by make), with its steps and checkpoints.
    assert value[("setup", "torch")] == 1.0
    steps = EPOCHS * -(-SAMPLES // BATCH)
    assert value[("process", "steps")] == steps
    assert value[("checkpoints", "count")] == steps // 20
    assert len(list((tmp_path / "ck").glob("ckpt-*.pt"))) == 3

    # Checkpoints are fsync'ed by the job: their blocks are written from its own
    # context, so block_io charges them to its tgid (journal commits are jbd2's).
    io = col["block_io"].filter((pl.col("tgid") == tgid) & (pl.col("op") == "WRITE"))
    written = io["bytes"].sum()
    ckpt_bytes = value[("checkpoints", "bytes")]
    assert ckpt_bytes <= written <= 1.5 * ckpt_bytes + (1 << 20), (written, ckpt_bytes)

    # The job's wall time as the kernel saw it: its exec to its exit.
    pt = col["process_trace"].filter(pl.col("pid") == tgid)
    exec_us = pt.filter(pl.col("kind") == "exec")["ts_uptime_us"].max()
    exit_us = pt.filter(pl.col("kind") == "exit")["ts_uptime_us"].max()
    wall_s = (exit_us - exec_us) / 1e6
    epochs_s = value[("total", "seconds")]
    job_out = parse_job_output((col.path / "benchmark_output" / "stdout.txt").read_text())
    done = next(r for r in job_out if r["kind"] == "done")
    done_us = int(done["uptime_us"])
    # The job's own clocks against the kernel's: its done line falls between its exec
    # and its exit, and the time it counts (from its start to done: importing torch,
    # set-up, the epochs) fits in exec -> done.
    assert exec_us < done_us <= exit_us
    assert epochs_s + value[("setup", "seconds")] < done["seconds"] <= (done_us - exec_us) / 1e6

    # On-CPU time of the job's threads, summed from quanta_runtime up to the moment
    # the job read its own getrusage-style account (os.times) just before exiting:
    # the interpreter's exit (torch's teardown, ~0.4 s) comes after that account.
    quanta = col["quanta_runtime"].filter(pl.col("tgid") == tgid)
    assert quanta.height > 0
    ends, lengths = pl.col("ts_uptime_us"), pl.col("quanta_run_length_us")
    before = (pl.min_horizontal(ends, pl.lit(done_us)) - (ends - lengths)).clip(lower_bound=0)
    traced_s = quanta.select(before.sum()).item() / 1e6
    assert traced_s == pytest.approx(value[("process", "cpu_seconds")], rel=0.10, abs=0.05)
    assert traced_s <= wall_s * 1.05  # one thread cannot run longer than it lived


def test_ctrl_c_keeps_the_finished_epochs_and_ends_the_job(tmp_path: Path) -> None:
    overrides = tmp_path / "o.yaml"
    job = {"epochs": 1000, "samples": 2_000, "threads": 1}
    overrides.write_text(yaml.safe_dump({"benchmark": {"name": "ml-training", "ml_training": job}}))
    collector = subprocess.Popen(
        [*KERNMLOPS, "collect", "--no-progress", "-o", str(tmp_path / "out"), "-c", str(overrides)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert collector.stderr is not None
    for line in collector.stderr:
        if "probes attached" in line:
            break
    # Stop once the job has printed two epochs (read from its stdout file, by /proc).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _epochs_printed(collector.pid) < 2:
        time.sleep(0.1)
    collector.send_signal(signal.SIGINT)
    rest = collector.stderr.read()
    assert collector.wait(timeout=30) == 128 + signal.SIGINT, rest
    col = only_collection(tmp_path / "out")
    assert col is not None, rest
    assert col.manifest["ended_by"] == "interrupted"
    res = col["benchmark_result"]
    done = res.filter((pl.col("key") == "total") & (pl.col("metric") == "epochs"))["value"][0]
    assert 2 <= done < 1000
    assert res.filter(pl.col("key") == "process").height == 0  # it never reached its end
    with pytest.raises(ProcessLookupError):  # the job is gone with its group
        os.kill(col.manifest["benchmark"]["pid"], 0)


def _epochs_printed(collector_pid: int) -> int:
    """Epoch lines in the benchmark's stdout so far (0 before it runs). The collector
    has other children (the containment watchdog), so every child's stdout is read."""
    most = 0
    for child in psutil.Process(collector_pid).children():
        try:
            text = Path(f"/proc/{child.pid}/fd/1").read_text()
        except OSError:
            continue
        most = max(most, text.count('"kind": "epoch"'))
    return most
