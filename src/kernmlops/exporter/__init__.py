"""Prometheus exporter: kernel counters and histograms, kept in BPF maps, as
live metrics (the way cloudflare's ebpf_exporter does it).

A metric set is a ``.bpf.c`` and a YAML beside it (bpf/exp_*.yaml for the
built-in ones): which maps are counters or histograms, how their keys split
into labels, and how each label is decoded. Nothing is streamed: programs add
to per-CPU maps, and a scrape reads them.

    from kernmlops.exporter import start_exporter
    running = start_exporter("127.0.0.1:9435")   # every default built-in set
    ...
    running.close()
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module; imported on first use, so that `kernmlops --help`
#: does not load libbpf, numpy and prometheus_client
_EXPORTS = {
    "DEFAULT_LISTEN": "server",
    "Exporter": "core",
    "ExporterError": "core",
    "JobFilter": "core",
    "ListenError": "server",
    "MetricSet": "config",
    "MetricSetError": "config",
    "MetricsServer": "server",
    "RunningExporter": "service",
    "SetStatus": "core",
    "WebConfig": "webconfig",
    "WebConfigError": "webconfig",
    "builtin_sets": "config",
    "failures": "service",
    "load_metric_set": "config",
    "load_web_config": "webconfig",
    "parse_listen": "server",
    "resolve_sets": "config",
    "start_exporter": "service",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
