"""A ring's records on disk, as they lay in the ring (headers included), written at
the tail and read back at the head: the collector's spool (kernmlops.collect.spool
says when rows are made from it, and how a killed collection is recovered).

Files, in the spool folder: ``<key>.json`` (what decodes the records: the hook, its
options, the ring and the object whose BTF describes it), then segments
``<key>.<n>.ring`` each with ``<key>.<n>.json`` (the rows every table had before
the segment's first record). A segment read to its end is retired at a flush and
deleted once the flush finished the parts that hold its rows.

Every segment is a run of frames of whole records, each with a checksum, so that a
flipped byte costs its frame and is named, never read as a wrong value; a kill may
cut the last frame, which a reader leaves.

Segments on disk are zstd-compressed once pyarrow (its codec) is loaded: under a
switch storm this VM's disk takes 14.6 MiB/s and the spool grows by 30 MB/s, while
these records compress 6.6 times at 480 MB/s. Such a segment (``"codec": "zstd"`` in
its json) has frames of ``<compressed bytes u32><raw bytes u32>`` and a zstd frame
that carries zstd's checksum of its content. Segments on the tmpfs stay raw (no disk
to spare, and no CPU spent on compression): frames of ``<magic u32><raw bytes
u32><CRC32C of the records u32><CRC32C of those 12 bytes u32>`` (:data:`RAW_FRAME`)
and the records as they lay in the ring. The native copier computes the CRC with
the CPU's crc32 instruction, three lanes at a time: about a tenth more CPU per
record than the write alone (``python -m bench capacity``). A segment's json says
``"version": 2``; raw segments of an older collection (no version) are records back
to back, and are still read.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kernmlops.ebpf.copier import (
    ACTIVE,
    DONE,
    STANDBY,
    Budget,
    ChecksummedZstd,
    CopiedRing,
    Copier,
)
from kernmlops.ebpf.copier import available as copier_available
from kernmlops.ebpf.crc32c import crc32c
from kernmlops.ebpf.ringbuf import HEADER_SIZE, RingBuffer, decode, record_stride, write_all
from kernmlops.errors import CollectionError
from kernmlops.fileio import write_atomic
from kernmlops.lazy import imported, lazy_import

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


#: a compressed segment's frame header: compressed bytes, raw bytes (little-endian)
FRAME = struct.Struct("<II")
#: raw bytes per frame at most (whole records): one frame is one step of reading back
FRAME_RAW = READ_BYTES
CODEC = "zstd"
#: a raw segment's frame header: its magic, the records' bytes, their CRC32C, and the
#: CRC32C of these 12 bytes (a damaged length is never trusted); then the records
RAW_FRAME = struct.Struct("<IIII")
#: "KMO\x8d": its top bit never starts a zstd frame's header (a size under 2 GiB)
RAW_MAGIC = 0x8D4F4D4B
RAW_MAGIC_BYTES = RAW_MAGIC.to_bytes(4, "little")
#: the segment format a json's "version" names: 2, raw segments in CRC frames; 1 (no
#: version: a collection of before), raw segments of records back to back
VERSION = 2


def _codec() -> Any:
    """zstd (level 1: the fastest, 6.6× on these records) once pyarrow is loaded, else
    None (a segment opened before the decoding libraries came in stays raw)."""
    if not imported("pyarrow"):
        return None
    framed = ChecksummedZstd.make()
    if framed is not None:
        return framed
    import pyarrow as pa

    return pa.Codec(CODEC, compression_level=1)  # no checksum: a libzstd that cannot


def _read_codec() -> Any:
    """The codec that reads zstd frames back (pyarrow's, imported here if need be)."""
    import pyarrow as pa

    return pa.Codec(CODEC)


#: the first bytes of a zstd frame (after our frame header)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: iter_frames' reason for a frame that runs past the end with nothing after it: the
#: one a kill cuts
CUT = "a frame cut short"


class Frame(NamedTuple):
    """One frame of a segment as a reader met it: its bytes in the file (``start`` to
    ``end``), its records (``raw``) if intact, else why not (``reason``)."""

    start: int
    end: int
    raw: bytes | None
    reason: str | None
    #: a damaged frame's record bytes, where its header is intact (and says so)
    raw_bytes: int | None = None


def frames(data: bytes | memoryview, codec: Any) -> Iterator[bytes]:
    """The raw bytes of each whole frame in ``data`` (a compressed segment's bytes, or
    a piece starting at a frame) up to the first that cannot be read."""
    for frame in iter_frames(data, codec):
        if frame.reason is not None:
            return
        yield frame.raw  # type: ignore[misc]


def iter_frames(data: bytes | memoryview, codec: Any) -> Iterator[Frame]:
    """Every frame of a compressed segment: intact ones with their raw bytes, and each
    stretch that cannot be read with its reason (a damaged header, a frame failing
    zstd's checksum, cut short). After damage, reading goes on at the next intact
    frame, so one bad byte loses one frame, not the rest."""
    view, at, n = memoryview(data), 0, len(data)
    while at < n:
        end, raw, reason = n, None, None
        if at + FRAME.size > n:
            reason = CUT
        else:
            size, raw_size = FRAME.unpack_from(view, at)
            end = at + FRAME.size + size
            if end > n:
                reason, end = CUT, n
            elif bytes(view[at + FRAME.size : at + FRAME.size + 4]) != ZSTD_MAGIC:
                reason, end = "a damaged frame header", n
            else:
                try:
                    raw = codec.decompress(view[at + FRAME.size : end],
                                           decompressed_size=raw_size, asbytes=True)  # fmt: skip
                except Exception as err:  # the codec raises its own error types
                    reason = f"a frame that fails zstd's check ({err})"
                else:
                    if len(raw) != raw_size:
                        reason = "a frame whose size is not what its header says"
        if reason is None:
            yield Frame(at, end, raw, None)
            at = end
            continue
        nxt = _next_frame(view, at + 1, end if reason not in (CUT,) and end < n else None)
        if reason == CUT and nxt is not None:
            reason = "a damaged frame header"  # frames follow: not the end a kill makes
        stop = nxt if nxt is not None else n
        yield Frame(at, stop, None, reason)
        if nxt is None:
            return
        at = nxt


def _next_frame(view: memoryview, start: int, hint: int | None) -> int | None:
    """Where the next plausible frame header starts at or after ``start`` (the end the
    damaged frame's header claims first, when it is plausible)."""
    data = view.obj if isinstance(view.obj, bytes) else bytes(view)
    n = len(data)

    def plausible(p: int) -> bool:
        if p < start or p + FRAME.size + 4 > n:
            return False
        size, _ = FRAME.unpack_from(data, p)
        return data[p + FRAME.size : p + FRAME.size + 4] == ZSTD_MAGIC and p + 8 + size <= n

    if hint is not None and plausible(hint):
        return hint
    i = data.find(ZSTD_MAGIC, start + FRAME.size)
    while i != -1:
        if plausible(i - FRAME.size):
            return i - FRAME.size
        i = data.find(ZSTD_MAGIC, i + 1)
    return None


def raw_head(records: bytes | memoryview) -> bytes:
    """The header of a raw frame of ``records`` (what the native copier writes too)."""
    head = struct.pack("<III", RAW_MAGIC, len(records), crc32c(records))
    return head + crc32c(head).to_bytes(4, "little")


def _raw_header(data: bytes, at: int) -> tuple[int, int] | None:
    """(record bytes, their CRC32C) of an intact raw frame header at ``at``, else None."""
    if at + RAW_FRAME.size > len(data):
        return None
    magic, size, crc, head_crc = RAW_FRAME.unpack_from(data, at)
    if magic != RAW_MAGIC or crc32c(memoryview(data)[at : at + 12]) != head_crc:
        return None
    return size, crc


def iter_raw_frames(data: bytes) -> Iterator[Frame]:
    """Every frame of a raw segment (version 2), as :func:`iter_frames` gives a
    compressed one's: a frame failing its CRC32C costs its own bytes (its header says
    where the next begins); after a damaged header, reading goes on at the next
    intact header (its magic and its own CRC)."""
    at, n = 0, len(data)
    while at < n:
        head = _raw_header(data, at)
        if head is not None:
            size, crc = head
            end = at + RAW_FRAME.size + size
            if end > n:
                # Only a kill's cut: a damaged length fails the header's CRC.
                yield Frame(at, n, None, CUT, size)
                return
            raw = data[at + RAW_FRAME.size : end]
            if crc32c(raw) == crc:
                yield Frame(at, end, raw, None)
            else:
                yield Frame(at, end, None, "a frame that fails its CRC32C", size)
            at = end
            continue
        nxt = data.find(RAW_MAGIC_BYTES, at + 1)
        while nxt != -1 and _raw_header(data, nxt) is None:
            nxt = data.find(RAW_MAGIC_BYTES, nxt + 1)
        if nxt == -1 and n - at < RAW_FRAME.size:
            yield Frame(at, n, None, CUT)  # a header the kill cut
            return
        yield Frame(at, n if nxt == -1 else nxt, None, "a damaged frame header")
        if nxt == -1:
            return
        at = nxt


@dataclass(frozen=True)
class SegmentFormat:
    """How a segment file is written, from its json."""

    #: the zstd codec of a compressed segment, None for a raw one
    codec: Any
    version: int = VERSION

    @property
    def framed(self) -> bool:
        """In frames (compressed, or raw of version 2): else records back to back."""
        return self.codec is not None or self.version >= 2


def segment_format(segment: Path) -> SegmentFormat:
    """A segment file's format (from its json)."""
    meta = json.loads(segment.with_suffix(".json").read_text())
    version = meta.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        raise ValueError(f"a segment format this version cannot read ({version!r})")
    if meta.get("codec") in (None, ""):
        return SegmentFormat(None, version)
    import pyarrow as pa

    return SegmentFormat(pa.Codec(meta["codec"]), version)


def segment_codec(segment: Path) -> Any:
    """The codec a segment file was written with (from its json), or None: raw."""
    return segment_format(segment).codec


def iter_segment(data: bytes, fmt: SegmentFormat) -> Iterator[Frame]:
    """Every frame of a segment's bytes (an old raw segment's records are one)."""
    if fmt.codec is not None:
        yield from iter_frames(data, fmt.codec)
    elif fmt.framed:
        yield from iter_raw_frames(data)
    elif data:
        yield Frame(0, len(data), data, None)


def _dump(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=1).encode())


@dataclass
class SpoolMemory:
    """Memory that outlives the collector, for the spools' first bytes: a folder on a
    tmpfs (``/dev/shm``) and a budget of bytes shared by every ring of a collection.
    Segments there cost no disk write (on this VM a storm's 17 MB/s of spool slowed
    the workload by 5 points through writeback alone) and survive a kill -9 or an OOM
    kill of the collector, not a reboot; past the budget, segments go to disk."""

    folder: Path
    limit: int
    #: of ``limit``, what only bridges a disk that is behind (RingSpool.STALL_QUEUED):
    #: otherwise a storm spends the whole budget in its first seconds, and a disk that
    #: stalls later holds the queue in the collector's heap
    for_stalls: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._used = 0
        #: the counter the native copiers share (kernmlops.ebpf.copier), where they run
        self.budget: Budget | None = Budget(self.limit) if copier_available() else None

    @property
    def used(self) -> int:
        return self.budget.used if self.budget is not None else self._used

    def _cap(self, stall: bool) -> int:
        return self.limit - (0 if stall else self.for_stalls)

    def available(self, stall: bool = False) -> bool:
        return self.used < self._cap(stall)

    def reserve(self, size: int, stall: bool = False) -> bool:
        if self.budget is not None:
            return self.budget.reserve(size, self._cap(stall))
        with self._lock:
            if self._used + size > self._cap(stall):
                return False
            self._used += size
            return True

    def release(self, size: int) -> None:
        if self.budget is not None:
            self.budget.release(size)
            return
        with self._lock:
            self._used = max(0, self._used - size)


@dataclass
class _Segment:
    path: Path
    #: rows every table had before this segment's first record
    rows_before: dict[str, int]
    fd: int = -1
    #: bytes handed over / in the file / read back (raw: before compression)
    written: int = 0
    on_disk: int = 0
    read: int = 0
    #: bytes of a segment in memory, frame headers included: its share of the budget
    file_bytes: int = 0
    #: the file's size at the last flush, in its json: recover names a file found
    #: shorter than that (cut) as a loss
    meta_bytes: int = 0
    #: in SpoolMemory's folder (its bytes count against the budget); written by the
    #: poll loop itself (a tmpfs write never waits for a disk), not by the writer
    in_memory: bool = False
    #: opened because the disk was behind (from the budget's share for stalls)
    stall: bool = False
    #: compressed in frames (pyarrow's Codec), or None: raw
    codec: Any = None
    #: the file offset of the next frame to read back
    file_read: int = 0
    #: whether rows_before is known: a segment opened while the one before it is not
    #: read to its end gets it once the reading reaches it (its json is rewritten)
    rows_exact: bool = True
    #: the copier's struct while the native copier writes it (kernmlops.ebpf.copier)
    native: Any = None
    #: the copier left it (its ``written`` is final)
    native_done: bool = False
    #: written in zstd frames by the copier (read back with pyarrow's codec)
    zstd_native: bool = False

    @property
    def framed(self) -> bool:
        return self.codec is not None or self.zstd_native


@dataclass
class RingSpool:
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
    #: where the first bytes go (None: all on disk, in ``folder``)
    memory: SpoolMemory | None = None

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stride = record_stride(self.itemsize)
        self._frame_raw = max(self.stride, FRAME_RAW // self.stride * self.stride)
        _dump(self.folder / f"{self.key}.json", {**self.info, "itemsize": self.itemsize})
        self._index = -1
        #: segments not retired yet, head (being read) to tail (being written)
        self._live: list[_Segment] = []
        self._retired: list[tuple[_Segment, dict[str, int]]] = []
        self._cond = threading.Condition()
        self._queue: list[tuple[_Segment, bytes]] = []
        self._queued = 0  # bytes in _queue
        self._queued_at = 0.0  # when the first of them was handed over
        self._wake = False  # someone waits for the queue to be written (drained)
        self._error: OSError | None = None
        self._sync_asked = False
        self._syncs = 0  # fsyncs done by the writer
        self._old_fds: list[int] = []  # retired segments' fds, closed by the writer
        self._unlink: list[_Segment] = []  # segments the writer deletes
        self._deleting = 0  # of them, not deleted yet
        self._closing = False
        #: the native copier and its ring, while it moves this ring (attach)
        self._copier: Copier | None = None
        self._ring: CopiedRing | None = None
        #: the disk segment the copier goes on in once the memory budget is spent
        self._standby: _Segment | None = None
        self._open_segment()
        self._writer = threading.Thread(target=self._write_loop, name=f"spool-{self.key}")
        self._writer.daemon = True
        self._writer.start()

    def _open_segment(self, disk: bool = False, stall: bool = False) -> _Segment:
        in_memory = self.memory is not None and not disk and self.memory.available(stall)
        seg = self._new_segment(in_memory, codec=None if in_memory else _codec())
        seg.stall = in_memory and stall
        self._live.append(seg)
        return seg

    def _new_segment(
        self, in_memory: bool, codec: Any = None, zstd_native: bool = False
    ) -> _Segment:
        """Open the next segment file and write its json. Its rows_before is exact only
        when every segment before it is read to its end (else the reading sets it)."""
        self._index += 1
        folder = self.memory.folder if in_memory and self.memory else self.folder
        exact = all(seg.read == seg.written for seg in self._live)
        seg = _Segment(folder / f"{self.key}.{self._index:05d}.ring", dict(self.rows))
        seg.rows_exact = exact
        seg.in_memory = in_memory
        seg.codec = codec
        seg.zstd_native = zstd_native
        self._write_meta(seg)
        # a new file of our own, never one planted there, nor one a link points at
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
        seg.fd = os.open(seg.path, flags, 0o600)
        return seg

    @staticmethod
    def _write_meta(seg: _Segment, durable: bool = True) -> None:
        meta: dict[str, Any] = {
            "version": VERSION,
            "rows_before": seg.rows_before if seg.rows_exact else None,
        }
        if seg.framed:
            meta["codec"] = CODEC
        if seg.meta_bytes:
            meta["bytes"] = seg.meta_bytes
        path = seg.path.with_suffix(".json")
        if durable:
            _dump(path, meta)
            return
        # At a flush: no fsync (it would wait for the spool's dirty pages); a machine
        # that crashes keeps the json before, a lower bound all the same.
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, path)

    def _note_sizes(self) -> None:
        """(At a flush) each live segment's json learns the file's size now."""
        for seg in self._live:
            try:
                size = os.fstat(seg.fd).st_size
            except OSError:
                continue
            if size != seg.meta_bytes:
                seg.meta_bytes = size
                self._write_meta(seg, durable=False)

    @property
    def _tail(self) -> _Segment:
        return self._live[-1]

    @property
    def pending(self) -> int:
        """Bytes handed over and not read back yet."""
        with self._cond:
            self._sync()
        return sum(seg.written - seg.read for seg in self._live)

    # The native copier (kernmlops.ebpf.copier) ------------------------------------

    def attach(self, copier: Copier, ring: CopiedRing) -> None:
        """From now on ``copier`` moves ``ring`` into this spool and :meth:`take` only
        looks at what it did: the empty tail becomes its active segment (zstd frames
        on disk, where it is not in memory), and a disk segment waits as its standby
        for when the memory budget is spent."""
        with self._cond:
            tail = self._tail
            if tail.written or self._queued:
                raise RuntimeError("the copier takes over an empty spool")
            if not tail.in_memory and copier.compresses:
                tail.zstd_native, tail.codec = True, None
                self._write_meta(tail)
            tail.native = copier.segment(tail.fd, zstd=tail.zstd_native, memory=tail.in_memory)
            self._copier, self._ring = copier, ring
            copier.rotate(ring, tail.native)
            self._arm_standby()

    def _arm_standby(self) -> None:
        copier, ring = self._copier, self._ring
        assert copier is not None and ring is not None
        seg = self._new_segment(False, zstd_native=copier.compresses)
        if seg.rows_exact:  # the tail goes on taking records until the copier switches
            seg.rows_exact = False
            self._write_meta(seg)
        seg.native = copier.segment(seg.fd, zstd=seg.zstd_native, memory=False)
        self._standby = seg
        copier.set_standby(ring, seg.native)

    def _drop_standby(self) -> None:
        """Take the standby back from the copier; delete it unless it was taken up."""
        if self._copier is None or self._ring is None:
            return
        self._copier.set_standby(self._ring, None)  # from here the copier cannot take it
        seg, self._standby = self._standby, None
        if seg is None:
            return
        if seg.native.state != STANDBY:
            self._taken_up(seg)  # just before: it is the copier's tail now
            return
        os.close(seg.fd)
        _remove(seg)
        self._copier.forget(seg.native)

    def _taken_up(self, seg: _Segment) -> None:
        """The copier went on in the standby ``seg``: it is live from now on."""
        seg.native_done = seg.native.state == DONE  # before written
        seg.written = seg.on_disk = int(seg.native.written)
        seg.file_bytes = int(seg.native.file_bytes)
        self._live.append(seg)

    def _sync(self, check: bool = True) -> None:
        """Bring the segments' counts up to what the copier wrote; a segment it went
        on in becomes live (and a new standby is armed); its write error is raised
        (``check``: a detach after the error was reported does not raise it again)."""
        ring, copier = self._ring, self._copier
        if ring is None or copier is None:
            return
        if check and copier.result is not None and copier.result < 0:
            err = -copier.result  # its loop ended on an error (epoll): nothing copies now
            raise OSError(err, f"the ring copier stopped: {os.strerror(err)}")
        if ring.error and check:
            # the segment the copier was writing: its filesystem is the one that failed
            writing = next((s for s in self._live if s.native is not None and not s.native_done
                            and s.native.state == ACTIVE), self._tail)  # fmt: skip
            raise OSError(ring.error, os.strerror(ring.error), str(writing.path))
        for seg in self._live:
            if seg.native is not None and not seg.native_done:
                seg.native_done = seg.native.state == DONE  # before written
                seg.written = seg.on_disk = int(seg.native.written)
                seg.file_bytes = int(seg.native.file_bytes)
        sb = self._standby
        if sb is not None and sb.native.state != STANDBY:
            self._standby = None
            self._taken_up(sb)
            self._arm_standby()

    def detach(self) -> None:
        """The copier has stopped (its last copy made): the spool goes on in Python."""
        with self._cond:
            if self._ring is None:
                return
            self._sync(check=False)
            self._drop_standby()
            for seg in self._live:
                if seg.native is not None:
                    if seg.zstd_native:
                        # for a write after the copier (a CPU's last batch): frames
                        # with zstd's checksum too, where libzstd takes the parameter
                        seg.codec = ChecksummedZstd.make() or _read_codec()
                        seg.zstd_native = False
                    seg.native = None
                    seg.native_done = False
            self._copier = self._ring = None

    def _rotate(self) -> None:
        """(With the lock held, the tail read to its end) a new tail for the copier:
        in memory if the budget allows, else on disk; the old one can be retired."""
        copier, ring = self._copier, self._ring
        assert copier is not None and ring is not None
        self._drop_standby()
        tail = self._tail
        if tail.read != tail.written:  # the copier wrote on meanwhile
            self._arm_standby()
            return
        in_memory = self.memory is not None and self.memory.available()
        seg = self._new_segment(in_memory, zstd_native=not in_memory and copier.compresses)
        seg.native = copier.segment(seg.fd, zstd=seg.zstd_native, memory=in_memory)
        copier.rotate(ring, seg.native)
        self._live.append(seg)
        self._sync()
        self._arm_standby()

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
            pieces = list(_frames_of(chunks, self._frame_raw)) if tail.in_memory else []
            need = size + RAW_FRAME.size * len(pieces)
            if tail.in_memory and memory is not None and memory.reserve(need, tail.stall):
                # Written here: a tmpfs write costs a copy and never waits for a disk,
                # and what waits for the writer would be in the collector's heap.
                for raw in pieces:
                    _write_raw_frame(tail.fd, raw)
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
                        _remove(seg)
                    return
            for seg in unlink:
                _remove(seg)
            if unlink:
                with self._cond:
                    self._deleting -= len(unlink)
                    self._cond.notify_all()
            try:
                for seg, run in _runs(chunks):
                    if seg.codec is None:  # before pyarrow is loaded
                        for raw in _frames_of(run, self._frame_raw):
                            _write_raw_frame(seg.fd, raw)
                            unsynced += RAW_FRAME.size + len(raw)
                        continue
                    for raw in _frames_of(run, self._frame_raw):
                        packed = seg.codec.compress(raw, asbytes=True)
                        write_all(seg.fd, FRAME.pack(len(packed), len(raw)) + packed)
                        unsynced += FRAME.size + len(packed)
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

    def take(self, reader: RingBuffer) -> int:
        """Copy what the ring holds to the spool; the bytes copied (none while the
        native copier moves it: then only what it did is looked at)."""
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
                seg.rows_before, seg.rows_exact = dict(self.rows), True
                self._write_meta(seg)
            codec = seg.codec if seg.codec is not None else _read_codec() if seg.framed else None
            while seg.on_disk > seg.read and (more is None or more()):
                raw = self._read_frame(seg, codec)
                yield decode(np.frombuffer(raw, np.uint8), 1, 0, len(raw), dtype).records
            if seg.read < seg.written or (seg.native is not None and not seg.native_done):
                return  # the rest of this segment is still with the writer (or copier)

    def _read_frame(self, seg: _Segment, codec: Any) -> bytes:
        """The records of the segment's next frame (zstd's with ``codec``, else raw),
        checked; the segment's read positions move past it."""
        at = seg.file_read
        head_size = FRAME.size if codec is not None else RAW_FRAME.size
        head = os.pread(seg.fd, head_size, at)
        if len(head) != head_size:
            raise CollectionError(f"spool {seg.path} is shorter than written")
        if codec is not None:
            size, raw_size = FRAME.unpack(head)
        else:
            found = _raw_header(head, 0)
            if found is None:
                raise CollectionError(f"spool {seg.path}: a damaged frame header at byte "
                                      f"{at:,}{_KEPT}")  # fmt: skip
            size, crc = found
            raw_size = size
        body = os.pread(seg.fd, size, at + head_size)
        if len(body) != size:
            raise CollectionError(f"spool {seg.path} is shorter than written")
        what = f"the frame at byte {at:,} ({raw_size:,} bytes, {raw_size // self.stride:,} records)"
        if codec is None:
            if crc32c(body) != crc:
                raise CollectionError(f"spool {seg.path}: {what} fails its CRC32C{_KEPT}")
            raw = body
        else:
            try:
                raw = codec.decompress(body, decompressed_size=raw_size, asbytes=True)
            except Exception as err:  # the codec raises its own error types
                raise CollectionError(f"spool {seg.path}: {what} fails zstd's check "
                                      f"({err}){_KEPT}") from None  # fmt: skip
        seg.file_read = at + head_size + size
        seg.read += raw_size
        return raw

    def _learn_rows(self) -> None:
        """(At a checkpoint, before segments are deleted) the first segment not read
        yet learns its rows_before: a recovery must never meet one that does not know
        them after the segment before it is gone."""
        for seg in self._live:
            finished = seg.read == seg.written and (seg.native is None or seg.native_done)
            if finished:
                continue
            if not seg.rows_exact and seg.read == 0:
                seg.rows_before, seg.rows_exact = dict(self.rows), True
                self._write_meta(seg)
            return

    def count(self, table: str, rows: int) -> None:
        self.rows[table] = self.rows.get(table, 0) + rows

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

    def _delete(self, seg: _Segment) -> None:
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
        _remove(seg)

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
            if self._ring is not None and self._copier is not None and self._copier.running:
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


def _runs(chunks: list[tuple[_Segment, bytes]]) -> Iterator[tuple[_Segment, list[bytes]]]:
    """The chunks grouped in runs of one segment (a compressed segment gets frames of
    about FRAME_RAW, not one per ring copy)."""
    for _, run in groupby(chunks, key=lambda c: id(c[0])):
        pieces = list(run)
        yield pieces[0][0], [chunk for _, chunk in pieces]


def _frames_of(run: list[bytes], size: int) -> Iterator[bytes | memoryview]:
    """The run's bytes cut in frames of ``size`` (the last shorter), each joined from
    the pieces it spans: never the whole run at once (a batch of MiB would be mapped
    and unmapped for every write)."""
    pieces: list[memoryview] = []
    have = 0
    for chunk in run:
        view = memoryview(chunk)
        while view:
            take = view[: size - have]
            pieces.append(take)
            have += len(take)
            view = view[len(take) :]
            if have == size:
                yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
                pieces, have = [], 0
    if pieces:
        yield pieces[0] if len(pieces) == 1 else b"".join(pieces)


#: what a damaged frame met while the collection runs means for its rows
_KEPT = (": its records are not made; the spool is kept, and `kernmlops recover` makes "
         "the rows of every other frame")  # fmt: skip


def _write_raw_frame(fd: int, raw: bytes | memoryview) -> None:
    """A raw frame: its header, then the records (a kill between them cuts the frame,
    which a reader tells from damage)."""
    write_all(fd, raw_head(raw))
    write_all(fd, raw)


def _remove(seg: _Segment) -> None:
    seg.path.unlink(missing_ok=True)
    seg.path.with_suffix(".json").unlink(missing_ok=True)
