"""A ring's records on disk, as they lay in the ring (headers included), written at
the tail and read back at the head: the collector's spool (kernmlops.collect.spool
says when rows are made from it, and how a killed collection is recovered).

Files, in the spool folder: ``<key>.json`` (what decodes the records: the hook, its
options, the ring and the object whose BTF describes it), then segments
``<key>.<n>.ring`` each with ``<key>.<n>.json`` (the rows every table had before
the segment's first record). A segment read to its end is retired at a flush and
deleted once the flush finished the parts that hold its rows.
"""

from __future__ import annotations

import json
import os
import threading
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
else:
    np = lazy_import("numpy")

#: bytes of spool read back per step: a bounded batch of rows (about a row group)
READ_BYTES = 1 << 20


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
        self._syncing: threading.Thread | None = None
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
        self._sync()
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

    def _sync(self) -> None:
        """fsync the segment in a thread of its own: seconds of a storm's spool take a
        while to reach the disk, and the poll loop must go on copying the rings. One
        sync at a time; the next checkpoint syncs what came since."""
        if self._syncing is not None and self._syncing.is_alive():
            return
        fd = os.dup(self._fd)

        def run() -> None:
            try:
                os.fsync(fd)
            except OSError:
                pass  # a failing disk shows at the next write, as the collection's error
            finally:
                os.close(fd)

        self._syncing = threading.Thread(target=run, name=f"spool-sync-{self.key}", daemon=True)
        self._syncing.start()

    def wait_synced(self) -> None:
        if self._syncing is not None:
            self._syncing.join()

    def close(self) -> None:
        """Stop writing; the files stay until :meth:`remove` (or a recovery)."""
        self.wait_synced()
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
