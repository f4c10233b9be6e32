"""Read a BPF_MAP_TYPE_PERF_EVENT_ARRAY map through libbpf's perf_buffer API.

libbpf opens one perf event per CPU, puts its fd in the map, maps its ring and
calls back per sample and per loss report. The callbacks run in the thread
that calls :meth:`PerfBuffer.poll`. Each sample costs a Python call: this is
for rare events (ebpf_exporter's oomkill counts), not a hot path; a ring
buffer (ringbuf.py) is read in batches instead.

libbpf opens rings on the CPUs online when the buffer is made, and a CPU's
event does not survive the CPU going offline: a CPU brought online later has
no working ring, and the program's samples there fail unseen (ebpf_exporter,
through libbpfgo, has the same gap). :meth:`PerfBuffer.refresh`, called at each
poll, reads the online CPUs and opens a ring (``perf_buffer__new_raw``, for
that CPU alone) on each that came online, or came back, since the last look; a
CPU offline and back between two looks is known by the kernel's uevents
(host.cpus.CpuHotplugWatch), which queue between looks (where there are none,
in a container's network namespace, such a CPU keeps its dead ring). What cannot be
opened (no map slot for the CPU, no privilege left after a capability drop) is
kept in :attr:`PerfBuffer.unread_cpus` with the reason.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable
from ctypes import CFUNCTYPE, POINTER, c_int, c_size_t, c_uint32, c_uint64, c_void_p

from kernmlops.ebpf.libbpf import LibbpfError, lib
from kernmlops.ebpf.objects import Map
from kernmlops.ebpf.perf_open import PERF_TYPE_SOFTWARE, PerfEventAttr
from kernmlops.host.cpus import CpuHotplugWatch, online_cpus

MAP_TYPE_PERF_EVENT_ARRAY = 4
#: pages per CPU (a power of two): 256 KiB holds some 16k small samples between
#: polls; ebpf_exporter asks for 1024 pages, 4 MiB of locked memory per CPU
DEFAULT_PAGES = 64

_SAMPLE_FN = CFUNCTYPE(None, c_void_p, c_int, c_void_p, c_uint32)
_LOST_FN = CFUNCTYPE(None, c_void_p, c_int, c_uint64)

# Private prototypes, as maps.py declares its own: the shared binding stays as it is.
# perf_buffer__new is libbpf 0.6's form (map fd, pages, sample, lost, ctx, opts).
_new = CFUNCTYPE(
    c_void_p, c_int, c_size_t, _SAMPLE_FN, _LOST_FN, c_void_p, c_void_p, use_errno=True
)(("perf_buffer__new", lib))
_EVENT_FN = CFUNCTYPE(c_int, c_void_p, c_int, c_void_p)
_new_raw = CFUNCTYPE(
    c_void_p, c_int, c_size_t, c_void_p, _EVENT_FN, c_void_p, c_void_p, use_errno=True
)(("perf_buffer__new_raw", lib))
_poll = CFUNCTYPE(c_int, c_void_p, c_int)(("perf_buffer__poll", lib))
_consume = CFUNCTYPE(c_int, c_void_p)(("perf_buffer__consume", lib))
_free = CFUNCTYPE(None, c_void_p)(("perf_buffer__free", lib))


SW_BPF_OUTPUT = 10  # PERF_COUNT_SW_BPF_OUTPUT
SAMPLE_RAW = 1 << 10  # PERF_SAMPLE_RAW
RECORD_LOST = 2  # PERF_RECORD_LOST: u64 id, u64 lost
RECORD_SAMPLE = 9  # PERF_RECORD_SAMPLE with PERF_SAMPLE_RAW: u32 size, the bytes
EVENT_CONT = -2  # LIBBPF_PERF_EVENT_CONT
_HEADER = struct.Struct("=IHH")  # struct perf_event_header: type, misc, size


class _RawOpts(ctypes.Structure):
    """struct perf_buffer_raw_opts of libbpf 1.x (its two ``long :0`` take no room)."""

    _fields_ = [
        ("sz", c_size_t),
        ("cpu_cnt", c_int),
        ("cpus", POINTER(c_int)),
        ("map_keys", POINTER(c_int)),
    ]


class PerfBuffer:
    """The per-CPU rings of one perf event array map.

    ``on_sample(cpu, data)`` gets each sample's bytes (at most ``keep`` of them
    when given: the kernel pads samples to 8 bytes); ``on_lost(cpu, count)``
    each report of samples the kernel dropped because a ring was full.
    """

    def __init__(
        self,
        bpf_map: Map,
        on_sample: Callable[[int, bytes], None],
        on_lost: Callable[[int, int], None],
        *,
        pages: int = DEFAULT_PAGES,
        keep: int | None = None,
    ) -> None:
        if bpf_map.type != MAP_TYPE_PERF_EVENT_ARRAY:
            raise LibbpfError(f"map {bpf_map.name} is not a perf event array")
        if pages <= 0 or pages & (pages - 1):
            raise ValueError(f"perf buffer pages: {pages} is not a power of two")
        self.name = bpf_map.name

        def sample(_ctx: int | None, cpu: int, data: int | None, size: int) -> None:
            n = size if keep is None else min(size, keep)
            on_sample(cpu, ctypes.string_at(data, n) if n else b"")

        def lost(_ctx: int | None, cpu: int, count: int) -> None:
            on_lost(cpu, count)

        def event(_ctx: int | None, cpu: int, header: int) -> int:
            # a record of a ring opened by refresh(), as libbpf reads its own
            kind, _misc, _size = _HEADER.unpack(ctypes.string_at(header, _HEADER.size))
            body = header + _HEADER.size
            if kind == RECORD_SAMPLE:
                size = ctypes.c_uint32.from_address(body).value
                sample(None, cpu, body + 4, size)
            elif kind == RECORD_LOST:
                on_lost(cpu, ctypes.c_uint64.from_address(body + 8).value)
            return EVENT_CONT

        # kept referenced: libbpf calls them until free
        self._sample_fn = _SAMPLE_FN(sample)
        self._lost_fn = _LOST_FN(lost)
        self._event_fn = _EVENT_FN(event)
        self._map_fd = bpf_map.fd
        self._slots = bpf_map.max_entries
        self._pages = pages
        # listening before libbpf opens its rings: a CPU that goes and comes back
        # after it read the online list is in the queue
        self._watch = CpuHotplugWatch()
        ctypes.set_errno(0)
        start = set(online_cpus())  # libbpf reads the same list now
        ptr = _new(bpf_map.fd, pages, self._sample_fn, self._lost_fn, None, None)
        if not ptr:
            self._watch.close()
            raise LibbpfError(f"open perf buffer of map {self.name}", ctypes.get_errno())
        self._ptr: int | None = ptr
        #: CPUs whose ring works, as far as the last look saw
        self.cpus: set[int] = {cpu for cpu in start if cpu < self._slots}
        #: rings refresh() opened, one buffer per CPU
        self._extra: dict[int, int] = {}
        #: online CPUs without a working ring, and why (refresh() tries them again
        #: only when they come online anew)
        self.unread_cpus: dict[int, str] = {}
        self._gone: set[int] = set()  # CPUs seen offline: their ring is dead
        self.refresh()

    def refresh(self, online: list[int] | None = None) -> list[int]:
        """Open a ring on each CPU online now (``online``: read from sysfs when
        None) that has none that works: online since the buffer was made, or
        back online since a look saw it offline or the kernel said it went (its
        uevents: gone and back between two looks). The CPUs given a ring."""
        if self._ptr is None:
            return []
        went, _came, overflowed = self._watch.take()
        now = set(online_cpus() if online is None else online)
        gone = (self.cpus | set(self.unread_cpus)) - now
        # offline since the last look, whether or not back: its event died with it;
        # uevents lost to an overflowing queue: any CPU may have gone, every ring anew
        gone |= (self.cpus | set(self.unread_cpus)) if overflowed else went
        self._gone |= gone
        self.cpus -= gone
        for cpu in gone:
            self.unread_cpus.pop(cpu, None)
        opened = []
        for cpu in sorted(now - self.cpus - set(self.unread_cpus)):
            why = self._open_ring(cpu)
            if why is None:
                self.cpus.add(cpu)
                self._gone.discard(cpu)
                opened.append(cpu)
            else:
                self.unread_cpus[cpu] = why
        return opened

    def _open_ring(self, cpu: int) -> str | None:
        """A ring for ``cpu`` alone, put in its map slot; None, or why not."""
        if cpu >= self._slots:
            return f"map {self.name} has {self._slots} slots, none for CPU {cpu}"
        old = self._extra.pop(cpu, None)
        if old is not None:
            _consume(old)
            _free(old)  # its event died with the CPU going offline
        attr = PerfEventAttr()
        attr.type = PERF_TYPE_SOFTWARE
        attr.size = ctypes.sizeof(PerfEventAttr)
        attr.config = SW_BPF_OUTPUT
        attr.sample_period_or_freq = 1
        attr.sample_type = SAMPLE_RAW
        attr.wakeup_events = 1
        key = (c_int * 1)(cpu)
        opts = _RawOpts(ctypes.sizeof(_RawOpts), 1, key, key)
        ctypes.set_errno(0)
        ptr = _new_raw(
            self._map_fd,
            self._pages,
            ctypes.addressof(attr),
            self._event_fn,
            None,
            ctypes.addressof(opts),
        )
        if not ptr:
            err = ctypes.get_errno()
            return os.strerror(err) if err else "failed"
        self._extra[cpu] = ptr
        return None

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for samples and hand each to the callbacks;
        the number handled, or -errno (-EINTR when a signal came)."""
        if self._ptr is None:
            raise LibbpfError(f"perf buffer of map {self.name} is closed")
        n = _poll(self._ptr, timeout_ms)
        if n < 0:
            return n
        return n + sum(max(0, _consume(ptr)) for ptr in list(self._extra.values()))

    def consume(self) -> int:
        """Hand every sample waiting now to the callbacks, without waiting."""
        if self._ptr is None:
            raise LibbpfError(f"perf buffer of map {self.name} is closed")
        n = _consume(self._ptr)
        return n + sum(max(0, _consume(ptr)) for ptr in list(self._extra.values()))

    def close(self) -> None:
        """Close the perf events and unmap the rings (idempotent); no thread
        may be polling."""
        if self._ptr is not None:
            while self._extra:
                _free(self._extra.popitem()[1])
            _free(self._ptr)
            self._ptr = None
            self._watch.close()

    def __enter__(self) -> PerfBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
