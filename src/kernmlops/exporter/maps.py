"""Read a whole BPF map at scrape time: keys as bytes, values as u64 words,
per-CPU values summed over the CPUs.

``bpf_map_lookup_batch`` reads many entries per system call; kernels (or map
types) without it are read key by key.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable
from ctypes import POINTER, c_int, c_uint32, c_void_p
from typing import Protocol, runtime_checkable

import numpy as np

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.libbpf import LibbpfError, lib
from kernmlops.ebpf.objects import Map

# A private prototype, so the shared libbpf binding is left as it is.
_lookup_batch = ctypes.CFUNCTYPE(
    c_int, c_int, c_void_p, c_void_p, c_void_p, c_void_p, POINTER(c_uint32), c_void_p
)(("bpf_map_lookup_batch", lib))
_get_next_key = ctypes.CFUNCTYPE(c_int, c_int, c_void_p, c_void_p, use_errno=True)(
    ("bpf_map_get_next_key", lib)
)
_lookup = ctypes.CFUNCTYPE(c_int, c_int, c_void_p, c_void_p, use_errno=True)(
    ("bpf_map_lookup_elem", lib)
)
#: the kernel's "not supported" (ENOTSUPP, 524) and the usual ones
_NO_BATCH = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, 524, errno.EPERM, errno.ENOSYS}
#: bytes of values one batch call may return (a chunk holds fewer entries on
#: machines with many CPUs)
_CHUNK_BYTES = 1 << 20


class KeyValueReader(Protocol):
    """What a metric reads at each scrape: keys as bytes and ``(n, words)`` u64
    values (a :class:`MapReader`, or perf_event_array.PerfEventCounts)."""

    name: str

    def read(self) -> tuple[list[bytes], np.ndarray]: ...


@runtime_checkable
class EventCounts(KeyValueReader, Protocol):
    """A reader that counts events per key (perf_event_array.PerfEventCounts):
    its metric counts a key that does not decode once per event, as
    ebpf_exporter does, not once per key as for a map. ``settled(key)`` says
    the metric knows the key's fate (it decodes, or a regexp drops it);
    ``take_unsettled()`` gives the events of every other key since its last
    call, flushes or not."""

    settled: Callable[[bytes], bool]

    def take_unsettled(self) -> dict[bytes, int]: ...


class MapReader:
    """Reads one map; its buffers are made once and reused at every scrape."""

    def __init__(self, bpf_map: Map, *, chunk: int | None = None, split_cpus: bool = False) -> None:
        self.name = bpf_map.name
        self.fd = bpf_map.fd
        self.key_size = bpf_map.key_size
        self.value_size = bpf_map.value_size
        self.max_entries = bpf_map.max_entries
        if self.value_size % 8:
            raise LibbpfError(
                f"map {self.name}: values of {self.value_size} bytes are not u64 words"
            )
        self.words = self.value_size // 8
        self.ncpu = libbpf.num_possible_cpus() if bpf_map.percpu else 1
        #: per-CPU values kept apart: each key appears once per CPU, with the
        #: CPU number appended as a u16 (ebpf_exporter's ``cpu`` label)
        self.split_cpus = split_cpus and bpf_map.percpu
        self.entry_bytes = self.value_size * self.ncpu  # per-CPU slots are 8-byte aligned
        self.chunk = chunk or max(16, min(self.max_entries, _CHUNK_BYTES // self.entry_bytes))
        self._keys = ctypes.create_string_buffer(self.chunk * self.key_size)
        self._values = ctypes.create_string_buffer(self.chunk * self.entry_bytes)
        self._batch = ctypes.create_string_buffer(max(8, self.key_size))
        self.batched: bool | None = None  # unknown until the first read

    def read(self) -> tuple[list[bytes], np.ndarray]:
        """Every key (bytes) and its value as ``(n, words)`` u64, CPUs summed."""
        if self.batched is not False:
            try:
                result = self._read_batched()
                self.batched = True
                return result
            except _BatchUnsupported:
                self.batched = False
        return self._read_one_by_one()

    def _finish(self, key_parts: list[bytes], value_parts: list[np.ndarray]) -> tuple:
        raw_keys = b"".join(key_parts)
        # one bytes object per key, cut in C (void items keep trailing zeros)
        keys = np.frombuffer(raw_keys, dtype=f"V{self.key_size}").tolist()
        if self.split_cpus:
            cpus = [cpu.to_bytes(2, "little") for cpu in range(self.ncpu)]
            keys = [key + cpu for key in keys for cpu in cpus]
        if not value_parts:
            return keys, np.zeros((0, self.words), np.uint64)
        values = np.concatenate(value_parts)
        return keys, values

    def _values_of(self, buf: ctypes.Array, n: int) -> np.ndarray:
        flat = np.frombuffer(buf, dtype="<u8", count=n * self.ncpu * self.words)
        if self.ncpu == 1 or self.split_cpus:
            return flat.reshape(n * self.ncpu, self.words).copy()
        return flat.reshape(n, self.ncpu, self.words).sum(axis=1, dtype=np.uint64)

    def _read_batched(self) -> tuple[list[bytes], np.ndarray]:
        key_parts: list[bytes] = []
        value_parts: list[np.ndarray] = []
        first = True
        total = 0
        while total < self.max_entries:
            count = c_uint32(self.chunk)
            rc = _lookup_batch(
                self.fd,
                None if first else self._batch,
                self._batch,
                self._keys,
                self._values,
                ctypes.byref(count),
                None,
            )
            n = count.value
            if rc < 0 and -rc != errno.ENOENT and n == 0:
                if first and -rc in _NO_BATCH:
                    raise _BatchUnsupported
                if -rc == errno.ENOSPC:  # a hash bucket larger than the chunk
                    self._grow()
                    return self._read_batched()
                raise LibbpfError(f"read map {self.name}", -rc)
            if n:
                key_parts.append(ctypes.string_at(self._keys, n * self.key_size))
                value_parts.append(self._values_of(self._values, n))
                total += n
            if rc < 0:  # ENOENT: the last batch
                break
            first = False
        return self._finish(key_parts, value_parts)

    def _grow(self) -> None:
        self.chunk *= 2
        self._keys = ctypes.create_string_buffer(self.chunk * self.key_size)
        self._values = ctypes.create_string_buffer(self.chunk * self.entry_bytes)

    def _read_one_by_one(self) -> tuple[list[bytes], np.ndarray]:
        keys: list[bytes] = []
        rows: list[np.ndarray] = []
        cur: ctypes.Array | None = None
        nxt = ctypes.create_string_buffer(self.key_size)
        value = ctypes.create_string_buffer(self.entry_bytes)
        while _get_next_key(self.fd, cur, nxt) == 0:
            key = nxt.raw
            cur = ctypes.create_string_buffer(key, self.key_size)
            if _lookup(self.fd, cur, value) != 0:
                continue  # deleted meanwhile
            keys.append(key)
            rows.append(self._values_of(value, 1))
        return self._finish([b"".join(keys)], rows)


class _BatchUnsupported(Exception):
    pass
