"""Ring records waiting on disk: what keeps the collector light on a saturated machine.

A BPF hook's rings are copied, as they lie (record headers included), into the
collection's ``.spool/`` every poll (kernmlops.ebpf.spool): one ``write`` per piece
of ring, no decoding. Rows are made from the spool (decode, the hook's own columns,
Parquet) while the machine has CPU to spare and the sink keeps up (:class:`Pacer`),
and all of what is left at stop, the way ``perf record`` writes first and ``perf
report`` decodes later. On a machine with idle CPU the spool is read back within a
poll and rows reach Parquet as they always did; under a storm that keeps every CPU
busy the collector takes only the copy's few percent of a core from the workload,
and its memory does not grow with the backlog (the page cache holds it, the disk
keeps it).

Durability is the collection's (README, "A collection survives its collector"):
the spool is fsync'd at every flush, and ``kernmlops recover`` (:func:`recover`)
turns what a killed collector left into parts, skipping the rows already in
finished parts. Its first ``collector.spool_memory_mib`` live on a tmpfs
(``/dev/shm``, linked from the spool as ``mem``): no disk write, and they outlive a
killed collector (not a reboot).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.manifest import SPOOL_DIR
from kernmlops.ebpf.ringbuf import decode, record_stride
from kernmlops.ebpf.spool import (
    CODEC,
    CUT,
    FRAME,
    RAW_MAGIC_BYTES,
    ZSTD_MAGIC,
    SegmentFormat,
    SpoolMemory,
    iter_segment,
    segment_format,
)
from kernmlops.errors import CollectionError
from kernmlops.host.cpus import SpareCpu
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np

    from kernmlops.ebpf.btf import RecordLayout
else:
    np = lazy_import("numpy")


__all__ = [
    "SPOOL_DIR",
    "Leftover",
    "Pacer",
    "SpareCpu",
    "collector_alive",
    "leftover_memory",
    "memory_lost",
    "pending_spools",
    "recover",
    "spool_memory",
]

#: the spool's link to its folder on a tmpfs
MEMORY_LINK = "mem"
#: where a tmpfs is expected, and the names of the spools' folders there
SHM = Path("/dev/shm")
MEMORY_PREFIX = "kernmlops-spool-"
#: in a memory folder: the spool folder it belongs to
OWNER_FILE = "owner"


def spool_memory(spool_dir: Path, collection_id: str, limit_mib: float) -> SpoolMemory | None:
    """A folder on the tmpfs for the spool's first ``limit_mib`` (at most half of the
    tmpfs's free space), linked from ``spool_dir``; None without a usable tmpfs."""
    if limit_mib <= 0 or not _is_tmpfs(SHM):
        return None
    try:
        st = os.statvfs(SHM)
        limit = min(int(limit_mib * 2**20), st.f_bavail * st.f_frsize // 2)
        if limit < 2**20:
            return None
        folder = memory_folder(collection_id)
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # someone else's (or a link): the spool stays on the disk
        # the way back, for leftover_memory: which collection a folder left by a
        # killed collector belongs to
        (folder / OWNER_FILE).write_text(str(spool_dir.resolve()))
        spool_dir.mkdir(parents=True, exist_ok=True)
        link = spool_dir / MEMORY_LINK
        if not link.is_symlink():
            link.symlink_to(folder)
    except OSError:
        return None
    # a quarter bridges a disk that stalls later in the run (ebpf.spool.STALL_QUEUED)
    return SpoolMemory(folder, limit, for_stalls=limit // 4)


def memory_folder(collection_id: str) -> Path:
    """The tmpfs folder of a collection's spool: named by its collection id only."""
    return SHM / f"{MEMORY_PREFIX}{collection_id}"


@dataclass(frozen=True)
class Leftover:
    """A tmpfs folder a killed collector left: RAM held until it is recovered or deleted."""

    folder: Path
    bytes: int
    #: the collection it was made for (its path then), and whether it is still there
    collection: Path | None
    found: bool

    def describe(self) -> str:
        size = f"{self.bytes / 2**20:,.0f} MiB"
        if self.collection is not None and self.found:
            return (
                f"a killed collection's spool holds {size} of memory in {self.folder}: "
                f"`kernmlops recover {self.collection}` makes its rows and frees it"
            )
        where = f"its collection was at {self.collection}" if self.collection else "unknown"
        return (f"a killed collection's spool holds {size} of memory in {self.folder} "
                f"({where}, moved or deleted since): run `kernmlops recover` on the "
                "collection where it is now, or delete the folder to free the memory")  # fmt: skip


def leftover_memory(min_age_s: float = 60.0) -> list[Leftover]:
    """The tmpfs folders of spools this user's killed collectors left, for a warning at
    the next start. Nothing is deleted here: a folder holds the only copy of its rows
    (a moved collection still finds it through its id), and only ``recover`` or its
    own collection removes it. Folders younger than ``min_age_s`` (a collector may be
    creating one) and those of a collector still running are left out."""
    found = []
    now = time.time()
    for folder in sorted(SHM.glob(f"{MEMORY_PREFIX}*")):
        try:
            st = folder.lstat()
            if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
                    or now - st.st_mtime < min_age_s):  # fmt: skip
                continue
            size = sum(p.lstat().st_size for p in folder.iterdir())
            try:
                owner: Path | None = Path((folder / OWNER_FILE).read_text().strip())
            except OSError:
                owner = None
        except OSError:
            continue
        collection = owner.parent if owner is not None else None
        back = owner is not None and _links_to(owner / MEMORY_LINK, folder)
        if back and collection is not None and collector_alive(collection) is not None:
            continue
        found.append(Leftover(folder, size, collection, back))
    return found


def _links_to(link: Path, folder: Path) -> bool:
    try:
        return link.is_symlink() and Path(os.readlink(link)) == folder
    except OSError:
        return False


def _is_tmpfs(path: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(f.split()[1:3] == [str(path), "tmpfs"] for f in mounts if len(f.split()) > 2)


def own_memory(spool_dir: Path) -> Path | None:
    """The spool's tmpfs folder, found through its collection's id only: the link
    ``mem`` must name ``memory_folder(<the manifest's collection id>)``, a folder of
    ours that no one else can write. A link to anywhere else (planted, or a folder
    someone else made) is never read nor deleted."""
    link = spool_dir / MEMORY_LINK
    if not link.is_symlink():
        return None
    from kernmlops.collect.manifest import read_manifest

    try:
        folder = memory_folder(read_manifest(spool_dir.parent).collection_id)
        st = folder.lstat()
    except (OSError, CollectionError):
        return None
    if Path(os.readlink(link)) != folder or not stat.S_ISDIR(st.st_mode):
        return None
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return folder


def spool_folders(spool_dir: Path) -> list[Path]:
    """The spool's folders: itself, and its memory folder while that exists."""
    mem = own_memory(spool_dir)
    return [spool_dir, spool_dir / MEMORY_LINK] if mem is not None else [spool_dir]


def memory_lost(collection: Path) -> Path | None:
    """The tmpfs folder a collection's spool links to, when it is gone (a reboot):
    the rows of its segments cannot be recovered."""
    link = collection / SPOOL_DIR / MEMORY_LINK
    return Path(os.readlink(link)) if link.is_symlink() and not link.exists() else None


def remove_spool(spool_dir: Path) -> None:
    """Delete a spool, its own memory folder included (never what else a link names)."""
    mem = own_memory(spool_dir)
    if mem is not None:
        shutil.rmtree(mem, ignore_errors=True)
    shutil.rmtree(spool_dir, ignore_errors=True)


class Pacer:
    """When a spooling hook may make rows during the run: the machine has CPU to spare
    and the sink is not behind (a write would wait for its writer, and the rings
    would not be copied meanwhile)."""

    def __init__(self, spare: SpareCpu, behind: Callable[[], bool]) -> None:
        self.spare = spare
        self.behind = behind

    def ask(self) -> bool:
        return not self.behind() and self.spare.ask()


def pending_spools(collection: Path) -> list[Path]:
    """The spool segments a collection still holds (after a kill), in order."""
    folder = collection / SPOOL_DIR
    if not folder.is_dir():
        return []
    return sorted((p for f in spool_folders(folder) for p in f.glob("*.ring")), key=_order)


def _order(segment: Path) -> tuple[str, int]:
    key, _, index = segment.stem.rpartition(".")
    return key, int(index) if index.isdigit() else -1


@dataclass
class Lost:
    """What ``recover`` could not read from one spool file, and why."""

    file: Path
    reason: str
    bytes: int = 0
    #: records (ring records: a batch counts as one) in those bytes, where known
    records: int | None = None

    def describe(self) -> str:
        what = f"{self.bytes:,} bytes"
        if self.records is not None:
            what += f" ({self.records:,} records)"
        return f"{self.file}: {what} not recovered: {self.reason}"


@dataclass
class Recovery:
    """What ``recover`` did: rows added per table, and what it could not read."""

    added: dict[str, int] = field(default_factory=dict)
    lost: list[Lost] = field(default_factory=list)


#: in the spool: held by the ``recover`` that works on it (its pid inside)
LOCK_FILE = "recover.lock"


def _lock(folder: Path) -> int:
    """Hold the spool for one ``recover``; a second one is told who has it."""
    import fcntl

    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise CollectionError(
            f"another `kernmlops recover` (pid {other}) is recovering {folder.parent}: "
            "wait for it to finish"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _meta(path: Path, what: str) -> dict:
    """A spool json, or CollectionError naming it (missing, unreadable, not an object)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CollectionError(f"its {what} {path.name} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CollectionError(f"its {what} {path.name} is damaged ({err})") from None
    if not isinstance(data, dict):
        raise CollectionError(f"its {what} {path.name} is damaged (not an object)")
    return data


def recover(collection: Path, bpf_dir: Path | None = None) -> Recovery:
    """Turn what a killed collector left in ``collection``'s spool into Parquet parts
    after the finished ones. Rows already in finished parts are not repeated: each
    segment says how many rows each table had before it, and the finished parts say
    how many they hold.

    Damage never stops it: every intact frame and record is recovered, and what could
    not be read (a description missing or damaged, a frame cut or failing its
    checksum, records of the wrong size, rows a later segment expected) is listed in
    the result. The spool is deleted only when nothing was lost; otherwise it stays,
    for another try or an autopsy. One ``recover`` at a time (a lock in the spool)."""
    import pyarrow.parquet as pq

    from kernmlops.collect.manifest import TableRecord, read_manifest, write_manifest
    from kernmlops.collect.sinks import ParquetSink
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks import get_hook

    folder = collection / SPOOL_DIR
    result = Recovery()
    segments = pending_spools(collection)
    if not segments:
        return result
    lock = _lock(folder)
    try:
        manifest = read_manifest(collection)
        sink = ParquetSink(collection, manifest.collection_id)
        finished: dict[str, int] = {}
        for table_dir in collection.iterdir():
            parts = sorted(table_dir.glob("part-*.parquet")) if table_dir.is_dir() else []
            if parts:
                finished[table_dir.name] = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
                sink.resume(table_dir.name, len(parts))
        by_key: dict[str, list[Path]] = {}
        for seg in segments:
            by_key.setdefault(seg.stem.rpartition(".")[0], []).append(seg)
        for key, segs in by_key.items():
            try:
                info = _meta(folder / f"{key}.json", "description")
                cls = get_hook(info["hook"])
                hook = cls(cls.Options.model_validate(info["options"]))
                name = Path(info["object"]).name
                obj = Path(bpf_dir) / name if bpf_dir else Path(info["object"])
                if not obj.exists():
                    raise CollectionError(
                        f"its records need {obj} to be decoded (build the BPF objects of "
                        "the version that collected, and pass their folder with --bpf-dir)"
                    )
                layout: RecordLayout = object_spec(obj).ring_layouts()[info["ring"]]
                dtype = layout.batch if layout.batch is not None else layout.dtype
                if dtype.itemsize != info["itemsize"]:
                    raise CollectionError(f"{obj} does not describe its records: rebuilt since?")
            except (CollectionError, KeyError, TypeError, ValueError) as err:
                reason = str(err) if isinstance(err, CollectionError) else f"its description "\
                    f"{key}.json is damaged ({type(err).__name__}: {err})"  # fmt: skip
                for seg in segs:
                    result.lost.append(Lost(seg, reason, _size(seg)))
                continue
            _recover_key(key, segs, hook, layout, dtype, finished, sink, result)
        sink.close()
        # The manifest's tables say what is on disk now (its state stays: the run was cut).
        files = sink.files_written()
        for table, n in result.added.items():
            record = manifest.tables.get(table) or TableRecord()
            record.rows = finished.get(table, 0) + n
            record.files = sorted({*record.files, *files.get(table, [])})
            manifest.tables[table] = record
        write_manifest(collection, manifest)
    finally:
        os.close(lock)
    if not result.lost:
        remove_spool(folder)
    return result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _recover_key(key: str, segs: list[Path], hook, layout, dtype, finished: dict[str, int],
                 sink, result: Recovery) -> None:  # fmt: skip
    """Recover one ring's segments, in order, into ``sink``; losses into ``result``."""
    from kernmlops.ebpf.btf import unbatch

    stride = record_stride(dtype.itemsize)
    made: dict[str, int] = {}
    for i, seg in enumerate(segs):
        # the ring's last bytes (a kill may cut them): an empty standby after is no data
        last = not any(_size(later) for later in segs[i + 1 :])
        try:
            meta = _meta(seg.with_suffix(".json"), "description")
            before = meta.get("rows_before")
            fmt: SegmentFormat | None = segment_format(seg)
        except (CollectionError, ValueError, TypeError) as err:
            # its rows come after the previous segment's, as for rows_before: null
            result.lost.append(Lost(seg, f"{err}; read as its first bytes look", 0))
            meta, before, fmt = {}, None, None
        if isinstance(before, dict):
            # rows a damaged segment before this one did not give: lost
            short = {t: n - made.get(t, 0) for t, n in before.items()
                     if isinstance(n, int) and n > made.get(t, 0)}  # fmt: skip
            if made and short:
                rows = ", ".join(f"{t} {n:,}" for t, n in sorted(short.items()))
                result.lost.append(
                    Lost(segs[i - 1], f"rows the next segment counts on are missing: {rows}")
                )
            made = {t: n for t, n in before.items() if isinstance(n, int)}
        try:
            data = seg.read_bytes()
        except OSError as err:
            result.lost.append(Lost(seg, f"cannot be read ({err.strerror or err})", _size(seg)))
            continue
        if fmt is None:
            fmt = _looks_like(data)
        flushed = meta.get("bytes")
        if isinstance(flushed, int) and len(data) < flushed:
            missing = flushed - len(data)
            result.lost.append(Lost(
                seg, f"cut short: {missing:,} bytes fewer than it held at the collector's "
                "last flush", missing, None if fmt.framed else missing // stride,
            ))  # fmt: skip
        pieces, bad = _pieces(data, fmt, stride, last)
        result.lost.extend(Lost(seg, reason, size, records) for reason, size, records in bad)
        for at, piece in pieces:
            raw, damaged = _good_records(np.frombuffer(piece, np.uint8), stride, dtype.itemsize)
            if damaged:
                result.lost.append(Lost(seg, f"records with a damaged header in the piece at "
                                        f"byte {at:,}", damaged * stride, damaged))  # fmt: skip
            records = decode(raw, 1, 0, len(raw), dtype).records
            if layout.batch is not None:
                records = unbatch(records, layout)
            for table, rows in hook.rows_from(key, records, layout):
                n = rows.num_rows if hasattr(rows, "num_rows") else rows.height
                first = made.get(table, 0)
                made[table] = first + n
                skip = min(n, max(0, finished.get(table, 0) - first))
                if skip < n:
                    sink.write(table, rows.slice(skip))
                    result.added[table] = result.added.get(table, 0) + n - skip


def _looks_like(data: bytes) -> SegmentFormat:
    """The format a segment whose json is lost seems to have, from its first frame."""
    if data[:4] == RAW_MAGIC_BYTES:
        return SegmentFormat(None)
    if data[FRAME.size : FRAME.size + 4] == ZSTD_MAGIC:
        import pyarrow as pa

        return SegmentFormat(pa.Codec(CODEC))
    return SegmentFormat(None, version=1)


def _pieces(data: bytes, fmt: SegmentFormat, stride: int, last: bool
            ) -> tuple[list[tuple[int, bytes]], list[tuple[str, int, int | None]]]:  # fmt: skip
    """A segment's bytes as (offset, whole records) pieces, and what could not be read
    ((reason, bytes, records where known) each). A kill may cut the last record or
    frame of the ring's last segment: that is the run's end, not a loss."""
    if not fmt.framed:  # an old raw segment: records back to back, no checksum
        whole = len(data) // stride * stride
        pieces = [(0, data[:whole])] if whole else []
        if whole < len(data) and not last:
            return pieces, [("cut short in a record", len(data) - whole, None)]
        return pieces, []
    pieces, bad = [], []
    for frame in iter_segment(data, fmt):
        records = frame.raw_bytes // stride if frame.raw_bytes is not None else None
        if frame.raw is not None and len(frame.raw) % stride:
            bad.append((f"a frame at byte {frame.start:,} of {len(frame.raw):,} bytes, not "
                        f"whole records of {stride}", frame.end - frame.start, None))  # fmt: skip
        elif frame.reason is None:
            pieces.append((frame.start, frame.raw))
        elif not (frame.reason == CUT and last):
            more = frame.end < len(data) and frame.reason != CUT
            what = "; reading went on at the next intact frame" if more else ""
            bad.append((f"{frame.reason} at byte {frame.start:,}{what}",
                        frame.end - frame.start, records))  # fmt: skip
    return pieces, bad


def _good_records(raw: np.ndarray, stride: int, itemsize: int) -> tuple[np.ndarray, int]:
    """The records whose ring header is sound (committed, of the ring's size), and how
    many were not: a damaged header costs its record, not its piece."""
    from kernmlops.ebpf.ringbuf import BUSY_BIT, LEN_MASK

    rows = raw[: len(raw) // stride * stride].reshape(-1, stride)
    header = rows[:, :4].copy().view("<u4").ravel()
    good = ((header & LEN_MASK) == itemsize) & ((header & BUSY_BIT) == 0)
    if good.all():
        return raw, 0
    return rows[good].ravel(), int((~good).sum())


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
