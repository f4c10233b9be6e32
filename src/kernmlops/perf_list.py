"""The perf events this machine has, by the names the perf hook's ``events`` option
takes: generic hardware, cache and software events, each PMU's own events from
sysfs, and (optionally) tracepoints counted as events. Each is probed by
opening it as a counter on CPU 0, so ``supported`` is the kernel's answer, not
a guess from a listing.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import polars as pl

from kernmlops.ebpf.perf_counters import (
    HARDWARE_ALIASES,
    PERF_TYPE_TRACEPOINT,
    SOFTWARE_ALIASES,
    EventSpec,
    PerfEventError,
    generic_events,
    pmu_events,
    pmu_scope,
    probe,
    tracepoint_id,
    tracepoints,
)

SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "name": pl.String,
    "kind": pl.String,  # hardware, cache, software, pmu, tracepoint
    "pmu": pl.String,  # sysfs PMU for kind pmu
    "type": pl.Int64,  # perf_event_attr.type
    "config": pl.UInt64,
    "config1": pl.UInt64,
    "config2": pl.UInt64,
    "encoding": pl.String,  # sysfs terms (event=0x3c,umask=0x00) or config=0x...
    "description": pl.String,  # "sysfs" for PMU events: sysfs has no descriptions
    "unit": pl.String,
    "scale": pl.Float64,
    "aliases": pl.List(pl.String),
    # where its PMU counts, if not on every CPU: "package 0,24" (one reader CPU a
    # package: the count is the package's) or a hybrid core type's "8-15"
    "cpus": pl.String,
    "supported": pl.Boolean,  # opened as a counter on CPU 0 (or its PMU's first CPU)
    "reason": pl.String,  # why not, when not
}

PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")

_ALIASES: dict[str, list[str]] = {}
for _alias, _name in {**HARDWARE_ALIASES, **SOFTWARE_ALIASES}.items():
    _ALIASES.setdefault(_name, []).append(_alias)


def _tracepoint_specs() -> Iterable[EventSpec]:
    for name in tracepoints():
        try:
            tp = tracepoint_id(name)
        except PerfEventError:
            continue  # vanished or unreadable between listing and reading
        yield EventSpec(
            name,
            "tracepoint",
            PERF_TYPE_TRACEPOINT,
            tp,
            encoding=f"id={tp}",
            description="tracepoint",
        )


#: Why tracepoint rows are not probed unless asked (list_events(probe_tracepoints=True);
#: the command line never does): each open and close of a tracepoint event waits for
#: an RCU grace period (~50 ms; 2,300 took 2 minutes).
TRACEPOINT_NOT_PROBED = "not opened to check (about 50 ms each)"


def list_events(
    *, tracepoints: bool = False, probe_tracepoints: bool = False, probe_cpu: int | None = 0
) -> pl.DataFrame:
    """One row per event (see SCHEMA), each opened as a counter on ``probe_cpu``.

    ``tracepoints`` adds every tracefs event as ``subsystem:event`` (thousands of
    rows; ``supported`` is null unless ``probe_tracepoints``). ``probe_cpu=None``
    skips every probe.
    """
    specs: list[EventSpec] = [*generic_events(), *pmu_events()]
    if tracepoints:
        specs.extend(_tracepoint_specs())
    rows = []
    for spec in specs:
        probed = probe_cpu is not None and (spec.kind != "tracepoint" or probe_tracepoints)
        scope = pmu_scope(spec.pmu)
        on = probe_cpu
        if scope is not None and on is not None and on not in scope.cpus:
            on = scope.cpus[0]  # a core type CPU 0 is not of, or a package's reader
        why = probe(spec, on) if probed and on is not None else None
        if probe_cpu is not None and not probed:
            why = TRACEPOINT_NOT_PROBED
        rows.append(
            {
                "name": spec.name,
                "kind": spec.kind,
                "pmu": spec.pmu,
                "type": spec.type,
                "config": spec.config,
                "config1": spec.config1,
                "config2": spec.config2,
                "encoding": spec.encoding,
                "description": spec.description,
                "unit": spec.unit,
                "scale": spec.scale,
                "aliases": _ALIASES.get(spec.name, []),
                "cpus": None if scope is None else scope.short(),
                "supported": why is None if probed else None,
                "reason": why,
            }
        )
    return pl.DataFrame(rows, schema=SCHEMA)


def none_opened(frame: pl.DataFrame) -> str | None:
    """Why no event of ``frame`` (list_events') could be opened, in one line; None
    when one could, or none was probed."""
    probed = frame.filter(pl.col("supported").is_not_null())
    if probed.height == 0 or probed["supported"].any():
        return None
    # the most common reason: an unprivileged user's is "not permitted" for them all
    common = str(probed["reason"].value_counts(sort=True)[0, "reason"])
    if not common.startswith("not permitted"):
        return f"no perf event could be opened on CPU 0: {common}"
    try:
        level = PARANOID.read_text().strip()
    except OSError:
        level = "unreadable"
    # above 0, counting a whole CPU takes CAP_PERFMON (or CAP_SYS_ADMIN)
    return (
        f"no perf event could be opened on CPU 0: not permitted (kernel.perf_event_paranoid "
        f"is {level}; above 0 counting a CPU needs root or CAP_PERFMON): run it as root, "
        "or lower it with sysctl kernel.perf_event_paranoid=0"
    )
