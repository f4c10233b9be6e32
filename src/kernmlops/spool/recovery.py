"""Finding the spools a killed collector left, reading their segments whatever the
damage, and removing them: what ``kernmlops recover`` (kernmlops.collect.recovery)
stands on. A spool is its folder in the collection (``.spool``) and its memory
folder on a tmpfs (kernmlops.spool.memory), or the copy of that folder a ``cp -r``
of the collection made.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.ebpf.ringbuf import BUSY_BIT, LEN_MASK
from kernmlops.host.pinned import read_plain
from kernmlops.spool.collection import (
    DONE_MARK,
    JSON_MAX_BYTES,
    SPOOL_DIR,
    done_segments,
    spool_done,
)
from kernmlops.spool.frames import (
    CODEC,
    CUT,
    FRAME,
    RAW_MAGIC_BYTES,
    READ_BYTES,
    ZSTD_MAGIC,
    Readable,
    SegmentBytes,
    SegmentFile,
    SegmentFormat,
    iter_segment,
    readable,
)
from kernmlops.spool.memory import MEMORY_LINK, own_memory

if TYPE_CHECKING:
    import numpy as np


def spool_folders(spool_dir: Path) -> list[Path]:
    """The spool's folders: itself, and its memory folder while that exists, or a
    copy of it (a collection copied with cp -r / copytree, which follows the link:
    ``mem`` is then a folder inside the spool, as trusted as the spool itself)."""
    mem = spool_dir / MEMORY_LINK
    if own_memory(spool_dir) is not None or _copied_memory(mem):
        return [spool_dir, mem]
    return [spool_dir]


def _copied_memory(mem: Path) -> bool:
    """Whether ``mem`` is a real folder of ours (not a link) inside the spool."""
    try:
        st = mem.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def remove_spool(spool_dir: Path) -> None:
    """Delete a spool whose rows are all in finished parts, its own memory folder
    included (never what else a link names). A mark (:data:`DONE_MARK`), made durable
    first and deleted last, says so: a kill part-way (the files go one at a time) leaves
    a spool that reads as done, not segments whose files are gone, a description
    deleted before its segments or a memory folder gone before its link, each of which
    ``recover`` would name as lost."""
    mem = own_memory(spool_dir)
    try:
        # held open, never through a link: root removes spools in its users' folders
        fd = os.open(spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone already, or a link
    try:
        try:
            # names each segment left and its size: a mark that does not (planted,
            # stale, damaged) is no mark (spool_done)
            mark = json.dumps({"segments": done_segments(spool_dir)}).encode()
            # a new file renamed over the name: never written through a link, nor into
            # a file a hard link planted there names
            tmp = f".{DONE_MARK}.{os.getpid()}.{secrets.token_hex(8)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with open(os.open(tmp, flags, 0o600, dir_fd=fd), "wb") as f:
                f.write(mark)
                os.fsync(f.fileno())
            os.rename(tmp, DONE_MARK, src_dir_fd=fd, dst_dir_fd=fd)
            os.fsync(fd)  # the mark is on the disk before any file goes
        except OSError:
            pass  # (no room) deleted all the same: only a kill now misleads
        if mem is not None:
            shutil.rmtree(mem, ignore_errors=True)
        for entry in list(os.scandir(fd)):
            if entry.name == DONE_MARK:
                continue
            if entry.is_dir(follow_symlinks=False):  # a copied memory folder
                shutil.rmtree(entry.name, ignore_errors=True, dir_fd=fd)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
        with contextlib.suppress(OSError):
            os.unlink(DONE_MARK, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(spool_dir)


def pending_spools(collection: Path) -> list[Path]:
    """The spool segments a collection still holds (after a kill), in order; with them
    those whose file is gone but whose json says it held records (:func:`deleted_bytes`:
    a path that does not exist, for ``recover`` to name as lost). None from a spool
    marked done (what a kill left of its removal)."""
    folder = collection / SPOOL_DIR
    if not folder.is_dir() or spool_done(folder):
        return []
    found = []
    for f in spool_folders(folder):
        found += f.glob("*.ring")
        found += (
            seg
            for seg in (meta.with_suffix(".ring") for meta in f.glob("*.json"))
            if _order(seg)[1] >= 0 and not os.path.lexists(seg) and deleted_bytes(seg)
        )
    return sorted(found, key=_order)


def deleted_bytes(segment: Path) -> int:
    """The bytes a segment whose file is gone held at the collector's last flush, as
    its json says, where the writer never retired it: someone else deleted the file.
    0 where the json cannot say so: a spool of before the mark (its writer, too,
    deleted a file before its json), one marked retired, one no flush noted a size
    for (a kill between the json's write and the file's creation), or unreadable."""
    try:
        meta = json.loads(read_plain(segment.with_suffix(".json"), limit=JSON_MAX_BYTES))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return 0
    if not isinstance(meta, dict) or meta.get("retired") is not False:
        return 0
    size = meta.get("bytes")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def _order(segment: Path) -> tuple[str, int]:
    key, _, index = segment.stem.rpartition(".")
    return key, int(index) if index.isdigit() else -1


def guess_format(data: bytes | memoryview) -> SegmentFormat:
    """The format a segment whose json is lost seems to have, from its first frame
    (its first 12 bytes are enough)."""
    if data[:4] == RAW_MAGIC_BYTES:
        return SegmentFormat(None)
    if data[FRAME.size : FRAME.size + 4] == ZSTD_MAGIC:
        import pyarrow as pa

        return SegmentFormat(pa.Codec(CODEC))
    return SegmentFormat(None, version=1)


#: what could not be read of a segment: (reason, bytes, records where known)
Bad = tuple[str, int, int | None]


def segment_pieces(data: Readable, fmt: SegmentFormat, stride: int, last: bool
                   ) -> tuple[Iterator[tuple[int, bytes | memoryview]], list[Bad]]:  # fmt: skip
    """A segment's bytes (in memory, or its file read a frame at a time: a SegmentFile)
    as (offset, whole records) pieces, read as they are asked for, and what could not
    be read: complete once every piece is read. A kill may cut the last record or
    frame of the ring's last segment: that is the run's end, not a loss."""
    bad: list[Bad] = []
    return _pieces(readable(data), fmt, stride, last, bad), bad


def _pieces(src: SegmentBytes | SegmentFile, fmt: SegmentFormat, stride: int, last: bool,
            bad: list[Bad]) -> Iterator[tuple[int, bytes | memoryview]]:  # fmt: skip
    n = len(src)
    if not fmt.framed:  # an old raw segment: records back to back, no checksum
        whole = n // stride * stride
        step = max(stride, READ_BYTES // stride * stride)  # never the whole file at once
        for at in range(0, whole, step):
            yield at, src.read(at, min(step, whole - at))
        if whole < n and not last:
            bad.append(("cut short in a record", n - whole, None))
        return
    for frame in iter_segment(src, fmt):
        records = frame.raw_bytes // stride if frame.raw_bytes is not None else None
        if frame.raw is not None and len(frame.raw) % stride:
            bad.append((f"a frame at byte {frame.start:,} of {len(frame.raw):,} bytes, not "
                        f"whole records of {stride}", frame.end - frame.start, None))  # fmt: skip
        elif frame.reason is None:
            yield frame.start, frame.raw  # type: ignore[misc]
        elif not (frame.reason == CUT and last):
            more = frame.end < n and frame.reason != CUT
            what = "; reading went on at the next intact frame" if more else ""
            bad.append((f"{frame.reason} at byte {frame.start:,}{what}",
                        frame.end - frame.start, records))  # fmt: skip


def good_records(raw: np.ndarray, stride: int, itemsize: int) -> tuple[np.ndarray, int]:
    """The records whose ring header is sound (committed, of the ring's size), and how
    many were not: a damaged header costs its record, not its piece."""
    rows = raw[: len(raw) // stride * stride].reshape(-1, stride)
    header = rows[:, :4].copy().view("<u4").ravel()
    good = ((header & LEN_MASK) == itemsize) & ((header & BUSY_BIT) == 0)
    if good.all():
        return raw, 0
    return rows[good].ravel(), int((~good).sum())
