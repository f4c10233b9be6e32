"""BPF objects, programs, maps and links over libbpf, each owning its fds.

A program whose name ends in ``_btf`` or ``_raw`` belongs to a variant: the
object is loaded with the first variant the kernel accepts (tp_btf, then
raw_tp), the way libbpf-tools picks program flavours at load time.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.buildfolder import check_build_dir
from kernmlops.ebpf.libbpf import LibbpfError, capture_log, check_int, check_ptr, lib
from kernmlops.ebpf.spec import VARIANTS, ObjectSpec, object_spec, program_variant
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")


class Link:
    """An attached program; destroying it detaches."""

    def __init__(self, ptr: int, program: str) -> None:
        self._ptr: int | None = ptr
        self.program = program

    @property
    def fd(self) -> int:
        if self._ptr is None:
            raise ValueError(f"link of {self.program} is destroyed")
        return lib.bpf_link__fd(self._ptr)

    def read_iter(self, chunk: int = 1 << 16) -> bytes:
        """Run an iterator link once and return everything it wrote."""
        from kernmlops.ebpf.libbpf import check_int

        fd = check_int(lib.bpf_iter_create(self.fd), f"create iterator of {self.program}")
        parts = []
        try:
            while data := os.read(fd, chunk):
                parts.append(data)
        finally:
            os.close(fd)
        return b"".join(parts)

    def destroy(self) -> None:
        if self._ptr is not None:
            lib.bpf_link__destroy(self._ptr)
            self._ptr = None

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


#: where libbpf looks for a tracepoint's id (the second: tracefs under debugfs)
_TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def _tracefs_id_unreadable(section: str) -> bool:
    """A ``tracepoint/<category>/<event>`` (or ``tp/``) program whose event id this
    process may not read in any tracefs mount."""
    kind, _, event = section.partition("/")
    if kind not in ("tracepoint", "tp") or event.count("/") != 1:
        return False
    return not any(os.access(f"{root}/events/{event}/id", os.R_OK) for root in _TRACEFS)


class Program:
    def __init__(self, ptr: int, obj: BpfObject) -> None:
        self._ptr = ptr
        self._obj = obj
        self.name: str = lib.bpf_program__name(ptr).decode()
        self.section: str = lib.bpf_program__section_name(ptr).decode()

    @property
    def autoload(self) -> bool:
        return bool(lib.bpf_program__autoload(self._ptr))

    @autoload.setter
    def autoload(self, value: bool) -> None:
        check_int(lib.bpf_program__set_autoload(self._ptr, value), f"set autoload of {self.name}")

    @property
    def variant(self) -> str | None:
        return program_variant(self.name)

    @property
    def fd(self) -> int:
        return lib.bpf_program__fd(self._ptr)

    def _link(self, ptr: int | None, what: str, log: str = "") -> Link:
        link = Link(check_ptr(ptr, f"attach {self.name} ({what})", log), self.name)
        self._obj._links.append(link)
        return link

    def attach(self) -> Link:
        """Attach by section name (tracepoint, raw_tp, tp_btf, ...)."""
        with capture_log() as log:
            ptr = lib.bpf_program__attach(self._ptr)
        if not ptr and ctypes.get_errno() == errno.EACCES and _tracefs_id_unreadable(self.section):
            # libbpf reads the event's id in tracefs, whose folder is root's alone (0700):
            # CAP_BPF and CAP_PERFMON do not open it. One line, not libbpf's log.
            raise LibbpfError(
                f"attach {self.name} ({self.section}): the tracepoint's id in tracefs "
                "cannot be read (tracefs is root's alone: it takes uid 0 or "
                "CAP_DAC_READ_SEARCH)"
            )
        return self._link(ptr, self.section, "".join(log.lines))

    def attach_perf_event(self, perf_fd: int) -> Link:
        """The link takes ownership of ``perf_fd`` and closes it when destroyed."""
        return self._link(lib.bpf_program__attach_perf_event(self._ptr, perf_fd), "perf event")

    def attach_xdp(self, ifindex: int) -> Link:
        return self._link(lib.bpf_program__attach_xdp(self._ptr, ifindex), self.section)

    def attach_iter(self) -> Link:
        return self._link(lib.bpf_program__attach_iter(self._ptr, None), self.section)


class Map:
    def __init__(self, ptr: int) -> None:
        self._ptr = ptr
        self.name: str = lib.bpf_map__name(ptr).decode()

    @property
    def fd(self) -> int:
        return lib.bpf_map__fd(self._ptr)

    @property
    def type(self) -> int:
        return lib.bpf_map__type(self._ptr)

    @type.setter
    def type(self, value: int) -> None:
        check_int(lib.bpf_map__set_type(self._ptr, value), f"set type of map {self.name}")

    @property
    def key_size(self) -> int:
        return lib.bpf_map__key_size(self._ptr)

    @property
    def value_size(self) -> int:
        return lib.bpf_map__value_size(self._ptr)

    @property
    def max_entries(self) -> int:
        return lib.bpf_map__max_entries(self._ptr)

    @max_entries.setter
    def max_entries(self, value: int) -> None:
        check_int(lib.bpf_map__set_max_entries(self._ptr, value), f"set size of map {self.name}")

    def reuse_fd(self, fd: int) -> None:
        """Use an existing map (before load): maps shared between objects."""
        check_int(lib.bpf_map__reuse_fd(self._ptr, fd), f"reuse fd for map {self.name}")

    @property
    def percpu(self) -> bool:
        return self.type in libbpf.PERCPU_MAPS

    def _value_buffer(self) -> ctypes.Array:
        if self.percpu:
            size = ((self.value_size + 7) // 8 * 8) * libbpf.num_possible_cpus()
        else:
            size = self.value_size
        return ctypes.create_string_buffer(size)

    def _key(self, key: int | bytes) -> bytes:
        if isinstance(key, int):
            return key.to_bytes(self.key_size, "little")
        if len(key) != self.key_size:
            raise ValueError(f"map {self.name}: key of {len(key)} bytes, want {self.key_size}")
        return key

    def lookup(self, key: int | bytes) -> bytes | None:
        """Value bytes (for per-CPU maps: every CPU's slot, 8-byte aligned), or None."""
        value = self._value_buffer()
        if lib.bpf_map_lookup_elem(self.fd, self._key(key), value) != 0:
            return None
        return value.raw

    def percpu_total(self, key: int | bytes) -> int:
        """The sum over CPUs of a per-CPU u64 counter (0 when the key is absent).
        No numpy: drop counts are read before the decoding libraries are loaded."""
        if self.value_size != 8:
            raise ValueError(f"map {self.name}: {self.value_size}-byte values, not u64 counters")
        raw = self.lookup(key)
        return sum(v for (v,) in struct.iter_unpack("<Q", raw)) if raw is not None else 0

    def lookup_percpu(self, key: int | bytes, dtype: np.dtype | str = "<u8") -> np.ndarray:
        """One value per possible CPU (zeros when the key is absent)."""
        dtype = np.dtype(dtype)
        if dtype.itemsize != self.value_size:
            raise ValueError(
                f"map {self.name}: dtype of {dtype.itemsize} bytes "
                f"for {self.value_size}-byte values"
            )
        raw = self.lookup(key)
        ncpu = libbpf.num_possible_cpus()
        stride = (self.value_size + 7) // 8 * 8
        if raw is None:
            raw = bytes(stride * ncpu)
        per_cpu = np.frombuffer(raw, dtype=np.uint8).reshape(ncpu, stride)[:, : self.value_size]
        return np.ascontiguousarray(per_cpu).view(dtype).reshape(ncpu)

    def update(self, key: int | bytes, value: bytes, flags: int = 0) -> None:
        rc = lib.bpf_map_update_elem(self.fd, self._key(key), value, flags)
        if rc != 0:
            raise LibbpfError(f"update map {self.name}", ctypes.get_errno() or -rc)

    def delete(self, key: int | bytes) -> bool:
        return lib.bpf_map_delete_elem(self.fd, self._key(key)) == 0

    def pop(self, key: int | bytes) -> bytes | None:
        """Take the value out: read and delete it in one step (hash maps, kernel 5.14+),
        so a program's update in between is not lost with the delete. None if absent."""
        value = self._value_buffer()
        if lib.bpf_map_lookup_and_delete_elem(self.fd, self._key(key), value) != 0:
            return None
        return value.raw

    def __iter__(self) -> Iterator[bytes]:
        """Every key (as bytes), in the kernel's order."""
        return self.keys()

    def keys(self) -> Iterator[bytes]:
        cur, nxt = None, ctypes.create_string_buffer(self.key_size)
        while lib.bpf_map_get_next_key(self.fd, cur, nxt) == 0:
            cur = nxt.raw
            yield cur

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key in list(self.keys()):
            value = self.lookup(key)
            if value is not None:
                yield key, value


class BpfObject:
    """One compiled ``.bpf.o``: open, configure, load, attach, close."""

    def __init__(self, path: str | Path, spec: ObjectSpec | None = None) -> None:
        # Set first: __del__ -> close() must work even if opening fails.
        self._ptr: int | None = None
        self._links: list[Link] = []
        self.path = Path(path)
        # as root, never an object another user could have put there, however the
        # folder was given (KERNMLOPS_BPF_DIR, --bpf-dir, a metric set's, a call's)
        check_build_dir(self.path.parent)
        if not self.path.exists():
            raise LibbpfError(f"BPF object {self.path} not found (build it: kernmlops build-bpf)")
        self._spec = spec
        self.variant: str | None = None
        with capture_log() as log:
            ptr = lib.bpf_object__open_file(str(self.path).encode(), None)
        self._ptr = check_ptr(ptr, f"open {self.path.name}", "".join(log.lines))
        self.programs: dict[str, Program] = {}
        p = lib.bpf_object__next_program(self._ptr, None)
        while p:
            prog = Program(p, self)
            self.programs[prog.name] = prog
            p = lib.bpf_object__next_program(self._ptr, p)
        self.maps: dict[str, Map] = {}
        m = lib.bpf_object__next_map(self._ptr, None)
        while m:
            mp = Map(m)
            self.maps[mp.name] = mp
            m = lib.bpf_object__next_map(self._ptr, m)
        self.loaded = False

    # -- before load --------------------------------------------------------
    def set_globals(self, values: Mapping[str, int | bool]) -> None:
        """Set ``const volatile`` globals (read-only once loaded)."""
        if not values:
            return
        if self._spec is None:
            self._spec = object_spec(self.path)
        symbols = self._spec.globals
        ro = lib.bpf_object__find_map_by_name(self._ptr, b".rodata")
        if not ro:
            raise LibbpfError(f"{self.path.name} has no .rodata for {sorted(values)}")
        size = ctypes.c_size_t()
        base = check_ptr(lib.bpf_map__initial_value(ro, ctypes.byref(size)), "rodata")
        for name, value in values.items():
            sym = symbols.get(name)
            if sym is None or sym.section != ".rodata":
                raise LibbpfError(f"{self.path.name} has no const volatile global {name!r}")
            if sym.offset + sym.size > size.value:
                raise LibbpfError(f"global {name!r} lies outside .rodata")
            try:
                data = int(value).to_bytes(sym.size, "little", signed=int(value) < 0)
            except OverflowError:
                raise LibbpfError(
                    f"value {value} does not fit global {name!r} ({sym.size} bytes)"
                ) from None
            ctypes.memmove(base + sym.offset, data, sym.size)

    def select_variant(self, variant: str | None) -> None:
        """Autoload programs of ``variant`` and those without a variant suffix."""
        for prog in self.programs.values():
            prog.autoload = prog.variant is None or prog.variant == variant
        self.variant = variant

    def _without_task_storage(self) -> None:
        """On a kernel without task storage (before Linux 5.11), an object whose
        programs can do without it (a ``kmo_task_storage`` global: sched_wait.h) gets
        the global cleared and each task storage map made an unused one-entry hash
        (its references are dead code then); any other is refused in one line
        instead of libbpf's log."""
        stores = [m for m in self.maps.values() if m.type == libbpf.MAP_TYPE_TASK_STORAGE]
        if not stores or libbpf.has_map_type(libbpf.MAP_TYPE_TASK_STORAGE):
            return
        if self._spec is None:
            self._spec = object_spec(self.path)
        if "kmo_task_storage" not in self._spec.globals:
            raise LibbpfError(
                f"{self.path.name} needs BPF task storage (Linux 5.11 or later), which this "
                "kernel does not have"
            )
        self.set_globals({"kmo_task_storage": False})
        for store in stores:
            store.type = libbpf.MAP_TYPE_HASH
            store.max_entries = 1

    def load(self) -> None:
        self._without_task_storage()
        with capture_log() as log:
            rc = lib.bpf_object__load(self._ptr)
        check_int(rc, f"load {self.path.name}", "".join(log.lines))
        self.loaded = True

    # -- after load ---------------------------------------------------------
    def attach_all(self) -> list[Link]:
        """Attach every loaded program by its section name."""
        return [p.attach() for p in self.programs.values() if p.autoload]

    def map(self, name: str) -> Map:
        try:
            return self.maps[name]
        except KeyError:
            raise LibbpfError(f"{self.path.name} has no map {name!r}") from None

    @property
    def links(self) -> Sequence[Link]:
        return tuple(self._links)

    def detach(self, keep: Sequence[Link] = ()) -> None:
        """Destroy every link but ``keep``; maps stay readable. Done before a
        final read, it leaves nothing that runs after the read."""
        for link in self._links:
            if not any(link is k for k in keep):
                link.destroy()
        self._links = [link for link in self._links if any(link is k for k in keep)]

    def close(self) -> None:
        """Detach every link and free the object (idempotent)."""
        for link in self._links:
            link.destroy()
        self._links.clear()
        if self._ptr is not None:
            lib.bpf_object__close(self._ptr)
            self._ptr = None

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def open_and_load(
    path: str | Path,
    *,
    globals_: Mapping[str, int | bool] | None = None,
    max_entries: Mapping[str, int] | None = None,
    reuse_maps: Mapping[str, int] | None = None,
    variants: Sequence[str | None] = VARIANTS,
    spec: ObjectSpec | None = None,
) -> BpfObject:
    """Open, configure and load an object with the first variant the kernel takes.

    An object without variant programs loads once. If every variant fails, the
    error of the first (preferred) one is raised, with its verifier log.
    """

    if spec is None:
        if not Path(path).exists():
            raise LibbpfError(f"BPF object {path} not found (build it: kernmlops build-bpf)")
        spec = object_spec(path)

    def attempt(variant: str | None) -> BpfObject:
        obj = BpfObject(path, spec)
        try:
            if any(p.variant for p in obj.programs.values()):
                obj.select_variant(variant)
            obj.set_globals(globals_ or {})
            for name, n in (max_entries or {}).items():
                obj.map(name).max_entries = n
            for name, fd in (reuse_maps or {}).items():
                if name in obj.maps:
                    obj.map(name).reuse_fd(fd)
            obj.load()
        except BaseException:
            obj.close()
            raise
        return obj

    if not spec.has_variants:
        return attempt(None)
    first: LibbpfError | None = None
    for variant in variants:
        try:
            return attempt(variant)
        except LibbpfError as err:
            first = first or err
    assert first is not None
    raise first


def object_info(obj: BpfObject) -> dict[str, Any]:
    """Programs and maps of an object, for the manifest and doctor."""
    return {
        "path": str(obj.path),
        "variant": obj.variant,
        "programs": {p.name: p.section for p in obj.programs.values() if p.autoload},
        "maps": sorted(obj.maps),
    }
