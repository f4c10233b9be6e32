"""The native ring copier (``native/ringcopy.c``): moves every spooled ring's records
into its spool without Python, on a thread that never holds the GIL.

Why: under a storm with more runnable tasks than CPUs, the collector's Python
threads take turns at the GIL, and the one the storm keeps off a CPU while it holds
the GIL (an import, a Parquet write) stalls the copy of every ring: 4.1-4.6M of
4.8M quanta records were lost in 10 s of ``stress-ng --switch 4`` on 2 vCPUs. The
copy itself costs a few percent of a core; in C it needs neither the GIL nor any
of Python's locks. Python keeps everything else: it opens the segments (and their
json), keeps a standby segment on disk ready, rotates segments at flushes, reads
the spool back, and deletes what parts hold (kernmlops.spool.copy.RingSpool).

The library is built beside the BPF objects (``kernmlops build-bpf``) and shipped in
the wheel; where it is missing (no C compiler where the tree was built) the spool
copies in Python as before, and ``KERNMLOPS_NATIVE_COPY=0`` asks for that too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import resource
import select
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kernmlops.ebpf.build import NATIVE_LIBRARY, default_build_dir
from kernmlops.host.capabilities import CAP_SYS_NICE, holds

LIBRARY = NATIVE_LIBRARY
ABI = 9
#: zstd level of the disk segments (pyarrow's Codec("zstd", 1) writes the same frames)
ZSTD_LEVEL = 1
#: the runway (native/runway.c): disk allocated ahead of a spool's writes, at least this
#: much (a quiet table's standby) and at most this much (a 16-core storm writes ~30 MB/s)
RUNWAY_MIN = 1 << 20
RUNWAY_MAX = 2 << 30
#: the disk queue (native/diskqueue.c): the most bytes of disk frames a copier holds
#: while its writer waits for the filesystem (~40 s of a 2-vCPU storm's frames, ~8 s
#: of a 16-core one's); pages are taken only as a stall fills them
QUEUE_CAP = 256 << 20
#: how long start() waits for the thread to make its buffers (a few ms)
PREPARE_S = 5.0


class Segment(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_int32),
        ("zstd", ctypes.c_int32),
        ("memory", ctypes.c_int32),
        ("state", ctypes.c_int32),
        ("written", ctypes.c_uint64),
        ("file_bytes", ctypes.c_uint64),
        ("synced", ctypes.c_uint64),
        ("alloc_end", ctypes.c_uint64),
        ("alloc_busy", ctypes.c_int32),
        ("alloc_off", ctypes.c_int32),
        ("alloc_asked", ctypes.c_int32),
        ("alloc_pad", ctypes.c_int32),
        ("queued", ctypes.c_uint64),
        ("queued_file", ctypes.c_uint64),
    ]


#: Segment.state
STANDBY, ACTIVE, DONE = 0, 1, 2


class Ring(ctypes.Structure):
    _fields_ = [
        ("cons", ctypes.c_void_p),
        ("prod", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_uint64),
        ("map_fd", ctypes.c_int32),
        ("lock", ctypes.c_int32),
        ("active", ctypes.POINTER(Segment)),
        ("standby", ctypes.POINTER(Segment)),
        ("copied", ctypes.c_uint64),
        ("passes", ctypes.c_uint64),
        ("error", ctypes.c_int32),
        ("waiting", ctypes.c_int32),
        ("packed", ctypes.c_void_p),
        ("packed_cap", ctypes.c_uint64),
        ("line", ctypes.c_void_p),
        ("line_cap", ctypes.c_uint64),
        ("owner", ctypes.c_void_p),
        ("shuffle", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("shuffled", ctypes.c_void_p),
        ("shuffled_cap", ctypes.c_uint64),
        ("spooled", ctypes.c_uint64),
        ("disk_raw", ctypes.c_uint64),
        ("disk_file", ctypes.c_uint64),
        ("standby_waits", ctypes.c_uint64),
        ("standby_wait_ns", ctypes.c_uint64),
        ("wait_since", ctypes.c_uint64),
        ("wlock", ctypes.c_int32),
        ("wpad", ctypes.c_int32),
    ]


class _Copier(ctypes.Structure):
    _fields_ = [
        ("abi", ctypes.c_int32),
        ("stop", ctypes.c_int32),
        ("nrings", ctypes.c_int32),
        ("stop_fd", ctypes.c_int32),
        ("interval_ms", ctypes.c_int64),
        ("memory_limit", ctypes.c_uint64),
        ("memory_used", ctypes.POINTER(ctypes.c_uint64)),
        ("frame_raw", ctypes.c_uint64),
        ("sync_bytes", ctypes.c_uint64),
        ("level", ctypes.c_int32),
        ("epfd", ctypes.c_int32),
        ("wakeups", ctypes.c_uint64),
        ("compress", ctypes.c_void_p),
        ("bound", ctypes.c_void_p),
        ("is_error", ctypes.c_void_p),
        ("rings", ctypes.POINTER(ctypes.POINTER(Ring))),
        ("cpu_ns", ctypes.c_uint64),
        ("workers", ctypes.c_int32),
        ("workers_ok", ctypes.c_int32),
        ("create", ctypes.c_void_p),
        ("free_cctx", ctypes.c_void_p),
        ("set", ctypes.c_void_p),
        ("compress2", ctypes.c_void_p),
        ("cctx", ctypes.c_void_p),
        ("runway_ms", ctypes.c_int64),
        ("runway_min", ctypes.c_uint64),
        ("runway_max", ctypes.c_uint64),
        ("keep_free", ctypes.c_uint64),
        ("runway_started", ctypes.c_int32),
        ("runway_errno", ctypes.c_int32),
        ("runway_calls", ctypes.c_uint64),
        ("runway_bytes", ctypes.c_uint64),
        ("runway_ns_max", ctypes.c_uint64),
        ("runway_short", ctypes.c_uint64),
        ("runway_outside", ctypes.c_uint64),
        ("runway_wake", ctypes.c_int32),
        ("runway_pad", ctypes.c_int32),
        ("runway", ctypes.c_void_p),
        ("write_ns_max", ctypes.c_uint64),
        ("slow_writes", ctypes.c_uint64),
        ("pass_gap_ns_max", ctypes.c_uint64),
        ("queue_cap", ctypes.c_uint64),
        ("queue", ctypes.c_void_p),
        ("queue_peak", ctypes.c_uint64),
        ("queue_full", ctypes.c_uint64),
        ("estimate", ctypes.c_void_p),
        ("init_static", ctypes.c_void_p),
        ("wksp", ctypes.c_void_p),
        ("prepared", ctypes.c_int32),
        ("prepared_pad", ctypes.c_int32),
    ]


_lib: ctypes.CDLL | None = None
_zstd: ctypes.CDLL | None = None
_tried = False


def library_path(build_dir: Path | None = None) -> Path:
    """Where the library lives: beside the BPF objects."""
    return (build_dir or default_build_dir()) / LIBRARY


def load() -> ctypes.CDLL | None:
    """The copier library, or None (missing, refused by this machine, or turned off
    with KERNMLOPS_NATIVE_COPY=0): the spool then copies in Python."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("KERNMLOPS_NATIVE_COPY", "1") == "0":
        return None
    from kernmlops.ebpf.build import BuildError, check_build_dir

    path = library_path()
    try:
        if not path.exists():
            return None
    except OSError:  # a folder this user may not search (another user's BPF folder)
        return None
    try:
        # as root, never a library another user could have put there (build() says why)
        check_build_dir(path.parent)
    except BuildError:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        if lib.kmo_abi() != ABI:
            return None
        lib.kmo_ring_map  # noqa: B018 (a library of another kind lacks it: not ours)
    except (OSError, AttributeError):
        return None
    lib.kmo_ring_map.argtypes = [ctypes.POINTER(Ring), ctypes.c_int, ctypes.c_uint64]
    lib.kmo_ring_unmap.argtypes = [ctypes.POINTER(Ring)]
    lib.kmo_copier_run.argtypes = [ctypes.POINTER(_Copier)]
    lib.kmo_copier_pass.argtypes = [ctypes.POINTER(_Copier)]
    lib.kmo_copier_pass.restype = ctypes.c_uint64
    seg_p = ctypes.POINTER(Segment)
    lib.kmo_ring_rotate.argtypes = [ctypes.POINTER(Ring), seg_p, seg_p, ctypes.c_int,
                                    seg_p, ctypes.c_uint64]  # fmt: skip
    lib.kmo_ring_rotate.restype = ctypes.c_int
    lib.kmo_ring_set_standby.argtypes = [ctypes.POINTER(Ring), ctypes.POINTER(Segment)]
    lib.kmo_ring_share.argtypes = [ctypes.POINTER(Ring), ctypes.POINTER(Ring)]
    counter = ctypes.POINTER(ctypes.c_uint64)
    lib.kmo_budget_reserve.argtypes = [counter, ctypes.c_uint64, ctypes.c_uint64]
    lib.kmo_budget_release.argtypes = [counter, ctypes.c_uint64]
    lib.kmo_shuffle_stride.argtypes = [ctypes.c_uint64, ctypes.c_uint32]
    lib.kmo_shuffle_stride.restype = ctypes.c_uint32
    lib.kmo_crc32c.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    lib.kmo_crc32c.restype = ctypes.c_uint32
    lib.kmo_crc32c_table.argtypes = lib.kmo_crc32c.argtypes
    lib.kmo_crc32c_table.restype = ctypes.c_uint32
    _lib = lib
    return lib


def zstd() -> ctypes.CDLL | None:
    """The system's libzstd (the disk segments' codec), or None: raw disk segments."""
    global _zstd
    if _zstd is None:
        name = ctypes.util.find_library("zstd") or "libzstd.so.1"
        try:
            _zstd = ctypes.CDLL(name)
        except OSError:
            return None
    return _zstd


class ChecksummedZstd:
    """zstd frames that carry zstd's checksum of their content, as the copier writes
    them (pyarrow's Codec cannot ask for one): the Python copy's disk segments."""

    LEVEL, CHECKSUM = 100, 201  # ZSTD_c_compressionLevel, ZSTD_c_checksumFlag

    def __init__(self, z: ctypes.CDLL, cctx: int) -> None:
        self._z, self._cctx = z, ctypes.c_void_p(cctx)

    @classmethod
    def make(cls, level: int = ZSTD_LEVEL) -> ChecksummedZstd | None:
        """None without a libzstd that takes the parameters."""
        z = zstd()
        if z is None:
            return None
        z.ZSTD_createCCtx.restype = ctypes.c_void_p
        z.ZSTD_compressBound.restype = ctypes.c_size_t
        z.ZSTD_compress2.restype = ctypes.c_size_t
        z.ZSTD_CCtx_setParameter.restype = ctypes.c_size_t
        z.ZSTD_isError.restype = ctypes.c_uint
        cctx = z.ZSTD_createCCtx()
        if not cctx:
            return None
        for param, value in ((cls.LEVEL, level), (cls.CHECKSUM, 1)):
            err = z.ZSTD_CCtx_setParameter(ctypes.c_void_p(cctx), param, value)
            if z.ZSTD_isError(ctypes.c_size_t(err)):
                return None
        return cls(z, cctx)

    def decompress(
        self, packed: bytes | memoryview, decompressed_size: int, asbytes: bool = True
    ) -> bytes:
        """Read back with pyarrow's codec (zstd checks the checksum as it decodes)."""
        import pyarrow as pa

        return pa.Codec("zstd").decompress(packed, decompressed_size=decompressed_size,
                                            asbytes=asbytes)  # fmt: skip

    def compress(self, raw: bytes | memoryview, asbytes: bool = True) -> bytes:
        if not isinstance(raw, bytes):
            raw = bytes(raw)  # ctypes passes bytes only (a frame can be a memoryview)
        cap = self._z.ZSTD_compressBound(ctypes.c_size_t(len(raw)))
        out = ctypes.create_string_buffer(cap)
        n = self._z.ZSTD_compress2(self._cctx, out, ctypes.c_size_t(cap), raw,
                                   ctypes.c_size_t(len(raw)))  # fmt: skip
        if self._z.ZSTD_isError(ctypes.c_size_t(n)):
            raise OSError(f"zstd could not compress a spool frame (error {n})")
        return out.raw[:n]


#: the copier thread's nice where SCHED_FIFO is refused (the highest there is)
FALLBACK_NICE = -20


def _name_thread(name: bytes) -> None:
    """Name the calling thread as the kernel shows it (comm, 15 bytes); threads it
    starts inherit the name. Best effort."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME


def _lower_nice(nice: int) -> int | None:
    """Give the calling thread ``nice`` (Linux: nice is per thread); its nice after,
    None if it was refused and is unchanged."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        return None
    return os.getpriority(os.PRIO_PROCESS, tid)


def realtime(priority: int) -> tuple[int, str | None, int | None]:
    """Give the calling thread SCHED_FIFO ``priority`` (0: leave it), else nice
    FALLBACK_NICE: (the priority it got, why it did not, the nice it got instead)."""
    if priority <= 0:
        return 0, None, None
    try:  # pid 0: this thread alone
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as err:
        why = f"SCHED_FIFO {priority}: {err.strerror or err}"
        allowed = expected_priority(priority)
        if err.errno == errno.EPERM and allowed.kind == "real-time":
            # allowed by a capability or rlimit, refused all the same: cgroup v1's
            # real-time budget, 0 in every new group (containers, some services)
            budget = "a cgroup without a real-time budget (cpu.rt_runtime_us)"
            why += f" despite {allowed.grant}: {budget}"
        return 0, why, _lower_nice(FALLBACK_NICE)
    return priority, None, None


@dataclass(frozen=True)
class Priority:
    """What a copier's thread, asked for SCHED_FIFO ``asked``, runs at (predicted or
    probed) and what grants it; ``str()`` says it in words, as doctor's row does."""

    asked: int  # the SCHED_FIFO priority asked for (0: none)
    kind: Literal["real-time", "nice", "normal"]  # SCHED_FIFO, FALLBACK_NICE, neither
    level: int  # the SCHED_FIFO priority (real-time), the nice (nice), 0 (normal)
    #: what allows it: "CAP_SYS_NICE", "RLIMIT_RTPRIO 5", "RLIMIT_NICE 40"; None when
    #: nothing does, or a probe found it where the prediction did not
    grant: str | None = None
    #: the kernel's refusal (realtime()'s why) where a probe met one not predicted
    refusal: str | None = None

    def __str__(self) -> str:
        if self.kind == "real-time":
            return f"SCHED_FIFO {self.level}" + (f" ({self.grant})" if self.grant else "")
        if self.kind == "nice":
            why = self.refusal or f"no CAP_SYS_NICE; {self.grant}"
            return f"nice {self.level}, not real-time ({why})"
        if self.refusal:
            return f"normal priority ({self.refusal})"
        if self.asked <= 0:
            return "normal priority (copier_priority 0)"
        return "normal priority: SCHED_FIFO and a lower nice need CAP_SYS_NICE"


def expected_priority(priority: int, mask: int | None = None) -> Priority:
    """What :func:`realtime` will give a copier asked for SCHED_FIFO ``priority``, as
    the kernel decides it (``mask``: the effective capabilities, default this
    process's): uid 0 alone counts for nothing, CAP_SYS_NICE or RLIMIT_RTPRIO does. A
    cgroup without a real-time budget may still refuse; the manifest says so then."""
    if priority <= 0:
        return Priority(priority, "normal", 0)
    if holds(CAP_SYS_NICE, mask):
        return Priority(priority, "real-time", priority, "CAP_SYS_NICE")
    rtprio = resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
    if rtprio == resource.RLIM_INFINITY or rtprio >= priority:
        return Priority(priority, "real-time", priority, f"RLIMIT_RTPRIO {rtprio}")
    nice = resource.getrlimit(resource.RLIMIT_NICE)[0]  # a nice of n needs 20 - n
    if nice == resource.RLIM_INFINITY or 20 - nice <= FALLBACK_NICE:
        return Priority(priority, "nice", FALLBACK_NICE, f"RLIMIT_NICE {nice}")
    return Priority(priority, "normal", 0)


def probed_priority(priority: int) -> Priority:
    """What a copier asked for SCHED_FIFO ``priority`` gets here: tried by
    :func:`realtime` in a thread of its own that ends at once (a thread's policy and
    nice are its own), so the kernel decides, a cgroup's real-time budget included,
    which :func:`expected_priority` cannot see."""
    expected = expected_priority(priority)
    if priority <= 0:
        return expected
    got: list[tuple[int, str | None, int | None]] = []
    probe = threading.Thread(target=lambda: got.append(realtime(priority)), name="kmo-prio-probe")
    probe.start()
    probe.join()
    prio, why, nice = got[0] if got else (0, "the probe did not run", None)
    if prio:
        return expected if expected.kind == "real-time" else Priority(priority, "real-time", prio)
    if expected.kind != "real-time":
        return expected  # refused as predicted: the prediction says why
    if nice is not None:
        return Priority(priority, "nice", nice, refusal=why)
    return Priority(priority, "normal", 0, refusal=why)


def priority_notes(statuses: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a collection says about its copiers' priority (hooks' ``status.copier``):
    nothing when SCHED_FIFO was granted; a note when only the nice fallback was; a
    warning when neither was."""
    notes = []
    niced = sorted({s["error"] for s in statuses if s.get("error") and s.get("nice") is not None})
    plain = sorted({s["error"] for s in statuses if s.get("error") and s.get("nice") is None})
    if niced:
        nice = min(s["nice"] for s in statuses if s.get("nice") is not None)
        notes.append(f"the ring copier runs at nice {nice}, not real-time ({', '.join(niced)})")
    if plain:
        notes.append(f"the ring copier runs at normal priority ({', '.join(plain)}): a storm "
                     "may keep it off the CPU and the rings overflow")  # fmt: skip
    return notes


def available() -> bool:
    return load() is not None


def default_workers(cpus: int | None = None) -> int:
    """zstd workers beside a copier for this machine: none up to 4 CPUs (one thread
    compresses ~6M quanta records/s, more than a 2-4 CPU storm makes), then one per 8
    CPUs (a storm makes ~0.5M records/s per CPU)."""
    n = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return 0 if n <= 4 else -(-n // 8)


class Budget:
    """Bytes of tmpfs segments a collection may hold, shared by its copiers and the
    spool's own writes: one counter the C side moves atomically."""

    def __init__(self, limit: int) -> None:
        lib = load()
        if lib is None:
            raise OSError("the native ring copier is not available")
        self._lib = lib
        self.limit = limit
        self.cell = ctypes.c_uint64(0)

    @property
    def used(self) -> int:
        return int(self.cell.value)

    def reserve(self, size: int, limit: int | None = None) -> bool:
        cap = self.limit if limit is None else limit
        return bool(self._lib.kmo_budget_reserve(ctypes.byref(self.cell), cap, size))

    def release(self, size: int) -> None:
        self._lib.kmo_budget_release(ctypes.byref(self.cell), size)


def _ref(seg: Segment | None) -> Any:
    return ctypes.byref(seg) if seg is not None else None


@dataclass(eq=False)
class CopiedRing:
    """One ring the copier moves; ``ring`` is the struct the C side reads."""

    name: str
    ring: Ring = field(default_factory=Ring)

    @property
    def copied(self) -> int:
        return int(self.ring.copied)

    @property
    def error(self) -> int:
        return int(self.ring.error)

    @property
    def standby_waits(self) -> tuple[int, float]:
        """(times, seconds): how often, and how long in all, the copier found the
        budget spent and no standby, and copied nothing until it had one (its ring
        fills meanwhile): 0 where Python keeps one ready (spool/native.py)."""
        r = self.ring
        ns = int(r.standby_wait_ns)
        if r.waiting:  # a wait under way (the C side's clock is CLOCK_MONOTONIC too)
            ns += max(0, time.monotonic_ns() - int(r.wait_since))
        return int(r.standby_waits), ns / 1e9


class Copier:
    """The copier thread and the rings it moves. Add rings, :meth:`start`, and
    :meth:`stop` (a last copy of what is committed) once the programs are detached."""

    def __init__(
        self,
        *,
        interval_ms: int,
        budget: Budget | None,
        frame_raw: int,
        sync_bytes: int,
        workers: int = 0,
        runway_s: float = 0.0,
        keep_free: int = 0,
        queue_cap: int = QUEUE_CAP,
    ) -> None:
        lib = load()
        if lib is None:
            raise OSError("the native ring copier is not available")
        self._lib = lib
        self.rings: list[CopiedRing] = []
        # without a budget no segment is in memory: a cell of its own, never used
        self.budget = budget or Budget(0)
        self._c = _Copier(abi=ABI, interval_ms=interval_ms, memory_limit=self.budget.limit,
                          memory_used=ctypes.pointer(self.budget.cell), frame_raw=frame_raw,
                          sync_bytes=sync_bytes, level=ZSTD_LEVEL,
                          runway_ms=int(runway_s * 1000), runway_min=RUNWAY_MIN,
                          runway_max=RUNWAY_MAX if runway_s > 0 else 0,
                          keep_free=keep_free, queue_cap=queue_cap)  # fmt: skip
        z = zstd()
        self.compresses = z is not None
        if z is not None:
            for name, attr in (("ZSTD_compress", "compress"), ("ZSTD_compressBound", "bound"),
                               ("ZSTD_isError", "is_error"), ("ZSTD_createCCtx", "create"),
                               ("ZSTD_freeCCtx", "free_cctx"), ("ZSTD_CCtx_setParameter", "set"),
                               ("ZSTD_compress2", "compress2")):  # fmt: skip
                setattr(self._c, attr, ctypes.cast(getattr(z, name), ctypes.c_void_p))
            # a context in memory of the copier's own, where libzstd exports them (its
            # "static" API): no frame allocates (ringcopy.c, prepare)
            for name, attr in (("ZSTD_estimateCCtxSize", "estimate"),
                               ("ZSTD_initStaticCCtx", "init_static")):  # fmt: skip
                fn = getattr(z, name, None)
                if fn is not None:
                    setattr(self._c, attr, ctypes.cast(fn, ctypes.c_void_p))
            self._c.workers = workers
        self._epoll = select.epoll()
        self._stop_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._stop_fd, select.EPOLLIN)
        self._c.epfd = self._epoll.fileno()
        self._c.stop_fd = self._stop_fd
        # wakes the runway thread when a segment is handed over (rotate, standby)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._c.runway_wake = self._wake_fd
        self._array: ctypes.Array | None = None
        self._thread: threading.Thread | None = None
        # (monotonic) from before the thread was made to after it ended: its CPU time
        # (cpu_s, the thread's own clock) falls within
        self._started: float | None = None
        self._ended: float | None = None
        #: the thread's own CPU clock (time.pthread_getcpuclockid), while it runs
        self._clock: int | None = None
        self.result: int | None = None
        #: the real-time priority the thread runs at (0: normal), or why not
        self.priority = 0
        self.priority_error: str | None = None
        #: the thread's nice where SCHED_FIFO was refused and FALLBACK_NICE was not
        self.nice: int | None = None
        self._segments: list[Segment] = []  # kept alive while the C side may read them
        # forgotten while the runway thread allocated in them: kept until it is done
        self._leaving: list[Segment] = []

    def add(
        self, name: str, map_fd: int, size: int, wakes: bool = True, shuffle: int = 0
    ) -> CopiedRing:
        """Map ring ``name`` (its map's fd and size) for the copier; before start.
        ``wakes``: its programs wake readers as it fills (else only the interval);
        ``shuffle``: the stride its zstd frames are shuffled at (0: not;
        kernmlops.spool.frames.shuffle)."""
        if self._thread is not None:
            raise RuntimeError("rings are added before the copier starts")
        ring = CopiedRing(name)
        err = self._lib.kmo_ring_map(ctypes.byref(ring.ring), map_fd, size)
        if err:
            raise OSError(-err, f"cannot map ring {name}: {os.strerror(-err)}")
        ring.ring.shuffle = shuffle
        if wakes:
            self._epoll.register(map_fd, select.EPOLLIN | select.EPOLLET)
        self.rings.append(ring)
        return ring

    def segment(self, fd: int, *, zstd: bool, memory: bool) -> Segment:
        seg = Segment(fd=fd, zstd=int(zstd), memory=int(memory))
        self._segments.append(seg)
        return seg

    def rotate(
        self,
        ring: CopiedRing,
        seg: Segment,
        standby: Segment | None = None,
        expect: tuple[Segment | None, int] | None = None,
    ) -> bool:
        """Make ``seg`` the ring's active segment and ``standby`` its standby in one
        step (the copier is never left without one: native/ringcopy.c says why).
        ``expect``: (the standby, the active segment's raw bytes) as last seen; where
        the copier has changed either since, nothing changes and it returns False."""
        done = self._lib.kmo_ring_rotate(
            ctypes.byref(ring.ring), ctypes.byref(seg), _ref(standby), int(expect is not None),
            _ref(expect[0]) if expect else None, expect[1] if expect else 0,
        )  # fmt: skip
        if done:
            self._wake_runway()
        return bool(done)

    def _wake_runway(self) -> None:
        with contextlib.suppress(OSError):  # EAGAIN: it is awake already
            os.eventfd_write(self._wake_fd, 1)

    def set_standby(self, ring: CopiedRing, seg: Segment | None) -> None:
        """Where the ring goes on once the budget is spent (None: take it back)."""
        self._lib.kmo_ring_set_standby(ctypes.byref(ring.ring), _ref(seg))
        if seg is not None:
            self._wake_runway()

    def share(self, ring: CopiedRing, owner: CopiedRing) -> None:
        """Have ``ring`` (of this copier) write into ``owner``'s segments, under its
        lock (one spool fed by the rings of several CPU groups, each moved by its own
        copier); before start. ``owner``'s copier must outlive this one's thread."""
        if self._thread is not None:
            raise RuntimeError("rings are shared before the copier starts")
        self._lib.kmo_ring_share(ctypes.byref(ring.ring), ctypes.byref(owner.ring))

    def forget(self, seg: Segment) -> None:
        """A segment the C side will not read again (done, and synced by Python): the
        runway thread may still be allocating in it (it took it while it was active or
        the standby), so it is kept until that ends."""
        self._segments = [s for s in self._segments if s is not seg]
        self._leaving = [s for s in (*self._leaving, seg) if s.alloc_busy]

    def trim(self, seg: Segment, fd: int) -> bool:
        """Give back what the runway allocated past the end of a segment the copier
        left (or of any, once the thread stopped); False: the runway thread is
        allocating in it now, ask again later. Best effort: an error leaves the
        blocks to the segment's deletion."""
        if self.running and seg.state != DONE:
            raise RuntimeError("only a segment the copier left is trimmed while it runs")
        if seg.alloc_busy or seg.queued:  # (the disk writer still appends to it)
            return False
        seg.alloc_off = 1
        if seg.alloc_end:
            with contextlib.suppress(OSError):
                # ext4 and xfs free the blocks past the end at a truncate to the size
                os.ftruncate(fd, os.fstat(fd).st_size)
            seg.alloc_end = 0
        return True

    @property
    def runway_s(self) -> float:
        """Seconds of the spools' writes allocated ahead (0: no runway)."""
        return int(self._c.runway_ms) / 1000 if self._c.runway_max else 0.0

    @property
    def runway(self) -> dict[str, Any]:
        """What the runway thread did (native/runway.c): for the manifest."""
        c = self._c
        out: dict[str, Any] = {
            "allocations": int(c.runway_calls),
            "allocated_bytes": int(c.runway_bytes),
            "longest_ms": round(int(c.runway_ns_max) / 1e6, 1),
            "outside_bytes": int(c.runway_outside),
        }
        if c.runway_short:
            out["short_of_space"] = int(c.runway_short)
        if c.runway_errno:
            out["error"] = os.strerror(int(c.runway_errno))
        return out

    @property
    def stalls(self) -> dict[str, Any]:
        """Where a stall shows (for the manifest): the longest write of a frame (by
        the disk writer, or the copier into memory), the writes of 10 ms or more,
        the longest time from one pass over the rings to the next (the interval, or
        a pass that waited), the disk queue's peak, and the frames it had no room
        for (their records waited in the ring)."""
        c = self._c
        return {
            "longest_write_ms": round(int(c.write_ns_max) / 1e6, 1),
            "slow_writes": int(c.slow_writes),
            "longest_pass_gap_ms": round(int(c.pass_gap_ns_max) / 1e6, 1),
            "queue_peak_bytes": int(c.queue_peak),
            "queue_full": int(c.queue_full),
        }

    @property
    def cpu_s(self) -> float:
        """The copier thread's CPU time now, read from its own clock while it runs: the
        count the thread keeps is as of the end of its last pass (a pass under way
        is not in it, however long); once it has stopped, that count, final."""
        clock, thread = self._clock, self._thread
        if clock is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(OSError):  # it has just ended: its own count is final
                return time.clock_gettime_ns(clock) / 1e9
        return int(self._c.cpu_ns) / 1e9

    @property
    def static_zstd(self) -> bool:
        """Whether zstd compresses in memory the copier held from its start (known
        once the thread has started)."""
        return int(self._c.prepared) == 2

    @property
    def workers(self) -> int:
        """zstd's worker threads compressing the disk frames (0: the copier alone);
        known once the thread has started."""
        return int(self._c.workers) if self._c.workers_ok else 0

    @property
    def ran_s(self) -> float | None:
        """Seconds the thread has existed (till now while it runs); None: never started."""
        if self._started is None:
            return None
        return (self._ended if self._ended is not None else time.monotonic()) - self._started

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, priority: int = 0) -> None:
        """Start the thread; with ``priority`` > 0 it runs SCHED_FIFO at that priority
        (perf record's --realtime): a storm in another session, or with more runnable
        tasks than CPUs, otherwise keeps it off the CPU for seconds on this kernel
        (`python -m bench capacity`). Where that is refused (:attr:`priority_error`:
        no CAP_SYS_NICE, or a cgroup without a real-time budget, which refuses even
        root) the thread asks for nice FALLBACK_NICE instead (:attr:`nice`): what
        root still gets there, and enough for the scheduler to run it first when
        it wakes. zstd's workers, started by this thread, inherit either."""
        self._install()
        ready = threading.Event()

        def run() -> None:
            _name_thread(b"kmo-copier")  # top -H, ps -L: the copier and zstd's workers
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
            self.priority, self.priority_error, self.nice = realtime(priority)
            ready.set()
            # ctypes lets go of the GIL for the whole call
            self.result = self._lib.kmo_copier_run(ctypes.byref(self._c))

        self._thread = threading.Thread(target=run, name="kernmlops-copier", daemon=True)
        self._started, self._ended = time.monotonic(), None
        self._thread.start()
        ready.wait()
        # and its buffers made (ringcopy.c, prepare) before the benchmark starts: the
        # copier never allocates while a storm runs
        deadline = time.monotonic() + PREPARE_S
        while not self._c.prepared and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)

    def _install(self) -> None:
        """Hand the C side the rings added so far."""
        self._array = (ctypes.POINTER(Ring) * len(self.rings))(
            *(ctypes.pointer(r.ring) for r in self.rings)
        )
        self._c.rings = self._array
        self._c.nrings = len(self.rings)

    def stop(self) -> None:
        """Copy what is committed and end the thread (idempotent)."""
        if self._thread is not None:
            self._c.stop = 1
            os.eventfd_write(self._stop_fd, 1)
            self._thread.join()
            self._thread = None
            self._clock = None  # the thread is gone: its clock names no one
            self._ended = time.monotonic()

    def copy_now(self) -> int:
        """One copy of every ring from this thread (only while the thread is stopped)."""
        if self._thread is not None:
            raise RuntimeError("the copier thread runs")
        if self._array is None or len(self._array) != len(self.rings):
            self._install()
        return int(self._lib.kmo_copier_pass(ctypes.byref(self._c)))

    def close(self) -> None:
        self.stop()
        for ring in self.rings:
            self._lib.kmo_ring_unmap(ctypes.byref(ring.ring))
        self.rings = []
        self._epoll.close()
        os.close(self._stop_fd)
        os.close(self._wake_fd)
