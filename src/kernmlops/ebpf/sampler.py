"""The native file sampler (``native/sampler.c``): files read whole at a fixed rate on
a thread that never takes the GIL, for sampled hooks whose sample is "read these open
files" (kernmlops.hooks.base.SampledHook.native_files).

Why: Python's sampler thread needs the GIL, and under a switch storm with more
runnable tasks than CPUs the collector thread holding it waits on the run queue:
memory_usage missed 44-98 of ~100 samples in 10 s of ``stress-ng --switch`` on 2
vCPUs. This thread runs at SCHED_FIFO (nice -20 where that is refused), as the ring
copier does, and only reads; Python parses what it read when it makes rows.

It lives in the ring copier's library (kernmlops.ebpf.copier.load); where that is
missing, or ``KERNMLOPS_NATIVE_COPY=0``, sampled hooks sample in Python as before.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from collections.abc import Sequence

from kernmlops.ebpf.copier import _name_thread, load, realtime

ABI = 3
#: a sample's head in the buffer: time (ns), file index, bytes; the bytes padded to 8
HEAD = struct.Struct("<QII")


class _Sampler(ctypes.Structure):
    _fields_ = [
        ("abi", ctypes.c_int32),
        ("stop", ctypes.c_int32),
        ("nfiles", ctypes.c_int32),
        ("stop_fd", ctypes.c_int32),
        ("period_ns", ctypes.c_int64),
        ("fds", ctypes.POINTER(ctypes.c_int32)),
        ("buf", ctypes.c_void_p),
        ("cap", ctypes.c_uint64),
        ("used", ctypes.c_uint64),
        ("max_cap", ctypes.c_uint64),
        ("taken", ctypes.c_uint64),
        ("missed", ctypes.c_uint64),
        ("lock", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("cpu_ns", ctypes.c_uint64),
        ("scratch", ctypes.c_void_p),
        ("scratch_cap", ctypes.c_uint64),
        ("mapped", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    ]


def available() -> bool:
    lib = load()
    return lib is not None and hasattr(lib, "kmo_sampler_run") and lib.kmo_sampler_abi() == ABI


#: what :meth:`NativeSampler.take` copies out at a time
TAKE_BYTES = 4 << 20
#: the most a file's sample holds (sampler.c's READ_MAX): a take that leaves this much
#: room (and a head's) unused took all there was
READ_MAX = 1 << 20


#: how long start() waits for the thread's first sample (a read of a /proc file)
FIRST_SAMPLE_S = 1.0


class NativeSampler:
    """A thread that reads ``fds`` whole every ``period_ns`` (the first time at once)
    into a buffer that grows up to ``buffer_bytes``; :meth:`take` gives what it read
    since."""

    def __init__(self, fds: Sequence[int], period_ns: int, buffer_bytes: int, name: str) -> None:
        lib = load()
        if lib is None or not available():
            raise OSError("the native sampler is not available")
        lib.kmo_sampler_take.restype = ctypes.c_uint64
        self._lib = lib
        self._name = name
        self._fds = (ctypes.c_int32 * len(fds))(*fds)
        self._out = ctypes.create_string_buffer(TAKE_BYTES)
        self._stop_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._c = _Sampler(abi=ABI, nfiles=len(fds), stop_fd=self._stop_fd, period_ns=period_ns,
                           fds=self._fds, max_cap=buffer_bytes)  # fmt: skip
        self._thread: threading.Thread | None = None
        self._missed_seen = 0
        self.result: int | None = None
        #: SCHED_FIFO priority it runs at (0: normal), or why not and its nice instead
        self.priority = 0
        self.priority_error: str | None = None
        self.nice: int | None = None

    def start(self, priority: int = 1) -> None:
        ready = threading.Event()

        def run() -> None:
            _name_thread(f"kmo-{self._name}".encode())
            self.priority, self.priority_error, self.nice = realtime(priority)
            ready.set()
            # ctypes lets go of the GIL for the whole call
            self.result = self._lib.kmo_sampler_run(ctypes.byref(self._c))

        self._thread = threading.Thread(target=run, name=f"kernmlops-{self._name}", daemon=True)
        self._thread.start()
        ready.wait()
        # "The first time at once": the start's sample is in before the first take (a
        # poll at once found none where the thread had not run yet: a busy machine).
        deadline = time.monotonic() + FIRST_SAMPLE_S
        while not self._c.taken and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.0002)

    def take(self) -> list[tuple[int, list[bytes]]]:
        """The samples read since the last take, each (time ns, every file's bytes)."""
        chunks = []
        room = len(self._out)
        while True:
            n = int(self._lib.kmo_sampler_take(ctypes.byref(self._c), self._out,
                                               ctypes.c_uint64(room)))  # fmt: skip
            # string_at copies the n bytes only: .raw[:n] copied the whole 4 MiB buffer
            # first, so that at 1 kHz a sample always came in during a pass and the
            # loop never ended (the collector hung at its stop)
            chunks.append(ctypes.string_at(self._out, n))
            # room for another whole sample left unused: all there was is taken (a take
            # returns whole samples only, so a full one may stop short of the room)
            if n + HEAD.size + READ_MAX <= room:
                break
        data = b"".join(chunks)
        n = len(data)
        out: list[tuple[int, list[bytes]]] = []
        at = 0
        while at < n:
            ns, index, size = HEAD.unpack_from(data, at)
            body = data[at + HEAD.size : at + HEAD.size + size]
            at += HEAD.size + (size + 7) // 8 * 8
            if index == 0:
                out.append((ns, [body]))
            else:
                out[-1][1].append(body)
        return out

    @property
    def missed(self) -> int:
        """Ticks without a sample since the last call (late wake-ups, a full buffer)."""
        missed = int(self._c.missed)
        new, self._missed_seen = missed - self._missed_seen, missed
        return new

    @property
    def error(self) -> int:
        """errno of the read that ended the thread (0: none)."""
        return int(self._c.error)

    @property
    def cpu_s(self) -> float:
        return int(self._c.cpu_ns) / 1e9

    def stop(self) -> None:
        """End the thread (idempotent); what it read stays for :meth:`take`."""
        if self._thread is not None:
            self._c.stop = 1
            os.eventfd_write(self._stop_fd, 1)
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self.stop()
        self._lib.kmo_sampler_free(ctypes.byref(self._c))
        if self._stop_fd >= 0:
            os.close(self._stop_fd)
            self._stop_fd = -1
