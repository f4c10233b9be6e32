"""One segment file of a ring's spool: opened, described by its json, written in
frames (kernmlops.spool.frames) and read back a frame at a time. The ring copy
(kernmlops.spool.copy) decides when a segment starts, where, and who writes it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernmlops.ebpf.crc32c import crc32c
from kernmlops.ebpf.ringbuf import write_all
from kernmlops.errors import CollectionError
from kernmlops.fileio import write_atomic
from kernmlops.spool.frames import (
    CODEC,
    FRAME,
    RAW_FRAME,
    VERSION,
    FrameError,
    claims_too_much,
    decode_frame,
    frame_head,
    header_sizes,
    raw_head,
    shuffle,
    shuffle_stride,
)

#: what a damaged frame met while the collection runs means for its rows
_KEPT = (": its records are not made; the spool is kept, and `kernmlops recover` makes "
         "the rows of every other frame")  # fmt: skip


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A spool json, written atomically and durably."""
    write_atomic(path, json.dumps(data, indent=1).encode())


@dataclass
class Segment:
    """One segment file of a ring's spool and where its writing and reading stand."""

    path: Path
    #: rows every table had before this segment's first record
    rows_before: dict[str, int]
    #: records made into rows before this segment's first (unbatched: the hook's
    #: events), exact when rows_before is; recover adds the records it reads to it
    records_before: int = 0
    fd: int = -1
    #: bytes handed over / in the file / read back (raw: before compression)
    written: int = 0
    on_disk: int = 0
    read: int = 0
    #: bytes of a segment in memory, frame headers included: its share of the budget
    file_bytes: int = 0
    #: the file's size at the last flush, in its json: recover names a file found
    #: shorter than that (cut), or gone while its json stays, as a loss
    meta_bytes: int = 0
    #: its rows are in finished parts and it is being deleted: said in its json before
    #: the file goes, so that a json a kill left alone is no loss (recover)
    retired: bool = False
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

    def open(self) -> None:
        """Create the segment file (its json written first)."""
        self.write_meta()
        # a new file of our own, never one planted there, nor one a link points at
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
        self.fd = os.open(self.path, flags, 0o600)

    def write_meta(self, durable: bool = True) -> None:
        """Write the segment's json: its format, rows before it, size at the last flush."""
        meta: dict[str, Any] = {
            "version": VERSION,
            "rows_before": self.rows_before if self.rows_exact else None,
            "records_before": self.records_before if self.rows_exact else None,
        }
        if self.framed:
            meta["codec"] = CODEC
        if self.meta_bytes:
            meta["bytes"] = self.meta_bytes
        # always there: a json with it comes from a writer that marks a segment retired
        # before deleting it (recover names no json of a writer before as a loss)
        meta["retired"] = self.retired
        path = self.path.with_suffix(".json")
        if durable:
            write_json(path, meta)
            return
        # At a flush: no fsync (it would wait for the spool's dirty pages); a machine
        # that crashes keeps the json before, a lower bound all the same.
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, path)

    def read_frame(self, codec: Any, stride: int) -> bytes:
        """The records of the segment's next frame (zstd's with ``codec``, else raw),
        checked; the segment's read positions move past it."""
        at = self.file_read
        head_size = FRAME.size if codec is not None else RAW_FRAME.size
        head = os.pread(self.fd, head_size, at)
        if len(head) != head_size:
            raise CollectionError(f"spool {self.path} is shorter than written")
        found = header_sizes(head, codec is not None)
        # a claim of more than any frame holds: damaged, never asked for
        why = "a damaged frame header" if found is None else claims_too_much(*found[:2])
        if found is None or why is not None:
            raise CollectionError(f"spool {self.path}: {why} at byte {at:,}{_KEPT}")
        size, raw_size, check = found
        body = os.pread(self.fd, size, at + head_size)
        if len(body) != size:
            raise CollectionError(f"spool {self.path} is shorter than written")
        what = f"the frame at byte {at:,} ({raw_size:,} bytes, {raw_size // stride:,} records)"
        if codec is None:
            if crc32c(body) != check:
                raise CollectionError(f"spool {self.path}: {what} fails its CRC32C{_KEPT}")
            raw = body
        else:
            try:
                raw = decode_frame(body, check, codec)
            except FrameError as err:
                raise CollectionError(f"spool {self.path}: {what} {err}{_KEPT}") from None
        self.file_read = at + head_size + size
        self.read += raw_size
        return raw

    def remove(self) -> None:
        """Delete the segment file and its json. A json that notes the file's size is
        first marked retired: one a kill leaves without its file is then told from one
        whose file was deleted by someone else (a loss, which recover names)."""
        if self.meta_bytes and not self.retired:
            self.retired = True
            # (a full disk) deleted all the same: only a kill just now would mislead
            with contextlib.suppress(OSError):
                self.write_meta(durable=False)
        self.path.unlink(missing_ok=True)
        self.path.with_suffix(".json").unlink(missing_ok=True)


def frames_of(run: list[bytes], size: int) -> Iterator[bytes | memoryview]:
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


def write_raw_frame(fd: int, raw: bytes | memoryview) -> int:
    """A raw frame: its header, then the records (a kill between them cuts the frame,
    which a reader tells from damage); the bytes written."""
    write_all(fd, raw_head(raw))
    write_all(fd, raw)
    return RAW_FRAME.size + len(raw)


def write_frame(fd: int, raw: bytes | memoryview, codec: Any, stride: int = 0) -> int:
    """A frame of ``raw``, compressed with ``codec`` (None: a raw frame), its records
    shuffled first at ``stride`` (0: not; kernmlops.spool.frames.shuffle); the bytes
    written."""
    if codec is None:
        return write_raw_frame(fd, raw)
    stride = shuffle_stride(len(raw), stride)
    packed = codec.compress(shuffle(raw, stride) if stride else raw, asbytes=True)
    write_all(fd, frame_head(len(packed), len(raw), stride) + packed)
    return FRAME.size + len(packed)
