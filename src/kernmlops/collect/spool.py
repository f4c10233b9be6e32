"""Ring records waiting on disk: what keeps the collector light on a saturated machine.

A BPF hook's rings are copied, as they lie (record headers included), into
``<collection>/.spool/<key>.<segment>.ring`` files every poll: one ``write`` per
piece of ring, no decoding. Rows are made from the spool (decode, the hook's own
columns, Parquet) when the machine has CPU to spare, and all of what is left at
stop, the way ``perf record`` writes first and ``perf report`` decodes later. On a
machine with idle CPU the spool is read back within a poll and rows reach Parquet
as they always did; under a storm that keeps every CPU busy the collector takes
only the copy's few percent of a core from the workload, and its memory does not
grow with the backlog (the page cache holds it, the disk keeps it).

Durability is the collection's (README, "A collection survives its collector"):
the spool is fsync'd at every flush, and ``kernmlops recover`` (:func:`recover`)
turns what a killed collector left into parts, skipping the rows already in
finished parts. So that it can, each segment records the rows every table had
before it (``<key>.<segment>.json``) and the spool's ``<key>.json`` names the hook,
its options and the object whose BTF describes the records. A segment is retired
when it was read to its end at a flush, and deleted once the flush finished the
parts that hold its rows.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.ebpf.ringbuf import HEADER_SIZE, RingBuffer, decode, record_stride
from kernmlops.errors import CollectionError
from kernmlops.fileio import write_atomic
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np

    from kernmlops.ebpf.btf import RecordLayout
else:
    np = lazy_import("numpy")

SPOOL_DIR = ".spool"
#: bytes of spool read back per step: a bounded batch of rows (about a row group)
READ_BYTES = 4 << 20
#: the CPU the machine must leave unused (idle, or ours) for rows to be made during a run
SPARE_CPUS = 0.5


def _dump(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1).encode())


@dataclass
class _Segment:
    path: Path
    #: rows every table had before this segment's first record
    rows_before: dict[str, int]


@dataclass
class RingSpool:
    """One ring's spool: written at the tail by :meth:`take`, read at the head by
    :meth:`records`; both in whole ring records."""

    folder: Path
    key: str
    #: bytes of one ring record (a batch, for a batched ring) without its header
    itemsize: int
    info: dict[str, Any]
    #: rows made from this spool so far, per table
    rows: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stride = record_stride(self.itemsize)
        _dump(self.folder / f"{self.key}.json", {**self.info, "itemsize": self.itemsize})
        self._index = -1
        self._retired: list[tuple[_Segment, dict[str, int]]] = []
        self._open_segment()

    def _open_segment(self) -> None:
        self._index += 1
        seg = _Segment(self.folder / f"{self.key}.{self._index:05d}.ring", dict(self.rows))
        _dump(seg.path.with_suffix(".json"), {"rows_before": seg.rows_before})
        self._segment = seg
        self._fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.written = self.read = 0

    @property
    def pending(self) -> int:
        """Bytes written and not read back yet."""
        return self.written - self.read

    def take(self, reader: RingBuffer) -> int:
        """Copy what the ring holds to the spool; the bytes copied."""
        n = reader.copy_to(self._fd, self.itemsize)
        self.written += n
        return n

    def append(self, records: np.ndarray) -> None:
        """Add records that never were in the ring (what a CPU's batch still held at
        detach), in the ring's format so that one reader serves both."""
        if not len(records):
            return
        rows = np.zeros((len(records), self.stride), np.uint8)
        rows[:, :4] = np.frombuffer(np.uint32(self.itemsize).tobytes(), np.uint8)
        rows[:, HEADER_SIZE : HEADER_SIZE + self.itemsize] = records.view(np.uint8).reshape(
            len(records), -1
        )
        data = rows.tobytes()
        done = 0
        while done < len(data):
            done += os.write(self._fd, data[done:])
        self.written += len(data)

    def records(
        self,
        dtype: np.dtype,
        max_bytes: int = READ_BYTES,
        more: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """Decode the spool from its head, ``max_bytes`` at a time (whole records),
        while ``more()`` (if given) says rows may be made."""
        step = max(self.stride, max_bytes // self.stride * self.stride)
        while self.pending and (more is None or more()):
            n = min(self.pending, step)
            raw = os.pread(self._fd, n, self.read)
            if len(raw) != n:
                raise CollectionError(f"spool {self._segment.path} is shorter than written")
            buf = np.frombuffer(raw, np.uint8)
            self.read += n
            yield decode(buf, 1, 0, n, dtype).records

    def count(self, table: str, rows: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + rows

    def checkpoint(self, finished: dict[str, int]) -> None:
        """At a flush: make the spool durable; retire the segment when it was read to
        its end (its rows are in this flush), and delete retired segments whose rows
        ``finished`` (rows in finished parts, per table) now holds."""
        os.fsync(self._fd)
        if self.written and not self.pending:
            os.close(self._fd)
            self._retired.append((self._segment, dict(self.rows)))
            self._open_segment()
        keep = []
        for seg, rows in self._retired:
            if all(finished.get(t, 0) >= n for t, n in rows.items()):
                _remove(seg)
            else:
                keep.append((seg, rows))
        self._retired = keep

    def close(self) -> None:
        """Stop writing; the files stay until :meth:`remove` (or a recovery)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        """Delete this spool's files: every row is in finished parts."""
        self.close()
        for seg, _ in self._retired:
            _remove(seg)
        _remove(self._segment)
        (self.folder / f"{self.key}.json").unlink(missing_ok=True)
        self._retired = []


def _remove(seg: _Segment) -> None:
    seg.path.unlink(missing_ok=True)
    seg.path.with_suffix(".json").unlink(missing_ok=True)


class Pacer:
    """When a spooling hook may make rows during the run: the machine has CPU to spare
    and the sink is not behind (a write would wait for its writer, and the rings
    would not be copied meanwhile)."""

    def __init__(self, spare: SpareCpu, behind: Callable[[], bool]) -> None:
        self.spare = spare
        self.behind = behind

    def ask(self) -> bool:
        return not self.behind() and self.spare.ask()


class SpareCpu:
    """Whether the machine has CPU to spare for making rows: idle CPU time plus our
    own, over the last ``window_s``, from /proc/stat (cheap: read at most every
    ``window_s``). ``ask()`` answers from the last window."""

    def __init__(self, window_s: float = 0.1, need: float = SPARE_CPUS) -> None:
        self.window_s = window_s
        self.need = need
        self._last = self._sample()
        self._at = time.monotonic()
        self.spare = True

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        """(idle seconds of all CPUs, busy+idle seconds of all CPUs, our CPU seconds)."""
        try:
            with open("/proc/stat", "rb") as f:
                fields = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return (0.0, 0.0, 0.0)
        tick = os.sysconf("SC_CLK_TCK")
        idle = (fields[3] + fields[4]) / tick
        t = os.times()
        return idle, sum(fields) / tick, t.user + t.system

    def ask(self) -> bool:
        now = time.monotonic()
        if now - self._at >= self.window_s:
            idle, total, own = self._sample()
            d_total = total - self._last[1]
            if d_total > 0:
                spare_cpus = (idle - self._last[0] + own - self._last[2]) / (now - self._at)
                self.spare = spare_cpus >= self.need
            self._last, self._at = (idle, total, own), now
        return self.spare


def pending_spools(collection: Path) -> list[Path]:
    """The spool segments a collection still holds (after a kill)."""
    folder = collection / SPOOL_DIR
    return sorted(folder.glob("*.ring")) if folder.is_dir() else []


def recover(collection: Path, bpf_dir: Path | None = None) -> dict[str, int]:
    """Turn what a killed collector left in ``collection``'s spool into Parquet parts
    after the finished ones, then delete the spool; the rows added per table. Rows
    already in finished parts are not repeated: each segment says how many rows each
    table had before it, and the finished parts say how many they hold."""
    import pyarrow.parquet as pq

    from kernmlops.collect.manifest import TableRecord, read_manifest, write_manifest
    from kernmlops.collect.sinks import ParquetSink
    from kernmlops.ebpf.btf import unbatch
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks import get_hook

    folder = collection / SPOOL_DIR
    infos = [p for p in sorted(folder.glob("*.json")) if "." not in p.stem]
    if not infos:
        return {}
    manifest = read_manifest(collection)
    sink = ParquetSink(collection, manifest.collection_id)
    finished: dict[str, int] = {}
    for table_dir in collection.iterdir():
        parts = sorted(table_dir.glob("part-*.parquet")) if table_dir.is_dir() else []
        if parts:
            finished[table_dir.name] = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
            sink.resume(table_dir.name, len(parts))
    added: dict[str, int] = {}
    for info_path in infos:
        key = info_path.stem
        info = json.loads(info_path.read_text())
        cls = get_hook(info["hook"])
        hook = cls(cls.Options.model_validate(info["options"]))
        obj = Path(bpf_dir) / Path(info["object"]).name if bpf_dir else Path(info["object"])
        if not obj.exists():
            raise CollectionError(
                f"spool {key} needs {obj} to decode its records (build the BPF objects "
                "of the version that collected, or pass their folder)"
            )
        layout: RecordLayout = object_spec(obj).ring_layouts()[info["ring"]]
        dtype = layout.batch if layout.batch is not None else layout.dtype
        if dtype.itemsize != info["itemsize"]:
            raise CollectionError(f"{obj} does not describe spool {key}: rebuilt since?")
        stride = record_stride(dtype.itemsize)
        for seg in sorted(folder.glob(f"{key}.*.ring")):
            made = dict(json.loads(seg.with_suffix(".json").read_text())["rows_before"])
            raw = np.fromfile(seg, np.uint8)
            whole = len(raw) // stride * stride  # a kill may cut the last record
            records = decode(raw[:whole], 1, 0, whole, dtype).records
            if layout.batch is not None:
                records = unbatch(records)
            for table, rows in hook.rows_from(key, records, layout):
                n = rows.num_rows if hasattr(rows, "num_rows") else rows.height
                first = made.get(table, 0)
                made[table] = first + n
                skip = min(n, max(0, finished.get(table, 0) - first))
                if skip < n:
                    sink.write(table, rows.slice(skip))
                    added[table] = added.get(table, 0) + n - skip
    sink.close()
    # The manifest's tables say what is on disk now (its state stays: the run was cut).
    files = sink.files_written()
    for table, n in added.items():
        record = manifest.tables.get(table) or TableRecord()
        record.rows = finished.get(table, 0) + n
        record.files = sorted({*record.files, *files.get(table, [])})
        manifest.tables[table] = record
    write_manifest(collection, manifest)
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return added


def collector_alive(collection: Path) -> int | None:
    """The pid of the collector still writing ``collection``, if it runs."""
    from kernmlops.collect.manifest import read_manifest

    pid = read_manifest(collection).collector_pid
    if not pid:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"kernmlops" in cmdline else None
