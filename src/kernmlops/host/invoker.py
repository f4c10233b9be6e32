"""The user behind ``sudo``: who gets what kernmlops writes, and who may run the benchmark.

``sudo kernmlops collect`` runs as root for BPF, but the collection is the user's: the
folders it creates and every file in them are handed to the invoking user
(``SUDO_UID``/``SUDO_GID``) once the collection is written, so that the user can read,
move and delete it. The hand-over happens after root's last write: during the run the
folders stay root's, so the user cannot swap a path root is about to write through.
It never follows a link, never changes what kernmlops did not create (a folder that
existed before, a file owned by someone else) and never a file with a second link.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kernmlops.errors import ConfigError

__all__ = [
    "Invoker",
    "created_by_mkdir",
    "give_fd",
    "hand_over",
    "handed_over",
    "invoker",
]


@dataclass(frozen=True)
class Invoker:
    """The user who ran kernmlops through sudo."""

    uid: int
    gid: int
    name: str
    home: str
    #: supplementary groups (with gid), as a login of the user has them
    groups: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """What a process of the user expects of its environment (sudo gives root's)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def invoker(environ: dict[str, str] | None = None) -> Invoker | None:
    """The invoking user while running as root under sudo; None otherwise (not root,
    no SUDO_UID, or sudo from root itself)."""
    env = os.environ if environ is None else environ
    if os.geteuid() != 0 or "SUDO_UID" not in env:
        return None
    try:
        uid = int(env["SUDO_UID"])
        gid = int(env.get("SUDO_GID", ""))
    except ValueError:
        raise ConfigError(
            f"SUDO_UID/SUDO_GID are not numbers ({env.get('SUDO_UID')!r}, "
            f"{env.get('SUDO_GID')!r}): unset them, or run through sudo"
        ) from None
    if uid == 0:
        return None
    try:
        entry = pwd.getpwuid(uid)
        name, home = entry.pw_name, entry.pw_dir
        groups = tuple(os.getgrouplist(name, gid))
    except KeyError:  # a uid without a passwd entry: its own id, no other group
        name, home, groups = str(uid), "/", (gid,)
    return Invoker(uid, gid, name, home, groups)


def created_by_mkdir(path: Path) -> list[Path]:
    """The folders ``path.mkdir(parents=True)`` would create, outermost first."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists() or folder.is_symlink():
            break
        missing.append(folder)
    return missing[::-1]


_AT_EMPTY_PATH = 0x1000  # linux/fcntl.h
_AT_SYMLINK_NOFOLLOW = 0x100


def _fchown(fd: int, who: Invoker) -> None:
    """chown what an O_PATH descriptor holds (a link itself too): the entry checked is
    the entry changed, whatever is renamed meanwhile."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    flags = _AT_EMPTY_PATH | _AT_SYMLINK_NOFOLLOW
    if libc.fchownat(fd, b"", who.uid, who.gid, flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def give_fd(fd: int, who: Invoker) -> None:
    """What ``fd`` holds to ``who``, if it is root's and ours to give: a folder, a link
    itself, or a regular file with one link (not a hard link made to another file)."""
    st = os.fstat(fd)
    if st.st_uid != 0:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink != 1:
        return
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
        _fchown(fd, who)


def _give(name: str | Path, who: Invoker, dir_fd: int | None = None) -> None:
    """One entry (``name`` in ``dir_fd``) to ``who``, never through a link."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    try:
        give_fd(fd, who)
    finally:
        os.close(fd)


def hand_over(tree: Path | int, who: Invoker | None, folders: Iterable[Path | int] = ()) -> None:
    """Give ``who`` everything in ``tree`` (inside first, the folder last) and each of
    ``folders`` (folders kernmlops created above it: those only, not their other
    contents). ``tree`` and ``folders`` may be descriptors of folders held open
    (kernmlops.host.pinned): then no path is looked up again. Nothing without an
    invoker; a file that vanished meanwhile is skipped."""
    if who is None:
        return
    if isinstance(tree, int):
        top = os.dup(tree)
    else:
        try:
            top = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (NotADirectoryError, FileNotFoundError):  # a file, a link, or nothing
            top = -1
            _give(tree, who)
    if top >= 0:
        try:
            # each folder opened below the last without following a link (fwalk)
            for _, dirs, files, dir_fd in os.fwalk(
                ".", dir_fd=top, topdown=False, follow_symlinks=False
            ):
                for name in [*files, *dirs]:
                    _give(name, who, dir_fd)
            give_fd(top, who)
        finally:
            os.close(top)
    for folder in reversed(list(folders)):
        if isinstance(folder, int):
            give_fd(folder, who)
        else:
            _give(folder, who)


def _key(st: os.stat_result) -> tuple[int, ...]:
    """What tells an entry that was there from a new one: its inode, and, as a freed
    inode is soon given again (a planted link removed, a file made in its place), its
    type, owner and, for a file, its change time (a folder's changes as entries come)."""
    kind = stat.S_IFMT(st.st_mode)
    return st.st_dev, st.st_ino, kind, st.st_uid, 0 if kind == stat.S_IFDIR else st.st_ctime_ns


def _inodes(path: Path) -> set[tuple[int, ...]]:
    """(st_dev, st_ino) of ``path`` and of everything under it, links themselves."""
    found: set[tuple[int, ...]] = set()
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        found.add(_key(st))
        if stat.S_ISDIR(st.st_mode):
            for top, dirs, files in os.walk(path):
                for name in [*dirs, *files]:
                    with contextlib.suppress(OSError):
                        st = os.lstat(Path(top) / name)
                        found.add(_key(st))
    return found


@contextlib.contextmanager
def handed_over(path: Path) -> Iterator[None]:
    """Under sudo, what the block writes at ``path`` (a file, or a folder and what is
    in it) and the folders made above it are the invoking user's once it is written:
    new entries only, never what was there before (a folder of root's that already
    held files keeps them root's). Nothing without sudo."""
    who = invoker()
    if who is None:
        yield
        return
    made = created_by_mkdir(path)
    before = _inodes(path)
    try:
        yield
    finally:
        for entry in sorted(_new(path, before), key=lambda p: -len(p.parts)):
            _give(entry, who)  # inside first; never through a link
        for folder in reversed(made):
            _give(folder, who)


def _new(path: Path, before: set[tuple[int, ...]]) -> list[Path]:
    found = []
    with contextlib.suppress(OSError):
        entries = [path]
        if path.is_dir() and not path.is_symlink():
            for top, dirs, files in os.walk(path):
                entries += [Path(top) / name for name in [*dirs, *files]]
        for entry in entries:
            with contextlib.suppress(OSError):
                st = os.lstat(entry)
                if _key(st) not in before:
                    found.append(entry)
    return found


def _inodes_held(top: int) -> set[tuple[int, ...]]:
    """(st_dev, st_ino) of the held folder ``top`` and of everything under it, each
    folder opened below the last without following a link."""
    st = os.fstat(top)
    found = {_key(st)}
    for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        for name in [*dirs, *files]:
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                found.add(_key(st))
    return found
