"""The spool's files as they lie on disk: segments of frames, each with a checksum.

A spool folder holds ``<key>.json`` (what decodes the records: the hook, its options,
the ring and the object whose BTF describes it), then segments ``<key>.<n>.ring`` each
with ``<key>.<n>.json`` (the rows every table had before the segment's first record,
its codec and format version, its size at the last flush, and whether it is retired:
marked before its file is deleted, so that recover names a file deleted otherwise).
The writer of these files is :class:`kernmlops.spool.copy.RingSpool`; this module
reads them (the collection while it runs, ``kernmlops recover`` after a kill).

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
record than the write alone (``python -m bench capacity``).

A compressed frame of a batched ring's records is byte-shuffled before zstd (blosc's
trick): the records' first bytes, then their second bytes, and so on, at the stride
of one record (:func:`shuffle`). A storm's 32-byte quanta records then compress 6.5
times instead of 4.95 and zstd runs about twice as fast on them (``python -m bench
capacity``: ``spool-disk`` against ``spool-disk-plain``): zstd is the copier's largest
cost once a long storm's spool is on disk. Such a
frame says so in its own header (:data:`SHUFFLED` in the raw-size word, with the
stride), so a frame is read right without its json, and a reader of before fails on
it (a size it cannot match) rather than reading shuffled bytes as records.

A segment's json says ``"version": 3`` (2: no shuffled frames; raw segments of an
older collection, no version, are records back to back): all are still read.

A segment is read a frame at a time (:class:`SegmentFile`: ``kernmlops recover`` holds
one frame, never the file), and a header that claims more than a frame ever held
(:data:`FRAME_LIMIT`) is damage, its bytes never asked for: a segment may be huge or
sparse (a user who owns the collection can plant one for root's ``recover``).
"""

from __future__ import annotations

import errno
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kernmlops.ebpf.copier import ChecksummedZstd
from kernmlops.ebpf.crc32c import crc32c
from kernmlops.lazy import imported, lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")

#: bytes of spool read back per step: a bounded batch of rows (about a row group)
READ_BYTES = 1 << 20

#: a compressed segment's frame header: compressed bytes, raw-size word (little-endian)
FRAME = struct.Struct("<II")
#: raw bytes per frame at most (whole records): one frame is one step of reading back
FRAME_RAW = READ_BYTES
#: raw bytes of a native copier's frame at most (its zstd workers' jobs side by side):
#: what a shuffled frame's header can name
FRAME_RAW_MAX = 8 << 20
#: record bytes a frame holds at most: the most any copier wrote (a raw frame was a
#: quarter ring before FRAME_RAW_MAX, and a ring is 1 GiB at most). A header that
#: claims more is damaged: a reader holds one frame, so this bounds its memory
FRAME_LIMIT = 256 << 20
#: a compressed frame's bytes at most: zstd's bound for FRAME_LIMIT record bytes
PACKED_LIMIT = FRAME_LIMIT + (FRAME_LIMIT >> 8) + (64 << 10)
#: the raw-size word of a frame whose records were shuffled: this bit, the stride in
#: 8-byte units in bits 24-30, the raw bytes in bits 0-23 (a frame under 16 MiB)
SHUFFLED = 1 << 31
SHUFFLED_RAW_MAX = (1 << 24) - 1
#: record strides a frame header can name (multiples of 8, as ring records are)
SHUFFLE_STRIDES = range(8, 128 * 8, 8)
CODEC = "zstd"
#: a raw segment's frame header: its magic, the records' bytes, their CRC32C, and the
#: CRC32C of these 12 bytes (a damaged length is never trusted); then the records
RAW_FRAME = struct.Struct("<IIII")
#: "KMO\x8d": its top bit never starts a zstd frame's header (a size under 2 GiB)
RAW_MAGIC = 0x8D4F4D4B
RAW_MAGIC_BYTES = RAW_MAGIC.to_bytes(4, "little")
#: the segment format a json's "version" names: 3, compressed frames may be shuffled
#: (their header says so); 2, raw segments in CRC frames; 1 (no version: a collection
#: of before), raw segments of records back to back
VERSION = 3


def shuffle(raw: bytes | memoryview, stride: int) -> bytes:
    """``raw``'s whole records of ``stride`` bytes byte-shuffled (byte 0 of every
    record, then byte 1, ...), the bytes after the last whole record as they are."""
    whole = len(raw) // stride * stride
    data = np.frombuffer(raw, np.uint8)
    return data[:whole].reshape(-1, stride).T.tobytes() + data[whole:].tobytes()


def unshuffle(data: bytes | memoryview, stride: int) -> bytes:
    """The records :func:`shuffle` shuffled, as they were."""
    whole = len(data) // stride * stride
    view = np.frombuffer(data, np.uint8)
    return view[:whole].reshape(stride, -1).T.tobytes() + view[whole:].tobytes()


def frame_head(packed: int, raw: int, stride: int = 0) -> bytes:
    """A compressed frame's header: ``packed`` bytes of zstd holding ``raw`` bytes of
    records, shuffled at ``stride`` (0: not shuffled)."""
    if not stride:
        return FRAME.pack(packed, raw)
    if stride not in SHUFFLE_STRIDES or raw > SHUFFLED_RAW_MAX:
        raise ValueError(f"a shuffled frame of {raw} bytes at stride {stride}")
    return FRAME.pack(packed, SHUFFLED | (stride // 8) << 24 | raw)


def raw_word(word: int) -> tuple[int, int]:
    """(raw bytes, shuffle stride or 0) of a compressed frame's raw-size word."""
    if word & SHUFFLED:
        return word & SHUFFLED_RAW_MAX, (word >> 24 & 0x7F) * 8
    return word, 0


def shuffle_stride(raw: int, stride: int) -> int:
    """The stride a frame of ``raw`` bytes is shuffled at (0: it is not): ``stride``
    where a header can say it, and the frame holds a record or more."""
    if stride in SHUFFLE_STRIDES and stride <= raw <= SHUFFLED_RAW_MAX:
        return stride
    return 0


def write_codec() -> Any:
    """zstd (level 1: the fastest, 6.6× on these records) once pyarrow is loaded, else
    None (a segment opened before the decoding libraries came in stays raw)."""
    if not imported("pyarrow"):
        return None
    framed = ChecksummedZstd.make()
    if framed is not None:
        return framed
    import pyarrow as pa

    return pa.Codec(CODEC, compression_level=1)  # no checksum: a libzstd that cannot


def read_codec() -> Any:
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


class FrameError(ValueError):
    """A compressed frame that cannot be read; the message says why, as a predicate
    ("fails zstd's check (...)"): its reader names the frame."""


def decode_frame(packed: bytes | memoryview, word: int, codec: Any) -> bytes:
    """The records of one compressed frame (its bytes after the header, and the raw
    word of its header): decompressed (zstd checks the frame's checksum), checked
    against the size the header says, unshuffled where they were shuffled."""
    raw_size, stride = raw_word(word)
    too_much = claims_too_much(len(packed), raw_size)
    if too_much is not None:  # never allocated: zstd would be handed that size
        raise FrameError(f"has {too_much}")
    try:
        raw = codec.decompress(packed, decompressed_size=raw_size, asbytes=True)
    except Exception as err:  # the codec raises its own error types
        raise FrameError(f"fails zstd's check ({err})") from None
    if len(raw) != raw_size:
        raise FrameError("is not the size its header says")
    return unshuffle(raw, stride) if stride else raw


#: bytes a search for the next intact frame reads from a segment file at a time
SCAN_BYTES = 1 << 20


class SegmentBytes:
    """A segment's bytes in memory, read as :class:`SegmentFile` reads a file."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = data if isinstance(data, bytes) else bytes(data)
        self._view = memoryview(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def read(self, at: int, n: int) -> memoryview:
        """``n`` bytes from ``at`` (fewer at the end)."""
        return self._view[at : at + n]

    def find(self, needle: bytes, start: int) -> int:
        return self._data.find(needle, start)


class SegmentFile:
    """A segment file (an open descriptor of a regular file) read a piece at a time:
    its reader holds a frame, or a window of SCAN_BYTES while it searches, never the
    file. Its size is the file's when opened; a file that shrinks while read fails
    with an OSError."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        #: the last window a search read (its offset, its bytes): a search goes on from
        #: a hit, and reads a header there, without reading the file again
        self._window: tuple[int, bytes] = (0, b"")

    def __len__(self) -> int:
        return self.size

    def read(self, at: int, n: int) -> bytes:
        """``n`` bytes from ``at`` (fewer at the end of the size it was opened with):
        the caller bounds ``n`` (a frame's header says it, checked against
        FRAME_LIMIT), never the file."""
        n = max(0, min(n, self.size - at))
        win_at, win = self._window
        if win_at <= at and at + n <= win_at + len(win):
            return win[at - win_at : at - win_at + n]
        data = os.pread(self.fd, n, at)
        while len(data) < n:
            more = os.pread(self.fd, n - len(data), at + len(data))
            if not more:
                raise OSError(errno.EIO, "the file shrank while it was read")
            data += more
        return data

    def find(self, needle: bytes, start: int) -> int:
        """Where ``needle`` is first at or after ``start``, -1 if nowhere. The file's
        holes are skipped (SEEK_DATA): they read as zeros, and no needle holds one
        (a sparse file of terabytes is searched in the time its data takes)."""
        assert 0 not in needle
        at = start
        while at + len(needle) <= self.size:
            win_at, win = self._window
            if not win_at <= at <= win_at + len(win) - len(needle):
                try:
                    at = max(at, os.lseek(self.fd, at, os.SEEK_DATA))
                except OSError as err:
                    if err.errno == errno.ENXIO:  # only a hole up to the end
                        return -1
                    raise
                if at + len(needle) > self.size:
                    return -1
                self._window = (0, b"")  # read() goes to the file
                win_at, win = at, self.read(at, SCAN_BYTES)
                self._window = (win_at, win)
            i = win.find(needle, at - win_at)
            if i != -1:
                return win_at + i
            at = win_at + len(win) - len(needle) + 1
        return -1


#: what the frame readers read: a segment's bytes, in memory or in its file
Readable = bytes | bytearray | memoryview | SegmentBytes | SegmentFile


def readable(data: Readable) -> SegmentBytes | SegmentFile:
    """``data`` as the frame readers read it (a SegmentFile as it is)."""
    return data if isinstance(data, SegmentBytes | SegmentFile) else SegmentBytes(data)


def claims_too_much(size: int, raw: int) -> str | None:
    """Why a frame header that claims ``size`` bytes after it and ``raw`` bytes of
    records (a raw frame's: both its size) is damage, when it claims more than any
    frame holds: the one rule, before any of those bytes is asked for or allocated.
    None: the claim may be believed."""
    if size <= PACKED_LIMIT and raw <= FRAME_LIMIT:
        return None
    return (f"a damaged frame header (it claims {max(size, raw):,} bytes, over the "
            f"{FRAME_LIMIT:,} a frame holds at most)")  # fmt: skip


def header_sizes(head: bytes | memoryview, compressed: bool) -> tuple[int, int, int] | None:
    """(bytes after it, record bytes, check) of the frame header ``head`` starts with:
    a compressed frame's (:data:`FRAME`; check: its raw-size word) or a raw one's
    (:data:`RAW_FRAME`; check: its records' CRC32C). None: ``head`` is short, or a raw
    header fails its own CRC32C. What it claims is :func:`claims_too_much`'s to judge."""
    if not compressed:
        found = raw_header_at(head, 0)
        return None if found is None else (found[0], found[0], found[1])
    if len(head) < FRAME.size:
        return None
    size, word = FRAME.unpack_from(head)
    return size, raw_word(word)[0], word


def frames(data: Readable, codec: Any) -> Iterator[bytes]:
    """The raw bytes of each whole frame in ``data`` (a compressed segment's bytes, or
    a piece starting at a frame) up to the first that cannot be read."""
    for frame in iter_frames(data, codec):
        if frame.reason is not None:
            return
        yield frame.raw  # type: ignore[misc]


def iter_frames(data: Readable, codec: Any) -> Iterator[Frame]:
    """Every frame of a compressed segment: intact ones with their raw bytes, and each
    stretch that cannot be read with its reason (a damaged header, a frame failing
    zstd's checksum, cut short). After damage, reading goes on at the next intact
    frame, so one bad byte loses one frame, not the rest. One frame is read at a
    time, and one whose header claims more than any holds is damaged, never read."""
    src = readable(data)
    at, n = 0, len(src)
    while at < n:
        end, raw, reason = n, None, None
        if at + FRAME.size > n:
            reason = CUT
        else:
            head = bytes(src.read(at, FRAME.size + 4))
            size, word = FRAME.unpack_from(head)
            end = at + FRAME.size + size
            if end > n:
                reason, end = CUT, n
            elif head[FRAME.size :] != ZSTD_MAGIC:
                reason, end = "a damaged frame header", n
            elif (too_much := claims_too_much(size, raw_word(word)[0])) is not None:
                reason, end = too_much, n
            else:
                try:
                    raw = decode_frame(src.read(at + FRAME.size, size), word, codec)
                except FrameError as err:
                    reason = f"a frame that {err}"
        if reason is None:
            yield Frame(at, end, raw, None)
            at = end
            continue
        nxt = _next_frame(src, at + 1, end if reason not in (CUT,) and end < n else None)
        if reason == CUT and nxt is not None:
            reason = "a damaged frame header"  # frames follow: not the end a kill makes
        stop = nxt if nxt is not None else n
        yield Frame(at, stop, None, reason)
        if nxt is None:
            return
        at = nxt


def _next_frame(src: SegmentBytes | SegmentFile, start: int, hint: int | None) -> int | None:
    """Where the next plausible frame header starts at or after ``start`` (the end the
    damaged frame's header claims first, when it is plausible)."""
    n = len(src)

    def plausible(p: int) -> bool:
        if p < start or p + FRAME.size + 4 > n:
            return False
        head = bytes(src.read(p, FRAME.size + 4))
        size, _ = FRAME.unpack_from(head)
        return head[FRAME.size :] == ZSTD_MAGIC and p + 8 + size <= n

    if hint is not None and plausible(hint):
        return hint
    i = src.find(ZSTD_MAGIC, start + FRAME.size)
    while i != -1:
        if plausible(i - FRAME.size):
            return i - FRAME.size
        i = src.find(ZSTD_MAGIC, i + 1)
    return None


def raw_head(records: bytes | memoryview) -> bytes:
    """The header of a raw frame of ``records`` (what the native copier writes too)."""
    head = struct.pack("<III", RAW_MAGIC, len(records), crc32c(records))
    return head + crc32c(head).to_bytes(4, "little")


def raw_header_at(data: bytes | memoryview, at: int) -> tuple[int, int] | None:
    """(record bytes, their CRC32C) of an intact raw frame header at ``at``, else None."""
    if at + RAW_FRAME.size > len(data):
        return None
    magic, size, crc, head_crc = RAW_FRAME.unpack_from(data, at)
    if magic != RAW_MAGIC or crc32c(memoryview(data)[at : at + 12]) != head_crc:
        return None
    return size, crc


def iter_raw_frames(data: Readable) -> Iterator[Frame]:
    """Every frame of a raw segment (version 2), as :func:`iter_frames` gives a
    compressed one's: a frame failing its CRC32C costs its own bytes (its header says
    where the next begins); after a damaged header, or one that claims more than a
    frame holds, reading goes on at the next intact header (its magic and its own
    CRC)."""
    src = readable(data)
    at, n = 0, len(src)
    while at < n:
        head = raw_header_at(src.read(at, RAW_FRAME.size), 0)
        reason = "a damaged frame header"
        if head is not None:
            size, crc = head
            end = at + RAW_FRAME.size + size
            if end > n:
                # Only a kill's cut: a damaged length fails the header's CRC.
                yield Frame(at, n, None, CUT, size)
                return
            too_much = claims_too_much(size, size)
            if too_much is None:
                raw = bytes(src.read(at + RAW_FRAME.size, size))
                if crc32c(raw) == crc:
                    yield Frame(at, end, raw, None)
                else:
                    yield Frame(at, end, None, "a frame that fails its CRC32C", size)
                at = end
                continue
            reason = too_much  # its CRCs may be right: a planted header
        nxt = src.find(RAW_MAGIC_BYTES, at + 1)
        while nxt != -1 and raw_header_at(src.read(nxt, RAW_FRAME.size), 0) is None:
            nxt = src.find(RAW_MAGIC_BYTES, nxt + 1)
        if nxt == -1 and n - at < RAW_FRAME.size:
            yield Frame(at, n, None, CUT)  # a header the kill cut
            return
        yield Frame(at, n if nxt == -1 else nxt, None, reason)
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
    """A segment file's format, from its json (read never through a link: a spool
    may lie in a folder a user owns)."""
    from kernmlops.host.pinned import read_plain
    from kernmlops.spool.collection import JSON_MAX_BYTES

    return format_of(json.loads(read_plain(segment.with_suffix(".json"), limit=JSON_MAX_BYTES)))


def format_of(meta: dict[str, Any]) -> SegmentFormat:
    """The format a segment's json (``meta``, already read) describes."""
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


def iter_segment(data: Readable, fmt: SegmentFormat) -> Iterator[Frame]:
    """Every frame of a segment's bytes (an old raw segment's records are one: read
    whole, so ``recover`` cuts a file of those in whole records itself)."""
    if fmt.codec is not None:
        yield from iter_frames(data, fmt.codec)
    elif fmt.framed:
        yield from iter_raw_frames(data)
    elif len(data):
        whole = data.read(0, len(data)) if isinstance(data, SegmentBytes | SegmentFile) else data
        yield Frame(0, len(data), bytes(whole), None)
