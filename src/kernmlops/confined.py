"""Paths that a folder's own files name, kept inside that folder.

A results folder (a duet run's ``duet-run.json``, a collection's manifest)
names other files in it. kernmlops often reads such folders as root, and a
folder may come from someone else: a name in it is a relative path that stays
in the folder once every link is followed (no absolute path, no ``..``, no
link out), and a file is read only up to a size limit, with one clear line
for anything else. What is read is checked again through the descriptor
actually opened (``/proc/self/fd``), so a link swapped in after the check is
refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from kernmlops.errors import CollectionError

MIB = 1 << 20


class UnsafePathError(CollectionError):
    """A folder names a path outside itself, or a file too large to read."""


def human_size(n: int) -> str:
    """1536 -> '1.5 KiB' (binary units, as limits are given)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _inside(root: str, target: str) -> bool:
    return target == root or target.startswith(root.rstrip("/") + "/")


def confined(folder: str | Path, name: object, *, what: str = "file") -> Path:
    """``folder/name`` with every link followed, or UnsafePathError when ``name``
    is not a relative path that stays inside ``folder``."""
    shown = repr(name)[:200]
    if not isinstance(name, str) or not name or "\0" in name:
        raise UnsafePathError(f"{folder}: {what} {shown} is not a file name: not read")
    parts = PurePosixPath(name)
    only = "not read (only files inside the folder are)"
    if parts.is_absolute():
        raise UnsafePathError(f"{folder}: {what} {shown} is an absolute path: {only}")
    if ".." in parts.parts:
        raise UnsafePathError(f"{folder}: {what} {shown} climbs out with '..': {only}")
    root = os.path.realpath(folder)
    target = os.path.realpath(os.path.join(root, name))
    if not _inside(root, target):
        raise UnsafePathError(
            f"{folder}: {what} {shown} is a link out of the folder (to {target}): not read"
        )
    return Path(target)


def check_size(path: str | Path, limit: int, *, what: str = "file", hint: str = "") -> int:
    """The size of ``path``; UnsafePathError when it is over ``limit`` bytes."""
    size = os.stat(path).st_size
    if size > limit:
        raise UnsafePathError(
            f"{path}: {what} of {human_size(size)}, over the {human_size(limit)} limit: "
            f"not read{hint}"
        )
    return size


def read_confined(
    folder: str | Path, name: object, limit: int, *, what: str = "file", hint: str = ""
) -> bytes:
    """The bytes of regular file ``folder/name`` (see ``confined``), at most ``limit``.

    OSError when it cannot be opened; UnsafePathError for a path out of the
    folder, something that is not a regular file, or a file over the limit.
    """
    path = confined(folder, name, what=what)
    # no O_NOFOLLOW needed on the last name: what matters is what was opened
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
        if not _inside(os.path.realpath(folder), opened):  # a link swapped in since
            raise UnsafePathError(
                f"{folder}: {what} {name!r} is a link out of the folder (to {opened}): not read"
            )
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path}: {what} is not a regular file: not read")
        if st.st_size > limit:
            raise UnsafePathError(
                f"{path}: {what} of {human_size(st.st_size)}, over the {human_size(limit)} "
                f"limit: not read{hint}"
            )
        chunks, left = [], limit + 1
        while left > 0:  # a file that grows past the limit while read is refused too
            chunk = os.read(fd, min(left, MIB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise UnsafePathError(
                f"{path}: {what} over the {human_size(limit)} limit: not read{hint}"
            )
        return data
    finally:
        os.close(fd)
