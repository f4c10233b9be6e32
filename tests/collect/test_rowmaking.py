"""Rows made from the spool in worker processes at stop: the same rows, in spool
order, after the run's own parts; a damaged frame costs only time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from kernmlops.collect.disk import human_bytes
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.rowmaking import STAGING_PREFIX, make_spooled_rows, plan
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.spec import object_spec
from kernmlops.hooks.process_trace import ProcessTraceHook
from kernmlops.spool.copy import RingSpool
from kernmlops.spool.frames import FRAME
from kernmlops.spool.jobs import SpoolPiece, SpoolWork
from tests.conftest import skip_here

OBJECT = object_path("process_trace")


class _Spooled:
    """The two calls make_spooled_rows makes of a hook, on one spool."""

    def __init__(self, spool: RingSpool) -> None:
        self.spool = spool
        self.made: tuple[dict[str, int], int] | None = None

    def spool_work(self) -> list[SpoolWork]:
        pieces = self.spool.unread()
        return [SpoolWork(self.spool.folder, self.spool.key, pieces)] if pieces else []

    def spool_made(self, key: str, rows: dict[str, int], events: int) -> None:
        self.spool.read_to_end(rows)
        self.made = (rows, events)


def _layout():
    return object_spec(OBJECT).ring_layouts()["process_trace_rb"]


def _records(n: int, first_pid: int = 0) -> np.ndarray:
    records = np.zeros(n, _layout().dtype)
    records["pid"] = np.arange(first_pid, first_pid + n)
    return records


def _make(hook: _Spooled, sink: ParquetSink, said: list[str], workers: int) -> list:
    """make_spooled_rows on one spool, however little it holds, in ``workers``."""
    flush = lambda: sink.flush(durable=True)  # noqa: E731
    return make_spooled_rows([hook], sink, flush, said.append, min_raw=0, workers=workers)  # type: ignore[list-item]


def _spool(tmp_path: Path, n: int, frames: int) -> RingSpool:
    """A spool of ``n`` process_trace records (pids 1000..) in about ``frames`` frames."""
    if not OBJECT.exists():
        skip_here("the BPF objects are not built (make bpf)")
    info = {"hook": "process_trace", "options": ProcessTraceHook.Options().model_dump(),
            "ring": "process_trace_rb", "object": str(OBJECT)}  # fmt: skip
    records = _records(n, 1000)
    spool = RingSpool(tmp_path / ".spool", "process_trace", records.itemsize, info)
    step = -(-n // frames)
    spool._frame_raw = step * spool.stride  # the writer would join them in MiB frames
    for lo in range(0, n, step):
        spool.append(records[lo : lo + step])
    spool.drained()
    return spool


def test_workers_make_the_same_rows_in_spool_order_after_the_runs_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernmlops.spool import jobs as spool_module

    monkeypatch.setattr(spool_module, "PIECE_RAW", 64 << 10)  # pieces of a few frames
    spool = _spool(tmp_path, 30_000, frames=24)
    hook = _Spooled(spool)
    sink = ParquetSink(tmp_path, "c0", row_group_rows=4096, rows_per_file=40_000, fast_parts=True)
    run = ProcessTraceHook().to_frame("process_trace", _records(500), _layout())
    sink.write("process_trace", run)  # rows made during the run: a plain part first
    said: list[str] = []
    # (an earlier test in the same run may have left a child of its own: not ours)
    before = {p.pid for p in psutil.Process().children()}
    try:
        done = _make(hook, sink, said, workers=3)
    finally:
        spool.close()
    assert done == [hook]
    raw = human_bytes(30_000 * spool.stride)  # every record, its ring header included
    assert said == [f"note: making rows from {raw} of spooled records on 3 cores"]
    assert hook.made == ({"process_trace": 30_000}, 30_000)
    assert spool.pending == 0 and spool.rows == {"process_trace": 30_000}
    assert not list(tmp_path.glob(f"{STAGING_PREFIX}*"))  # the workers' folder is gone
    # no worker, nor any helper process, stays
    assert {p.pid for p in psutil.Process().children()} <= before
    assert sink.close() == {"process_trace": 30_500}
    files = sink.files_written()["process_trace"]
    assert len(files) == 4  # the run's part, then one per job, in order
    pids = [pid for f in files for pid in pq.read_table(tmp_path / f)["pid"].to_pylist()]
    assert pids == [*range(500), *range(1000, 31_000)]
    # Compaction rewrites the plain part and keeps the workers' (compact) as they are.
    adopted = [(tmp_path / f).stat().st_ino for f in files[1:]]
    assert sink.compact() == {"process_trace": "compacted"}
    files = sink.files_written()["process_trace"]
    assert [(tmp_path / f).stat().st_ino for f in files[1:]] == adopted
    whole = pq.read_table(tmp_path / "process_trace", columns=["pid"])["pid"].to_pylist()
    assert whole == [*range(500), *range(1000, 31_000)]


def test_a_damaged_frame_leaves_the_rows_to_the_collector(tmp_path: Path) -> None:
    spool = _spool(tmp_path, 3_000, frames=4)
    hook = _Spooled(spool)
    seg = next((tmp_path / ".spool").glob("*.ring"))
    data = bytearray(seg.read_bytes())
    data[FRAME.size + 40] ^= 0xFF  # in the first frame (zstd: a spool on disk)
    seg.write_bytes(bytes(data))
    sink = ParquetSink(tmp_path, "c0")
    said: list[str] = []
    try:
        done = _make(hook, sink, said, workers=2)
        assert done == [] and hook.made is None
        assert spool.pending == 3_000 * spool.stride  # nothing marked read
    finally:
        spool.close()
    assert "failed (CollectionError:" in said[-1] and "fails zstd's check" in said[-1]
    assert said[-1].endswith("making them here")
    assert not list(tmp_path.glob(f"{STAGING_PREFIX}*"))
    assert sink.close() == {}


def test_jobs_cut_each_spool_in_order_and_never_mix_spools() -> None:
    def work(key: str, sizes: list[int]) -> SpoolWork:
        pieces, at = [], 0
        for size in sizes:
            pieces.append(SpoolPiece("seg", at, at + size, None, size))
            at += size
        return SpoolWork(Path("."), key, pieces)

    a, b = work("a", [10] * 9), work("b", [10] * 3)
    jobs = plan([a, b], 4, min_job=0)
    assert [(w.key, [p.start for p in pieces]) for w, pieces in jobs] == [
        ("a", [0, 10, 20]),
        ("a", [30, 40, 50]),
        ("a", [60, 70, 80]),
        ("b", [0, 10, 20]),
    ]
    # a floor on a job's size: fewer, larger jobs
    assert len(plan([a, b], 4, min_job=60)) == 3


def test_recover_removes_the_parts_of_workers_a_kill_stopped(tmp_path: Path) -> None:
    from kernmlops.collect.recovery import recover

    staged = tmp_path / f"{STAGING_PREFIX}4242" / "0" / "process_trace"
    staged.mkdir(parents=True)
    (staged / "part-00000.parquet").write_bytes(b"PAR1")
    assert recover(tmp_path).added == {}  # the spool holds every one of their rows
    assert not (tmp_path / f"{STAGING_PREFIX}4242").exists()


def test_one_worker_per_cpu_per_job_and_per_gib_of_memory() -> None:
    from kernmlops.collect.rowmaking import MIN_JOB_RAW, workers_for

    gib = 1 << 30
    assert workers_for(100 * MIN_JOB_RAW, cpus=16, ram=128 * gib) == 16
    assert workers_for(3 * MIN_JOB_RAW - 1, cpus=16, ram=128 * gib) == 3
    assert workers_for(100 * MIN_JOB_RAW, cpus=192, ram=1024 * gib) == 64
    assert workers_for(100 * MIN_JOB_RAW, cpus=16, ram=4 * gib) == 4
    assert workers_for(1, cpus=1, ram=gib) == 1
    assert workers_for(100 * MIN_JOB_RAW, cpus=3, ram=128 * gib) == 1  # start costs more


def test_parts_written_at_stop_are_compact_and_kept_unless_small(tmp_path: Path) -> None:
    # The run's parts are plain; from the stop on (write_whole_parts) the sink encodes
    # compactly: compaction rewrites the plain ones and a small stop part with them,
    # and keeps a stop part of a quarter of a file (rows_per_file) or more as it is.
    sink = ParquetSink(tmp_path, "c0", row_group_rows=1000, rows_per_file=12_000, fast_parts=True)
    layout = _layout()
    for lo in (0, 500):  # two flushes of the run
        sink.write("process_trace", ProcessTraceHook().to_frame("t", _records(500, lo), layout))
        sink.flush(durable=True)
    sink.write("small", ProcessTraceHook().to_frame("t", _records(10), layout))
    sink.write_whole_parts()  # finishes the open parts first: they are plain
    sink.write("process_trace", ProcessTraceHook().to_frame("t", _records(3000, 1000), layout))
    sink.write("small", ProcessTraceHook().to_frame("t", _records(10, 10), layout))
    sink.close()
    stop = tmp_path / sink.files_written()["process_trace"][-1]
    assert pq.ParquetFile(stop).metadata.row_group(0).column(1).compression == "ZSTD"
    inode = stop.stat().st_ino
    assert sink.compact() == {"process_trace": "compacted", "small": "compacted"}
    files = sink.files_written()
    assert len(files["process_trace"]) == 2 and len(files["small"]) == 1
    assert (tmp_path / files["process_trace"][1]).stat().st_ino == inode  # kept, not read
    pids = pq.read_table(tmp_path / "process_trace")["pid"].to_pylist()
    assert pids == list(range(4000))
    assert pq.read_table(tmp_path / "small")["pid"].to_pylist() == list(range(20))
    assert sink.compact() == {"process_trace": "skipped: compact already",
                              "small": "skipped: compact already"}  # fmt: skip
