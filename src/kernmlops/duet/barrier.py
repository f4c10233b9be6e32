"""The sync-duet barrier of asynchronous-duet's Java agent (java-ubench-agent).

A sync-duet side that speaks that protocol names a barrier on its command line
(``syncduet_run_base: java -agentpath:... --iteration-barrier $$ ...``): the
runner replaces ``$$`` with one name shared by both sides, and before the trial
creates the barrier as the agent expects it: POSIX shared memory
``/dev/shm/java-ubench-agent<name>`` holding a process-shared
``pthread_barrier_t`` for two parties. Each side waits on it before every
iteration, so the two sides' iterations start together. The runner removes it
after the trial.

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
from pathlib import Path

#: the agent's prefix of every barrier's shared-memory name
PREFIX = "java-ubench-agent"
PLACEHOLDER = "$$"
SHM = Path("/dev/shm")
#: sizeof(pthread_barrier_t) with glibc on 64-bit targets (20 on 32-bit ones)
_BARRIER_SIZE = 32 if ctypes.sizeof(ctypes.c_void_p) == 8 else 20
_PTHREAD_PROCESS_SHARED = 1


def barrier_path(name: str) -> Path:
    return SHM / f"{PREFIX}{name}"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def make_barrier(name: str, parties: int = 2) -> Path:
    """Create the named barrier for ``parties`` processes; OSError if it cannot."""
    path = barrier_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
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
            path.unlink()
        raise
    finally:
        os.close(fd)
    return path


def remove_barrier(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        barrier_path(name).unlink()


class BarrierClient:
    """One side's handle on a named barrier: ``wait()`` before each iteration."""

    def __init__(self, name: str) -> None:
        self._fd = os.open(barrier_path(name), os.O_RDWR)
        self._mem = mmap.mmap(self._fd, _BARRIER_SIZE)
        self._barrier = (ctypes.c_char * _BARRIER_SIZE).from_buffer(self._mem)
        self._libc = _libc()

    def wait(self) -> None:
        self._libc.pthread_barrier_wait(self._barrier)

    def close(self) -> None:
        del self._barrier
        self._mem.close()
        os.close(self._fd)
