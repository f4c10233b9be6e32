"""The sync-duet barrier of asynchronous-duet's Java agent (java-ubench-agent).

A sync-duet side that speaks that protocol names a barrier on its command line
(``syncduet_run_base: java -agentpath:... --iteration-barrier $$ ...``): the
runner replaces ``$$`` with one name shared by both sides, and before the trial
creates the barrier as the agent expects it: POSIX shared memory
``/dev/shm/java-ubench-agent<name>`` holding a process-shared
``pthread_barrier_t`` for two parties. Each side waits on it before every
iteration, so the two sides' iterations start together. The runner removes it
after the trial.

``/dev/shm`` is shared with every local user, and the agent's shm_open() takes
no folder, so the barrier cannot live in a private directory. It is made safe
the other way: its name carries 64 random bits (``new_name``), it is created
with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and mode 0600 (a planted file or link at that
name is an error, never followed or truncated), and the sticky ``/dev/shm``
keeps others from replacing it afterwards. A side opens it with
``O_NOFOLLOW`` and checks it is a regular file of the runner's (or root's).

Containers see it when they share the host's ``/dev/shm`` and IPC namespace
(the runner adds ``-v /dev/shm:/dev/shm --ipc host`` in sync-duet trials), and
the image's C library lays out ``pthread_barrier_t`` as glibc does.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import re
import secrets
import stat
from pathlib import Path

#: the agent's prefix of every barrier's shared-memory name
PREFIX = "java-ubench-agent"
PLACEHOLDER = "$$"
SHM = Path("/dev/shm")
#: sizeof(pthread_barrier_t) with glibc on 64-bit targets (20 on 32-bit ones)
_BARRIER_SIZE = 32 if ctypes.sizeof(ctypes.c_void_p) == 8 else 20
_PTHREAD_PROCESS_SHARED = 1
# shm_open() names are one path component; the shell must not split them either
_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,200}")


def new_name(stem: str) -> str:
    """``<stem>.<16 hex digits>:barrier``: a name no other user can guess ahead."""
    return f"{stem}.{secrets.token_hex(8)}:barrier"


def barrier_path(name: str) -> Path:
    """The barrier's file; ValueError for a name that is not one plain component."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"barrier name {name!r}: letters, digits and _.:+- only")
    return SHM / f"{PREFIX}{name}"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def make_barrier(name: str, parties: int = 2) -> Path:
    """Create the named barrier for ``parties`` processes; OSError if it cannot
    (FileExistsError when anything, a planted link included, holds the name)."""
    path = barrier_path(name)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise FileExistsError(f"{path} exists already (not made by this run: left alone)") from None
    try:
        os.ftruncate(fd, _BARRIER_SIZE)
        with mmap.mmap(fd, _BARRIER_SIZE) as mem:
            libc = _libc()
            attr = ctypes.create_string_buffer(16)  # pthread_barrierattr_t: 4 bytes
            barrier = (ctypes.c_char * _BARRIER_SIZE).from_buffer(mem)
            try:
                libc.pthread_barrierattr_init(attr)
                libc.pthread_barrierattr_setpshared(attr, _PTHREAD_PROCESS_SHARED)
                err = libc.pthread_barrier_init(barrier, attr, ctypes.c_uint(parties))
                libc.pthread_barrierattr_destroy(attr)
            finally:
                del barrier  # release the buffer before the map closes
            if err:
                raise OSError(err, f"pthread_barrier_init: {os.strerror(err)}")
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()  # ours: O_EXCL made it, the sticky /dev/shm kept it ours
        raise
    finally:
        os.close(fd)
    return path


def remove_barrier(name: str) -> None:
    """Remove a barrier this process made with ``make_barrier``."""
    with contextlib.suppress(FileNotFoundError):
        barrier_path(name).unlink()


def open_barrier(name: str) -> int:
    """A read-write descriptor on an existing barrier, never through a link, and
    only on a regular file of ours or root's, large enough to hold it."""
    path = barrier_path(name)
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < _BARRIER_SIZE:
            raise OSError(f"{path} is not a barrier (not a {_BARRIER_SIZE}-byte file)")
        if st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(f"{path} belongs to uid {st.st_uid}: not used")
    except OSError:
        os.close(fd)
        raise
    return fd


class BarrierClient:
    """One side's handle on a named barrier: ``wait()`` before each iteration."""

    def __init__(self, name: str) -> None:
        self._fd = open_barrier(name)
        self._mem = mmap.mmap(self._fd, _BARRIER_SIZE)
        self._barrier = (ctypes.c_char * _BARRIER_SIZE).from_buffer(self._mem)
        self._libc = _libc()

    def wait(self) -> None:
        self._libc.pthread_barrier_wait(self._barrier)

    def close(self) -> None:
        del self._barrier
        self._mem.close()
        os.close(self._fd)
