"""Perf events by name: the generic hardware, cache and software events, tracepoints
counted as events, and each PMU's own events from sysfs; counters opened per CPU
with enabled / running times (for multiplexing) and read in one pass.

Names follow ``perf list``: ``cycles``, ``dTLB-load-misses``, ``context-switches``,
``tlb:tlb_flush``, ``msr/tsc/``, ``cpu/event=0x3c,umask=0x00/``, ``r01c2``.

A PMU may count on some CPUs only (:func:`pmu_scope`): one whose sysfs folder has a
``cpumask`` counts a whole package or die (RAPL's ``power``, the uncore PMUs), and the
kernel reads it on the CPU that file names whatever CPU it is opened on, so its events
are opened there alone, as ``perf stat -a`` does: opened on every CPU, each CPU would
repeat its package's count. One with a ``cpus`` file (a hybrid machine's ``cpu_core``
and ``cpu_atom``) exists on those CPUs only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.counters import event_column
from kernmlops.ebpf.perf_open import (
    PERF_FLAG_FD_CLOEXEC,
    PERF_TYPE_HARDWARE,
    PERF_TYPE_HW_CACHE,
    PERF_TYPE_SOFTWARE,
    PerfEventAttr,
)
from kernmlops.host.cpus import format_cpu_list, parse_cpu_list
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_import("numpy")


PERF_TYPE_TRACEPOINT = 2
PERF_TYPE_RAW = 4

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
#: value, time_enabled, time_running: three u64 per read.
READ_FORMAT = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
READ_SIZE = 24

PMU_DIR = Path("/sys/bus/event_source/devices")
TRACEFS_EVENTS = (Path("/sys/kernel/tracing/events"), Path("/sys/kernel/debug/tracing/events"))

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "riscv64": 241}
_libc = ctypes.CDLL(None, use_errno=True)

# name -> (config, description); aliases map to the first spelling perf uses.
HARDWARE: dict[str, tuple[int, str]] = {
    "cycles": (0, "CPU cycles"),
    "instructions": (1, "instructions retired"),
    "cache-references": (2, "cache accesses (usually last-level cache)"),
    "cache-misses": (3, "cache misses (usually last-level cache)"),
    "branch-instructions": (4, "branch instructions retired"),
    "branch-misses": (5, "mispredicted branches"),
    "bus-cycles": (6, "bus cycles"),
    "stalled-cycles-frontend": (7, "cycles stalled in the front end"),
    "stalled-cycles-backend": (8, "cycles stalled in the back end"),
    "ref-cycles": (9, "reference cycles (not scaled by frequency)"),
}
HARDWARE_ALIASES = {
    "cpu-cycles": "cycles",
    "branches": "branch-instructions",
    "idle-cycles-frontend": "stalled-cycles-frontend",
    "idle-cycles-backend": "stalled-cycles-backend",
}

SOFTWARE: dict[str, tuple[int, str]] = {
    "cpu-clock": (0, "time on the CPU clock (ns)"),
    "task-clock": (1, "time on the task clock (ns)"),
    "page-faults": (2, "page faults"),
    "context-switches": (3, "context switches"),
    "cpu-migrations": (4, "tasks migrated to this CPU"),
    "minor-faults": (5, "minor page faults (no I/O)"),
    "major-faults": (6, "major page faults (I/O)"),
    "alignment-faults": (7, "alignment faults"),
    "emulation-faults": (8, "instruction emulation faults"),
    "dummy": (9, "placeholder; never counts"),
    "bpf-output": (10, "BPF output (sampling only)"),
    "cgroup-switches": (11, "context switches between cgroups"),
}
SOFTWARE_ALIASES = {
    "faults": "page-faults",
    "cs": "context-switches",
    "migrations": "cpu-migrations",
}
#: Software events that count nanoseconds (their columns end in _ns).
NS_EVENTS = frozenset({"cpu-clock", "task-clock"})

# Generic cache events: cache | op << 8 | result << 16. perf accepts only some
# op combinations per cache; these are the ones it lists.
CACHES: dict[str, tuple[int, tuple[str, ...]]] = {
    "L1-dcache": (0, ("load", "store", "prefetch")),
    "L1-icache": (1, ("load", "prefetch")),
    "LLC": (2, ("load", "store", "prefetch")),
    "dTLB": (3, ("load", "store", "prefetch")),
    "iTLB": (4, ("load",)),
    "branch": (5, ("load",)),
    "node": (6, ("load", "store", "prefetch")),
}
CACHE_OPS = {"load": 0, "store": 1, "prefetch": 2}
_PLURAL = {"load": "loads", "store": "stores", "prefetch": "prefetches"}


class PerfEventError(Exception):
    """An event name that does not resolve, or an event the kernel will not open."""

    def __init__(self, message: str, errno_: int = 0) -> None:
        super().__init__(message)
        self.errno = errno_


@dataclass(frozen=True)
class EventSpec:
    """One event, resolved: what perf_event_open needs, and where it came from."""

    name: str  # canonical perf-list name
    kind: str  # hardware, cache, software, tracepoint, pmu, raw
    type: int
    config: int
    config1: int = 0
    config2: int = 0
    pmu: str | None = None
    encoding: str = ""  # sysfs terms (event=0x3c,umask=0x00) or config=0x...
    description: str = ""
    unit: str | None = None  # sysfs <event>.unit
    scale: float | None = None  # sysfs <event>.scale

    @property
    def column(self) -> str:
        """Table column of the event's count: snake case, _ns for time events."""
        base = event_column(self.name)
        return f"{base}_ns" if self.name in NS_EVENTS else base


# --- generic events ---------------------------------------------------------
def cache_events() -> dict[str, tuple[int, str]]:
    """Every generic cache event name -> (config, description)."""
    out: dict[str, tuple[int, str]] = {}
    for cache_name, (cache_id, ops) in CACHES.items():
        for op in ops:
            base = cache_id | CACHE_OPS[op] << 8
            out[f"{cache_name}-{_PLURAL[op]}"] = (base, f"{cache_name} {op} accesses")
            out[f"{cache_name}-{op}-misses"] = (base | 1 << 16, f"{cache_name} {op} misses")
    return out


def generic_events() -> list[EventSpec]:
    """Hardware, cache and software events, in perf list's order."""
    out = [
        EventSpec(n, "hardware", PERF_TYPE_HARDWARE, c, encoding=f"config={c:#x}", description=d)
        for n, (c, d) in HARDWARE.items()
    ]
    out += [
        EventSpec(n, "cache", PERF_TYPE_HW_CACHE, c, encoding=f"config={c:#x}", description=d)
        for n, (c, d) in cache_events().items()
    ]
    out += [
        EventSpec(n, "software", PERF_TYPE_SOFTWARE, c, encoding=f"config={c:#x}", description=d)
        for n, (c, d) in SOFTWARE.items()
    ]
    return out


# --- tracepoints ------------------------------------------------------------
def tracefs_events() -> Path | None:
    """The tracefs events folder, if mounted and readable."""
    for path in TRACEFS_EVENTS:
        try:
            if path.is_dir():
                return path
        except OSError:  # tracefs is root-only
            continue
    return None


def tracepoint_id(name: str) -> int:
    """The id of ``subsystem:event`` (tracefs must be mounted)."""
    subsystem, _, event = name.partition(":")
    root = tracefs_events()
    if root is None:
        raise PerfEventError(
            f"{name}: tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
        )
    try:
        return int((root / subsystem / event / "id").read_text())
    except FileNotFoundError:
        raise PerfEventError(f"{name}: no such tracepoint in {root}", errno.ENOENT) from None
    except PermissionError as err:
        raise PerfEventError(f"{name}: {err.strerror}", errno.EACCES) from None


def tracepoints() -> list[str]:
    """Every ``subsystem:event`` tracefs lists."""
    root = tracefs_events()
    if root is None:
        return []
    return sorted(f"{p.parent.parent.name}:{p.parent.name}" for p in root.glob("*/*/id"))


# --- PMUs from sysfs ---------------------------------------------------------
def pmu_type(pmu: str) -> int:
    try:
        return int((PMU_DIR / pmu / "type").read_text())
    except FileNotFoundError:
        raise PerfEventError(f"no PMU {pmu!r} in {PMU_DIR}", errno.ENOENT) from None


def pmus() -> list[str]:
    return sorted(p.name for p in PMU_DIR.iterdir()) if PMU_DIR.is_dir() else []


@dataclass(frozen=True)
class PmuScope:
    """The CPUs a PMU counts on, where it does not count on every CPU."""

    cpus: tuple[int, ...]
    #: the count is a package's or die's (sysfs ``cpumask``), read on ``cpus`` alone;
    #: else (``cpus``: a hybrid core type) each of ``cpus`` counts its own
    per_package: bool

    def short(self) -> str:
        """``package 0,24`` or ``8-15``: perf-list's column."""
        cpus = format_cpu_list(list(self.cpus))
        return f"package {cpus}" if self.per_package else cpus

    def describe(self, pmu: str) -> str:
        what = "a package's count, read on" if self.per_package else "counts on"
        return f"{what} CPU {format_cpu_list(list(self.cpus))} (PMU {pmu})"


@cache
def pmu_scope(pmu: str | None) -> PmuScope | None:
    """Where ``pmu``'s events count (see the module's note); None: on every CPU (the
    core PMU, software, tracepoints, or a PMU sysfs says nothing of)."""
    if not pmu:
        return None
    for name, per_package in (("cpumask", True), ("cpus", False)):
        cpus = parse_cpu_list(_read_optional(PMU_DIR / pmu / name))
        if cpus:
            return PmuScope(tuple(cpus), per_package)
    return None


@cache
def pmu_format(pmu: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Term -> (config field, bit positions), e.g. umask -> ("config", (8..15))."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    directory = PMU_DIR / pmu / "format"
    if not directory.is_dir():
        return out
    for f in directory.iterdir():
        field_, _, spec = f.read_text().strip().partition(":")
        bits: list[int] = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            bits.extend(range(int(lo), int(hi or lo) + 1))
        out[f.name] = (field_, tuple(bits))
    return out


def encode_terms(pmu: str, terms: str) -> tuple[int, int, int]:
    """``event=0x3c,umask=0x1`` -> (config, config1, config2) through the PMU's format."""
    fmt = pmu_format(pmu)
    configs = {"config": 0, "config1": 0, "config2": 0}
    for term in filter(None, (t.strip() for t in terms.split(","))):
        key, eq, raw = term.partition("=")
        value = int(raw, 0) if eq else 1  # a bare term is a flag set to 1
        if key in configs and key not in fmt:  # config=0x... written directly
            configs[key] |= value
            continue
        if key not in fmt:
            raise PerfEventError(f"{pmu}: unknown term {key!r} (known: {', '.join(sorted(fmt))})")
        field_, bits = fmt[key]
        if value >> len(bits):
            raise PerfEventError(f"{pmu}: {key}={raw} does not fit in {len(bits)} bits")
        for i, bit in enumerate(bits):
            if value >> i & 1:
                configs[field_] |= 1 << bit
    return configs["config"], configs["config1"], configs["config2"]


def _read_optional(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def pmu_event(pmu: str, event: str) -> EventSpec:
    """``pmu/event/`` from sysfs: its terms, encoded; unit and scale when given."""
    directory = PMU_DIR / pmu / "events"
    terms = _read_optional(directory / event)
    if terms is None:
        raise PerfEventError(f"{pmu}/{event}/: no such event in {directory}", errno.ENOENT)
    config, config1, config2 = encode_terms(pmu, terms)
    scale = _read_optional(directory / f"{event}.scale")
    return EventSpec(
        f"{pmu}/{event}/",
        "pmu",
        pmu_type(pmu),
        config,
        config1,
        config2,
        pmu=pmu,
        encoding=terms,
        description="sysfs",
        unit=_read_optional(directory / f"{event}.unit"),
        scale=float(scale) if scale else None,
    )


def pmu_events() -> list[EventSpec]:
    """Every event that some PMU names in sysfs (``<pmu>/events/<name>``)."""
    out = []
    for pmu in pmus():
        directory = PMU_DIR / pmu / "events"
        if not directory.is_dir():
            continue
        for f in sorted(directory.iterdir()):
            if "." in f.name:  # <event>.unit, .scale, .per-pkg, .snapshot
                continue
            try:
                out.append(pmu_event(pmu, f.name))
            except (PerfEventError, ValueError, OSError):
                continue  # a term this parser does not know: not listable by name
    return out


# --- names -------------------------------------------------------------------
_PMU_NAME = re.compile(r"^([\w.-]+)/([^/]*)/$")
_RAW_NAME = re.compile(r"^r([0-9a-fA-F]+)$")


def resolve(name: str) -> EventSpec:
    """An event name as perf list writes it -> EventSpec. Raises PerfEventError."""
    name = name.strip()
    hw = HARDWARE_ALIASES.get(name, name)
    if hw in HARDWARE:
        c, d = HARDWARE[hw]
        return EventSpec(
            hw, "hardware", PERF_TYPE_HARDWARE, c, encoding=f"config={c:#x}", description=d
        )
    sw = SOFTWARE_ALIASES.get(name, name)
    if sw in SOFTWARE:
        c, d = SOFTWARE[sw]
        return EventSpec(
            sw, "software", PERF_TYPE_SOFTWARE, c, encoding=f"config={c:#x}", description=d
        )
    caches = cache_events()
    if name in caches:
        c, d = caches[name]
        return EventSpec(
            name, "cache", PERF_TYPE_HW_CACHE, c, encoding=f"config={c:#x}", description=d
        )
    if m := _PMU_NAME.match(name):
        pmu, body = m.groups()
        if "=" in body or "," in body:  # pmu/term=value,.../
            config, config1, config2 = encode_terms(pmu, body)
            return EventSpec(
                name,
                "pmu",
                pmu_type(pmu),
                config,
                config1,
                config2,
                pmu=pmu,
                encoding=body,
                description="raw terms",
            )
        return pmu_event(pmu, body)
    if m := _RAW_NAME.match(name):
        c = int(m.group(1), 16)
        return EventSpec(
            name, "raw", PERF_TYPE_RAW, c, encoding=f"config={c:#x}", description="raw PMU event"
        )
    if re.fullmatch(r"[\w-]+:[\w-]+", name):
        tp = tracepoint_id(name)
        return EventSpec(
            name,
            "tracepoint",
            PERF_TYPE_TRACEPOINT,
            tp,
            encoding=f"id={tp}",
            description="tracepoint",
        )
    raise PerfEventError(f"unknown perf event {name!r} (see: kernmlops perf-list)", errno.ENOENT)


def resolve_all(
    names: Sequence[str], *, distinct_columns: bool = False
) -> tuple[list[EventSpec], dict[str, str]]:
    """Each name resolved once: aliases of an event already taken are skipped, and
    with ``distinct_columns`` so is an event whose column name (``event_column``)
    another already has. Returns the specs and, name -> reason, those left out."""
    specs: dict[str, EventSpec] = {}
    columns: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for name in names:
        try:
            spec = resolve(name)
        except (PerfEventError, ValueError, OSError) as err:
            left_out[name] = str(err)
            continue
        if spec.name in specs:
            continue  # an alias of an event already counted
        clash = columns.get(event_column(spec.name))
        if distinct_columns and clash is not None:
            left_out[spec.name] = f"its column name clashes with {clash}'s"
            continue
        specs[spec.name] = spec
        columns[event_column(spec.name)] = spec.name
    return list(specs.values()), left_out


# --- counting ------------------------------------------------------------------
def errno_reason(err: int) -> str:
    """What an errno from perf_event_open means, in perf's words where it has some."""
    name = errno.errorcode.get(err, str(err))
    text = os.strerror(err)
    if err in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return f"not supported on this machine ({name}: {text})"
    if err in (errno.EACCES, errno.EPERM):
        return f"not permitted ({name}: {text}; see /proc/sys/kernel/perf_event_paranoid)"
    return f"{name}: {text}"


def open_counter(spec: EventSpec, cpu: int, pid: int = -1) -> int:
    """A counting event (no sampling) read as value, enabled ns, running ns."""
    nr = _NR_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        raise PerfEventError(f"perf_event_open: unknown syscall number on {platform.machine()}")
    attr = PerfEventAttr()
    attr.type = spec.type
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = spec.config
    attr.config1 = spec.config1
    attr.config2 = spec.config2
    attr.read_format = READ_FORMAT
    fd = _libc.syscall(nr, ctypes.byref(attr), pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise PerfEventError(f"{spec.name} on cpu {cpu}: {errno_reason(err)}", err)
    return fd


def probe(spec: EventSpec, cpu: int = 0) -> str | None:
    """None if the event opens on ``cpu``, else why not."""
    try:
        os.close(open_counter(spec, cpu))
    except PerfEventError as err:
        return errno_reason(err.errno) if err.errno else str(err)
    return None


class CounterSet:
    """Counters of several events on several CPUs, read into one array per pass.

    Each fd is its own event (no groups): a group is scheduled all or nothing,
    so one hardware event too many would leave the whole group unread. The
    kernel multiplexes independent events; enabled / running say by how much.
    An event whose PMU counts on some CPUs only (:func:`pmu_scope`) is opened on
    those of ``cpus`` alone: ``opened`` says where.
    """

    def __init__(
        self,
        events: Sequence[EventSpec],
        cpus: Sequence[int],
        *,
        skip_unsupported: bool = False,
        everywhere: bool = False,
    ) -> None:
        """Open every event on each of ``cpus`` its PMU counts on. With
        ``skip_unsupported``, an event that fails on any of them, or that counts on
        none of them, is left out and its reason kept in ``unsupported``; otherwise
        the first failure is raised. ``everywhere``: leave out the events whose PMU
        does not count on every CPU (a per-task count reads whichever CPU it runs on,
        and a package's count is no task's)."""
        self.events: list[EventSpec] = []
        self.cpus = list(cpus)
        self.unsupported: dict[str, str] = {}
        #: [event, cpu]: whether the event is opened on that CPU (read() gives 0 where not)
        self.opened = np.zeros((0, len(self.cpus)), dtype=bool)
        self._fds: list[int] = []
        self._cells: list[int] = []  # each fd's cell: event index * len(cpus) + cpu index
        rows: list[np.ndarray] = []
        try:
            for spec in events:
                scope = pmu_scope(spec.pmu)
                where = [i for i, cpu in enumerate(self.cpus) if scope is None or cpu in scope.cpus]
                refused = None
                if scope is not None and everywhere:
                    refused = f"{scope.describe(spec.pmu or '')}, not on every CPU"
                elif not where:
                    refused = f"not counted on these CPUs: {scope.describe(spec.pmu or '')}"
                if refused is not None:
                    if not skip_unsupported:
                        raise PerfEventError(f"{spec.name}: {refused}", errno.EOPNOTSUPP)
                    self.unsupported[spec.name] = refused
                    continue
                fds: list[int] = []
                try:
                    for i in where:
                        cpu = self.cpus[i]
                        fds.append(open_counter(spec, cpu))
                except PerfEventError as err:
                    for fd in fds:
                        os.close(fd)
                    if not skip_unsupported:
                        raise
                    why = errno_reason(err.errno) if err.errno else str(err)
                    # Naming the CPU matters only where CPUs differ (hybrid PMUs).
                    self.unsupported[spec.name] = why if not fds else f"{why} on cpu {cpu}"
                    continue
                base = len(self.events) * len(self.cpus)
                self.events.append(spec)
                self._fds.extend(fds)
                self._cells.extend(base + i for i in where)
                row = np.zeros(len(self.cpus), dtype=bool)
                row[where] = True
                rows.append(row)
        except BaseException:
            self.close()
            raise
        if rows:
            self.opened = np.stack(rows)
        self._fd_at = dict(zip(self._cells, self._fds, strict=True))
        self._buf = bytearray(READ_SIZE * len(self._fds))
        view = memoryview(self._buf)
        self._slices = [view[i * READ_SIZE : (i + 1) * READ_SIZE] for i in range(len(self._fds))]

    def fd(self, event: int, cpu: int) -> int | None:
        """The fd of ``events[event]`` on ``cpus[cpu]`` (indexes, not ids), None where
        it is not opened: for BPF programs that read the counters themselves (a perf
        event array)."""
        return self._fd_at.get(event * len(self.cpus) + cpu)

    def read(self) -> np.ndarray:
        """uint64 array [event, cpu, (value, enabled_ns, running_ns)], cumulative; 0
        where the event is not opened (``opened``)."""
        for fd, part in zip(self._fds, self._slices, strict=True):
            if os.readv(fd, [part]) != READ_SIZE:
                raise PerfEventError(f"short read from perf event fd {fd}")
        out = np.zeros((len(self.events) * len(self.cpus), 3), dtype=np.uint64)
        out[self._cells] = np.frombuffer(self._buf, dtype=np.uint64).reshape(-1, 3)
        return out.reshape(len(self.events), len(self.cpus), 3)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        self._slices = []

    def __enter__(self) -> CounterSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
