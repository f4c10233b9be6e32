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
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.manifest import SPOOL_DIR
from kernmlops.ebpf.ringbuf import decode, record_stride
from kernmlops.ebpf.spool import SpoolMemory, frames, segment_codec
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
    "Pacer",
    "SpareCpu",
    "collector_alive",
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
    sweep_memory()
    try:
        st = os.statvfs(SHM)
        limit = min(int(limit_mib * 2**20), st.f_bavail * st.f_frsize // 2)
        if limit < 2**20:
            return None
        folder = SHM / f"{MEMORY_PREFIX}{collection_id}"
        folder.mkdir(mode=0o700, exist_ok=True)
        st = folder.lstat()
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None  # someone else's (or a link): the spool stays on the disk
        # the way back, for sweep_memory: a folder whose collection is gone is freed
        (folder / OWNER_FILE).write_text(str(spool_dir.resolve()))
        spool_dir.mkdir(parents=True, exist_ok=True)
        link = spool_dir / MEMORY_LINK
        if not link.is_symlink():
            link.symlink_to(folder)
    except OSError:
        return None
    # a quarter bridges a disk that stalls later in the run (ebpf.spool.STALL_QUEUED)
    return SpoolMemory(folder, limit, for_stalls=limit // 4)


def sweep_memory(min_age_s: float = 60.0) -> list[Path]:
    """Free the tmpfs folders of spools whose collection is gone (deleted before it
    was recovered): what they hold can no longer be recovered. A folder younger than
    ``min_age_s`` is left alone (a collector may be creating it). The folders freed."""
    freed = []
    now = time.time()
    for folder in SHM.glob(f"{MEMORY_PREFIX}*"):
        try:
            if now - folder.stat().st_mtime < min_age_s:
                continue
            owner = Path((folder / OWNER_FILE).read_text().strip())
            alive = (owner / MEMORY_LINK).resolve() == folder.resolve()
        except OSError:
            alive = False
        if not alive:
            shutil.rmtree(folder, ignore_errors=True)
            freed.append(folder)
    return freed


def _is_tmpfs(path: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(f.split()[1:3] == [str(path), "tmpfs"] for f in mounts if len(f.split()) > 2)


def spool_folders(spool_dir: Path) -> list[Path]:
    """The spool's folders: itself, and its memory folder while that exists."""
    mem = spool_dir / MEMORY_LINK
    return [spool_dir, mem] if mem.is_dir() else [spool_dir]


def memory_lost(collection: Path) -> Path | None:
    """The tmpfs folder a collection's spool links to, when it is gone (a reboot):
    the rows of its segments cannot be recovered."""
    link = collection / SPOOL_DIR / MEMORY_LINK
    return Path(os.readlink(link)) if link.is_symlink() and not link.exists() else None


def remove_spool(spool_dir: Path) -> None:
    """Delete a spool, its memory folder included."""
    mem = spool_dir / MEMORY_LINK
    if mem.is_symlink():
        shutil.rmtree(mem.resolve(), ignore_errors=True)
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
        segments = [p for f in spool_folders(folder) for p in f.glob(f"{key}.*.ring")]
        made: dict[str, int] = {}
        for seg in sorted(segments, key=_order):
            # a segment opened before the one ahead of it was read says nothing: its
            # rows come right after that one's
            before = json.loads(seg.with_suffix(".json").read_text())["rows_before"]
            if before is not None:
                made = dict(before)
            codec = segment_codec(seg)
            pieces = frames(seg.read_bytes(), codec) if codec else [np.fromfile(seg, np.uint8)]
            for piece in pieces:
                raw = np.frombuffer(piece, np.uint8)
                whole = len(raw) // stride * stride  # a kill may cut the last record
                records = decode(raw[:whole], 1, 0, whole, dtype).records
                if layout.batch is not None:
                    records = unbatch(records, layout)
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
    remove_spool(folder)
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
