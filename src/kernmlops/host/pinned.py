"""Files and folders root reads and writes where another user could change them.

``sudo kernmlops collect -o ~/data`` writes, as root, below folders the user owns: the
user could rename one of them away and put a link in its place between two of root's
steps, and root's next write would land where the link points (``/etc`` ...). A root
cron job reading a user's folder meets the same links. Without root there is no one to
guard against: links are followed as usual. Which function to reach for:

Holding a folder (to write in it, or to read a tree a user may change)
    :func:`pin` opens a path one component at a time from ``/`` with ``O_NOFOLLOW`` and
    holds the last folder open (:class:`Pinned`): every later read and write goes
    through that descriptor (:attr:`Pinned.io`, a ``/proc/self/fd/N`` path, see
    :func:`fd_path`), whatever is done to the path meanwhile. ``create=True`` makes
    what is missing (as root's, 0755). Under sudo (``invoker_uid``) a folder of a third
    user is refused: they could swap it, and the files would not be the invoker's.
    :func:`pin_in` holds a folder found inside a held one, by the same rules.
    :func:`handed_over_held` gives what a block wrote in a held folder (and the folders
    ``pin`` made for it) to the sudo user, once written.

Making a fresh output folder or file
    ``pin(path, create=True, fresh=True)``: the last folder is made now, and is the one
    made (ours and empty), never one planted there. Inside a held folder,
    :func:`subfolder` (``fresh=True``: the same check) and :func:`create_new` (a new
    file, ``O_EXCL|O_NOFOLLOW``: a leftover or a planted link at the name is removed,
    never written through).

Reading a plain file another user may control
    :func:`read_plain` (all of it, or at most ``limit`` bytes) and
    :func:`open_plain_file` (a descriptor, to read a piece at a time): never through a
    link, a regular file only, and as root no hard link to another user's file.
    :func:`read_bounded` is the bounded read itself, of a plain file already open: a
    file over the limit is not read, one that grows past it is refused
    (:class:`TooBig`, with its size for callers that word their own message).
    :func:`open_regular` is for a path the user named themselves: links followed as
    they ask, but a plain file only, opened without blocking (a FIFO at the name would
    wait for a writer for ever).

Following links a user planted
    Where a link in a user's folder must be followed (a collection folder of theirs
    linked to where its user keeps it), :func:`may_follow` is the rule (the kernel's
    fs.protected_symlinks, sharpened): a link of root's where only root can change the
    folder, or under sudo one of root's or the invoker's in a folder no third user
    can change, followed with the invoker's rights (every folder past it one they
    could enter, the file one they could read). :func:`pin` applies it to each
    component; :func:`open_plain` to a name in a held folder; :func:`open_named` to a
    path named in a place a user may change (its folders walked as ``pin`` walks
    them, then ``open_plain``).

All of them share one walk (``_walk``, with ``_InvokerChecks`` for the sudo user's
rights): a refusal is :class:`UnsafePath`, another failure an OutputError or an
OSError, each worded for one line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from kernmlops.errors import OutputError
from kernmlops.errors import why_not_written as _why
from kernmlops.host.invoker import _give, _inodes_held, _key, give_fd, invoker

__all__ = [
    "Pinned",
    "TooBig",
    "UnsafePath",
    "create_new",
    "fd_path",
    "handed_over_held",
    "may_follow",
    "open_plain",
    "open_plain_file",
    "open_regular",
    "pin",
    "pin_in",
    "read_plain",
    "subfolder",
]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit (ELOOP)


class UnsafePath(OutputError):
    """A path root will not write through: a link another user could have planted, or a
    folder of another user."""


def fd_path(fd: int) -> Path:
    """A path that names what ``fd`` holds, whatever is renamed meanwhile: the kernel
    resolves ``/proc/self/fd/N`` to the open file itself (for any library that takes
    a path, such as pyarrow's writer)."""
    return Path(f"/proc/self/fd/{fd}")


# -- who may be followed, and the invoker's rights past a link of theirs ---------------


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _others_write(st: os.stat_result) -> bool:
    """Whether a user other than root can change the entries of folder ``st``: it is
    a user's, or open to its group or all (sticky folders such as /tmp excepted: there
    no one renames an entry of another)."""
    if st.st_uid != 0:
        return True
    return _open_to_others(st)


def _open_to_others(st: os.stat_result) -> bool:
    """Folder ``st`` lets its group or everyone rename entries (a sticky one does not)."""
    return bool(st.st_mode & 0o022) and not st.st_mode & stat.S_ISVTX


def may_follow(link: os.stat_result, folder: os.stat_result, invoker_uid: int | None) -> bool:
    """Whether root may follow the link ``link`` found in ``folder`` (the kernel's
    fs.protected_symlinks, sharpened): one of root's where only root can change the
    folder (no one else could have made it), or, under sudo, one of root's or the
    invoker's in a folder of root's or theirs that no third user can change (the
    invoker could as well have named its target: followed with their rights, see
    :func:`pin`). Without root any link is followed."""
    if os.geteuid() != 0:
        return True
    if link.st_uid == 0 and not _others_write(folder):
        return True
    return (
        invoker_uid is not None
        and link.st_uid in (0, invoker_uid)
        and folder.st_uid in (0, invoker_uid)
        and not _open_to_others(folder)
    )


@dataclass(frozen=True)
class _Rights:
    """What the invoker may do where root follows their link: their uid and groups."""

    uid: int
    groups: frozenset[int]

    @classmethod
    def of(cls, uid: int) -> _Rights:
        try:
            entry = pwd.getpwuid(uid)
            return cls(uid, frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid)))
        except KeyError:  # no passwd entry: no group to count on
            return cls(uid, frozenset())

    def may(self, st: os.stat_result, bits: int) -> bool:
        """Mode bits ``bits`` (4 read, 2 write, 1 enter) are the user's on ``st``
        (ACLs not counted: they are refused what only an ACL would grant them)."""
        if st.st_uid == self.uid:
            mode = st.st_mode >> 6
        elif st.st_gid in self.groups:
            mode = st.st_mode >> 3
        else:
            mode = st.st_mode
        return mode & bits == bits


def _followed_for_invoker(link: os.stat_result, folder: os.stat_result) -> bool:
    """As root, whether following ``link`` (found in ``folder``, and allowed by
    :func:`may_follow`) is on the invoker's behalf: not root's own link in a folder only
    root can change. Past it, the walk goes only where the invoker could."""
    return os.geteuid() == 0 and (link.st_uid != 0 or _others_write(folder))


@dataclass
class _InvokerChecks:
    """What a walk checks for the invoking sudo user (``uid``; None: no sudo), as root:
    no folder of a third user on the way, links followed only as :func:`may_follow`
    allows and, once one of theirs was followed (``via``, worded for messages), every
    folder past it checked with their rights (``rights``, None when not root under
    sudo). ``path`` and ``action`` word the refusals."""

    path: Path
    action: str
    uid: int | None
    via: str | None = None
    rights: _Rights | None = None

    @classmethod
    def of(cls, path: Path, action: str, uid: int | None, via: str | None) -> _InvokerChecks:
        rights = _Rights.of(uid) if os.geteuid() == 0 and uid is not None else None
        return cls(path, action, uid, via, rights)

    @property
    def _write(self) -> bool:
        return self.action != "read"

    def _past_link(self) -> _Rights | None:
        """The invoker's rights once the walk is past a link of theirs (as root under
        sudo), where they count; None before."""
        return self.rights if self.via else None

    def _refuse(self, here: Path, verb: str) -> UnsafePath:
        who = _user(self.uid) if self.uid is not None else "its owner"
        return UnsafePath(
            f"cannot {self.action} {self.path}: {self.via}, to {here}, which {who} could "
            f"not {verb}: as root, kernmlops follows a link of {who}'s only where {who} "
            "could go"
        )

    def opened(self, st: os.stat_result, here: Path, made: bool) -> None:
        """Folder ``here`` (``st``) was opened on the way (``made``: by this walk)."""
        if os.geteuid() != 0 or self.uid is None:
            return
        if st.st_uid not in (0, self.uid) and (self._write or self.via):
            raise UnsafePath(
                f"cannot {self.action} {self.path}: {here} belongs to {_user(st.st_uid)}, "
                f"neither to you ({_user(self.uid)}) nor to root: as root, kernmlops "
                f"{'writes in' if self._write else 'follows your link into'} no folder "
                "another user can change"
            )
        rights = self._past_link()
        if rights is not None and not made:
            if _open_to_others(st):
                raise self._refuse(here, "keep from other users (it is open to them)")
            if not rights.may(st, 1):
                raise self._refuse(here, "enter")

    def may_make_in(self, parent: int, where: Path, mine: bool) -> None:
        """A folder is to be made in ``parent`` (``where``; ``mine``: made by this walk,
        where the invoker's right was checked above it)."""
        rights = self._past_link()
        if rights is not None and not mine and not rights.may(os.fstat(parent), 3):
            raise self._refuse(where, "write in") from None

    def follow(self, link: os.stat_result, folder: os.stat_result, here: Path) -> None:
        """The link ``here`` (``link``, in ``folder``) is to be followed: refused unless
        :func:`may_follow`; one followed for the invoker starts their checks."""
        if not may_follow(link, folder, self.uid):
            raise UnsafePath(
                f"cannot {self.action} {self.path}: {here} is a link in a folder "
                f"{_user(folder.st_uid)} can change; root does not follow "
                f"it: name the folder it leads to ({os.path.realpath(here)})"
            ) from None
        if self.via is None and _followed_for_invoker(link, folder):
            self.via = f"{here} is a link in a folder {_user(folder.st_uid)} can change"

    def last(self, fd: int, here: Path, made: bool) -> None:
        """The walk's last folder ``here`` (``fd``): past a link of the invoker's, one
        they may write in (read, to read), unless this walk made it."""
        rights = self._past_link()
        want = 3 if self._write else 5  # write in it, or read it (and enter it, both)
        if rights is not None and not made and not rights.may(os.fstat(fd), want):
            raise self._refuse(here, "write in" if self._write else "read")


# -- holding a folder: the walk --------------------------------------------------------


@dataclass
class Pinned:
    """A folder held open. ``path`` is as it was named (for messages, the manifest),
    ``io`` the path every read and write goes through. ``created``: descriptors of the
    folders :func:`pin` made, outermost first (to be handed over)."""

    path: Path
    fd: int
    owner: int
    created: list[int] = field(default_factory=list)

    @property
    def io(self) -> Path:
        return fd_path(self.fd)

    def close(self) -> None:
        for fd in [*self.created, self.fd]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.created = []


def pin(path: Path, *, create: bool = False, fresh: bool = False, invoker_uid: int | None = None,
        what: str = "the output folder", action: str = "write to") -> Pinned:  # fmt: skip
    """Open ``path`` as a folder, one component at a time, and hold it.

    ``create``: make the folders that are missing (0755, as root's). ``fresh``: the
    last one must be made now (nothing anyone planted). ``invoker_uid``: under sudo,
    the invoking user: a folder owned by a user other than root and this one is
    refused (``action`` ``"read"``: only past a link of theirs), and their own links
    are followed as they would follow them (:func:`may_follow`): every folder after
    one must be root's or theirs, open to no third user, one they may enter, and the
    last one they may write in (read, for ``"read"``). ``action`` words the refusals.
    A ``/proc/<pid>/fd/N`` link (:func:`fd_path`) is followed by the kernel to the
    open folder itself, never by the name it shows. A failure removes the empty
    folders it made (or, not empty, gives them to the invoker): none is left root's
    in a user's folder. The error's ``reason`` is its cause alone (``"a file is in
    the way, not a folder"``, an OSError's strerror) for callers that word their own
    message.

    Raises:
        UnsafePath: a component is a link in a folder a user other than root can
            change (while running as root), or a folder of another user.
        OutputError: a component is missing (without ``create``), is a file, or
            cannot be made or opened.
    """
    path = Path(os.path.abspath(path))
    return _walk(path, list(path.parts[1:]), os.open("/", _DIR), Path("/"), create=create,
                 fresh=fresh, invoker_uid=invoker_uid, what=what, action=action)  # fmt: skip


def _walk(path: Path, todo: list[str], start: int, start_path: Path, *, create: bool = False,
          fresh: bool = False, invoker_uid: int | None = None, what: str = "the output folder",
          action: str = "write to", via: str | None = None) -> Pinned:  # fmt: skip
    """:func:`pin`'s walk of the names ``todo`` from the folder ``start`` (a descriptor
    it owns, named ``start_path``). ``via``: the walk already went through a link of
    the invoker's (so worded)."""
    checks = _InvokerChecks.of(path, action, invoker_uid, via)
    try:
        proc_dev = os.stat("/proc").st_dev
    except OSError:
        proc_dev = -1
    # (fd, made by us, what it is called) from the start down; '..' of a link's target
    # pops one, down to ``floor`` (the last "/" pushed, or a folder reached by its
    # descriptor: its '..' is opened, the real parent, not the one walked through)
    stack: list[tuple[int, bool, Path]] = [(start, False, start_path)]
    floor, floor_root = 0, start_path == Path("/")
    popped: list[tuple[int, int, Path]] = []  # made, then left by '..': (fd, parent, name)
    links = 0

    def accept(fd: int, made: bool, here: Path) -> None:
        """Each folder opened is held on the stack (so a refusal closes it), then checked."""
        st = os.fstat(fd)
        stack.append((fd, made and st.st_uid == os.geteuid(), here))
        checks.opened(st, here, made)

    try:
        while todo:
            name = todo.pop(0)
            parent, _, where = stack[-1]
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) > floor + 1:
                    fd, made, where = stack.pop()
                    if made:  # left behind, still ours: handed over or removed with the rest
                        popped.append((fd, os.dup(stack[-1][0]), where))
                    else:
                        os.close(fd)
                elif not floor_root:  # above a folder held by its descriptor: its real parent
                    fd = os.open("..", _DIR, dir_fd=parent)
                    stack.pop()
                    os.close(parent)
                    accept(fd, False, where.parent)
                continue
            here = where / name
            made = False
            try:
                fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
                if fresh and not todo:
                    os.close(fd)
                    raise _err(f"cannot {action} {path}: {here} exists", "it exists")
            except FileNotFoundError:
                if not create:
                    raise _err(
                        f"{path}: no such folder ({here} is missing)", "no such folder"
                    ) from None
                checks.may_make_in(parent, where, mine=stack[-1][1])
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                    made = True
                except FileExistsError:  # made meanwhile: opened as whatever it is
                    if fresh and not todo:
                        raise _err(f"cannot {action} {path}: {here} exists", "it exists") from None
                except OSError as err:
                    raise _err(f"cannot create {what} {path}: {_why(err)}", err.strerror) from None
                fd = _open_dir(name, parent, here, path, action)
                if made and fresh and not todo and _not_the_one_made(fd):
                    os.close(fd)
                    swapped = f"cannot {action} {path}: {here} was replaced as it was made"
                    raise UnsafePath(swapped) from None
            except NotADirectoryError:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise _err(
                        f"cannot {action} {path}: {here} is a file, not a folder",
                        "a file is in the way, not a folder",
                    ) from None
                links += 1
                folder = os.fstat(parent)
                checks.follow(st, folder, here)
                if links > _MAX_LINKS:
                    raise _err(
                        f"cannot {action} {path}: too many links", "too many links"
                    ) from None
                if folder.st_dev == proc_dev:
                    # /proc/self, /proc/<pid>/fd/N: the kernel goes to what is open; the
                    # name readlink shows may have been given to another folder meanwhile
                    try:
                        fd = os.open(name, _DIR, dir_fd=parent)
                    except OSError as err:
                        raise _err(
                            f"cannot open {what} {path}: {_why(err)}", err.strerror
                        ) from None
                    accept(fd, False, here)
                    floor, floor_root = len(stack) - 1, False
                    continue
                target = os.readlink(name, dir_fd=parent)
                todo = [*Path(target).parts, *todo]
                if target.startswith("/"):  # from / again
                    todo.pop(0)
                    stack.append((os.open("/", _DIR), False, Path("/")))
                    floor, floor_root = len(stack) - 1, True
                continue
            except OSError as err:
                raise _err(f"cannot open {what} {path}: {_why(err)}", err.strerror) from None
            accept(fd, made, here)
        fd, made, here = stack[-1]
        checks.last(fd, here, made)  # refused: still on the stack, closed below
        stack.pop()
        if made and os.fstat(fd).st_mode & 0o022:  # umask 0: no one else may write in it
            os.fchmod(fd, 0o755)
        made_above = [f for f, _, _ in popped] + [f for f, m, _ in stack if m]
        pinned = Pinned(path, fd, os.fstat(fd).st_uid, made_above)
        if made:
            pinned.created.append(os.dup(fd))
        for f, m, _ in stack:
            if not m:
                os.close(f)
        for _, parent, _ in popped:
            os.close(parent)
        return pinned
    except BaseException:
        made_here = [(f, stack[i - 1][0], w) for i, (f, m, w) in enumerate(stack) if m]
        _undo([*popped, *made_here])
        for f, _, _ in stack:
            with contextlib.suppress(OSError):
                os.close(f)
        for f, parent, _ in popped:
            for x in (f, parent):
                with contextlib.suppress(OSError):
                    os.close(x)
        raise


def _undo(made: list[tuple[int, int, Path]]) -> None:
    """After a failure, the folders :func:`pin` made (outermost first): each removed,
    innermost first, if it is still the one made there and empty; else given to the
    invoker under sudo (never left root's in a user's folder)."""
    who = invoker()
    for fd, parent, where in reversed(made):
        try:
            st = os.fstat(fd)
            now = os.stat(where.name, dir_fd=parent, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise FileNotFoundError  # moved meanwhile: not removed by name
            os.rmdir(where.name, dir_fd=parent)
        except OSError:
            if who is not None:
                with contextlib.suppress(OSError):
                    give_fd(fd, who)


def _err(message: str, reason: str | None, cls: type[OutputError] = OutputError) -> OutputError:
    err = cls(message)
    err.reason = reason or message  # type: ignore[attr-defined]
    return err


def _open_dir(name: str, parent: int, here: Path, path: Path, action: str) -> int:
    try:
        return os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
    except NotADirectoryError:  # swapped for a link or a file right after it was made
        raise UnsafePath(f"cannot {action} {path}: {here} was replaced as it was made") from None


def _not_the_one_made(fd: int) -> bool:
    """Whether a folder opened just after its mkdir is not ours and empty: where a user
    may write in its parent, they may rename theirs in between, with links at the
    names to be written."""
    return os.fstat(fd).st_uid != os.geteuid() or bool(os.listdir(fd))


# -- making new folders and files in a held folder -------------------------------------


def subfolder(folder: Path, name: str, *, create: bool = True, fresh: bool = False) -> int:
    """A folder in the held ``folder`` (an :attr:`Pinned.io` path), made if missing,
    opened without following a link; its descriptor. ``fresh``: made now, and the
    folder opened is the one made (ours and empty): in a folder a user may write in,
    they may swap one of theirs in between the mkdir and the open, with links at the
    names to be written.

    Raises:
        UnsafePath: ``name`` is a link or a file there, or (``fresh``) was replaced as
            it was made.
        FileExistsError: (``fresh``) it was there already.
    """
    if create or fresh:
        try:
            os.mkdir(folder / name, 0o755)
        except FileExistsError:
            if fresh:
                raise
    try:
        fd = os.open(folder / name, _DIR | os.O_NOFOLLOW)
    except NotADirectoryError:
        raise UnsafePath(f"{name} is a link or a file, not a folder: not written through") from None
    if fresh and _not_the_one_made(fd):
        os.close(fd)
        raise UnsafePath(f"{name} was replaced as it was made: not written in")
    return fd


def create_new(path: Path, mode: int = 0o644) -> int:
    """A new, empty file at ``path`` opened for writing: never an existing one, never
    through a link (what was there under that name, a leftover or a planted link, is
    removed first: only the name goes, never what a link names)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, mode)


# -- reading a plain file another user may control -------------------------------------


def read_plain(path: Path, *, owner: int = -1, limit: int | None = None) -> bytes:
    """A file's bytes, read from a folder a user may own: never through a link, only a
    regular file and, as root, never a file with a second link unless it is ``owner``'s
    (a hard link to a file of root's, where fs.protected_hardlinks is off). ``limit``:
    at most that many bytes (a file of a few KB made huge, even sparse, would be read
    whole into memory), growing past it while read or not.

    Raises:
        OSError: ELOOP for a link, EINVAL for anything else that is not a plain file,
            EFBIG for a file over ``limit`` (its strerror names the limit).
    """
    fd = open_plain_file(path, owner=owner)
    with os.fdopen(fd, "rb") as f:
        return f.read() if limit is None else read_bounded(f, limit, path)


class TooBig(OSError):
    """EFBIG: a file over a read's limit, not read. ``size``: its size as it was found
    (None: not known, one that grew past the limit while it was read), for a caller
    that words its own message."""

    size: int | None = None


def read_bounded(f: BinaryIO, limit: int, path: Path, *, of_limit: str = "limit") -> bytes:
    """The bytes of the open plain file ``f`` (``path``, for the error), at most
    ``limit``: one over it is never read (a small file made huge, even sparse), nor
    one that grows past it while read.

    Raises:
        TooBig: (an OSError, EFBIG) its strerror "<size>, over the <limit> <of_limit>:
            not read".
    """
    from kernmlops.confined import human_size

    size = os.fstat(f.fileno()).st_size
    data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        shown = human_size(max(size, len(data)))
        why = f"{shown}, over the {human_size(limit)} {of_limit}: not read"
        err = TooBig(errno.EFBIG, why, str(path))
        err.size = size if size > limit else None
        raise err
    return data


def open_regular(path: Path, *, follow: bool = True) -> int:
    """A descriptor of ``path`` (read-only), a plain file only, opened without blocking:
    a FIFO put at its name would wait for a writer for ever. ``follow``: a link to one
    is followed (else ELOOP).

    Raises:
        OSError: EINVAL for what is not a plain file (a folder, a FIFO, a device).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a plain file", str(path))
    return fd


def open_plain_file(path: Path, *, owner: int = -1) -> int:
    """A descriptor of ``path`` (read-only), checked as :func:`read_plain` checks it,
    for a file to be read a piece at a time.

    Raises:
        OSError: ELOOP for a link, EINVAL for anything else that is not a plain file,
            EPERM for a hard link to another file (as root).
    """
    fd = open_regular(path, follow=False)
    try:
        st = os.fstat(fd)
        if os.geteuid() == 0 and st.st_nlink != 1 and st.st_uid != owner:
            raise OSError(errno.EPERM, "a hard link to another file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- following a link in a held folder, or in a path named in a user's place -----------


def pin_in(folder: int, name: str, shown: Path, *, invoker_uid: int | None = None,
           action: str = "read", what: str = "the folder") -> Pinned:  # fmt: skip
    """The folder ``name`` in the held ``folder`` (``shown``: its path, for messages),
    held: a link there followed only as :func:`pin` follows one (:func:`may_follow`,
    then the invoker's rights)."""
    return _walk(shown, [name], os.dup(folder), shown.parent, invoker_uid=invoker_uid,
                 action=action, what=what)  # fmt: skip


def open_plain(folder: int, name: str, shown: Path, *, invoker_uid: int | None = None) -> int:
    """``name`` in the held ``folder`` opened for reading (``shown``: its path, for
    messages). As root, a link there is followed only where :func:`may_follow` allows,
    its target's folders walked as :func:`pin` walks them; through a link of the
    invoker's, only to a file of root's or theirs that they may read. Not a plain
    file: the caller checks (:func:`os.fstat`).

    Raises:
        OSError: ELOOP for a link not followed (or a link to a link), EACCES for a
            file the invoker could not read through their link.
        OutputError: the folders the link leads through are refused (see :func:`pin`).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if os.geteuid() != 0:  # no one to guard against
        return os.open(name, flags, dir_fd=folder)
    try:
        return os.open(name, flags | os.O_NOFOLLOW, dir_fd=folder)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        link = os.stat(name, dir_fd=folder, follow_symlinks=False)
        held = os.fstat(folder)
        if not stat.S_ISLNK(link.st_mode) or not may_follow(link, held, invoker_uid):
            raise
    target = os.readlink(name, dir_fd=folder)
    head, base = os.path.split(target)
    if base in ("", ".", ".."):
        raise OSError(errno.ELOOP, "a link to a folder", str(shown))
    via = None
    if _followed_for_invoker(link, held):
        via = f"{shown} is a link in a folder {_user(held.st_uid)} can change"
    if head.startswith("/"):
        start, start_path, todo = os.open("/", _DIR), Path("/"), list(Path(head).parts[1:])
    else:  # from the folder itself: its '..' is its real parent
        start, start_path, todo = os.dup(folder), shown.parent, list(Path(head).parts)
    there = _walk(Path(os.path.normpath(shown.parent / target)), todo, start, start_path,
                  invoker_uid=invoker_uid, what="the file", action="read", via=via)  # fmt: skip
    try:
        fd = os.open(base, flags | os.O_NOFOLLOW, dir_fd=there.fd)  # one link, not a chain
    finally:
        there.close()
    if via is not None and invoker_uid is not None:
        st = os.fstat(fd)
        if st.st_uid not in (0, invoker_uid) or not _Rights.of(invoker_uid).may(st, 4):
            os.close(fd)
            raise OSError(errno.EACCES, f"a link to a file {_user(invoker_uid)} could not read")
    return fd


def open_named(path: Path, *, what: str = "the file") -> int:
    """A descriptor of the plain file ``path`` (read-only), read as the held folders
    read it: its folders walked as :func:`pin` walks them for reading, a link followed
    only as :func:`open_plain` follows one (under sudo, the invoker's own with their
    rights; never another user's where they can change the folder). For a file named
    in a place a user may change, read as root.

    Raises:
        OSError: ELOOP for a link not followed, EINVAL for what is not a plain file.
        OutputError: a folder on the way is refused (see :func:`pin`).
    """
    who = invoker()
    uid = who.uid if who else None
    held = pin(path.parent, invoker_uid=uid, what=what, action="read")
    try:
        fd = open_plain(held.fd, path.name, path, invoker_uid=uid)
    finally:
        held.close()
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a plain file", str(path))
    return fd


# -- under sudo, what was written is the invoker's -------------------------------------


@contextlib.contextmanager
def handed_over_held(folder: Pinned) -> Iterator[None]:
    """Under sudo, what the block writes in the held ``folder`` (kernmlops.host.pinned)
    and the folders :func:`~kernmlops.host.pinned.pin` made for it are the invoking
    user's once written: new entries only (a file of root's that was there stays
    root's), every one reached through the held descriptor, never by its path again.
    Nothing without sudo."""
    who = invoker()
    if who is None:
        yield
        return
    before = _inodes_held(folder.fd)
    try:
        yield
    finally:
        for _, dirs, files, dir_fd in os.fwalk(
            ".", dir_fd=folder.fd, topdown=False, follow_symlinks=False
        ):
            for name in [*files, *dirs]:
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if _key(st) not in before:
                        _give(name, who, dir_fd)
        for fd in reversed(folder.created):  # the folder itself too, if pin made it
            with contextlib.suppress(OSError):
                give_fd(fd, who)
