"""The exporter: loads the metric sets' BPF objects, and at each scrape reads
their maps and turns them into Prometheus metric families (a
``prometheus_client`` custom collector), with its own metrics beside them.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.btf import BtfError, Kind
from kernmlops.ebpf.libbpf import LibbpfError
from kernmlops.ebpf.objects import BpfObject, open_and_load
from kernmlops.ebpf.spec import object_spec
from kernmlops.errors import KernmlopsError
from kernmlops.exporter.decoders import (
    CgroupPaths,
    DecodeError,
    DecoderContext,
    DropLabelSet,
    LabelDecodeError,
    label_decoders,
)
from kernmlops.exporter.histogram import Buckets
from kernmlops.exporter.maps import EventCounts, KeyValueReader, MapReader
from kernmlops.exporter.perf_event import PerfEventLinks, is_perf_event, register_section_handler
from kernmlops.exporter.spec import (
    KERNMLOPS_FORMAT,
    CounterSpec,
    HistogramSpec,
    MetricSet,
)
from kernmlops.exporter.xdp import attach_xdp, is_xdp_interface
from kernmlops.exporter.xdp import register_section_handler as register_xdp_handler

SELF = "kernmlops_exporter"
#: label sets a metric remembers before those gone from its map are forgotten
_COMPACT_FLOOR = 4096
_UNSEEN = np.iinfo(np.uint64).max
#: decoders that read /proc/kallsyms
_KALLSYMS_DECODERS = frozenset({"ksym", "kstack"})
DEFAULT_MAX_LABEL_SETS = 10_000
COMM_LEN = 15  # the kernel keeps 15 characters of a task's name
BPF_STATS_RUN_TIME = 0
BPF_STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


class ExporterError(KernmlopsError):
    """A metric set cannot be loaded, or does not fit its BPF object."""


@dataclass(frozen=True)
class JobFilter:
    """Restrict every set to one job, in the kernel: a process (``tgid``), a
    thread name (``comm``, as the kernel keeps it: 15 characters) and/or a
    cgroup v2 and everything below it (``cgroup``: its path below the cgroup
    mount, or its full path)."""

    tgid: int | None = None
    comm: str | None = None
    cgroup: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.tgid or self.comm or self.cgroup)

    def scope(self) -> list[str]:
        """What the filter keeps, in words (every part must hold); [] when inactive."""
        parts = []
        if self.tgid:
            parts.append(f"process {self.tgid}")
        if self.comm:
            parts.append(f"threads named {self.comm[:COMM_LEN]}")
        if self.cgroup:
            parts.append(f"tasks in cgroup {self.cgroup} and below")
        return parts

    def globals(self, cgroups: CgroupPaths | None = None) -> dict[str, int]:
        """Values of the ``const volatile`` settings in bpf/exp_common.h."""
        out: dict[str, int] = {}
        if self.tgid is not None:
            if self.tgid <= 0:
                raise ExporterError(f"--tgid {self.tgid}: a process id is positive")
            out["exp_tgid"] = self.tgid
        if self.comm is not None:
            raw = self.comm.encode()[:COMM_LEN]
            if not raw:
                raise ExporterError("--comm: give a name")
            out["exp_comm_on"] = 1
            out["exp_comm"] = int.from_bytes(raw.ljust(16, b"\0"), "little")
        if self.cgroup is not None:
            try:
                cg_id, level = (cgroups or CgroupPaths()).id_of(self.cgroup)
            except DecodeError as err:
                raise ExporterError(f"--cgroup: {err}") from None
            out["exp_cgroup_id"] = cg_id
            out["exp_cgroup_level"] = level
        return out


@dataclass
class Phase:
    """One step of the exporter's start-up, timed (Unix ns) for the trace
    ebpf_exporter sends about its own start when tracing is configured (the
    runtime sends it: SetRuntime.services_started): its name, parent (an index
    in the list), attributes, events ``(name, ns, attributes)`` and error."""

    name: str
    parent: int | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    start_ns: int = field(default_factory=time.time_ns)
    end_ns: int = 0
    events: list[tuple[str, int, dict[str, str]]] = field(default_factory=list)
    error: str | None = None


class StartupTrace:
    """The phases of :meth:`Exporter.start`, named as ebpf_exporter names its
    own (``attach`` > ``register_handlers``, ``attach_configs`` >
    ``attach_config`` {config} > ``new_module``, ``pass_kaddrs``,
    ``bpf_load_object``, ``attach_module``); and of :meth:`Exporter.close`
    (``detach`` > ``close_module`` {config}, with a ``prog_detach`` {SEC} event
    per attached program and a ``close`` event)."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []

    def begin(self, name: str, parent: int | None = None, **attributes: str) -> int:
        self.phases.append(Phase(name, parent, dict(attributes)))
        return len(self.phases) - 1

    def end(self, index: int, error: str | None = None) -> None:
        phase = self.phases[index]
        if not phase.end_ns:
            phase.end_ns = time.time_ns()
        if error is not None:
            phase.error = error

    def fail(self, index: int, error: str) -> None:
        self.phases[index].error = error

    def event(self, index: int, name: str, **attributes: str) -> None:
        self.phases[index].events.append((name, time.time_ns(), dict(attributes)))


@dataclass
class ProgramStatus:
    name: str
    section: str
    attached: bool = False
    error: str | None = None
    fd: int = -1


@dataclass
class SetStatus:
    """What --check reports and the self-metrics show of one set."""

    name: str
    path: Path
    loaded: bool = False
    error: str | None = None
    variant: str | None = None
    programs: list[ProgramStatus] = field(default_factory=list)
    #: labels that can never decode here (ksym without kallsyms addresses): the
    #: set loads, but its series would all be left out; --check fails on it
    label_problems: list[str] = field(default_factory=list)

    @property
    def attached(self) -> int:
        return sum(p.attached for p in self.programs)

    @property
    def missed(self) -> list[ProgramStatus]:
        return [p for p in self.programs if not p.attached]


class MetricReader:
    """One counter or histogram: its map, label decoders and label sets."""

    def __init__(
        self,
        set_name: str,
        spec: CounterSpec | HistogramSpec,
        reader: KeyValueReader,
        ctx: DecoderContext,
        max_label_sets: int,
        *,
        flavor: str = KERNMLOPS_FORMAT,
        offset: int = 0,
    ) -> None:
        self.set_name = set_name
        self.spec = spec
        #: the HELP served: the spec's, and, when the exporter counts only a job
        #: (Exporter.scope), which one, so no reader takes it for the whole machine
        self.help = spec.help
        self.reader = reader
        self.decoders = label_decoders(spec.labels, ctx, flavor=flavor, offset=offset)
        self._cgroups = ctx.cgroups
        self.label_names = [d.name for d in self.decoders]
        self.max_label_sets = spec.max_label_sets or max_label_sets
        #: raw key -> index (position) of its label set, or -1 (dropped by a regexp)
        self._index: dict[bytes, int] = {}
        self._index_cap = max(65536, 4 * getattr(reader, "max_entries", 0))
        #: label sets by position, in the order first seen; those long gone from
        #: the map are forgotten (_compact), so keys that churn cost no memory
        self._labelsets: list[tuple[str, ...]] = []
        self._positions: dict[tuple[str, ...], int] = {}
        #: per position: its value's total at the last scrape, and the scrape at
        #: which that last changed (which label sets the limit keeps)
        self._last_total = np.zeros(0, np.uint64)
        self._changed_at = np.zeros(0, np.int64)
        self._scrape_no = 0
        #: label sets present in the map but left out of the latest scrape
        #: (more than max_label_sets)
        self.dropped = 0
        self.decoder_errors: dict[str, int] = {}
        #: keys counted in decoder_errors: not counted again while they stay undecodable
        self._undecodable: set[bytes] = set()
        #: the label that failed in the last _label_index (events' errors, _count_events)
        self._failed_label: str | None = None
        self._text_labels: dict[int, tuple[str, str]] = {}
        self._text_prefixes: dict[int, list[str]] = {}
        self._last_positions: list[int] = []
        self._last_prefixes: list[str] = []
        self.last_error: str | None = None

    def _label_index(self, key: bytes) -> int:
        found = self._index.get(key)
        if found is not None:
            return found
        if len(self._index) > self._index_cap:
            self._index.clear()  # keys churn (an LRU map): start the cache afresh
        try:
            labels = tuple(d(key) for d in self.decoders)
        except DropLabelSet:
            self._index[key] = -1
            return -1
        except LabelDecodeError as err:
            # not in _index: tried again at every scrape, it may decode later (a new cgroup)
            return self._undecodable_key(key, err.label, err)
        self._undecodable.discard(key)
        pos = self._positions.get(labels)
        if pos is None:
            pos = self._positions[labels] = len(self._labelsets)
            self._labelsets.append(labels)
        self._index[key] = pos
        return pos

    def _undecodable_key(self, key: bytes, label: str, err: Exception) -> int:
        """-1 for a key whose ``label`` does not decode, counted in decoder_errors
        once: not again at each scrape (rate() would then follow the scrape
        interval), again once it has decoded or left the map. A reader of
        events (maps.EventCounts) has each event counted by _count_events."""
        self._failed_label = label
        self.last_error = str(err)
        if isinstance(self.reader, EventCounts):
            return -1
        if key not in self._undecodable:
            self._undecodable.add(key)
            self.decoder_errors[label] = self.decoder_errors.get(label, 0) + 1
        return -1

    def _settled(self, key: bytes) -> bool:
        return key in self._index

    def _count_events(self, reader: EventCounts) -> None:
        """Each event since the last scrape whose key does not decode, counted
        under the label that failed (ebpf_exporter counts per event); the
        reader keeps apart only the events of keys not known to decode."""
        reader.settled = self._settled
        for key, n in reader.take_unsettled().items():
            self._failed_label = None
            if self._label_index(key) < 0 and self._failed_label is not None:
                label = self._failed_label
                self.decoder_errors[label] = self.decoder_errors.get(label, 0) + n

    def _forget_gone(self, present: Iterable[bytes]) -> None:
        """Undecodable keys no longer in the map: counted again if they come back."""
        if self._undecodable:
            self._undecodable.intersection_update(present)

    def _read(self) -> tuple[list[bytes], np.ndarray]:
        """The map's keys and values; the cgroup decoder learns when they were
        read (a cgroup a later walk does not find was removed)."""
        self._cgroups.keys_read(time.monotonic())
        return self.reader.read()

    def snapshot(self) -> tuple[list[int], np.ndarray]:
        """Label sets present now (as indices) and their values, the keys of one
        label set summed."""
        keys, values = self._read()
        self._forget_gone(keys)
        found = list(map(self._index.get, keys))  # known keys: one dict lookup each, in C
        if None in found:
            found = [
                self._label_index(k) if i is None else i for k, i in zip(keys, found, strict=True)
            ]
        if isinstance(self.reader, EventCounts):
            self._count_events(self.reader)
        idx = np.array(found, dtype=np.int64) if found else np.zeros(0, np.int64)
        keep = idx >= 0
        idx, values = idx[keep], values[keep]
        order = np.argsort(idx, kind="stable")
        idx, values = idx[order], values[order]
        if len(idx) < 2 or bool(np.all(idx[1:] != idx[:-1])):
            return self._served(idx, values)  # one key per label set: no sums needed
        starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
        return self._served(idx[starts], np.add.reduceat(values, starts, axis=0))

    def _served(self, positions: np.ndarray, values: np.ndarray) -> tuple[list[int], np.ndarray]:
        """The label sets present now (``positions``, ascending, one row of
        ``values`` each) that this scrape serves: all of them, or, past
        ``max_label_sets``, those whose values changed most recently (then the
        first seen); the others are counted in ``dropped``. The limit is on the
        label sets in the map now, not on all it ever held: keys that churn (a
        comm, a cgroup, evicted from an LRU map) make room for new ones."""
        self._scrape_no += 1
        if len(self._last_total) < len(self._labelsets):
            grow = max(len(self._labelsets), 2 * len(self._last_total)) - len(self._last_total)
            # a label set seen for the first time counts as changed, whatever its value
            self._last_total = np.r_[self._last_total, np.full(grow, _UNSEEN, np.uint64)]
            self._changed_at = np.r_[self._changed_at, np.zeros(grow, np.int64)]
        if len(self._labelsets) > max(_COMPACT_FLOOR, 2 * len(positions)):
            positions = self._compact(positions)
        totals = values.sum(axis=1, dtype=np.uint64)
        changed = positions[totals != self._last_total[positions]]
        self._changed_at[changed] = self._scrape_no
        self._last_total[positions] = totals
        self.dropped = max(0, len(positions) - self.max_label_sets)
        if self.dropped:
            recent = np.lexsort((positions, -self._changed_at[positions]))
            keep = np.sort(recent[: self.max_label_sets])
            positions, values = positions[keep], values[keep]
        return positions.tolist(), values

    def _compact(self, present: np.ndarray) -> np.ndarray:
        """Forget the label sets not in the map now (their keys are gone):
        the present ones keep their order, at new positions, which are returned."""
        old_to_new = np.full(len(self._labelsets), -1, np.int64)
        old_to_new[present] = np.arange(len(present))
        self._labelsets = [self._labelsets[i] for i in present.tolist()]
        self._positions = {labels: i for i, labels in enumerate(self._labelsets)}
        remap = old_to_new.tolist()
        index: dict[bytes, int] = {}
        for key, i in self._index.items():
            if i < 0:
                index[key] = -1  # left out by a regexp: stays so
            elif remap[i] >= 0:
                index[key] = remap[i]
        self._index = index
        self._last_total = self._last_total[present]
        self._changed_at = self._changed_at[present]
        self._text_labels.clear()
        self._text_prefixes.clear()
        self._last_positions, self._last_prefixes = [], []
        return np.arange(len(present), dtype=np.int64)

    def family(self, snap: tuple[list[int], np.ndarray]) -> Metric:
        """The snapshot as a prometheus_client metric family."""
        positions, values = snap
        labelsets = [self._labelsets[i] for i in positions]
        spec = self.spec
        if isinstance(spec, CounterSpec):
            counter = CounterMetricFamily(spec.name, self.help, labels=self.label_names)
            scaled = values[:, 0].astype(np.float64) * spec.value_multiplier
            for labels, value in zip(labelsets, scaled.tolist(), strict=True):
                counter.add_metric(labels, value)
            return counter
        buckets = self.buckets
        hist = HistogramMetricFamily(spec.name, self.help, labels=self.label_names)
        cumulative = buckets.cumulative(values[:, : buckets.nslots]).astype(np.float64).tolist()
        sums = buckets.sums(values).tolist()
        le = buckets.le
        for labels, counts, total in zip(labelsets, cumulative, sums, strict=True):
            hist.add_metric(labels, list(zip(le, counts, strict=True)), total)
        return hist

    def _label_parts(self, pos: int) -> tuple[str, str]:
        """The label set's ``name="value"`` pairs, sorted by name as
        prometheus_client writes them, split where ``le`` goes: (before, after)."""
        found = self._text_labels.get(pos)
        if found is None:
            pairs = sorted(zip(self.label_names, self._labelsets[pos], strict=True))
            before = "".join(f'{k}="{escape_label_value(v)}",' for k, v in pairs if k < "le")
            after = "".join(f',{k}="{escape_label_value(v)}"' for k, v in pairs if k > "le")
            found = self._text_labels[pos] = (before, after)
        return found

    def _prefixes(self, positions: list[int]) -> list[str]:
        """Each series' text before its value (``name{labels} ``), made once per
        label set: a histogram's buckets, then _count and _sum."""
        if positions == self._last_positions:  # the usual scrape: the same label sets
            return self._last_prefixes
        cache = self._text_prefixes
        missing = [p for p in positions if p not in cache]
        spec = self.spec
        for pos in missing:
            before, after = self._label_parts(pos)
            labels = (before + after.removeprefix(",")).removesuffix(",")
            braced = f"{{{labels}}}" if labels else ""
            if isinstance(spec, CounterSpec):
                cache[pos] = [f"{spec.exposed_name}{braced} "]
                continue
            bucket = f"{spec.name}_bucket{{"
            cache[pos] = [
                *(f'{bucket}{before}le="{bound}"{after}}} ' for bound in self.buckets.le),
                f"{spec.name}_count{braced} ",
                f"{spec.name}_sum{braced} ",
            ]
        prefixes = list(itertools.chain.from_iterable(map(cache.__getitem__, positions)))
        self._last_positions, self._last_prefixes = positions, prefixes
        return prefixes

    def text(self, snap: tuple[list[int], np.ndarray], out: list[str]) -> None:
        """The snapshot in the text exposition format into ``out``: the bytes
        ``generate_latest`` writes for :meth:`family`, made without a sample
        object per line: each series' text up to its value is made once per
        label set, the values are formatted in bulk (a scrape of thousands of
        series stays in milliseconds)."""
        positions, values = snap
        spec = self.spec
        doc = self.help.replace("\\", r"\\").replace("\n", r"\n")
        if isinstance(spec, CounterSpec):
            name = spec.exposed_name
            out.append(f"# HELP {name} {doc}\n# TYPE {name} counter\n")
            table = values[:, 0].astype(np.float64) * spec.value_multiplier
        else:
            name = spec.name
            out.append(f"# HELP {name} {doc}\n# TYPE {name} histogram\n")
            buckets = self.buckets
            cumulative = buckets.cumulative(values[:, : buckets.nslots]).astype(np.float64)
            table = np.column_stack([cumulative, cumulative[:, -1], buckets.sums(values)])
        if not positions:
            return
        lines = map(operator.add, self._prefixes(positions), float_texts(table))
        out.append("\n".join(lines) + "\n")

    @cached_property
    def buckets(self) -> Buckets:
        assert isinstance(self.spec, HistogramSpec)
        return Buckets.from_spec(self.spec)


def float_texts(values: np.ndarray) -> list[str]:
    """``floatToGoString`` of every value (row by row), made in bulk: the repr
    of a float list is written in C, and only the values it writes otherwise
    (from 1e6 on, which Go writes with an exponent; inf, nan) one by one."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    if not flat.size:
        return []
    texts = repr(flat.tolist())[1:-1].split(", ")
    for i in np.flatnonzero(~np.isfinite(flat) | (flat >= 1e6)).tolist():
        texts[i] = floatToGoString(flat[i])
    return texts


class ExactCounterFamily(Metric):
    """A counter served under exactly its name, as Go's Prometheus client
    serves one: ``CounterMetricFamily`` strips a ``_total`` it is given and
    writes one after every name, so it cannot serve a counter named without
    it (ebpf_exporter's ``ebpf_exporter_ebpf_program_run_time_seconds``).
    Written by :func:`plain_text` (``generate_latest`` would add ``_total``
    to its TYPE line)."""

    def __init__(self, name: str, documentation: str, labels: list[str]) -> None:
        super().__init__(name, documentation, "counter")
        self._labelnames = tuple(labels)

    def add_metric(self, labels: list[str], value: float) -> None:
        pairs = dict(zip(self._labelnames, labels, strict=True))
        self.samples.append(Sample(self.name, pairs, value))


def plain_text(families: list[Metric]) -> str:
    """What ``generate_latest`` writes for gauge and counter families whose
    names are valid as they are (the exporter's own metrics), without its
    per-sample escaping machinery; other types go through it. An
    :class:`ExactCounterFamily` keeps its name (no ``_total`` added)."""
    out = []
    for family in families:
        if family.type not in ("gauge", "counter"):
            out.append(generate_latest(_Families([family])).decode())  # type: ignore[arg-type]
            continue
        name = family.name
        if family.type == "counter" and not isinstance(family, ExactCounterFamily):
            name += "_total"
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n")
        for s in family.samples:
            value = floatToGoString(s.value)
            if s.labels:
                pairs = sorted(s.labels.items())
                labels = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)
                out.append(f"{s.name}{{{labels}}} {value}\n")
            else:
                out.append(f"{s.name} {value}\n")
    return "".join(out)


class _Families:
    """A collector of ready families (for generate_latest)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def escape_label_value(value: str) -> str:
    """As the text format (and prometheus_client) escapes a label value."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _LoadedSet:
    def __init__(self, metric_set: MetricSet) -> None:
        self.set = metric_set
        self.status = SetStatus(metric_set.name, metric_set.path)
        self.obj: BpfObject | None = None
        self.metrics: list[MetricReader] = []
        #: what runs beside the set (SetRuntime.services): stopped before the
        #: object closes, as they use its maps
        self.services: list[Any] = []
        self.services_started = False

    def start_services(self) -> None:
        if not self.services_started:
            self.services_started = True
            for service in self.services:
                service.start()

    def close(self) -> None:
        while self.services:
            self.services.pop().close()
        for metric in self.metrics:  # a perf event array's poller, if services were not made
            close = getattr(metric.reader, "close", None)
            if close is not None:
                close()
        if self.obj is not None:
            self.obj.close()
            self.obj = None
        self.metrics.clear()


def _object_globals(path: Path) -> set[str]:
    try:
        btf = object_spec(path).btf
    except BtfError:
        return set()
    return {t.name for t in btf.types if t.kind is Kind.VAR}


def check_fit(metric_set: MetricSet, spec: CounterSpec | HistogramSpec, obj: BpfObject) -> None:
    """The metric's labels and buckets fit its map, or an error saying how not."""
    where = f"metric set {metric_set.path}: {spec.name}"
    bpf_map = obj.maps.get(spec.map)
    if bpf_map is None:
        maps = ", ".join(sorted(m for m in obj.maps if not m.startswith("."))) or "none"
        raise ExporterError(f"{where}: the object has no map {spec.map!r} (maps: {maps})")
    if spec.key_bytes > bpf_map.key_size:
        raise ExporterError(
            f"{where}: labels span {spec.key_bytes} bytes, the key of map {spec.map} has "
            f"{bpf_map.key_size}"
        )
    want = 8
    if isinstance(spec, HistogramSpec):
        b = Buckets.from_spec(spec)
        want = b.value_words * 8
        what = f"{b.nslots} slots (buckets 0..{len(b.bounds) - 1} and overflow)"
        if spec.sum:
            what += " and the sum"
    else:
        what = "one u64"
    if bpf_map.value_size != want:
        raise ExporterError(
            f"{where}: values of map {spec.map} are {bpf_map.value_size} bytes; "
            f"the metric needs {want} ({what})"
        )


#: section prefixes of program types that fail at load, not at attach, where the
#: kernel lacks them (a VM without fentry: EPERM, with libbpf's hint at 'ulimit -l')
_LOAD_TIME_TYPES = {"fentry": ("fentry/", "fexit/", "fmod_ret/", "fentry.s/", "fexit.s/")}


def _attach_error(section: str, err: LibbpfError) -> str:
    """One line. A uprobe or USDT fails for a reason only libbpf's log gives (the
    binary is a script, it has no such probe) and an errno that does not say it
    (EBADF): its last line is added."""
    first, *rest = str(err).splitlines()
    if rest and section.startswith(("usdt", "uprobe", "uretprobe")):
        return f"{first} ({rest[-1].strip().removeprefix('libbpf: ')})"
    return first


def _missing_program_type(path: Path, bpf_dir: Path | None) -> str | None:
    """Why an object that did not load cannot load here, when it has programs of a
    type this kernel refuses (what ``kernmlops doctor`` probes); None otherwise."""
    from kernmlops.ebpf.probe import probe_program

    try:
        sections = object_spec(path).programs.values()
    except (KernmlopsError, OSError):
        return None
    for feature, prefixes in _LOAD_TIME_TYPES.items():
        used = sorted(sec for sec in sections if sec.startswith(prefixes))
        if not used:
            continue
        found = probe_program(feature, bpf_dir)
        if not found.ok and "not found" not in found.detail:
            return (
                f"this kernel does not load {feature} programs, and it has {len(used)} "
                f"({', '.join(used)}); kernmlops doctor shows the program types it loads"
            )
    return None


class Exporter:
    """Loads metric sets and serves them as a ``prometheus_client`` collector.

    ``process_filter_fd`` is the fd of a ``kmo_tracked`` map (a collection's
    process filter): the sets then count only the processes it tracks, which
    ``tracked`` names in the served HELP texts (as the job filter's are).
    """

    def __init__(
        self,
        sets: list[MetricSet],
        *,
        job: JobFilter | None = None,
        process_filter_fd: int | None = None,
        self_tgid: int | None = None,
        bpf_dir: Path | None = None,
        max_label_sets: int | None = None,
        bpf_stats: bool = False,
        decoder_context: DecoderContext | None = None,
        tracked: str = "the processes of the collection",
        services_later: bool = False,
    ) -> None:
        self.sets = [_LoadedSet(ms) for ms in sets]
        self.job = job or JobFilter()
        self.process_filter_fd = process_filter_fd
        #: what the sets count, when not the whole machine: added to every HELP
        #: text, whose own words (a set's YAML) cannot know the flags it runs with
        parts = [*([tracked] if process_filter_fd is not None else []), *self.job.scope()]
        self.scope = (
            parts[0] if len(parts) == 1 else f"tasks that match each of: {'; '.join(parts)}"
        ) if parts else ""  # fmt: skip
        self.self_tgid = os.getpid() if self_tgid is None else self_tgid
        self.bpf_dir = bpf_dir
        #: a ceiling over every metric's own max_label_sets (--max-label-sets);
        #: None: each metric's own, else DEFAULT_MAX_LABEL_SETS
        self.max_label_sets = max_label_sets
        self.want_bpf_stats = bpf_stats
        #: start() leaves the sets' services (threads) to start_services()
        self.services_later = services_later
        self.ctx = decoder_context or DecoderContext()
        self._stats_fd: int | None = None
        self._lock = threading.Lock()
        #: reads of every map (render() and collect() calls): scrapes arriving during
        #: one share it, so this is not the scrapes served (MetricsServer.scrapes)
        self.renders = 0
        self.last_scrape_s = 0.0
        #: the phases of the last start(), for the start-up trace
        self.startup = StartupTrace()

    # -- loading ------------------------------------------------------------------
    def start(self) -> list[SetStatus]:
        """Load and attach every set; a set that fails is reported, not raised."""
        trace = self.startup = StartupTrace()
        root = trace.begin("attach")
        job_globals = self.job.globals(self.ctx.cgroups)
        if self.want_bpf_stats and self._stats_fd is None:
            fd = libbpf.lib.bpf_enable_stats(BPF_STATS_RUN_TIME)
            if fd < 0:
                raise ExporterError(f"cannot enable BPF stats: {libbpf.strerror(-fd)}")
            self._stats_fd = fd  # stats stay on while this fd is open
        handlers = trace.begin("register_handlers", root)
        register_section_handler()
        register_xdp_handler()
        trace.end(handlers)
        configs = trace.begin("attach_configs", root)
        for loaded in self.sets:
            step = trace.begin("attach_config", configs, config=loaded.status.name)
            try:
                self._load(loaded, job_globals, step)
            except (KernmlopsError, OSError) as err:
                loaded.status.error = str(err)
                loaded.close()
            trace.end(step, loaded.status.error)
            for left in range(step + 1, len(trace.phases)):  # the step an error cut short
                trace.end(left)
        trace.end(configs)
        trace.end(root)
        self._warm()
        if not self.services_later:
            self.start_services()
        return self.statuses

    def _warm(self) -> None:
        """Read the system tables the decoders need now, not in the first scrape
        (and before capabilities are dropped); a set whose labels need kernel
        symbols this process cannot see gets a label problem."""
        used_by = {
            loaded.status.name: {
                d.name
                for metric in loaded.metrics
                for label in metric.spec.labels
                for d in label.decoders
            }
            for loaded in self.sets
        }
        used = set().union(*used_by.values())
        if "syscall" in used:
            _ = self.ctx.syscall_names
        if "cgroup" in used:
            with contextlib.suppress(DecodeError):  # reported per key when scraped
                self.ctx.cgroups.scan()
        if used & _KALLSYMS_DECODERS:
            try:
                self.ctx.kallsyms.load()
            except DecodeError as err:
                for loaded in self.sets:
                    needs = sorted(used_by[loaded.status.name] & _KALLSYMS_DECODERS)
                    if needs:
                        loaded.status.label_problems.append(
                            f"its {' and '.join(needs)} labels cannot be decoded, so every "
                            f"series with them would be left out: {err}"
                        )

    def _load(self, loaded: _LoadedSet, job_globals: dict[str, int], step: int) -> None:
        trace = self.startup
        trace.begin("new_module", step)  # the object found (built), its globals read
        ms = loaded.set
        path = ms.object_path(self.bpf_dir)
        src = ms.source
        cached = not ms.builtin and not ms.spec.object and path.name.startswith("exporter-")
        stale = not path.exists() or (
            src is not None and src.stat().st_mtime > path.stat().st_mtime
        )
        if cached and src is not None and stale:
            from kernmlops.ebpf.build import compile_object

            compile_object(src, path, vmlinux_dir=self.bpf_dir, cflags=ms.cflags)
        if not path.exists():
            hint = "kernmlops build-bpf" if ms.builtin else "compile its .bpf.c"
            raise ExporterError(f"metric set {ms.name}: BPF object {path} not found ({hint})")
        available = _object_globals(path)
        values: dict[str, int | bool] = {}
        if "kmo_self_tgid" in available:
            values["kmo_self_tgid"] = self.self_tgid
        if self.process_filter_fd is not None:
            if "kmo_filter_on" not in available:
                raise ExporterError(
                    f"metric set {ms.name}: its object has no process filter (include "
                    "exp_common.h), so it cannot follow a collection's processes"
                )
            values["kmo_filter_on"] = True
        missing = sorted(set(job_globals) - available)
        if missing:
            raise ExporterError(
                f"metric set {ms.name}: its object cannot be restricted to a job "
                f"(no {', '.join(missing)}: include exp_common.h and call exp_*_wanted())"
            )
        values.update(job_globals)
        trace.end(len(trace.phases) - 1)
        runtime = ms.runtime  # another format's way (compat.py), or None: ours
        if runtime is not None:
            kaddrs = trace.begin("pass_kaddrs", step) if ms.kaddrs else None
            for symbol in ms.kaddrs if kaddrs is not None else ():
                trace.event(kaddrs, "kaddr", symbol=symbol)
            try:
                values.update(runtime.load_globals(ms))
            except KernmlopsError as err:
                if kaddrs is not None:
                    trace.end(kaddrs, str(err))
                raise
            if kaddrs is not None:
                trace.end(kaddrs)
        reuse = {"kmo_tracked": self.process_filter_fd} if self.process_filter_fd else {}
        register_section_handler()
        register_xdp_handler()
        loading = trace.begin("bpf_load_object", step)
        try:
            obj = loaded.obj = open_and_load(path, globals_=values, reuse_maps=reuse)
        except LibbpfError as err:
            trace.end(loading, str(err))
            hint = _missing_program_type(path, self.bpf_dir)
            if hint is None:
                raise
            why = libbpf.strerror(err.errno) if err.errno else "refused"
            raise ExporterError(f"load {path.name}: {why}: {hint}") from None
        trace.end(loading)
        loaded.status.loaded = True
        loaded.status.variant = obj.variant
        for spec in ms.metrics:
            (runtime.check_fit if runtime is not None else check_fit)(ms, spec, obj)
        for spec in ms.metrics:
            default = self.max_label_sets or DEFAULT_MAX_LABEL_SETS
            if runtime is not None:
                metric = runtime.make_reader(ms.name, spec, obj, self.ctx, default)
            else:
                reader = MapReader(obj.map(spec.map))
                metric = MetricReader(ms.name, spec, reader, self.ctx, default)
            if self.max_label_sets is not None:  # a ceiling, over the set's own too
                metric.max_label_sets = min(metric.max_label_sets, self.max_label_sets)
            if self.scope:
                metric.help = f"{metric.spec.help} (counted only for {self.scope})"
            loaded.metrics.append(metric)
        if runtime is not None:  # before attaching: a program's first events find them
            loaded.services = runtime.services(ms, loaded.metrics, obj, self.ctx)
        attaching = trace.begin("attach_module", step)
        for prog in obj.programs.values():
            if not prog.autoload:
                continue
            st = ProgramStatus(prog.name, prog.section, fd=prog.fd)
            trace.event(attaching, "prog_attach", SEC=prog.section)
            try:
                if is_perf_event(prog.section):
                    where = f"metric set {ms.name}: program {prog.name}"
                    loaded.services.append(PerfEventLinks(prog, where=where))
                elif is_xdp_interface(prog.section):
                    attach_xdp(prog)
                else:
                    prog.attach()
                st.attached = True
            except LibbpfError as err:
                st.error = _attach_error(prog.section, err)
                # as ebpf_exporter records a failed attach: an exception event, an error status
                trace.event(attaching, "exception", **{"exception.message": st.error})
                trace.fail(attaching, st.error)
            loaded.status.programs.append(st)
        trace.end(attaching)

    def start_services(self) -> None:
        """Start what runs beside the loaded sets (threads: perf event array
        pollers, cgroup id map keepers). Separate from :meth:`start` so that
        ``--capabilities.keep`` drops capabilities first, as the threads then
        inherit the drop; :meth:`start` calls it unless ``services_later``."""
        for loaded in self.sets:
            if loaded.obj is not None:
                loaded.start_services()
        runtimes = {id(s.set.runtime): s.set.runtime for s in self.sets if s.set.runtime}
        for runtime in runtimes.values():
            runtime.services_started(self.sets, self.startup.phases)

    @property
    def statuses(self) -> list[SetStatus]:
        return [s.status for s in self.sets]

    @property
    def bpf_stats_on(self) -> bool:
        if self._stats_fd is not None:
            return True
        try:
            return BPF_STATS_SYSCTL.read_text().strip() == "1"
        except OSError:
            return False

    def close(self) -> None:
        """Detach and unload everything (idempotent). A format that reports it
        (ebpf_exporter's, with spans configured) is handed the close's phases."""
        runtimes = {id(s.set.runtime): s.set.runtime for s in self.sets if s.set.runtime}
        # asked before the sets close: their span rings hold what would send it
        reporters = [r for r in (rt.closing(self.sets) for rt in runtimes.values()) if r]
        trace = StartupTrace()
        root = trace.begin("detach")
        for loaded in self.sets:
            step = None
            if loaded.obj is not None:
                step = trace.begin("close_module", root, config=loaded.set.name)
                for prog in loaded.status.programs:
                    if prog.attached:
                        trace.event(step, "prog_detach", SEC=prog.section)
                trace.event(step, "close")
            loaded.close()
            if step is not None:
                trace.end(step)
        trace.end(root)
        for report in reporters:
            report(trace.phases)
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scraping -----------------------------------------------------------------
    def describe(self) -> list[Metric]:
        # Present so registering does not run a scrape.
        return []

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's collector protocol: every metric family."""
        with self._lock:
            t0 = time.perf_counter()
            families: list[Metric] = []
            for loaded in self.sets:
                for metric in loaded.metrics:
                    families.append(metric.family(metric.snapshot()))
            families.extend(self._self_metrics(time.perf_counter() - t0))
            self.renders += 1
            self.last_scrape_s = time.perf_counter() - t0
        yield from families

    def render(self) -> bytes:
        """The text exposition format of a scrape (what /metrics serves): the
        same bytes as ``generate_latest(self.registry())`` for kernmlops' own
        sets, written directly for the metric sets (their series can number
        thousands) and by :func:`plain_text` for the exporter's own few
        metrics. ebpf_exporter's configs keep its names here (counters with no
        ``_total`` added), which prometheus_client's registry cannot write."""
        with self._lock:
            t0 = time.perf_counter()
            out: list[str] = []
            for loaded in self.sets:
                for metric in loaded.metrics:
                    metric.text(metric.snapshot(), out)
            out.append(plain_text(self._self_metrics(time.perf_counter() - t0)))
            self.renders += 1
            self.last_scrape_s = time.perf_counter() - t0
        return "".join(out).encode()

    def registry(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def _self_metrics(self, elapsed_s: float) -> list[Metric]:
        enabled = GaugeMetricFamily(
            f"{SELF}_set_enabled", "1 if the metric set is loaded and serving", labels=["set"]
        )
        attached = GaugeMetricFamily(
            f"{SELF}_programs_attached", "BPF programs attached, per set", labels=["set"]
        )
        missed = GaugeMetricFamily(
            f"{SELF}_programs_not_attached",
            "BPF programs of a loaded set that could not attach",
            labels=["set"],
        )
        full = CounterMetricFamily(
            f"{SELF}_map_full",
            "map inserts that failed because a metric map was full",
            labels=["set"],
        )
        recursion = CounterMetricFamily(
            f"{SELF}_program_recursion_misses",
            "runs of a program the kernel skipped (another BPF program was running)",
            labels=["set", "program"],
        )
        run_time = CounterMetricFamily(
            f"{SELF}_program_run_seconds",
            "time spent in a BPF program (kernel BPF stats; --bpf-stats)",
            labels=["set", "program"],
        )
        run_count = CounterMetricFamily(
            f"{SELF}_program_runs",
            "runs of a BPF program (kernel BPF stats; --bpf-stats)",
            labels=["set", "program"],
        )
        errors = CounterMetricFamily(
            f"{SELF}_decoder_errors",
            "map keys whose labels could not be decoded (their values are left out), each "
            "counted once until it decodes or leaves the map (it is tried at every scrape); "
            "a perf event array's samples, each one counted",
            labels=["set", "metric", "label"],
        )
        dropped = GaugeMetricFamily(
            f"{SELF}_label_sets_dropped",
            "label sets in the map left out of this scrape: more than the metric's "
            "max_label_sets (those whose values changed least recently are left out)",
            labels=["set", "metric"],
        )
        program_info = GaugeMetricFamily(
            f"{SELF}_program_info",
            "a loaded BPF program: its kernel id and tag (bpftool prog show id ID)",
            labels=["set", "program", "id", "tag"],
        )
        unattached = GaugeMetricFamily(
            f"{SELF}_perf_event_cpus_unattached",
            "online CPUs a perf_event program does not run on: brought online after the "
            "start, and its event could not be opened there",
            labels=["set", "program"],
        )
        stats_on = self.bpf_stats_on
        for loaded in self.sets:
            st = loaded.status
            for service in loaded.services:
                if isinstance(service, PerfEventLinks):
                    n = float(len(service.unattached))
                    unattached.add_metric([st.name, service.program], n)
            enabled.add_metric([st.name], 1.0 if loaded.obj is not None else 0.0)
            if loaded.obj is None:
                continue
            attached.add_metric([st.name], float(st.attached))
            missed.add_metric([st.name], float(len(st.missed)))
            if "exp_map_full" in loaded.obj.maps:
                n = loaded.obj.map("exp_map_full").lookup_percpu(0).sum()
                full.add_metric([st.name], float(n))
            for prog in st.programs:
                info = libbpf.prog_info(prog.fd)
                tag = bytes(info.tag).hex()
                program_info.add_metric([st.name, prog.name, str(info.id), tag], 1.0)
                if not prog.attached:
                    continue
                recursion.add_metric([st.name, prog.name], float(info.recursion_misses))
                if stats_on:
                    run_time.add_metric([st.name, prog.name], info.run_time_ns / 1e9)
                    run_count.add_metric([st.name, prog.name], float(info.run_cnt))
            for metric in loaded.metrics:
                for label, n in sorted(metric.decoder_errors.items()):
                    errors.add_metric([st.name, metric.spec.name, label], float(n))
                dropped.add_metric([st.name, metric.spec.name], float(metric.dropped))
        out: list[Metric] = [enabled, attached, missed, program_info, full, recursion, errors]
        out.append(dropped)
        if unattached.samples:
            out.append(unattached)
        if stats_on:
            out += [run_time, run_count]
        runtimes = {id(s.set.runtime): s.set.runtime for s in self.sets if s.set.runtime}
        for runtime in runtimes.values():
            out += runtime.self_metrics(self.sets, stats_on)  # its dashboards find them
        stats = GaugeMetricFamily(
            f"{SELF}_bpf_stats_enabled", "1 if the kernel keeps BPF program run times"
        )
        stats.add_metric([], 1.0 if stats_on else 0.0)
        scrapes = CounterMetricFamily(
            f"{SELF}_scrapes",
            "renders of the metrics, each reading every map once; scrapes that arrive "
            "during one share it, so this can be below the scrapes answered "
            "(kernmlops_exporter_http_responses_total)",
        )
        scrapes.add_metric([], float(self.renders + 1))
        duration = GaugeMetricFamily(
            f"{SELF}_scrape_duration_seconds",
            "time this scrape took to read and decode the maps",
        )
        duration.add_metric([], elapsed_s)
        return [*out, stats, scrapes, duration, _build_info()]


def _build_info() -> GaugeMetricFamily:
    """``kernmlops_exporter_build_info`` 1, labelled with what was built and where it
    runs (Prometheus exporters' ``*_build_info``, with Python in Go's place)."""
    import platform

    import kernmlops

    info = GaugeMetricFamily(
        f"{SELF}_build_info",
        "1, labelled with the kernmlops version, the Python version and the kernel release",
        labels=["version", "pythonversion", "kernel"],
    )
    info.add_metric([kernmlops.__version__, platform.python_version(), platform.release()], 1.0)
    return info
