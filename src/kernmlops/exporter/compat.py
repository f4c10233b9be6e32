"""cloudflare/ebpf_exporter's config format, read as it is.

An ebpf_exporter config is ``<name>.yaml`` beside ``<name>.bpf.c`` (or its
compiled ``<name>.bpf.o``). It differs from our own format in three ways, and
this module maps each onto the exporter's machinery:

- **The map is named after the metric** (no ``map:`` key), and the metric is
  served as ``ebpf_exporter_<name>``, a counter without ``_total`` added.
- **Histograms keep one u64 per key, the bucket in the last key field**: the
  last label is the bucket (``bucket_min`` .. ``bucket_max``), and the key with
  bucket ``bucket_max + 1`` (``fixed``: the last bucket key + 1) holds the sum.
  Buckets outside that range are not shown, as ebpf_exporter does not show them.
- **Decoders return a label where ours raise**: an address without a symbol is
  ``unknown_addr:0x...``, a regexp's label is what matched, device numbers
  are glibc's encoding, a cgroup is its full path (``/sys/fs/cgroup/...``, not
  the path below the mount our own format gives; see
  ``decoders.build_decoder(flavor=...)``).

The ``.bpf.c`` is compiled as ebpf_exporter builds its examples (``-target
bpf -mcpu=v3``, ``<vmlinux.h>`` from this kernel, libbpf's ``<bpf/...>``
headers) with our own ``maps.bpf.h``, ``bits.bpf.h`` and ``regs-ip.bpf.h``
(bpf/ebpf_exporter/) on the include path, which give the helpers its examples
call by the same names, and a ``bpf/bpf_core_read.h`` there that includes
``bpf_helpers.h`` first, as libbpf 1.4 and later do (some examples rely on it).
A file is in this format when none of its metrics has a ``map:`` key
(:func:`is_ebpf_exporter_config`).

Three of its features run beside the set while it is served (:func:`services`):
``perf_event_array: true`` counters, counted from a perf event array's
samples (perf_event_array.py), ``tracing: spans:``, ring buffer records sent
as OpenTelemetry spans (tracing.py), and ``cgroup_id_map``, a map kept filled
with the matching cgroups' ids (cgroup_id_map.py).
"""

from __future__ import annotations

import errno
import math
import re
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field, ValidationError, field_validator

from kernmlops.ebpf.libbpf import MAP_TYPE_RINGBUF
from kernmlops.ebpf.perfbuf import MAP_TYPE_PERF_EVENT_ARRAY
from kernmlops.exporter.cgroup_id_map import HASH, CgroupIdMap
from kernmlops.exporter.cgroup_id_map import TYPES as CGROUP_ID_MAP_TYPES
from kernmlops.exporter.core import ExactCounterFamily, ExporterError, MetricReader
from kernmlops.exporter.decoders import DecodeError, DecoderContext, cgroup2_mount, label_decoders
from kernmlops.exporter.histogram import Buckets
from kernmlops.exporter.maps import MapReader
from kernmlops.exporter.perf_event_array import DEFAULT_FLUSH_S, PerfEventCounts, go_duration_s
from kernmlops.exporter.spec import (
    BUILTIN_DIR,
    EBPF_EXPORTER_FORMAT,
    CounterSpec,
    HistogramSpec,
    LabelSpec,
    MetricSet,
    MetricSetError,
    MetricSetSpec,
    MetricsSpec,
    _Strict,
    format_errors,
)
from kernmlops.exporter.tracing import (
    START_UP,
    SpanLabelSpec,
    SpanPipeline,
    SpanRing,
    SpanSpec,
    check_available,
    hold_pipeline,
    release_pipeline,
    send_startup,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from prometheus_client.core import Metric

    from kernmlops.ebpf.objects import BpfObject

NAMESPACE = "ebpf_exporter"
#: tracing spans not exported (span_drop_metrics)
SPANS_DROPPED = "dropped_tracing_spans_total"
#: our helpers for ebpf_exporter-style programs (maps.bpf.h, bits.bpf.h, regs-ip.bpf.h)
INCLUDE_DIR = BUILTIN_DIR / "ebpf_exporter"
#: as ebpf_exporter's examples are compiled (its examples/Makefile)
CFLAGS = ("-mcpu=v3", "-I", str(INCLUDE_DIR))
#: "name" is in its schema too, though the file's name overrides it
_TOP_KEYS = frozenset({"name", "metrics", "kaddrs", "tracing", "cgroup_id_map"})
_CPU_LABEL = "cpu"


# --- the file ---------------------------------------------------------------------
class _EeCounter(_Strict):
    name: str
    help: str = Field(min_length=1)
    perf_event_array: bool = False
    flush_interval: Any = Field(
        None, description="a Go duration (30s, 1h); a perf_event_array counter's reset"
    )
    labels: list[LabelSpec] = Field(default_factory=list)

    @field_validator("flush_interval")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is not None:
            go_duration_s(value)  # ValueError: said as the field's error
        return value


class CgroupIdMapSpec(_Strict):
    """``cgroup_id_map``: the map the exporter fills with the ids of the
    cgroups whose paths match a regexp (see exporter/cgroup_id_map.py)."""

    name: str = Field(min_length=1, description="the BPF map to fill")
    type: str = Field("hash", description="hash (the default) or cgrp_storage")
    regexps: list[str] = Field(default_factory=list)

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        value = value or HASH  # ebpf_exporter: empty means hash
        if value not in CGROUP_ID_MAP_TYPES:
            raise ValueError(f"{value!r} is not one of {', '.join(CGROUP_ID_MAP_TYPES)}")
        return value

    @field_validator("regexps")
    @classmethod
    def _regexps(cls, values: list[str]) -> list[str]:
        for i, text in enumerate(values):
            try:
                re.compile(text)
            except re.error as err:
                raise ValueError(f"regexps[{i}] {text!r} is not a valid regexp: {err}") from None
        return values

    def patterns(self) -> list[re.Pattern[str]]:
        return [re.compile(text) for text in self.regexps]


class _EeHistogram(_Strict):
    name: str
    help: str = Field(min_length=1)
    bucket_type: str
    bucket_multiplier: float = 1.0
    bucket_min: int = 0
    bucket_max: int = 0
    bucket_keys: list[float] | None = None
    labels: list[LabelSpec] = Field(description="the last label is the bucket")

    @field_validator("labels")
    @classmethod
    def _bucket_last(cls, labels: list[LabelSpec]) -> list[LabelSpec]:
        if not labels:
            raise ValueError("a histogram's last label is the bucket: give at least that one")
        return labels


class _EeMetrics(_Strict):
    counters: list[_EeCounter] = Field(default_factory=list)
    histograms: list[_EeHistogram] = Field(default_factory=list)


class _EeSpan(_Strict):
    ringbuf: str = Field(min_length=1, description="the BPF_MAP_TYPE_RINGBUF to read")
    name: str = ""
    service: str = ""
    labels: list[SpanLabelSpec] = Field(default_factory=list)


class _EeTracing(_Strict):
    spans: list[_EeSpan] = Field(default_factory=list)


class _EeConfig(_Strict):
    name: Any = None  # ebpf_exporter names a config after its file, whatever this says
    metrics: _EeMetrics | None = None
    kaddrs: list[str] = Field(default_factory=list)
    tracing: _EeTracing | None = None
    cgroup_id_map: CgroupIdMapSpec | None = None


class EeCounterSpec(CounterSpec):
    """A counter of an ebpf_exporter config: served under its own name."""

    tail_padding: int = Field(0, ge=0, description="padding after the last label")
    #: counted from the samples of a perf event array named ``map``, not read from a map
    perf_event_array: bool = False
    #: seconds between resets of a perf_event_array counter (ebpf_exporter's flush_interval)
    flush_interval_s: float = DEFAULT_FLUSH_S

    @property
    def exposed_name(self) -> str:
        return self.name

    @property
    def total_key_bytes(self) -> int:
        return self.key_bytes + self.tail_padding


def _padding_before(labels: list[LabelSpec]) -> tuple[list[LabelSpec], int]:
    """ebpf_exporter's ``padding`` follows its label, ours precedes it: the
    same layout, each padding moved to the next label; the last one's trails."""
    out, before = [], 0
    for label in labels:
        out.append(label.model_copy(update={"padding": before}))
        before = label.padding
    return out, before


class GoBuckets(Buckets):
    """Buckets whose ``le`` is written as Go writes a float (``1024``, not
    ``1024.0``): the label values ebpf_exporter's series have."""

    @property
    def le(self) -> tuple[str, ...]:
        return (*(go_float(b * self.multiplier) for b in self.bounds[self.first :]), "+Inf")


def go_float(value: float) -> str:
    """A float as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` writes it (what
    the Prometheus Go client writes for ``le``): shortest digits, exponent form
    below 1e-4 and from 1e6 on."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).rstrip("0") or "0"
    exp10 = exponent + len(digits) - 1 if text != "0" else 0
    prefix = "-" if sign else ""
    if exp10 < -4 or exp10 >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    return prefix + format(Decimal(repr(abs(value))).normalize(), "f")


class EeHistogramSpec(HistogramSpec):
    """A histogram of an ebpf_exporter config: ``labels`` are the key's fields
    before the bucket; ``bucket_label`` is the last one."""

    bucket_label: LabelSpec
    tail_padding: int = Field(0, ge=0, description="padding after the bucket")

    @property
    def bucket_keys_raw(self) -> list[float]:
        """The bucket keys the kernel writes, in order."""
        if self.bucket_type == "fixed":
            return list(self.bucket_keys or ())
        assert self.bucket_max is not None
        return [float(i) for i in range(self.bucket_min, self.bucket_max + 1)]

    @property
    def sum_key(self) -> float:
        return self.bucket_keys_raw[-1] + 1

    @property
    def bounds(self) -> tuple[float, ...]:
        """Each bucket's upper bound before the multiplier (ebpf_exporter's keyer)."""
        keys = self.bucket_keys_raw
        if self.bucket_type == "exp2":
            return tuple(2.0**k for k in keys)
        if self.bucket_type == "exp2zero":
            return tuple(0.0 if k == 0 else 2.0 ** (k - 1) for k in keys)
        return tuple(keys)  # linear, fixed

    @property
    def total_key_bytes(self) -> int:
        return (
            self.key_bytes + self.bucket_label.padding + self.bucket_label.size + self.tail_padding
        )


def is_ebpf_exporter_config(data: Any) -> bool:
    """ebpf_exporter's configs name no map (the map is the metric's name) and
    have none of our top-level keys (description, object, default)."""
    if not isinstance(data, dict) or not set(data) <= _TOP_KEYS:
        return False
    metrics = data.get("metrics")
    if metrics is None:
        return "tracing" in data
    if not isinstance(metrics, dict):
        return False
    entries = [
        m
        for kind in ("counters", "histograms")
        for m in (metrics.get(kind) or [])
        if isinstance(m, dict)
    ]
    return bool(entries) and not any("map" in m for m in entries)


def parse_ebpf_exporter_config(data: Any, path: Path) -> MetricSet:
    """An ebpf_exporter config as a metric set (named after its file, as
    ebpf_exporter names configs)."""
    where = f"ebpf_exporter config {path}"
    try:
        cfg = _EeConfig.model_validate(data)
    except ValidationError as err:
        source = f"{path} (ebpf_exporter's format)"
        raise MetricSetError(format_errors(err, source, data, _EeConfig)) from None
    span_specs = cfg.tracing.spans if cfg.tracing else []
    has_metrics = cfg.metrics is not None and bool(cfg.metrics.counters or cfg.metrics.histograms)
    if not has_metrics and not span_specs:
        raise MetricSetError(f"{where}: neither metrics nor tracing are defined")
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    counters, histograms, spans = [], [], []
    try:
        for i, sp in enumerate(span_specs):
            labels, tail = _padding_before(sp.labels)
            loc = f"tracing.spans[{i}] ({sp.name or sp.ringbuf})"
            spans.append(
                _spec(
                    SpanSpec,
                    where,
                    loc,
                    ringbuf=sp.ringbuf,
                    name=sp.name,
                    service=sp.service,
                    labels=labels,
                    tail_padding=tail,
                )
            )
        rings = [sp.ringbuf for sp in spans]
        twice = sorted({r for r in rings if rings.count(r) > 1})
        if twice:  # two readers of one ring would each get some of its records
            raise MetricSetError(f"{where}: tracing spans read ring {', '.join(twice)} twice")
        if spans:
            try:
                check_available()
            except MetricSetError as err:
                raise MetricSetError(f"{where}: {err}") from None
        for i, c in enumerate(cfg.metrics.counters if cfg.metrics else []):
            loc = f"metrics.counters[{i}] ({c.name})"
            flush_s = go_duration_s(c.flush_interval) if c.flush_interval is not None else 0.0
            labels, tail = _padding_before(c.labels)
            counters.append(
                _spec(
                    EeCounterSpec,
                    where,
                    loc,
                    name=f"{NAMESPACE}_{c.name}",
                    help=c.help,
                    map=c.name,
                    labels=labels,
                    tail_padding=tail,
                    perf_event_array=c.perf_event_array,
                    # as Go's ticker there: none or not above zero is an hour
                    flush_interval_s=flush_s if flush_s > 0 else DEFAULT_FLUSH_S,
                )
            )
        for i, h in enumerate(cfg.metrics.histograms if cfg.metrics else []):
            loc = f"metrics.histograms[{i}] ({h.name})"
            fixed = h.bucket_type == "fixed"
            labels, tail = _padding_before(h.labels)
            histograms.append(
                _spec(
                    EeHistogramSpec,
                    where,
                    loc,
                    name=f"{NAMESPACE}_{h.name}",
                    help=h.help,
                    map=h.name,
                    labels=labels[:-1],
                    bucket_label=labels[-1],
                    tail_padding=tail,
                    bucket_type=h.bucket_type,
                    bucket_min=0 if fixed else h.bucket_min,
                    bucket_max=None if fixed else h.bucket_max,
                    bucket_keys=h.bucket_keys if fixed else None,
                    bucket_multiplier=h.bucket_multiplier or 1.0,
                )
            )
        description = f"ebpf_exporter config {stem}"
        if has_metrics:
            metrics = MetricsSpec(counters=counters, histograms=histograms)
            spec = MetricSetSpec(description=description, metrics=metrics)
        else:  # spans only: no metrics, which our own format refuses
            metrics = MetricsSpec.model_construct(counters=[], histograms=[])
            spec = MetricSetSpec.model_construct(description=description, metrics=metrics)
    except ValidationError as err:
        raise MetricSetError(format_errors(err, f"{path} (ebpf_exporter's format)", data)) from None
    return MetricSet(
        name=stem,
        spec=spec,
        path=path,
        builtin=False,
        format=EBPF_EXPORTER_FORMAT,
        cflags=CFLAGS,
        kaddrs=tuple(cfg.kaddrs),
        runtime=RUNTIME,
        cgroup_id_map=cfg.cgroup_id_map,
        spans=tuple(spans),
    )


def _spec(cls: type, where: str, loc: str, **fields: Any) -> Any:
    try:
        return cls(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        at = f"{loc}.{field}" if field else loc
        raise MetricSetError(f"invalid {where}: {at}: {msg}") from None  # one line, as all


def resolve_config_dir(config_dir: str, names: str) -> list[str]:
    """ebpf_exporter's ``--config.dir DIR --config.names a,b``: DIR/a.yaml, DIR/b.yaml."""
    folder = Path(config_dir)
    try:  # is_dir() and exists() raise where a folder on the way may not be searched
        if not folder.is_dir():
            why = "not a folder" if folder.exists() else "no such folder"  # a file: 'no such'
            raise MetricSetError(f"--config.dir {config_dir}: {why}")
        out = []
        for name in (n.strip() for n in names.split(",")):
            if not name:
                continue
            path = folder / f"{name}.yaml"
            if not path.exists():
                known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml"))) or "none"
                raise MetricSetError(f"--config.names {name}: no {path} (configs there: {known})")
            out.append(str(path))
    except OSError as err:
        denied = err.errno in (errno.EACCES, errno.EPERM)
        why = "permission denied" if denied else (err.strerror or str(err))
        raise MetricSetError(f"--config.dir {config_dir}: cannot be read: {why}") from None
    if not out:
        raise MetricSetError("--config.names: give at least one config name")
    return out


# --- loading ----------------------------------------------------------------------
def kaddr_globals(symbols: tuple[str, ...], kallsyms: Path = Path("/proc/kallsyms")) -> dict:
    """``kaddr_<symbol>`` values for a config's ``kaddrs``: as ebpf_exporter reads
    them, the last address the kernel's own lines give a name (static functions
    share names), a module's lines (a fourth field, ``[module]``) left out."""
    if not symbols:
        return {}
    wanted, found = set(symbols), {}
    with kallsyms.open() as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 3 and parts[2] in wanted:
                found[parts[2]] = int(parts[0], 16)  # a later line replaces an earlier
    missing = sorted(wanted - set(found))
    if missing:
        raise MetricSetError(f"kaddrs: no symbol {', '.join(missing)} in {kallsyms}")
    if not any(found.values()):
        raise MetricSetError(f"kaddrs: {kallsyms} shows no addresses: run as root")
    return {f"kaddr_{name}": addr for name, addr in found.items()}


def split_cpus(spec: CounterSpec | HistogramSpec, percpu: bool) -> bool:
    """ebpf_exporter: a per-CPU map whose last label is ``cpu`` is served per CPU."""
    return percpu and bool(spec.labels) and spec.labels[-1].name == _CPU_LABEL


def check_fit(metric_set: MetricSet, spec: CounterSpec | HistogramSpec, obj: BpfObject) -> None:
    """The map exists, holds one u64 per key, and the labels span its key."""
    where = f"ebpf_exporter config {metric_set.path}: {spec.map}"
    bpf_map = obj.maps.get(spec.map)
    if bpf_map is None:
        maps = ", ".join(sorted(m for m in obj.maps if not m.startswith("."))) or "none"
        raise ExporterError(f"{where}: the object has no map {spec.map!r} (maps: {maps})")
    perf = bpf_map.type == MAP_TYPE_PERF_EVENT_ARRAY
    if isinstance(spec, EeCounterSpec) and spec.perf_event_array:
        if not perf:
            raise ExporterError(
                f"{where}: the counter has perf_event_array: true, but map {spec.map} is "
                "not a BPF_MAP_TYPE_PERF_EVENT_ARRAY"
            )
        return  # its samples are the keys: any length, cut to the labels' span
    if perf:
        raise ExporterError(
            f"{where}: map {spec.map} is a perf event array: give its counter "
            "perf_event_array: true"
        )
    if bpf_map.value_size != 8:
        raise ExporterError(
            f"{where}: values of map {spec.map} are {bpf_map.value_size} bytes, not one u64"
        )
    span = spec.total_key_bytes if isinstance(spec, EeCounterSpec | EeHistogramSpec) else 0
    key = bpf_map.key_size
    if split_cpus(spec, bpf_map.percpu):
        key += 2  # the CPU number, appended per CPU
        if len(spec.labels) == 1 and span == 2:
            return  # only cpu: the key (an array index) is not a label
    if span != key and (spec.labels or isinstance(spec, EeHistogramSpec)):
        raise ExporterError(
            f"{where}: the labels span {span} bytes but the map's key has {key} "
            "(label sizes and padding must cover the key exactly)"
        )


def make_reader(
    set_name: str,
    spec: CounterSpec | HistogramSpec,
    obj: BpfObject,
    ctx: DecoderContext,
    max_label_sets: int,
) -> MetricReader:
    bpf_map = obj.map(spec.map)
    if isinstance(spec, EeCounterSpec) and spec.perf_event_array:
        counts = PerfEventCounts(
            bpf_map,
            spec.total_key_bytes,
            flush_interval_s=spec.flush_interval_s,
            where=f"set {set_name}: perf event array {spec.map}",
        )
        return MetricReader(
            set_name, spec, counts, ctx, max_label_sets, flavor=EBPF_EXPORTER_FORMAT
        )
    split = split_cpus(spec, bpf_map.percpu)
    reader = MapReader(bpf_map, split_cpus=split)
    if isinstance(spec, EeHistogramSpec):
        return BucketKeyHistogram(set_name, spec, reader, ctx, max_label_sets)
    offset = 0
    if split and len(spec.labels) == 1 and spec.key_bytes == 2:
        offset = bpf_map.key_size  # only the appended CPU number is a label
    return MetricReader(
        set_name, spec, reader, ctx, max_label_sets, flavor=EBPF_EXPORTER_FORMAT, offset=offset
    )


class BucketKeyHistogram(MetricReader):
    """Reads a histogram whose bucket is the last key field (one u64 per key)
    into the slot layout ``MetricReader.text`` writes: bucket counts, an empty
    overflow slot (ebpf_exporter's +Inf is the last bucket's count), the sum."""

    spec: EeHistogramSpec

    def __init__(
        self,
        set_name: str,
        spec: EeHistogramSpec,
        reader: MapReader,
        ctx: DecoderContext,
        max_label_sets: int,
    ) -> None:
        super().__init__(set_name, spec, reader, ctx, max_label_sets, flavor=EBPF_EXPORTER_FORMAT)
        self._prefix = spec.key_bytes
        (self._bucket,) = label_decoders(
            [spec.bucket_label], ctx, flavor=EBPF_EXPORTER_FORMAT, offset=spec.key_bytes
        )
        keys = spec.bucket_keys_raw
        self._slots = {k: i for i, k in enumerate(keys)}
        self._slots[spec.sum_key] = len(keys) + 1  # after the (empty) overflow slot
        self._width = len(keys) + 2
        self._bucket_cache: dict[bytes, int] = {}

    @cached_property
    def buckets(self) -> Buckets:
        return GoBuckets(self.spec.bounds, self.spec.bucket_multiplier, 0, True)

    def _slot(self, key: bytes) -> int:
        raw = key[self._prefix :]
        found = self._bucket_cache.get(raw)
        if found is not None:
            return found
        try:
            value = float(int(self._bucket(key), 0))
        except (DecodeError, ValueError) as err:
            return self._undecodable_key(key, self._bucket.name, err)
        self._undecodable.discard(key)
        slot = self._bucket_cache[raw] = self._slots.get(value, -1)
        return slot

    def snapshot(self) -> tuple[list[int], np.ndarray]:
        keys, values = self._read()
        n, prefix = len(keys), self._prefix
        self._forget_gone([*keys, *(k[:prefix] for k in keys)])  # _slot's keys, _label_index's
        idx = np.fromiter((self._label_index(k[:prefix]) for k in keys), np.int64, count=n)
        slot = np.fromiter((self._slot(k) for k in keys), np.int64, count=n)
        keep = (idx >= 0) & (slot >= 0)
        present, rows = np.unique(idx[keep], return_inverse=True)
        out = np.zeros((len(present), self._width), dtype=np.uint64)
        np.add.at(out, (rows, slot[keep]), values[keep, 0])
        return self._served(present.astype(np.int64), out)


# --- ebpf_exporter's own metrics ----------------------------------------------------
def builtin_metrics(loaded_sets: list[Any], stats_on: bool) -> list[Metric]:
    """ebpf_exporter's built-in metrics, by the names, types and labels its
    exporter package gives them (``prometheus.NewDesc`` and ``CounterOpts``
    in exporter/exporter.go; the help texts are our own), for every loaded
    set: enabled configs, program info (id, tag), attached, run time and count
    (with BPF stats on), decoder errors. Its counters are named in full there,
    ``_total`` or not (``ebpf_program_run_time_seconds`` has none), and served
    as named."""
    from prometheus_client.core import GaugeMetricFamily

    from kernmlops.ebpf import libbpf

    ns = NAMESPACE
    enabled = GaugeMetricFamily(
        f"{ns}_enabled_configs", "1 for each metric set (config) loaded and served", labels=["name"]
    )
    info = GaugeMetricFamily(
        f"{ns}_ebpf_program_info",
        "1 per loaded BPF program, with its set, name, tag and kernel id",
        labels=["config", "program", "tag", "id"],
    )
    attached = GaugeMetricFamily(
        f"{ns}_ebpf_program_attached",
        "1 when the program with this kernel id is attached",
        labels=["id"],
    )
    run_time = ExactCounterFamily(
        f"{ns}_ebpf_program_run_time_seconds",
        "time the kernel spent running this program (needs BPF stats on)",
        labels=["id"],
    )
    run_count = ExactCounterFamily(
        f"{ns}_ebpf_program_run_count_total",
        "runs of this program (needs BPF stats on)",
        labels=["id"],
    )
    errors = ExactCounterFamily(
        f"{ns}_decoder_errors_total",
        "map keys whose labels could not be decoded, per metric set, each counted once "
        "until it decodes or leaves the map; perf event array samples and tracing span "
        "records, each one counted",
        labels=["config"],
    )
    for loaded in loaded_sets:
        if loaded.obj is None:
            continue
        name = loaded.status.name
        enabled.add_metric([name], 1.0)
        span_errors = sum(s.errors for s in loaded.services if isinstance(s, SpanRing))
        errors.add_metric(
            [name],
            float(sum(sum(m.decoder_errors.values()) for m in loaded.metrics) + span_errors),
        )
        for prog in loaded.status.programs:
            if prog.fd < 0:
                continue
            pi = libbpf.prog_info(prog.fd)
            pid = str(pi.id)
            info.add_metric([name, prog.name, bytes(pi.tag).hex(), pid], 1.0)
            attached.add_metric([pid], 1.0 if prog.attached else 0.0)
            if stats_on:
                run_time.add_metric([pid], pi.run_time_ns / 1e9)
                run_count.add_metric([pid], float(pi.run_cnt))
    out: list[Metric] = [enabled, info, attached, errors]
    if stats_on:
        out += [run_time, run_count]
    return out + perf_lost_metrics(loaded_sets) + span_drop_metrics(loaded_sets)


def perf_lost_metrics(loaded_sets: list[Any]) -> list[Metric]:
    """Per perf_event_array counter, the samples the kernel dropped because a
    CPU's ring was full, by the name ebpf_exporter gives that count
    (``dropped_perf_event_map_events_<counter>``; it keeps the count but does
    not serve it), and the online CPUs it cannot read (brought online after the
    start, no ring opened for them: ebpf_exporter does not see such CPUs either)."""
    from prometheus_client.core import GaugeMetricFamily

    out: list[Metric] = []
    unread = GaugeMetricFamily(
        "kernmlops_exporter_perf_event_array_cpus_unread",
        "online CPUs whose samples this perf_event_array counter does not see: "
        "brought online after the start, and no ring could be opened for them",
        labels=["counter"],
    )
    for loaded in loaded_sets:
        for metric in loaded.metrics:
            if isinstance(metric.reader, PerfEventCounts):
                unread.add_metric([metric.reader.name], float(len(metric.reader.unread_cpus)))
                lost = ExactCounterFamily(
                    f"dropped_perf_event_map_events_{metric.reader.name}",
                    "samples of this perf_event_array counter the kernel dropped "
                    "(a CPU's perf ring was full)",
                    labels=[],
                )
                lost.add_metric([], float(metric.reader.lost))
                out.append(lost)
    return [*out, unread] if unread.samples else out


def span_drop_metrics(loaded_sets: list[Any]) -> list[Metric]:
    """Tracing spans made but not exported, per config, ring and reason
    (``queue_full``, ``export_failed``, ``at_exit``; see tracing.SpanPipeline),
    in the style of ``dropped_perf_event_map_events_<counter>``: ebpf_exporter's
    Go SDK counts the spans its batch processor drops only inside itself.
    Served (zeros included) when a config has spans; the exporter's own
    start-up trace under config and ringbuf ``""``."""
    rings = [s for loaded in loaded_sets for s in loaded.services if isinstance(s, SpanRing)]
    if not rings:
        return []
    dropped = ExactCounterFamily(
        SPANS_DROPPED,
        "tracing spans made but not exported: over the span queue (OTEL_BSP_MAX_QUEUE_SIZE), "
        "a failed export (the collector down or refusing), or unsent at exit",
        labels=["config", "ringbuf", "reason"],
    )
    for ring in rings:
        for reason, n in ring.dropped().items():
            dropped.add_metric([ring.config, ring.spec.ringbuf, reason], float(n))
    for reason, n in rings[0].dropped(START_UP).items():  # the start-up trace's own
        dropped.add_metric(["", "", reason], float(n))
    return [dropped]


def services(
    metric_set: MetricSet, metrics: list[MetricReader], obj: BpfObject, ctx: DecoderContext
) -> list[Any]:
    """What runs beside the set while it is served: a poller per
    perf_event_array counter, a reader per ring of tracing spans, and the keeper
    of its cgroup_id_map (filled now, before the programs attach)."""
    out: list[Any] = [m.reader for m in metrics if isinstance(m.reader, PerfEventCounts)]
    for span in metric_set.spans:
        where = f"ebpf_exporter config {metric_set.path}: tracing span {span.span_name}"
        bpf_map = obj.maps.get(span.ringbuf)
        if bpf_map is None:
            maps = ", ".join(sorted(m for m in obj.maps if not m.startswith("."))) or "none"
            raise ExporterError(f"{where}: the object has no map {span.ringbuf!r} (maps: {maps})")
        if bpf_map.type != MAP_TYPE_RINGBUF:
            raise ExporterError(f"{where}: map {span.ringbuf} is not a BPF_MAP_TYPE_RINGBUF")
        out.append(SpanRing(metric_set.name, span, bpf_map, ctx, where=where))
    spec = metric_set.cgroup_id_map
    if spec is None:
        return out
    where = f"ebpf_exporter config {metric_set.path}: cgroup_id_map"
    bpf_map = obj.maps.get(spec.name)
    if bpf_map is None:
        maps = ", ".join(sorted(m for m in obj.maps if not m.startswith("."))) or "none"
        raise ExporterError(f"{where}: the object has no map {spec.name!r} (maps: {maps})")
    root = cgroup2_mount()
    if root is None:
        raise ExporterError(f"{where}: no cgroup v2 hierarchy is mounted")
    out.append(CgroupIdMap(bpf_map, spec.type, spec.patterns(), root, where=where))
    return out


class _EbpfExporterRuntime:
    """ebpf_exporter's sets as the core loads and reads them (spec.SetRuntime)."""

    def load_globals(self, metric_set: MetricSet) -> dict[str, int]:
        return kaddr_globals(metric_set.kaddrs)

    def check_fit(
        self, metric_set: MetricSet, spec: CounterSpec | HistogramSpec, obj: BpfObject
    ) -> None:
        check_fit(metric_set, spec, obj)

    def make_reader(
        self,
        set_name: str,
        spec: CounterSpec | HistogramSpec,
        obj: BpfObject,
        ctx: DecoderContext,
        max_label_sets: int,
    ) -> MetricReader:
        return make_reader(set_name, spec, obj, ctx, max_label_sets)

    def self_metrics(self, loaded_sets: list[Any], stats_on: bool) -> list[Metric]:
        return builtin_metrics(loaded_sets, stats_on)

    def services(
        self,
        metric_set: MetricSet,
        metrics: list[MetricReader],
        obj: BpfObject,
        ctx: DecoderContext,
    ) -> list[Any]:
        return services(metric_set, metrics, obj, ctx)

    def services_started(self, loaded_sets: list[Any], phases: list[Any]) -> None:
        """With tracing spans configured (and only then), the start-up trace
        ebpf_exporter sends about itself, through the rings' pipeline."""
        pipeline = _rings_pipeline(loaded_sets)
        if pipeline is not None and phases:
            send_startup(pipeline, phases)

    def closing(self, loaded_sets: list[Any]) -> Callable[[list[Any]], None] | None:
        """With tracing spans configured, the ``detach`` trace ebpf_exporter sends
        at exit: the rings' pipeline is held past the rings' own close, and
        flushed once the trace is in it."""
        pipeline = _rings_pipeline(loaded_sets)
        if pipeline is None:
            return None
        held = hold_pipeline(pipeline)

        def report(phases: list[Any]) -> None:
            try:
                send_startup(held, phases)
            finally:
                release_pipeline(held)

        return report


def _rings_pipeline(loaded_sets: list[Any]) -> SpanPipeline | None:
    """The span pipeline the sets' span rings send through (None: no spans, or
    the rings not started)."""
    rings = [s for loaded in loaded_sets for s in loaded.services if isinstance(s, SpanRing)]
    return next((r.pipeline for r in rings if r.pipeline is not None), None)


RUNTIME = _EbpfExporterRuntime()
