"""The spool's memory: a budget of bytes on a tmpfs (``/dev/shm``) for the spools'
first bytes, and the folder there that holds them.

Segments in memory cost no disk write and outlive a killed collector (a kill -9, the
OOM killer), not a reboot. A collection's folder is ``/dev/shm/kernmlops-spool-<its
collection id>``, private to its user, linked from the spool as ``mem``; it is found
again through the collection's id only, so a planted link is never read nor deleted.
What a killed collector left there, or a stop that parked the spool (Ctrl+C again, a
full disk), is named at the next start (:func:`leftover_memory`, by how its collection
ended) and freed by ``kernmlops recover``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kernmlops.ebpf.copier import Budget
from kernmlops.ebpf.copier import available as copier_available
from kernmlops.spool.collection import (
    SPOOL_DIR,
    collection_id_of,
    collector_and_state,
    spool_done,
)

#: the spool's link to its folder on a tmpfs
MEMORY_LINK = "mem"
#: where a tmpfs is expected, and the names of the spools' folders there
SHM = Path("/dev/shm")
MEMORY_PREFIX = "kernmlops-spool-"
#: in a memory folder: the spool folder it belongs to
OWNER_FILE = "owner"


@dataclass
class SpoolMemory:
    """Memory that outlives the collector, for the spools' first bytes: a folder on a
    tmpfs (``/dev/shm``) and a budget of bytes shared by every ring of a collection.
    Segments there cost no disk write (on this VM a storm's 17 MB/s of spool slowed
    the workload by 5 points through writeback alone) and survive a kill -9 or an OOM
    kill of the collector, not a reboot; past the budget, segments go to disk."""

    folder: Path
    limit: int
    #: of ``limit``, what only bridges a disk that is behind (kernmlops.spool.copy.STALL_QUEUED):
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


#: the least tmpfs room worth a memory spool (less: the spool goes to the disk)
MIN_ROOM = 1 << 20


def memory_room(limit_mib: float) -> tuple[int, int] | None:
    """(bytes of the tmpfs a spool asking for ``limit_mib`` gets: at most half of its
    free space; the tmpfs's free bytes), or None where there is no tmpfs at SHM."""
    if not _is_tmpfs(SHM):
        return None
    st = os.statvfs(SHM)
    free = st.f_bavail * st.f_frsize
    return min(int(limit_mib * 2**20), free // 2), free


def spool_memory(spool_dir: Path, collection_id: str, limit_mib: float) -> SpoolMemory | None:
    """A folder on the tmpfs for the spool's first ``limit_mib`` (at most half of the
    tmpfs's free space), linked from ``spool_dir``; None without a usable tmpfs."""
    if limit_mib <= 0:
        return None
    try:
        room = memory_room(limit_mib)
        if room is None or room[0] < MIN_ROOM:
            return None
        limit = room[0]
        folder = memory_folder(collection_id)
        folder.mkdir(mode=0o700, exist_ok=True)
        if not _ours_alone(folder.lstat()):
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
    # a quarter bridges a disk that stalls later in the run (kernmlops.spool.copy.STALL_QUEUED)
    return SpoolMemory(folder, limit, for_stalls=limit // 4)


def _ours_alone(st: os.stat_result) -> bool:
    """Whether a tmpfs folder's lstat is a folder (no link) of this user's that no one
    else may read or write: the only kind of memory folder used, read or deleted."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def memory_folder(collection_id: str) -> Path:
    """The tmpfs folder of a collection's spool: named by its collection id only."""
    return SHM / f"{MEMORY_PREFIX}{collection_id}"


#: how a leftover's collection ended (its manifest's state), as its warning names it;
#: any other state (a hook's bug at the stop, say), or none known: neutral
_WHOSE = {
    "running": "a killed collection's spool",  # never finalised: its collector died
    "interrupted": "an interrupted collection's spool",  # Ctrl+C again at the stop
    "disk_full": "the spool of a collection stopped by a full disk",
}


@dataclass(frozen=True)
class Leftover:
    """A tmpfs folder a killed or stopped collection left (its spool parked for
    ``recover``): RAM held until it is recovered or deleted."""

    folder: Path
    bytes: int
    #: the collection it was made for (its path then), and whether it is still there
    collection: Path | None
    found: bool
    #: that collection's state, as its manifest says (None: not found)
    state: str | None = None

    def describe(self) -> str:
        size = f"{self.bytes / 2**20:,.0f} MiB"
        whose = _WHOSE.get(self.state or "", "a collection's unrecovered spool")
        if self.collection is not None and self.found:
            return (
                f"{whose} holds {size} of memory in {self.folder}: "
                f"`kernmlops recover {self.collection}` makes its rows and frees it"
            )
        where = f"its collection was at {self.collection}" if self.collection else "unknown"
        return (f"{whose} holds {size} of memory in {self.folder} "
                f"({where}, moved or deleted since): run `kernmlops recover` on the "
                "collection where it is now, or delete the folder to free the memory")  # fmt: skip


def leftover_memory(min_age_s: float = 60.0) -> list[Leftover]:
    """The tmpfs folders of spools this user's killed or stopped collectors left, for a
    warning at the next start. Nothing is deleted here: a folder holds the only copy of its rows
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
        state = None
        if back and collection is not None:
            pid, state = collector_and_state(collection)  # one read of its manifest
            if pid is not None:
                continue
        found.append(Leftover(folder, size, collection, back, state))
    return found


def free_empty_memory(collection_id: str | None) -> Path | None:
    """Remove a collection's own tmpfs folder (found by its id only, ours, mode 0700)
    where it holds no segment: what a collector killed while it set up its spool
    leaves (the folder made, the spool's link not yet), which no spool leads back to.
    Call only where no collector of that collection runs. The folder removed, or None
    (none, not ours, or holding segments: kept)."""
    if not collection_id:
        return None
    folder = memory_folder(collection_id)
    try:
        if not _ours_alone(folder.lstat()):
            return None
        if set(os.listdir(folder)) - {OWNER_FILE}:
            return None  # segments: rows, for a spool that links to them
        with contextlib.suppress(FileNotFoundError):
            (folder / OWNER_FILE).unlink()
        folder.rmdir()
    except OSError:
        return None
    return folder


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
    """The spool's tmpfs folder, found through its collection's id only
    (:func:`memory_of`, with the id its manifest says now)."""
    return memory_of(spool_dir, collection_id_of(spool_dir.parent))


def memory_of(spool_dir: Path, collection_id: str | None) -> Path | None:
    """The spool's tmpfs folder, for a reader that has its collection's manifest: the
    link ``mem`` must name ``memory_folder(collection_id)``, a folder of ours that no
    one else can write. A link to anywhere else (planted, or a folder someone else
    made), or none without an id, is never read nor deleted."""
    link = spool_dir / MEMORY_LINK
    if collection_id is None or not link.is_symlink():
        return None
    try:
        folder = memory_folder(collection_id)
        st = folder.lstat()
    except OSError:
        return None
    if Path(os.readlink(link)) != folder or not _ours_alone(st):
        return None
    return folder


def memory_owned_elsewhere(spool_dir: Path, collection_id: str | None) -> Path | None:
    """The spool, other than ``spool_dir``, that the spool's tmpfs folder (that of
    ``collection_id``, its manifest's id: :func:`memory_of`) was made for,
    when that spool is still there and links to the folder: ``spool_dir`` is then a
    copy's (``cp -a`` keeps the link), and recovering it would take the original's
    rows away from it. A moved collection's old spool is gone: None."""
    folder = memory_of(spool_dir, collection_id)
    if folder is None:
        return None
    try:
        owner = Path((folder / OWNER_FILE).read_text().strip())
        if os.path.samefile(owner, spool_dir):
            return None
    except (OSError, ValueError):
        return None  # no owner named, or its spool is gone (moved, deleted)
    return owner if _links_to(owner / MEMORY_LINK, folder) else None


def foreign_memory(collection: Path, collection_id: str | None) -> Path | None:
    """What a collection's ``mem`` link names when that is not its spool's own folder
    (that of ``collection_id``, its manifest's id: a planted link, a folder someone
    else made): never read, but said, since rows of this collection may be there."""
    spool_dir = collection / SPOOL_DIR
    link = spool_dir / MEMORY_LINK
    if (not link.is_symlink() or not link.exists()
            or memory_of(spool_dir, collection_id) is not None):  # fmt: skip
        return None
    return Path(os.readlink(link))


def memory_lost(collection: Path) -> Path | None:
    """The tmpfs folder a collection's spool links to, when it is gone (a reboot):
    the rows of its segments cannot be recovered. None for a spool marked done."""
    link = collection / SPOOL_DIR / MEMORY_LINK
    if spool_done(collection / SPOOL_DIR):
        return None  # its rows are in parts: the folder went first in its removal
    return Path(os.readlink(link)) if link.is_symlink() and not link.exists() else None
