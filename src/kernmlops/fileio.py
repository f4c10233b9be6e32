"""Files written whole: a reader (or a collector killed mid-write) sees the old
content or the new one, never half of one."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from pathlib import Path

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


def write_atomic(path: str | Path, data: bytes | str, *, durable: bool = False) -> Path:
    """Write ``data`` (str as UTF-8) to a temporary name beside ``path``, then rename it
    over ``path``. ``durable`` also syncs the file before and the folder after the
    rename, so the new content survives a crash of the machine. The temporary file is
    removed if anything fails; the error (an OSError) is the caller's to report."""
    path = Path(path)
    refuse_special(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per writing process
    raw = data.encode("utf-8") if isinstance(data, str) else data
    # new, never through a link: root writes manifests in folders their user owns
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a killed writer's leftover, or a planted link (the link goes)
    try:
        with open(os.open(tmp, flags, 0o644), "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)  # the rename itself
    return path


def refuse_special(path: str | Path) -> None:
    """OSError (EINVAL) where ``path`` is a device, a FIFO or a socket, or a link to
    one: the rename would put a file in its place (as root, ``-o /dev/null`` would take
    /dev/null from every other program; ``/dev/stdout`` is a link to a pipe)."""
    for follow in (False, True):
        try:
            mode = os.stat(path, follow_symlinks=follow).st_mode
        except OSError:
            return  # nothing there, or a dangling link: the file is new
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
            kind = "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file"
            raise OSError(errno.EINVAL, f"it is {kind}: name a file of its own", str(path))


def fsync_path(path: str | Path) -> None:
    """Sync a file's data, or a folder's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exchange(a: str | Path, b: str | Path) -> None:
    """Swap two paths (folders or files) in one atomic step (``renameat2`` with
    ``RENAME_EXCHANGE``): a reader, or a crash, sees one or the other, never neither.

    Raises:
        OSError: the file system cannot exchange (``EINVAL``: overlayfs, NFS, ...;
            ``ENOSYS``: no ``renameat2`` in this C library or kernel), or a path is missing.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:  # a C library older than glibc 2.28
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(a))
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(a), None, str(b))
