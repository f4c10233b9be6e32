"""What a metric set is, once read: the models of the YAML beside a ``.bpf.c``
(which BPF maps are metrics, how their keys split into labels, how each label
is decoded) and :class:`MetricSet`, a validated file.

The bottom of the exporter: the loaders (config.py for kernmlops' own format,
compat.py for ebpf_exporter's), the decoders, the histograms and the exporter
core all build on these definitions, and this module imports none of them.
The file format itself is described in config.py.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kernmlops.errors import ConfigError
from kernmlops.validation import keys_at, problems, shown_key, unknown_key

#: Where the built-in metric sets live: bpf/exp_<name>.bpf.c + exp_<name>.yaml.
BUILTIN_DIR = Path(__file__).resolve().parent.parent / "bpf"
BUILTIN_PREFIX = "exp_"

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SET_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count", "_total")

DecoderName = Literal[
    "uint", "string", "comm", "static_map", "ksym", "syscall", "majorminor", "cgroup",
    "errno", "regexp", "kstack", "inet_ip", "dname", "hex", "ifname", "pci_vendor",
    "pci_device", "pci_class", "pci_subclass",
]  # fmt: skip

#: decoders that take a number: as raw key bytes (first in a chain) or as the
#: decimal text an earlier decoder made
INT_DECODERS = frozenset(
    {"uint", "static_map", "ksym", "syscall", "majorminor", "cgroup", "errno", "ifname"}
    | {"pci_vendor", "pci_device", "pci_class", "pci_subclass"}
)
#: decoders that take raw key bytes as they are
BYTES_DECODERS = frozenset({"string", "comm", "kstack", "inet_ip", "dname", "hex"})
#: options each decoder accepts (beyond ``name``)
DECODER_OPTIONS: dict[str, frozenset[str]] = {
    "uint": frozenset({"signed"}),
    "string": frozenset(),
    "comm": frozenset(),
    "static_map": frozenset({"static_map", "default", "allow_unknown"}),
    "ksym": frozenset(),
    "syscall": frozenset(),
    "majorminor": frozenset({"encoding", "output"}),
    "cgroup": frozenset(),
    "errno": frozenset(),
    "regexp": frozenset({"regexps"}),
    **{name: frozenset() for name in ("kstack", "inet_ip", "dname", "hex", "ifname")},
    **{name: frozenset() for name in ("pci_vendor", "pci_device", "pci_class", "pci_subclass")},
}


class MetricSetError(ConfigError):
    """A metric set file is missing, not YAML, or invalid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DecoderSpec(_Strict):
    """One step of a label's decoder chain."""

    name: DecoderName
    signed: bool | None = Field(None, description="uint: two's complement")
    static_map: dict[str, str] | None = Field(None, description="static_map: value -> label")
    default: str | None = Field(None, description="static_map: label of unmapped values")
    allow_unknown: bool | None = Field(
        None, description="static_map: an unmapped value is its own label (ebpf_exporter's option)"
    )
    encoding: Literal["kernel", "user"] | None = Field(
        None, description="majorminor: kernel dev_t (major << 20 | minor) or glibc's"
    )
    output: Literal["name", "numbers"] | None = Field(
        None, description="majorminor: device name (sda) or MAJOR:MINOR"
    )
    regexps: list[str] | None = Field(None, description="regexp: keep label sets matching any")

    @field_validator("static_map", mode="before")
    @classmethod
    def _keys_as_text(cls, value: Any) -> Any:
        # YAML gives int keys for `1: write`; the chain compares decimal text.
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
        return value

    @field_validator("regexps")
    @classmethod
    def _compiles(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or ():
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"bad regular expression {pattern!r}: {err}") from None
        return value

    @model_validator(mode="after")
    def _options_fit(self) -> DecoderSpec:
        allowed = DECODER_OPTIONS[self.name]
        given = {k for k in self.model_fields_set if k != "name"}
        extra = sorted(given - allowed)
        if extra:
            what = ", ".join(sorted(allowed)) or "none"
            raise ValueError(f"decoder {self.name!r} takes no {', '.join(extra)} (options: {what})")
        if self.name == "static_map" and not self.static_map:
            raise ValueError("decoder 'static_map' needs a non-empty static_map: {value: label}")
        if self.name == "regexp" and not self.regexps:
            raise ValueError("decoder 'regexp' needs regexps: [pattern, ...]")
        if self.allow_unknown and self.default is not None:
            raise ValueError("static_map: give default or allow_unknown, not both")
        return self


class LabelSpec(_Strict):
    """A label is ``size`` bytes of the map key, after ``padding`` bytes."""

    name: str
    size: int = Field(ge=1, le=4096)
    padding: int = Field(0, ge=0, le=4096, description="bytes skipped before this label")
    decoders: list[DecoderSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _label_name(cls, name: str) -> str:
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(f"{name!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        if name == "le":
            raise ValueError("'le' is reserved for histogram buckets")
        return name

    @model_validator(mode="after")
    def _chain(self) -> LabelSpec:
        first = self.decoders[0].name
        if first in INT_DECODERS and self.size not in (1, 2, 4, 8):
            raise ValueError(f"decoder {first!r} reads an integer: size must be 1, 2, 4 or 8")
        if first == "regexp":
            raise ValueError("decoder 'regexp' matches text: put string or uint before it")
        return self


class _MetricSpec(_Strict):
    name: str
    help: str = Field(min_length=1)
    map: str = Field(min_length=1, description="the BPF map holding the values")
    labels: list[LabelSpec] = []
    max_label_sets: int | None = Field(
        None,
        ge=1,
        description="label sets served from what the map holds now; past it, those "
        "changed least recently are left out and counted",
    )

    @field_validator("name")
    @classmethod
    def _metric_name(cls, name: str) -> str:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"{name!r} is not a Prometheus metric name")
        return name

    @model_validator(mode="after")
    def _unique_labels(self) -> _MetricSpec:
        seen: set[str] = set()
        for label in self.labels:
            if label.name in seen:
                raise ValueError(f"label {label.name!r} appears twice")
            seen.add(label.name)
        return self

    @property
    def key_bytes(self) -> int:
        """How many bytes of the map key the labels cover."""
        return sum(label.padding + label.size for label in self.labels)


class CounterSpec(_MetricSpec):
    """A u64 value per key (per-CPU maps are summed), as a Prometheus counter."""

    value_multiplier: float = Field(1.0, gt=0, description="e.g. 1e-9 for ns -> seconds")

    @property
    def exposed_name(self) -> str:
        return self.name if self.name.endswith("_total") else self.name + "_total"


class HistogramSpec(_MetricSpec):
    """Bucket slots kept in the kernel, made cumulative on the way out."""

    bucket_type: Literal["exp2", "exp2zero", "linear", "fixed"]
    bucket_min: int = Field(0, ge=0, description="first bucket shown (lower ones fold into it)")
    bucket_max: int | None = Field(None, ge=0, description="last bucket (exp2, exp2zero, linear)")
    bucket_keys: list[float] | None = Field(None, description="fixed: upper bounds, increasing")
    bucket_multiplier: float = Field(1.0, gt=0, description="e.g. 1e-6 for µs -> seconds")
    sum: bool = Field(True, description="the value ends with the exact sum of observations")

    @field_validator("name")
    @classmethod
    def _not_a_suffix(cls, name: str) -> str:
        if name.endswith(_HISTOGRAM_SUFFIXES):
            raise ValueError(f"a histogram name must not end with {'/'.join(_HISTOGRAM_SUFFIXES)}")
        return name

    @model_validator(mode="after")
    def _buckets(self) -> HistogramSpec:
        if self.bucket_type == "fixed":
            if not self.bucket_keys:
                raise ValueError("bucket_type 'fixed' needs bucket_keys: [upper bounds]")
            if self.bucket_max is not None:
                raise ValueError("bucket_type 'fixed' takes bucket_keys, not bucket_max")
            keys = self.bucket_keys
            if any(b <= a for a, b in itertools.pairwise(keys)):
                raise ValueError(f"bucket_keys must increase strictly (got {keys})")
            last = len(keys) - 1
        else:
            if self.bucket_max is None:
                raise ValueError(f"bucket_type {self.bucket_type!r} needs bucket_max")
            if self.bucket_keys is not None:
                raise ValueError(f"bucket_type {self.bucket_type!r} takes no bucket_keys")
            if self.bucket_type in ("exp2", "exp2zero") and self.bucket_max > 63:
                raise ValueError("bucket_max of an exp2 histogram is at most 63 (u64 values)")
            if self.bucket_type == "linear" and self.bucket_max > 4096:
                raise ValueError("bucket_max of a linear histogram is at most 4096")
            last = self.bucket_max
        if self.bucket_min > last:
            raise ValueError(f"bucket_min {self.bucket_min} is past the last bucket ({last})")
        return self


class MetricsSpec(_Strict):
    counters: list[CounterSpec] = []
    histograms: list[HistogramSpec] = []

    @model_validator(mode="after")
    def _some(self) -> MetricsSpec:
        if not self.counters and not self.histograms:
            raise ValueError("no metrics: give counters and/or histograms")
        names = [c.exposed_name for c in self.counters] + [h.name for h in self.histograms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"metric names appear twice: {', '.join(dup)}")
        return self


class MetricSetSpec(_Strict):
    name: str | None = None
    description: str = ""
    object: str | None = Field(
        None, description="compiled object, relative to this file (default: <stem>.bpf.o)"
    )
    default: bool = Field(True, description="built-in sets: on when no --config is given")
    metrics: MetricsSpec

    @field_validator("name")
    @classmethod
    def _set_name(cls, name: str | None) -> str | None:
        if name is not None and not _SET_NAME.match(name):
            raise ValueError(f"{name!r}: a set name is lower case letters, digits and _")
        return name


#: the two file formats a metric set may be written in
KERNMLOPS_FORMAT = "kernmlops"
EBPF_EXPORTER_FORMAT = "ebpf_exporter"


class SetRuntime(Protocol):
    """How the sets of a file format other than kernmlops' own are loaded and
    read (compat.py gives ebpf_exporter's). The loader that parsed the file
    puts it in :attr:`MetricSet.runtime`; the exporter core calls it, so the
    core never imports the formats built on top of it."""

    def load_globals(self, metric_set: MetricSet) -> dict[str, int]:
        """Values of the object's globals to set before loading."""
        ...

    def check_fit(self, metric_set: MetricSet, spec: Any, obj: Any) -> None:
        """Raise unless ``spec`` fits its map in the loaded ``obj``."""
        ...

    def make_reader(self, set_name: str, spec: Any, obj: Any, ctx: Any, max_label_sets: int) -> Any:
        """The metric reader of ``spec`` (a ``core.MetricReader``)."""
        ...

    def self_metrics(self, loaded_sets: list[Any], stats_on: bool) -> list[Any]:
        """The format's own metrics about the loaded sets (metric families)."""
        ...

    def services(self, metric_set: MetricSet, metrics: list[Any], obj: Any, ctx: Any) -> list[Any]:
        """What runs beside the loaded set until it is closed (each with
        ``start()``, called once capabilities are dropped, and ``close()``);
        made before its programs attach."""
        ...

    def services_started(self, loaded_sets: list[Any], phases: list[Any]) -> None:
        """The services run (capabilities dropped): the format may now report
        the start-up's ``phases`` (``core.Phase``; ebpf_exporter's start-up trace)."""
        ...

    def closing(self, loaded_sets: list[Any]) -> Callable[[list[Any]], None] | None:
        """The sets are about to be closed: a function to hand the close's
        ``phases`` to once they are (ebpf_exporter's ``detach`` trace), or None
        where nothing is reported."""
        ...


@dataclass(frozen=True)
class MetricSet:
    """A validated metric set file and where its BPF object comes from."""

    name: str
    spec: MetricSetSpec
    path: Path
    builtin: bool
    #: KERNMLOPS_FORMAT, or EBPF_EXPORTER_FORMAT (see exporter/compat.py)
    format: str = KERNMLOPS_FORMAT
    #: clang options beyond the usual ones for the ``.bpf.c`` beside the file
    cflags: tuple[str, ...] = ()
    #: ``kaddr_<symbol>`` globals to set from /proc/kallsyms (ebpf_exporter's kaddrs)
    kaddrs: tuple[str, ...] = ()
    #: how a set of another format loads and reads; None: kernmlops' own way
    runtime: SetRuntime | None = None
    #: ebpf_exporter's cgroup_id_map (compat.CgroupIdMapSpec): a map the exporter
    #: keeps filled with the matching cgroups' ids
    cgroup_id_map: Any = None
    #: ebpf_exporter's tracing spans (tracing.SpanSpec): ring buffers read beside the set
    spans: tuple[Any, ...] = ()

    @property
    def stem(self) -> str:
        return self.path.name.removesuffix(".yaml").removesuffix(".yml")

    @property
    def source(self) -> Path | None:
        """The ``.bpf.c`` beside the file, if there is one."""
        src = self.path.with_name(self.stem + ".bpf.c")
        return src if src.exists() else None

    def object_path(self, build_dir: Path | None = None) -> Path:
        from kernmlops.ebpf.build import object_path

        if self.spec.object:
            return (self.path.parent / self.spec.object).resolve()
        if self.builtin:
            return object_path(self.stem, build_dir)
        beside = self.path.with_name(self.stem + ".bpf.o")
        if beside.exists() or self.source is None:
            return beside
        # Built from the .bpf.c beside it, into the build folder; the folder's
        # hash keeps two files of one name apart.
        tag = hashlib.sha1(str(self.path.resolve().parent).encode()).hexdigest()[:8]
        return object_path(f"exporter-{self.stem}-{tag}", build_dir)

    @property
    def metrics(self) -> list[CounterSpec | HistogramSpec]:
        return [*self.spec.metrics.counters, *self.spec.metrics.histograms]


# --- errors ---------------------------------------------------------------------
def _where(loc: tuple[Any, ...], data: Any) -> str:
    """``metrics.histograms[0] (kernmlops_x).labels[1] (op).size`` from a pydantic loc."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{shown_key(part)}" if out else shown_key(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"


def format_errors(
    error: ValidationError, source: str, data: Any, model: type[BaseModel] | None = None
) -> str:
    """One line for one problem, else a line per problem; ``model``: the file's
    top-level model (ours by default)."""
    found = []
    for err in error.errors():
        loc = tuple(err["loc"])
        where = _where(loc, data)
        if err["type"] == "extra_forbidden":
            valid = keys_at(model or MetricSetSpec, loc[:-1])
            found.append(f"{where}: {unknown_key(str(loc[-1]), valid)}")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        got = err.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        found.append(f"{where}: {msg}{shown}")
    return problems(f"invalid metric set {source}", found)
