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
#: bytes written after which the writer syncs the spool (besides at every flush)
SYNC_BYTES = 8 << 20
#: bytes the poll loop may hand the writer before it waits for the disk
MAX_QUEUED = 64 << 20


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
    :meth:`records`; both in whole ring records.

    The file is written by a thread of its own: under a storm that keeps every CPU
    busy, the journal's thread runs late and a ``write`` that needs it waits, up to
    seconds; the poll loop only copies the ring's bytes to memory and goes on (at
    most ``MAX_QUEUED`` of them wait for the writer)."""

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
        self._cond = threading.Condition()
        self._queue: list[bytes] = []
        self._queued = 0  # bytes in _queue
        self._error: OSError | None = None
        self._sync_asked = False
        self._syncs = 0  # fsyncs done by the writer
        self._old_fds: list[int] = []  # retired segments' fds, closed by the writer
        self._closing = False
        self._open_segment()
        self._writer = threading.Thread(target=self._write_loop, name=f"spool-{self.key}")
        self._writer.daemon = True
        self._writer.start()

    def _open_segment(self) -> None:
        self._index += 1
        seg = _Segment(self.folder / f"{self.key}.{self._index:05d}.ring", dict(self.rows))
        _dump(seg.path.with_suffix(".json"), {"rows_before": seg.rows_before})
        self._segment = seg
        self._fd = os.open(seg.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        #: bytes handed over / in the file / read back, in this segment
        self.written = self.on_disk = self.read = 0

    @property
    def pending(self) -> int:
        """Bytes handed over and not read back yet."""
        return self.written - self.read

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, chunks: list[bytes]) -> int:
        size = sum(len(c) for c in chunks)
        if not size:
            return 0
        with self._cond:
            self._raise()
            while self._queued and self._queued + size > MAX_QUEUED and self._error is None:
                self._cond.wait()  # the disk is that far behind: the loop waits too
            self._raise()
            self._queue.extend(chunks)
            self._queued += size
            self.written += size
            self._cond.notify_all()
        return size

    def _write_loop(self) -> None:
        unsynced = 0
        while True:
            with self._cond:
                while not self._queue and not self._closing and not self._sync_asked:
                    self._cond.wait()
                chunks, self._queue = self._queue, []
                sync, self._sync_asked = self._sync_asked, False
                fd = self._fd
                old, self._old_fds = self._old_fds, []
                if not chunks and not sync and self._closing:
                    for f in old:
                        os.close(f)
                    return
            for f in old:  # no write of ours uses them any more
                os.close(f)
            try:
                for chunk in chunks:
                    _write_all(fd, chunk)
                unsynced += sum(len(c) for c in chunks)
                if sync or unsynced >= SYNC_BYTES:
                    # Keep the page cache's share of the spool small: an fsync of
                    # any other file (the manifest) waits for the journal, and with
                    # it for every dirty page of the spool (ext4 data=ordered).
                    os.fsync(fd)
                    unsynced = 0
                    with self._cond:
                        self._syncs += 1
            except OSError as err:
                with self._cond:
                    self._error = err
                    self._queue, self._queued = [], 0
                    self._cond.notify_all()
                return
            with self._cond:
                size = sum(len(c) for c in chunks)
                self._queued -= size
                self.on_disk += size
                self._cond.notify_all()

    def take(self, reader: RingBuffer) -> int:
        """Copy what the ring holds to the spool; the bytes copied."""
        return self._put(reader.take_bytes(self.itemsize))

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
        self._put([rows.tobytes()])

    def drained(self) -> None:
        """Wait until the writer has everything handed over in the file."""
        with self._cond:
            while self._queued and self._error is None:
                self._cond.wait()
            self._raise()

    def records(
        self,
        dtype: np.dtype,
        max_bytes: int = READ_BYTES,
        more: Callable[[], bool] | None = None,
    ) -> Iterator[np.ndarray]:
        """Decode the spool from its head, ``max_bytes`` at a time (whole records),
        while ``more()`` (if given) says rows may be made; without ``more``, all of it
        (the writer is waited for)."""
        if more is None:
            self.drained()
        step = max(self.stride, max_bytes // self.stride * self.stride)
        while self.on_disk > self.read and (more is None or more()):
            n = min(self.on_disk - self.read, step)
            raw = os.pread(self._fd, n, self.read)
            if len(raw) != n:
                raise CollectionError(f"spool {self._segment.path} is shorter than written")
            buf = np.frombuffer(raw, np.uint8)
            self.read += n
            yield decode(buf, 1, 0, n, dtype).records

    def count(self, table: str, rows: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + rows

    def checkpoint(self, finished: dict[str, int]) -> None:
        """At a flush: have the writer sync the spool; retire the segment when it was
        read to its end (its rows are in this flush), and delete retired segments
        whose rows ``finished`` (rows in finished parts, per table) now holds."""
        with self._cond:
            self._raise()
            self._sync_asked = True
            if self.written and self.read == self.written and not self._queued:
                self._old_fds.append(self._fd)  # the writer may be syncing it now
                self._retired.append((self._segment, dict(self.rows)))
                self._open_segment()
            self._cond.notify_all()
        keep = []
        for seg, rows in self._retired:
            if all(finished.get(t, 0) >= n for t, n in rows.items()):
                _remove(seg)
            else:
                keep.append((seg, rows))
        self._retired = keep

    def wait_synced(self) -> None:
        """Wait until what was handed over is in the file and synced."""
        with self._cond:
            target = self._syncs + 1
            self._sync_asked = True
            self._cond.notify_all()
            while self._syncs < target and self._error is None and self._writer.is_alive():
                self._cond.wait(0.05)
            self._raise()

    def close(self) -> None:
        """Stop writing (what was handed over is written first); the files stay until
        :meth:`remove` (or a recovery)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._writer.join()
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _remove(seg: _Segment) -> None:
    seg.path.unlink(missing_ok=True)
    seg.path.with_suffix(".json").unlink(missing_ok=True)
