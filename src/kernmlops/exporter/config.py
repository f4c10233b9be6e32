"""Metric set files: the YAML beside a ``.bpf.c`` that says which BPF maps are
metrics, how their keys split into labels and how each label is decoded.

```yaml
name: biolatency                 # default: the file's stem without exp_
description: block I/O latency by device and op
metrics:
  counters:
    - name: kernmlops_block_io_bytes_total
      help: bytes of completed block requests
      map: block_io_bytes        # key: the labels in order; value: u64
      labels:
        - name: device
          size: 4
          decoders: [{name: majorminor}]
  histograms:
    - name: kernmlops_block_io_latency_seconds
      help: block I/O latency, issue to completion
      map: block_io_latency      # value: u64 slots[n], then u64 sum
      bucket_type: exp2          # exp2, exp2zero, linear, fixed
      bucket_max: 26
      bucket_multiplier: 0.000001
      labels: [...]
```

Everything is validated before anything is loaded; an error names the file,
the key (``metrics.histograms[0] (name).bucket_max``) and the reason.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kernmlops.exporter import compat
from kernmlops.exporter.spec import (
    _SET_NAME,
    BUILTIN_DIR,
    BUILTIN_PREFIX,
    BYTES_DECODERS,
    DECODER_OPTIONS,
    EBPF_EXPORTER_FORMAT,
    INT_DECODERS,
    KERNMLOPS_FORMAT,
    CounterSpec,
    DecoderSpec,
    HistogramSpec,
    LabelSpec,
    MetricSet,
    MetricSetError,
    MetricSetSpec,
    MetricsSpec,
    format_errors,
)
from kernmlops.validation import not_a_config
from kernmlops.yamlfile import safe_yaml

# The models live in spec.py (below the loaders, the decoders and the core);
# they are named here too, where a reader of a metric set file looks for them.
__all__ = [
    "BUILTIN_DIR",
    "BUILTIN_PREFIX",
    "BYTES_DECODERS",
    "DECODER_OPTIONS",
    "EBPF_EXPORTER_FORMAT",
    "INT_DECODERS",
    "KERNMLOPS_FORMAT",
    "CounterSpec",
    "DecoderSpec",
    "HistogramSpec",
    "LabelSpec",
    "MetricSet",
    "MetricSetError",
    "MetricSetSpec",
    "MetricsSpec",
    "builtin_sets",
    "format_errors",
    "load_metric_set",
    "parse_metric_set",
    "resolve_sets",
]


# --- loading ----------------------------------------------------------------------
def parse_metric_set(data: Any, path: Path, *, builtin: bool = False) -> MetricSet:
    """Validate the parsed YAML of ``path``: our format, or ebpf_exporter's
    (told apart by :func:`kernmlops.exporter.compat.is_ebpf_exporter_config`)."""
    if data is None:  # an empty file, comments only, or a FIFO nothing was written to
        raise MetricSetError(f"invalid metric set {path}: it is empty (no program, no metric)")
    if not isinstance(data, dict):
        raise MetricSetError(f"invalid metric set {path}: the top level must be a mapping")
    if not_a_config(data):  # e.g. -c /etc/shadow: its lines are not echoed as keys
        raise MetricSetError(
            f"invalid metric set {path}: not a metric set (no key of its top level looks like "
            "one; its lines are not shown)"
        )
    if compat.is_ebpf_exporter_config(data):
        return compat.parse_ebpf_exporter_config(data, path)
    try:
        spec = MetricSetSpec.model_validate(data)
    except ValidationError as err:
        raise MetricSetError(format_errors(err, str(path), data)) from None
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    name = spec.name or stem.removeprefix(BUILTIN_PREFIX)
    if not _SET_NAME.match(name):
        raise MetricSetError(
            f"invalid metric set {path}: name: the file name gives {name!r}; set name: to "
            "lower case letters, digits and _"
        )
    return MetricSet(name=name, spec=spec, path=path, builtin=builtin)


def load_metric_set(path: str | Path, *, builtin: bool = False) -> MetricSet:
    path = Path(path)
    data = safe_yaml(path, what="metric set", error=MetricSetError)
    return parse_metric_set(data, path, builtin=builtin)


def builtin_sets() -> dict[str, MetricSet]:
    """The metric sets shipped with kernmlops, by name."""
    out: dict[str, MetricSet] = {}
    for path in sorted(BUILTIN_DIR.glob(f"{BUILTIN_PREFIX}*.yaml")):
        ms = load_metric_set(path, builtin=True)
        out[ms.name] = ms
    return out


def resolve_sets(configs: list[str] | tuple[str, ...]) -> list[MetricSet]:
    """``--config`` values: a path to a metric set file, or a built-in set's name.
    None given: every built-in set marked default."""
    builtins = builtin_sets()
    if not configs:
        return [ms for ms in builtins.values() if ms.spec.default]
    out: list[MetricSet] = []
    for item in configs:
        path = Path(item)
        if path.exists() or path.suffix in (".yaml", ".yml") or "/" in item:
            out.append(load_metric_set(path))
        elif item in builtins:
            out.append(builtins[item])
        else:
            near = difflib.get_close_matches(item, builtins, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise MetricSetError(
                f"--config {item!r}: no such file and no built-in set of that name{hint} "
                f"(built-in: {', '.join(builtins)})"
            )
    names = [ms.name for ms in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MetricSetError(f"metric set given twice: {', '.join(dup)}")
    metric_owner: dict[str, str] = {}
    for ms in out:
        for m in ms.metrics:
            exposed = m.exposed_name if isinstance(m, CounterSpec) else m.name
            if exposed in metric_owner:
                raise MetricSetError(
                    f"metric {exposed} is defined by both set {metric_owner[exposed]} "
                    f"({_path_of(out, metric_owner[exposed])}) and set {ms.name} ({ms.path})"
                )
            metric_owner[exposed] = ms.name
    return out


def _path_of(sets: list[MetricSet], name: str) -> Path:
    return next(ms.path for ms in sets if ms.name == name)
