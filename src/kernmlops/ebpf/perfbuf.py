"""Read a BPF_MAP_TYPE_PERF_EVENT_ARRAY map through libbpf's perf_buffer API.

libbpf opens one perf event per CPU, puts its fd in the map, maps its ring and
calls back per sample and per loss report. The callbacks run in the thread
that calls :meth:`PerfBuffer.poll`. Each sample costs a Python call: this is
for rare events (ebpf_exporter's oomkill counts), not a hot path; a ring
buffer (ringbuf.py) is read in batches instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import CFUNCTYPE, c_int, c_size_t, c_uint32, c_uint64, c_void_p

from kernmlops.ebpf.libbpf import LibbpfError, lib
from kernmlops.ebpf.objects import Map

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
_poll = CFUNCTYPE(c_int, c_void_p, c_int)(("perf_buffer__poll", lib))
_consume = CFUNCTYPE(c_int, c_void_p)(("perf_buffer__consume", lib))
_free = CFUNCTYPE(None, c_void_p)(("perf_buffer__free", lib))


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

        # kept referenced: libbpf calls them until free
        self._sample_fn = _SAMPLE_FN(sample)
        self._lost_fn = _LOST_FN(lost)
        ctypes.set_errno(0)
        ptr = _new(bpf_map.fd, pages, self._sample_fn, self._lost_fn, None, None)
        if not ptr:
            raise LibbpfError(f"open perf buffer of map {self.name}", ctypes.get_errno())
        self._ptr: int | None = ptr

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for samples and hand each to the callbacks;
        the number handled, or -errno (-EINTR when a signal came)."""
        if self._ptr is None:
            raise LibbpfError(f"perf buffer of map {self.name} is closed")
        return _poll(self._ptr, timeout_ms)

    def consume(self) -> int:
        """Hand every sample waiting now to the callbacks, without waiting."""
        if self._ptr is None:
            raise LibbpfError(f"perf buffer of map {self.name} is closed")
        return _consume(self._ptr)

    def close(self) -> None:
        """Close the perf events and unmap the rings (idempotent); no thread
        may be polling."""
        if self._ptr is not None:
            _free(self._ptr)
            self._ptr = None

    def __enter__(self) -> PerfBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
