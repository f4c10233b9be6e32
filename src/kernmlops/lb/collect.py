"""``lb collect``: a collection with load-balancing decisions in it.

The benchmark runs in an ordinary :class:`~kernmlops.collect.session.Session`
(so the collection has its usual tables and manifest); beside it run the lb
hooks, system-wide (a balancing decision concerns every task on both
runqueues), drained by a thread into the same collection folder. After the
run the manifest gains the lb hooks' status and an ``lb`` section (variant,
CPU-to-node map, migration cost, model, shadow summary); the tracepoint
variant then rebuilds its decisions from the scheduler tables.

Variants: ``kprobe`` (exact; fexit or kprobe + kretprobe), ``tracepoint``
(approximate; any kernel with tracepoints) and ``both`` (to measure the
approximation where kprobes work, i.e. in the kernel lab).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.collect.manifest import (
    HookRecord,
    Manifest,
    TableRecord,
    read_manifest,
    write_manifest,
)
from kernmlops.collect.session import CollectionResult, Session
from kernmlops.collect.sinks import ParquetSink
from kernmlops.config import Config, Flags
from kernmlops.errors import KernmlopsError
from kernmlops.hooks.base import HookContext, HookStatus
from kernmlops.lb.dataset import TABLE
from kernmlops.lb.features import MIGRATION_COST_NS
from kernmlops.lb.hook import LbHook, LbKprobeHook, LbTracepointHook, cpu_nodes

VARIANTS = ("kprobe", "tracepoint", "both")
#: scheduler tables the tracepoint variant is rebuilt from
TRACEPOINT_HOOKS = ("sched_migrate", "quanta_runtime", "process_trace", "system_info")


@dataclass
class LbCollectResult:
    result: CollectionResult
    path: Path
    variant: str
    hooks: dict[str, HookStatus]
    rows: dict[str, int]
    shadow: dict[str, Any] | None = None
    tracepoint: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def session_flags(variant: str, flags: Flags | None = None) -> Flags:
    """``flags`` with what the variant needs: system-wide, and for the tracepoint
    variant the scheduler tables."""
    if variant not in VARIANTS:
        raise KernmlopsError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    flags = replace(flags or Flags(), filter="system")
    if variant in ("tracepoint", "both"):
        flags = replace(flags, hooks=list(TRACEPOINT_HOOKS))
    return flags


class _Drainer:
    """Drains the lb hooks into a sink from the session's own loop (its
    progress callback, every 0.25 s), in the main thread: no thread races
    the session's first imports, and the rings (8 MiB) hold far more than a
    quarter second of decisions."""

    def __init__(self, then: Callable[[Any], None] | None) -> None:
        self.hooks: list[LbHook] = []
        self.sink: ParquetSink | None = None
        self.then = then

    def drain(self) -> None:
        for hook in self.hooks:
            for table, frame in hook.poll():
                assert self.sink is not None
                self.sink.write(table, frame)

    def on_progress(self, progress: Any) -> None:
        self.drain()
        if self.then is not None:
            self.then(progress)

    def stop(self) -> None:
        """Final drain, then detach (every hook, even if one fails)."""
        error: Exception | None = None
        for hook in self.hooks:
            try:
                for table, frame in hook.stop():
                    assert self.sink is not None
                    self.sink.write(table, frame)
            except Exception as err:  # raised after every hook is closed
                error = error or err
                hook.close()
        if error is not None:
            raise error


def collect(
    config: Config,
    variant: str = "kprobe",
    *,
    model: Any = None,
    model_meta: dict[str, Any] | None = None,
    migration_cost_ns: int = MIGRATION_COST_NS,
    attach: str = "auto",
    bpf_dir: Path | None = None,
    on_attached: Callable[[dict[str, HookStatus]], None] | None = None,
    on_progress: Callable[[Any], None] | None = None,
) -> LbCollectResult:
    """Run the configured benchmark and collect load-balancing decisions.

    ``model`` (a FixedModel) turns on shadow mode: the hooks evaluate it in
    the kernel on every decision. ``attach``: auto (fexit, else kprobe),
    fexit or kprobe. Raises HookUnavailable when the variant's
    programs cannot run on this kernel (nothing is collected then)."""
    from kernmlops.lb.shadow import BpfStats, summarize

    drainer = _Drainer(on_progress)
    session = Session(
        config, on_progress=drainer.on_progress, on_attached=on_attached, bpf_dir=bpf_dir
    )
    nodes = cpu_nodes()
    common = {
        "model": model,
        "migration_cost_ns": migration_cost_ns,
        "collection_id": session.collection_id,
        "nodes": nodes,
    }
    hooks: list[LbHook] = []
    if variant in ("kprobe", "both"):
        hooks.append(LbKprobeHook(attach=attach, **common))
    if variant in ("tracepoint", "both") and model is not None:
        hooks.append(LbTracepointHook(**common))
    ctx = HookContext(session.collection_id, None, os.getpid(), bpf_dir)
    sink = ParquetSink(session.path, session.collection_id)
    drainer.hooks, drainer.sink = hooks, sink
    with BpfStats():
        started: list[LbHook] = []
        try:
            for hook in hooks:
                hook.start(ctx)
                started.append(hook)
        except BaseException:
            for hook in started:
                hook.close()
            sink.close()
            raise
        drain_error: Exception | None = None
        try:
            result = session.run()
        finally:
            try:
                drainer.stop()
            except Exception as err:  # raised once the collection is written
                drain_error = err
            rows = sink.close()
    for hook in hooks:
        hook.status.rows = {t: rows.get(t, 0) for t in hook.tables}
    shadow = None
    if model is not None:
        shadow = {}
        for hook in hooks:
            table = next(iter(hook.tables))
            frame = _read_table(session.path, table)
            kind = "kprobe" if isinstance(hook, LbKprobeHook) else "tracepoint"
            stats = hook.stats.as_dict() if hook.stats else None
            shadow[kind] = summarize(frame, stats, kind)
    out = LbCollectResult(
        result=result,
        path=session.path,
        variant=variant,
        hooks={h.name: h.status for h in hooks},
        rows=rows,
        shadow=shadow,
    )
    lb_section: dict[str, Any] = {
        "variant": variant,
        "attach": attach,
        "cpu_node": nodes,
        "migration_cost_ns": migration_cost_ns,
        "model": model_meta,
        "shadow": shadow,
    }
    if variant in ("tracepoint", "both"):
        out.tracepoint = _build_tracepoint(session.path, nodes, out)
        lb_section["tracepoint"] = out.tracepoint
    if drain_error is not None:
        lb_section["error"] = f"lb hooks: {drain_error}"
    _update_manifest(session.path, out, lb_section)
    if drain_error is not None:
        raise KernmlopsError(f"lb hooks failed while collecting: {drain_error}") from drain_error
    return out


def _read_table(path: Path, table: str) -> pl.DataFrame | None:
    parts = sorted((path / table).glob("part-*.parquet"))
    if not parts:
        return None
    return pl.concat([pl.read_parquet(p) for p in parts], how="diagonal_relaxed")


def _build_tracepoint(path: Path, nodes: list[int], out: LbCollectResult) -> dict[str, Any]:
    """Rebuild the tracepoint decisions of the finished collection; with the
    kprobe variant beside it, compare the two."""
    from kernmlops.data import read_collection
    from kernmlops.lb.dataset import from_kprobe_records
    from kernmlops.lb.tracepoint import compare_with_kprobe, tracepoint_decisions

    collection = read_collection(path)
    tp = tracepoint_decisions(collection, nodes)
    table = "lb_decisions_tracepoint" if out.variant == "both" else TABLE
    sink = ParquetSink(path, collection.collection_id)
    sink.write(table, tp.drop("collection_id"))
    out.rows.update(sink.close())
    info: dict[str, Any] = {
        "table": table,
        "rows": tp.height,
        "positives": int((tp["can_migrate"] == 1).sum()) if tp.height else 0,
    }
    if out.variant == "both" and TABLE in collection:
        kp = collection[TABLE]
        if "src_nid" not in kp.columns:
            kp = from_kprobe_records(kp)
        info["vs_kprobe"] = compare_with_kprobe(tp, kp)
    return info


def _update_manifest(path: Path, out: LbCollectResult, lb_section: dict[str, Any]) -> None:
    try:
        manifest = read_manifest(path)
    except KernmlopsError:
        manifest = Manifest(collection_id=out.result.collection_id)
    hooks = {n: HookRecord.model_validate(s.as_dict()) for n, s in out.hooks.items()}
    manifest.hooks = {**manifest.hooks, **hooks}
    tables = dict(manifest.tables)
    for table, n in out.rows.items():
        files = sorted(p.name for p in (path / table).glob("*.parquet"))
        tables[table] = TableRecord(rows=n, files=files)
    manifest.tables = tables
    manifest.lb = lb_section  # type: ignore[attr-defined]  # a section of its own
    write_manifest(path, manifest)
