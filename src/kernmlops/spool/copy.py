"""The ring copy: a ring's records copied, as they lay in the ring (headers
included), to segment files at the tail and read back at the head.

Rows are made from the spool while the machine has CPU to spare
(kernmlops.spool.pacing) and all of what is left at stop; a killed collection is
recovered from its files (kernmlops.spool.recovery, kernmlops.collect.recovery). A
segment read to its end is retired at a flush and deleted once the flush finished the
parts that hold its rows. Its first bytes go to memory on a tmpfs
(kernmlops.spool.memory), the rest to disk; the files' format is
kernmlops.spool.frames, one file's writes and reads kernmlops.spool.segment.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.ebpf.copier import CopiedRing, Copier
from kernmlops.ebpf.ringbuf import HEADER_SIZE, RingBuffer, RingGroup, decode, record_stride
from kernmlops.lazy import lazy_import
from kernmlops.spool.frames import CODEC, FRAME_RAW, RAW_FRAME, read_codec, write_codec
from kernmlops.spool.jobs import SpoolPiece, frame_spans, pieces
from kernmlops.spool.memory import SpoolMemory
from kernmlops.spool.native import CopierSide
from kernmlops.spool.segment import (
    Segment,
    frames_of,
    write_frame,
    write_json,
    write_raw_frame,
)

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")

#: bytes written after which the writer syncs the spool (besides at every flush)
SYNC_BYTES = 8 << 20
#: bytes the poll loop may hand the writer before it waits for the disk
MAX_QUEUED = 64 << 20
#: bytes queued for the disk past which the disk is behind: the next bytes go to a
#: segment in memory, if the budget's share for this (SpoolMemory.for_stalls) allows,
#: and on to disk again once the queue is under half of this
STALL_QUEUED = 8 << 20
#: bytes the writer takes from the queue at a time (what it holds besides the queue)
WRITE_BATCH = 8 << 20
#: the writer is woken once this much is handed over, or once the first of it has
#: waited WAKE_S (or at a checkpoint, a drain, the close): waking it at every copy
#: (60 a second under a storm) cost the poll loop more than the copies
WAKE_BYTES = 4 << 20
WAKE_S = 0.25


@dataclass
class RingSpool(CopierSide):
    """One ring's spool: written at the tail by :meth:`take`, read at the head by
    :meth:`records`; both in whole ring records. Segments follow each other: a new one
    starts at a flush once the last is read to its end, or when the memory budget
    (``memory``) is spent and the spool goes on on disk.

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
    #: records made into rows so far (unbatched: the hook's events from this spool)
    records_made: int = 0
    #: where the first bytes go (None: all on disk, in ``folder``)
    memory: SpoolMemory | None = None
    #: the stride compressed frames are byte-shuffled at (one record of a batched
    #: ring), 0: not shuffled (kernmlops.spool.frames.shuffle)
    shuffle: int = 0

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stride = record_stride(self.itemsize)
        self._frame_raw = max(self.stride, FRAME_RAW // self.stride * self.stride)
        write_json(self.folder / f"{self.key}.json", {**self.info, "itemsize": self.itemsize})
        self._index = -1
        #: segments not retired yet, head (being read) to tail (being written)
        self._live: list[Segment] = []
        self._retired: list[tuple[Segment, dict[str, int]]] = []
        self._cond = threading.Condition()
        self._queue: list[tuple[Segment, bytes]] = []
        self._queued = 0  # bytes in _queue
        self._queued_at = 0.0  # when the first of them was handed over
        self._wake = False  # someone waits for the queue to be written (drained)
        self._error: OSError | None = None
        self._sync_asked = False
        self._syncs = 0  # fsyncs done by the writer
        self._old_fds: list[int] = []  # retired segments' fds, closed by the writer
        self._unlink: list[Segment] = []  # segments the writer deletes
        self._deleting = 0  # of them, not deleted yet
        self._closing = False
        #: the native copier and its ring, while it moves this ring (attach)
        self._copier: Copier | None = None
        self._ring: CopiedRing | None = None
        self._shared: list[tuple[Copier, CopiedRing]] = []
        #: the disk segment the copier goes on in once the memory budget is spent
        self._standby: Segment | None = None
        self._untrimmed: list[Segment] = []
        self._open_segment()
        self._writer = threading.Thread(target=self._write_loop, name=f"spool-{self.key}")
        self._writer.daemon = True
        self._writer.start()

    def _open_segment(self, disk: bool = False, stall: bool = False) -> Segment:
        in_memory = self.memory is not None and not disk and self.memory.available(stall)
        seg = self._new_segment(in_memory, codec=None if in_memory else write_codec())
        seg.stall = in_memory and stall
        self._live.append(seg)
        return seg

    def _new_segment(
        self, in_memory: bool, codec: Any = None, zstd_native: bool = False
    ) -> Segment:
        """Open the next segment file and write its json. Its rows_before is exact only
        when every segment before it is read to its end (else the reading sets it)."""
        self._index += 1
        folder = self.memory.folder if in_memory and self.memory else self.folder
        exact = all(seg.read == seg.written for seg in self._live)
        path = folder / f"{self.key}.{self._index:05d}.ring"
        seg = Segment(path, dict(self.rows), self.records_made)
        seg.rows_exact = exact
        seg.in_memory = in_memory
        seg.codec = codec
        seg.zstd_native = zstd_native
        seg.open()
        return seg

    def _note_sizes(self) -> None:
        """(At a flush) each live segment's json learns the file's size now."""
        for seg in self._live:
            try:
                size = os.fstat(seg.fd).st_size
            except OSError:
                continue
            if size != seg.meta_bytes:
                seg.meta_bytes = size
                seg.write_meta(durable=False)

    @property
    def _tail(self) -> Segment:
        return self._live[-1]

    @property
    def pending(self) -> int:
        """Bytes handed over and not read back yet."""
        with self._cond:
            self._sync()
        return sum(seg.written - seg.read for seg in self._live)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, chunks: list[bytes]) -> int:
        size = sum(len(c) for c in chunks)
        if not size:
            return 0
        with self._cond:
            self._raise()
            tail = self._tail
            memory = self.memory
            if tail.stall and self._queued <= STALL_QUEUED // 2:
                self._open_segment(disk=True)  # the disk caught up
                tail = self._tail
            elif (
                not tail.in_memory
                and self._queued + size > STALL_QUEUED
                and memory is not None
                and memory.available(stall=True)
            ):
                self._open_segment(stall=True)  # the disk is behind: bridge it in memory
                tail = self._tail
            pieces = list(frames_of(chunks, self._frame_raw)) if tail.in_memory else []
            need = size + RAW_FRAME.size * len(pieces)
            if tail.in_memory and memory is not None and memory.reserve(need, tail.stall):
                # Written here: a tmpfs write costs a copy and never waits for a disk,
                # and what waits for the writer would be in the collector's heap.
                for raw in pieces:
                    write_raw_frame(tail.fd, raw)
                tail.written += size
                tail.on_disk += size
                tail.file_bytes += need
                return size
            if tail.in_memory:
                self._open_segment(disk=True)  # the budget is spent: on to disk
                tail = self._tail
            while self._queued and self._queued + size > MAX_QUEUED and self._error is None:
                self._cond.wait()  # the disk is that far behind: the loop waits too
            self._raise()
            if not self._queue:
                self._queued_at = time.monotonic()
            self._queue.extend((tail, c) for c in chunks)
            self._queued += size
            tail.written += size
            if self._queued >= WAKE_BYTES:
                self._cond.notify_all()
        return size

    def _idle(self) -> bool:
        """(Writer, with the lock held) whether nothing is due yet: what is queued is
        small and fresh, and nobody asked for a sync, a drain, a deletion or the end."""
        return not (
            self._closing or self._sync_asked or self._unlink or self._wake
            or self._queued >= WAKE_BYTES
            or (self._queue and time.monotonic() - self._queued_at >= WAKE_S)
        )  # fmt: skip

    def _write_loop(self) -> None:
        unsynced = 0
        while True:
            with self._cond:
                while self._idle():
                    self._cond.wait(WAKE_S if self._queue else None)
                # At most WRITE_BATCH at a time: what the writer holds is in no queue
                # the loop sees, and a disk that stalls must not hold 2 x MAX_QUEUED.
                cut = taken = 0
                while cut < len(self._queue) and taken < WRITE_BATCH:
                    taken += len(self._queue[cut][1])
                    cut += 1
                chunks, self._queue = self._queue[:cut], self._queue[cut:]
                if self._queue:
                    self._queued_at = time.monotonic()
                self._wake = False
                sync, self._sync_asked = self._sync_asked, False
                live = [seg.fd for seg in self._live if not seg.in_memory]
                old, self._old_fds = self._old_fds, []
                unlink, self._unlink = self._unlink, []
                if not chunks and not sync and self._closing:
                    for f in old:
                        os.close(f)
                    for seg in unlink:
                        seg.remove()
                    return
            for seg in unlink:
                seg.remove()
            if unlink:
                with self._cond:
                    self._deleting -= len(unlink)
                    self._cond.notify_all()
            try:
                for seg, run in _runs(chunks):
                    # raw frames before pyarrow is loaded (seg.codec None), then zstd's
                    for raw in frames_of(run, self._frame_raw):
                        unsynced += write_frame(seg.fd, raw, seg.codec, self.shuffle)
                if sync or unsynced >= SYNC_BYTES:
                    # Keep the page cache's share of the spool small: an fsync of
                    # any other file (the manifest) waits for the journal, and with
                    # it for every dirty page of the spool (ext4 data=ordered).
                    # Segments in memory need none: a tmpfs has nothing to sync.
                    for fd in live:
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
            finally:
                for f in old:  # no write of ours uses them any more
                    os.close(f)
            with self._cond:
                for seg, chunk in chunks:
                    seg.on_disk += len(chunk)
                self._queued -= sum(len(c) for _, c in chunks)
                self._cond.notify_all()

    def take(self, reader: RingBuffer | RingGroup) -> int:
        """Copy what the ring (or each ring of a group) holds to the spool; the bytes
        copied (none while the native copier moves it: then only what it did is
        looked at)."""
        if self._ring is not None:
            with self._cond:
                self._sync()
            return 0
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
        """Wait until the writer has everything handed over in the file (and the
        segments it was to delete deleted)."""
        with self._cond:
            while (self._queued or self._deleting) and self._error is None:
                self._wake = True
                self._cond.notify_all()
                self._cond.wait()
            self._raise()

    def records(
        self, dtype: np.dtype, *, more: Callable[[], bool] | None = None
    ) -> Iterator[np.ndarray]:
        """Decode the spool from its head, a frame (at most FRAME_RAW of records) at a
        time, while ``more()`` (if given) says rows may be made; without ``more``, all
        of it (the writer is waited for). A frame that fails its checksum raises
        CollectionError: its records are never made, and the spool stays for
        ``kernmlops recover``, which reads every other frame."""
        if more is None:
            self.drained()
        with self._cond:
            self._sync()
        for seg in list(self._live):
            if not seg.rows_exact:
                # every segment before it is read, and its rows counted
                seg.rows_before, seg.records_before = dict(self.rows), self.records_made
                seg.rows_exact = True
                seg.write_meta()
            codec = seg.codec if seg.codec is not None else read_codec() if seg.framed else None
            while seg.on_disk > seg.read and (more is None or more()):
                raw = seg.read_frame(codec, self.stride)
                yield decode(np.frombuffer(raw, np.uint8), 1, 0, len(raw), dtype).records
            if seg.read < seg.written or (seg.native is not None and not seg.native_done):
                return  # the rest of this segment is still with the writer (or copier)

    def unread(self) -> list[SpoolPiece]:
        """(Once the copier left it, and nothing more is handed over) the frames not
        read back yet, in order, for rows made elsewhere, which then call
        :meth:`read_to_end`; [] where a frame header cannot be read (the rows are
        then made here, which names the damage)."""
        self.drained()
        with self._cond:
            self._sync()
            if any(s.native is not None and not s.native_done for s in self._live):
                return []
            self._learn_rows()  # a recovery after a kill must know where the head was
            live = list(self._live)
        out: list[SpoolPiece] = []
        for seg in live:
            spans = frame_spans(seg.fd, seg.file_read, os.fstat(seg.fd).st_size, seg.framed)
            if spans is None:
                return []
            out += pieces(seg.path, spans, CODEC if seg.framed else None)
        return out

    def read_to_end(self, rows: dict[str, int], records: int = 0) -> None:
        """Every record :meth:`unread` gave (``records`` of them) has its ``rows``
        (per table) in finished parts: the spool is read to its end."""
        with self._cond:
            for seg in self._live:
                seg.read = seg.written
                seg.file_read = os.fstat(seg.fd).st_size
        for table, n in rows.items():
            self.count(table, n)
        self.records_made += records

    def _learn_rows(self) -> None:
        """(At a checkpoint, before segments are deleted) the first segment not read
        yet learns its rows_before: a recovery must never meet one that does not know
        them after the segment before it is gone."""
        for seg in self._live:
            finished = seg.read == seg.written and (seg.native is None or seg.native_done)
            if finished:
                continue
            if not seg.rows_exact and seg.read == 0:
                seg.rows_before, seg.records_before = dict(self.rows), self.records_made
                seg.rows_exact = True
                seg.write_meta()
            return

    def count(self, table: str, rows: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + rows

    def count_records(self, records: int) -> None:
        """``records`` more were made into rows (as :meth:`count` counts their rows)."""
        self.records_made += records

    def checkpoint(self, finished: dict[str, int]) -> None:
        """At a flush: have the writer sync the spool; retire the segments read to their
        end (their rows are in this flush; a new one starts if the tail was), and
        delete retired segments whose rows ``finished`` (rows in finished parts, per
        table) now holds."""
        with self._cond:
            self._raise()
            self._sync_asked = True
            if self._ring is not None:
                self._sync()
                tail = self._tail
                if tail.written and tail.read == tail.written:
                    self._rotate()
            # read to its end (an empty one too, unless it is the tail: a segment the
            # budget left before its first byte), and left by the copier
            done = [
                s for s in self._live
                if s.read == s.written and (s.written or s is not self._tail)
                and (s.native is None or s.native_done)
            ]  # fmt: skip
            if done and done[-1] is self._tail and not self._queued and self._ring is None:
                self._open_segment()
            self._learn_rows()
            self._note_sizes()
            for seg in done:
                if seg is not self._tail:
                    self._live.remove(seg)
                    self._old_fds.append(seg.fd)  # the writer may be syncing it now
                    self._retired.append((seg, dict(self.rows)))
                    if seg.native is not None and self._copier is not None:
                        self._copier.forget(seg.native)
                        seg.native = None
            self._cond.notify_all()
        keep = []
        for seg, rows in self._retired:
            if all(finished.get(t, 0) >= n for t, n in rows.items()):
                self._delete(seg)
            else:
                keep.append((seg, rows))
        self._retired = keep

    def _delete(self, seg: Segment) -> None:
        """Have the writer delete a segment: with the discard mount option an unlink
        of a large file waits for the disk, and the poll loop must not."""
        if seg.in_memory and self.memory is not None:
            self.memory.release(seg.file_bytes)
        with self._cond:
            if self._writer.is_alive() and not self._closing:
                self._unlink.append(seg)
                self._deleting += 1
                self._cond.notify_all()
                return
        seg.remove()

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
            copiers = [self._copier, *(c for c, _ in self._shared)]
            if self._ring is not None and any(c is not None and c.running for c in copiers):
                raise RuntimeError("stop the copier before closing its spool")
            self.detach()
            self._closing = True
            self._cond.notify_all()
        self._writer.join()
        for seg in self._live:
            if seg.fd >= 0:
                os.close(seg.fd)
                seg.fd = -1

    def remove(self) -> None:
        """Delete this spool's files: every row is in finished parts."""
        self.close()
        for seg, _ in self._retired:
            self._delete(seg)
        for seg in self._live:
            self._delete(seg)
        (self.folder / f"{self.key}.json").unlink(missing_ok=True)
        self._retired = []
        self._live = []


def _runs(chunks: list[tuple[Segment, bytes]]) -> Iterator[tuple[Segment, list[bytes]]]:
    """The chunks grouped in runs of one segment (a compressed segment gets frames of
    about FRAME_RAW, not one per ring copy)."""
    for _, run in groupby(chunks, key=lambda c: id(c[0])):
        pieces = list(run)
        yield pieces[0][0], [chunk for _, chunk in pieces]
