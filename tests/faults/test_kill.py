"""SIGKILL (and the OOM killer) at every stage of a collection."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import polars as pl
import pytest

from kernmlops.collect.manifest import read_manifest
from kernmlops.spool.memory import memory_folder
from tests.faults.conftest import (
    EVENT_WAIT_S,
    FLUSH_S,
    SLACK_S,
    assert_no_benchmark_left,
    assert_recovered_manifest,
    kill_collector,
    now_us,
    read_everything,
    recover,
    start_collect,
    wait_for_flushes,
    wait_until,
)
from tests.switches import SpooledSwitches, spooled_switches

pytestmark = pytest.mark.bpf

# A context-switch storm (~100k switches/s: what 2 vCPUs drain without drops while the
# storm runs), and a child that leaves the session and process group.
STORM = [
    "--", "sh", "-c",
    "setsid sleep 1000 & exec stress-ng --switch 1 --switch-freq 50000 -t 60 --quiet",
]  # fmt: skip


def last_ts_us(collection: Path, table: str) -> int:
    parts = sorted((collection / table).glob("part-*.parquet"))
    return pl.scan_parquet(parts).select(pl.col("ts_uptime_us").max()).collect().item()


def repeated_runs(quanta: pl.DataFrame, length: int = 8) -> int:
    """Runs of ``length`` consecutive rows of a CPU (in file order) found more than
    once: what rows made twice (from the spool and from a finished part) leave. One
    row alone may come twice: a task switched out twice within a microsecond of the
    scheduler's clock, with quanta of the same rounded length.

    A storm's millions of rows: each run is screened first by a hash of its rows' hashes
    (in numpy, ~1 s; the runs as strings take ~20 s). Equal runs hash alike, so where no
    two hashes are equal no run repeats; where some are, the runs are compared exactly."""
    import numpy as np

    frame = quanta.with_row_index("_file_order").sort("cpu", "_file_order")
    cpu = frame["cpu"].to_numpy()
    rows = pl.struct(pl.all().exclude("collection_id", "_file_order")).hash()
    hashes = frame.select(rows).to_series().to_numpy()
    n = len(hashes) - length + 1
    if n <= 0:
        return 0
    mixed = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):  # wraps around, as a hash does
        for i in range(length):
            mixed = mixed * np.uint64(0x100000001B3) + hashes[i : i + n]
    mixed = np.sort(mixed[cpu[:n] == cpu[length - 1 :]])  # runs within one CPU
    if not (mixed[1:] == mixed[:-1]).any():
        return 0
    row = pl.concat_str(pl.all().exclude("collection_id").cast(pl.String), separator=":")
    run = pl.concat_str([row.shift(-i).over("cpu") for i in range(length)], separator="|")
    runs = quanta.select(run=run)["run"].drop_nulls()
    return int(runs.is_duplicated().sum())


def test_repeated_runs_finds_rows_made_twice() -> None:
    rows = pl.DataFrame({
        "ts_uptime_us": range(100), "quanta_run_length_us": [2] * 100,
        "cpu": [0, 1] * 50, "pid": [7] * 100, "tgid": [7] * 100,
    })  # fmt: skip
    coincident = pl.concat([rows[:40], rows[39:40], rows[40:]])  # one row twice
    assert repeated_runs(rows) == 0 and repeated_runs(coincident) == 0
    again = pl.concat([rows[:60], rows[30:50], rows[60:]])  # 20 rows made twice
    assert repeated_runs(again) > 0


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.15])
def test_sigkill_during_attach(tmp_path: Path, bpf_baseline, after_s: float) -> None:
    """Killed before or while the probes attach: the benchmark (held at its gate, or
    just released) dies with the collector, nothing stays attached, the manifest says
    running."""
    run = start_collect(tmp_path / "out", *STORM)
    manifests = (tmp_path / "out").glob
    # the manifest is written before the first probe is loaded
    assert wait_until(lambda: any(manifests("curated/*/*/manifest.json")), 60, 0.001)
    time.sleep(after_s)
    kill_collector(run)
    assert_no_benchmark_left(run.marker)
    manifest = read_manifest(run.collection())
    assert manifest.state == "running"
    # nothing was flushed this early; what is there (if anything) reads
    if list(run.collection().glob("*/part-*.parquet")):
        read_everything(run.collection())
    # recover leaves nothing of it in /dev/shm (a kill as the spool was set up left
    # its folder there, which no spool linked to)
    recover(run.collection())
    assert not memory_folder(manifest.collection_id).exists()


def test_sigkill_mid_run_loses_at_most_one_flush(tmp_path: Path, bpf_baseline) -> None:
    run = start_collect(tmp_path / "out", *STORM)
    run.wait_for("probes attached")
    # two flushes, however long they take (the first waits for the decoding libraries'
    # import, which a loaded machine makes slow), and a little into the third interval
    wait_for_flushes(run, 2)
    time.sleep(0.3)
    killed_us = kill_collector(run)
    assert_no_benchmark_left(run.marker)
    col = run.collection()
    manifest = read_manifest(col)
    assert manifest.state == "running" and manifest.flushes >= 1
    read_everything(col)  # the finished parts read as they are
    recover(col)  # rows still in the spool (a machine with no CPU to spare)
    rows = read_everything(col)
    assert rows["quanta_runtime"] > 10_000  # a storm: thousands of switches a second
    lost_s = (killed_us - last_ts_us(col, "quanta_runtime")) / 1e6
    print(f"\n[loss] mid-run: {lost_s:.3f} s")  # the figure bench/README reports (-s)
    assert 0 <= lost_s <= FLUSH_S + SLACK_S, lost_s
    # the manifest's checkpoint counted the parts of its last flush (the kill may have
    # come between a flush's parts and its rewrite: one behind), and the recovery
    # brought it up to the parts on disk
    checkpoint = manifest.tables.get("quanta_runtime")
    assert checkpoint is None or checkpoint.rows <= rows["quanta_runtime"]
    assert read_manifest(col).tables["quanta_runtime"].rows == rows["quanta_runtime"]
    assert manifest.hooks["quanta_runtime"].attached


def test_sigkill_mid_run_keeps_what_the_benchmark_printed(tmp_path: Path, bpf_baseline) -> None:
    """A benchmark's captured output is written into the collection as it runs (it
    was once kept by a copy at the end, lost with a killed collector): stress-ng's
    first lines are in benchmark_output/ before the kill, and after it and the
    recovery."""
    run = start_collect(tmp_path / "out", "--hooks", "process_trace", "-b", "stress-ng",
                        more_config="benchmark:\n  stress_ng:\n    scenario: cpu\n"
                        "    workers: 1\n    duration_s: 60\n")  # fmt: skip
    run.wait_for("probes attached")
    output = run.collection() / "benchmark_output"

    def printed() -> bool:
        found = [output / n for n in ("stdout.txt", "stderr.txt") if (output / n).exists()]
        return b"dispatching hogs: 1 cpu" in b"".join(p.read_bytes() for p in found)

    try:
        assert wait_until(printed, 15), list(output.iterdir()) if output.exists() else None
    finally:
        kill_collector(run)
    assert_no_benchmark_left(run.marker)
    assert printed()
    recover(run.collection())
    assert printed()


@pytest.mark.parametrize("memory_mib", [256, 4])
def test_sigkill_with_every_row_in_the_spool_loses_at_most_one_flush_after_recover(
    tmp_path: Path, bpf_baseline, memory_mib: int
) -> None:
    """A machine with no CPU to spare: the rings only went to the spool when the kill
    came. The finished parts read as they are; `kernmlops recover` adds the spool's
    rows (none twice), and what is lost is what a flush interval bounds. The spool's
    first MiB are on the tmpfs: all of it (256), or 4 MiB and the rest on disk."""
    from kernmlops.spool.recovery import pending_spools

    run = start_collect(
        tmp_path / "out",
        *STORM,
        more_config=f"  spool_spare_cpus: 1000\n  spool_memory_mib: {memory_mib}\n",
    )
    run.wait_for("probes attached")
    col = run.collection()

    def spooled(folder: Path) -> int:
        # the storm's record bytes in folder's segments (the tmpfs's, or the disk's)
        return sum(p.stat().st_size for p in folder.glob("quanta_switch.*.ring"))

    def enough() -> bool:
        if memory_mib == 4:  # past the tmpfs's 4 MiB: records on disk
            return spooled(col / ".spool") > 0
        # all on the tmpfs: as many, 4 MiB (~130k switches of 32 bytes; over 10,000
        # rows are asserted)
        return spooled(col / ".spool" / "mem") >= 4 << 20

    # Killed once the spool holds what the checks below need, however long the storm
    # (rate-limited, and slower on a loaded machine) takes: once in CI nothing had
    # reached the disk segment 3.3 s after the probes attached. Its end (60 s) would
    # end the wait too.
    wait_until(lambda: run.proc.poll() is not None or enough(), EVENT_WAIT_S, 0.1)
    killed_us = kill_collector(run)
    assert_no_benchmark_left(run.marker)
    # never read to its end: segment 0 on the tmpfs, and past 4 MiB one on disk
    # (the copier's standby on disk, never taken up, is empty)
    segments = [p for p in pending_spools(col)
                if p.name.startswith("quanta_switch.") and p.stat().st_size]  # fmt: skip
    shm = (col / ".spool" / "mem").resolve()
    assert shm.parent == Path("/dev/shm")
    assert segments[0].name == "quanta_switch.00000.ring" and segments[0].parent.name == "mem"
    if memory_mib == 4:
        assert [p.name for p in segments] == [f"quanta_switch.0000{i}.ring" for i in (0, 1)]
        assert segments[1].parent == col / ".spool"
    else:
        assert len(segments) == 1
    before = read_everything(col)
    assert before.get("quanta_runtime", 0) == 0
    assert "quanta_runtime" in recover(col)
    assert not (col / ".spool").exists() and not shm.exists()
    rows = read_everything(col)
    assert rows["quanta_runtime"] > 10_000
    lost_s = (killed_us - last_ts_us(col, "quanta_runtime")) / 1e6
    print(f"\n[loss] spool only, recovered: {lost_s:.3f} s")
    assert 0 <= lost_s <= FLUSH_S + SLACK_S, lost_s
    quanta = pl.read_parquet(sorted((col / "quanta_runtime").glob("part-*.parquet")))
    assert repeated_runs(quanta) == 0
    # the manifest counts what the parts hold, per table and per hook, and says the
    # collector was killed and recover made the rest (before: running, hooks at 0)
    on_disk = assert_recovered_manifest(col, "running")
    assert on_disk["quanta_runtime"] == rows["quanta_runtime"]
    manifest = read_manifest(col)
    hook = manifest.hooks["quanta_runtime"]
    assert hook.rows["quanta_runtime"] == rows["quanta_runtime"]
    assert hook.rows["quanta_queued_time"] == rows["quanta_queued_time"]
    assert manifest.recovery is not None
    assert manifest.recovery.rows_added["quanta_runtime"] == rows["quanta_runtime"]
    assert "nothing to recover" in recover(col)  # a second time changes nothing
    assert read_everything(col) == rows
    assert read_manifest(col) == manifest


def test_sigkill_during_the_final_flush(tmp_path: Path, bpf_baseline) -> None:
    """SIGTERM starts the stop (drain, detach, final flush); SIGKILL lands in it."""
    run = start_collect(tmp_path / "out", *STORM)
    run.wait_for("probes attached")
    # two flushes, however long the first takes (see the mid-run kill), and half an
    # interval: the stop then drains a running collection's rings
    wait_for_flushes(run, 2)
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    killed_us = kill_collector(run)
    assert_no_benchmark_left(run.marker)
    col = run.collection()
    read_everything(col)
    recover(col)
    rows = read_everything(col)
    lost_s = (killed_us - last_ts_us(col, "quanta_runtime")) / 1e6
    print(f"\n[loss] final flush: {lost_s:.3f} s")  # the figure bench/README reports (-s)
    assert lost_s <= FLUSH_S + SLACK_S, lost_s
    manifest = read_manifest(col)
    # recovered: the stop's spool held rows; else the kill came after it was removed
    assert manifest.state in ("running", "interrupted", "recovered")
    if manifest.state == "recovered":
        assert manifest.recovery is not None
        assert manifest.recovery.recovered_from in ("running", "interrupted")
        assert_recovered_manifest(col, manifest.recovery.recovered_from)
    assert rows["quanta_runtime"] > 0


def test_oom_killer_takes_the_benchmark_not_the_collector(tmp_path: Path, bpf_baseline) -> None:
    """In a memory-limited cgroup a benchmark that eats memory is what the OOM killer
    ends (the collector lowered its own OOM score): the collection finishes and says the
    benchmark was killed."""
    from tests.faults.memcg import memory_limited

    with memory_limited(600 << 20) as enter:
        run = start_collect(
            tmp_path / "out", "--", "sh", "-c",
            "exec python3 -c 'import sys; a=[]\nwhile True: a.append(bytearray(1<<24))'",
            preexec=enter,
        )  # fmt: skip
        code, err = run.finish(timeout_s=120)
    assert code == 137, err  # the benchmark's exit: SIGKILL
    assert "Traceback" not in err
    col = run.collection()
    manifest = read_manifest(col)
    assert manifest.state == "failed" and manifest.benchmark.exit_code == 137
    assert read_everything(col)["memory_usage"] > 0
    assert_no_benchmark_left(run.marker)


def test_sigkill_under_memory_pressure(tmp_path: Path, bpf_baseline) -> None:
    """What an OOM kill of the collector itself looks like: SIGKILL while the benchmark
    fills a memory-limited cgroup. The flushed rows survive, the benchmark dies."""
    from tests.faults.memcg import memory_limited

    with memory_limited(900 << 20) as enter:
        run = start_collect(
            tmp_path / "out", "--", "sh", "-c",
            "stress-ng --vm 1 --vm-bytes 300M --vm-keep -t 60 --quiet & "
            "exec stress-ng --switch 1 -t 60 --quiet",
            preexec=enter,
        )  # fmt: skip
        run.wait_for("probes attached")
        # two flushes (the libraries' import is slow under this pressure), and into the
        # third interval
        wait_for_flushes(run, 2)
        time.sleep(0.3)
        killed_us = kill_collector(run)
        assert_no_benchmark_left(run.marker)
    col = run.collection()
    read_everything(col)
    recover(col)
    read_everything(col)
    lost_s = (killed_us - last_ts_us(col, "quanta_runtime")) / 1e6
    print(f"\n[loss] memory pressure: {lost_s:.3f} s")  # the figure bench/README reports (-s)
    assert lost_s <= FLUSH_S + SLACK_S, lost_s


# Loaded by the collector's Python (PYTHONPATH) in the next test: a SIGKILL at an exact
# step of taking the row workers' parts in, which no signal from outside could hit.
KILL_AT = """
import os, signal
where = os.environ.get("KMO_KILL_AT", "")
if where:
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.hooks.bpf import BpfHook

    adopt, made, seen = ParquetSink.adopt, BpfHook.spool_made, [0]

    def adopt_then_kill(self, *args, **kwargs):
        if where == f"adopt-{seen[0]}":
            os.kill(os.getpid(), signal.SIGKILL)
        seen[0] += 1
        return adopt(self, *args, **kwargs)

    def kill_before_made(self, *args, **kwargs):
        if where == "made":
            os.kill(os.getpid(), signal.SIGKILL)
        return made(self, *args, **kwargs)

    ParquetSink.adopt, BpfHook.spool_made = adopt_then_kill, kill_before_made
    # pieces of a MiB: the storm's few MiB make two jobs of its ring, as a long one's
    from kernmlops.spool import jobs

    jobs.PIECE_RAW = 1 << 20
"""


@pytest.mark.parametrize("where", ["adopt-0", "adopt-1", "made"])
def test_sigkill_while_taking_in_the_row_workers_parts_loses_nothing_after_recover(
    tmp_path: Path, bpf_baseline, where: str
) -> None:
    """The stop's row workers made every spooled record's rows into staged parts; the
    collector is killed before the first is taken in, after one, or after all of
    them before the spool is marked read. `kernmlops recover` then makes the rows of
    what no part holds: every switch of the storm is there once (no gap on any CPU,
    no run of rows twice) and the workers' staging folder is gone."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(KILL_AT)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    run = start_collect(
        tmp_path / "out",
        *STORM,
        env={"PYTHONPATH": path, "KMO_KILL_AT": where},
        # every record stays in the spool until the stop, and two workers make its rows
        more_config="  spool_spare_cpus: 1000\n  spool_row_workers: 2\n",
    )
    run.wait_for("probes attached")
    col = run.collection()

    def stormed() -> SpooledSwitches:
        return spooled_switches(col / ".spool", col / ".spool" / "mem", live=True)

    def enough(seen: SpooledSwitches) -> bool:
        # twice the rows asserted below, and the storm 1.5 s past the first second that
        # the gap checks leave out: more than the 1 s a CPU may go without a row
        return seen.rows["quanta_runtime"] >= 100_000 and seen.span_s >= 2.5

    # Stopped once the spool holds what the checks need, however the storm and the
    # copy run (a fixed 3 s after the attach: less of it where the copy lags).
    wait_until(lambda: run.proc.poll() is not None or enough(stormed()), EVENT_WAIT_S, 0.25)
    seen = stormed()
    if not enough(seen):
        kill_collector(run)  # nothing of it left for the next test
    assert enough(seen), seen
    stopped_us = now_us()
    run.proc.send_signal(signal.SIGTERM)
    run.wait_for("making rows from")
    assert run.proc.wait(timeout=120) == -signal.SIGKILL, run.finish()
    assert_no_benchmark_left(run.marker)
    # every record the storm left, decoded apart from the collector (the stop drained
    # the rings into the spool before the workers started)
    shutil.copytree(col / ".spool", tmp_path / "snapshot")  # follows `mem` (the tmpfs)
    spooled = spooled_switches(tmp_path / "snapshot")
    # taken in or not, the workers' parts were staged (their folder is removed once all
    # are taken in, before the spool is marked read): the ring's in two jobs at least
    staged = list(col.glob(".rows-*/*/*/part-*"))
    assert bool(staged) == (where != "made")
    if staged:
        assert len([p for p in staged if p.parent.name == "quanta_runtime"]) >= 2, staged
    before = read_everything(col).get("quanta_runtime", 0)
    said = recover(col)
    assert not list(col.glob(".rows-*")) and not (col / ".spool").exists()
    rows = read_everything(col)
    if where == "adopt-0":
        assert rows["quanta_runtime"] > before  # no worker's part was taken in
    assert rows["quanta_runtime"] > 50_000, said  # ~100k switches/s for 2.5 s
    # each spooled record's rows once: none lost, none made twice
    assert {t: rows[t] for t in spooled.rows} == spooled.rows, said
    quanta = pl.read_parquet(sorted((col / "quanta_runtime").glob("part-*.parquet")))
    assert repeated_runs(quanta) == 0
    # no stretch of the storm without rows: a part lost or skipped would leave one (each
    # job is a run of whole frames of the table's ring, one ring per 16 CPUs: a stretch
    # of time on every CPU that switched); the storm's start (its processes spawning, a
    # CPU idle for a few hundred ms) left out. No bound on one CPU alone: with one ring
    # a lost job is a gap on every CPU, and one CPU may go without the storm's switches
    # for long, its pairs moved to the other (1.16 s in a CI run, while the lab's QEMU,
    # booting beside the loud tests, held that CPU).
    storm = pl.col("ts_uptime_us").is_between(quanta["ts_uptime_us"].min() + 1_000_000, stopped_us)
    ts = quanta.filter(storm).sort("ts_uptime_us")
    gap = ts.select(gap=pl.col("ts_uptime_us").diff()).max().item()
    assert gap < 200_000, f"{gap / 1e6:.3f} s without a row on any CPU"
    lost_s = (stopped_us - last_ts_us(col, "quanta_runtime")) / 1e6
    assert lost_s <= SLACK_S, lost_s
    assert read_manifest(col).tables["quanta_runtime"].rows == rows["quanta_runtime"]
    assert "nothing to recover" in recover(col)
