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
(kernmlops.collect.recovery) turns what a killed collector left into parts, skipping
the rows already in finished parts. Its first ``collector.spool_memory_mib`` live on a tmpfs
(``/dev/shm``, linked from the spool as ``mem``): no disk write, and they outlive a
killed collector (not a reboot).
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernmlops.collect.manifest import SPOOL_DIR
from kernmlops.ebpf.spool import SpoolMemory
from kernmlops.errors import CollectionError
from kernmlops.host.cpus import SpareCpu

__all__ = [
    "SPOOL_DIR",
    "Leftover",
    "Pacer",
    "SpareCpu",
    "collector_alive",
    "foreign_memory",
    "leftover_memory",
    "memory_lost",
    "pending_spools",
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


def foreign_memory(collection: Path) -> Path | None:
    """What a collection's ``mem`` link names when that is not its spool's own folder
    (a planted link, a folder someone else made): never read, but said, since rows
    of this collection may be there."""
    spool_dir = collection / SPOOL_DIR
    link = spool_dir / MEMORY_LINK
    if not link.is_symlink() or not link.exists() or own_memory(spool_dir) is not None:
        return None
    return Path(os.readlink(link))


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
