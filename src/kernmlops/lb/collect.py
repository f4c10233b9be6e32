"""``lb collect``: a collection with load-balancing decisions in it.

The benchmark runs in an ordinary :class:`~kernmlops.collect.session.Session`
(so the collection has its usual tables and manifest); beside it run the lb
hooks as the session's own (``Session.extra_hooks``: system-wide, since a balancing
decision concerns every task on both runqueues; drained by its loop into its sink,
their status in its manifest). A participant adds the ``lb`` section (variant,
CPU-to-node map, migration cost, model, shadow summary) to the final manifest; for
the tracepoint variant it first rebuilds the decisions from the scheduler tables.

Variants: ``kprobe`` (exact; fexit or kprobe + kretprobe), ``tracepoint``
(approximate; any kernel with tracepoints; the ``lb_tp`` program records each
pull, with a model or without, and its records are the pulls' rows) and
``both`` (to measure the approximation where kprobes work, i.e. in the kernel
lab).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.collect.manifest import Manifest, TableRecord
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.participants import Participant
from kernmlops.collect.running import CollectionResult
from kernmlops.collect.session import Session
from kernmlops.config import Config, Flags
from kernmlops.errors import KernmlopsError
from kernmlops.hooks.base import HookContext, HookStatus
from kernmlops.lb.dataset import TABLE
from kernmlops.lb.features import MIGRATION_COST_NS, kernel_migration_cost_ns
from kernmlops.lb.hook import LbHook, LbKprobeHook, LbTracepointHook, cpu_nodes

VARIANTS = ("kprobe", "tracepoint", "both")
#: scheduler tables the tracepoint variant is rebuilt from
TRACEPOINT_HOOKS = ("sched_migrate", "quanta_runtime", "process_trace", "system_info")


@dataclass
class LbCollectResult:
    path: Path
    variant: str
    model: Any = None
    nodes: list[int] = field(default_factory=list)
    #: set once the session has run
    result: CollectionResult = field(init=False)
    hooks: dict[str, HookStatus] = field(default_factory=dict)
    #: rows of the lb tables (also in ``result.rows``)
    rows: dict[str, int] = field(default_factory=dict)
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


class _LbManifest(Participant):
    """The ``lb`` section of the manifest (variant, CPU-to-node map, migration cost,
    model, shadow summary) and, for the tracepoint variant, the decisions rebuilt
    from the finished collection's scheduler tables: added when the session writes
    its final manifest."""

    def __init__(self, out: LbCollectResult, hooks: list[LbHook], section: dict[str, Any]):
        self.out = out
        self.hooks = hooks
        self.section = section

    def contribute(self, manifest: Manifest, path: Path) -> None:
        from kernmlops.lb.shadow import summarize

        out = self.out
        out.rows = {t: manifest.tables[t].rows for h in self.hooks for t in h.tables
                    if t in manifest.tables}  # fmt: skip
        tp = None
        if out.variant in ("tracepoint", "both"):
            # first: the tracepoint shadow is scored on this data set's pulls
            out.tracepoint, tp = _build_tracepoint(path, manifest, out)
            self.section["tracepoint"] = out.tracepoint
        if out.model is not None:
            out.shadow = {}
            for hook in self.hooks:
                table = next(iter(hook.tables))
                frame = _read_table(path, table)
                kind = "kprobe" if isinstance(hook, LbKprobeHook) else "tracepoint"
                stats = hook.stats.as_dict() if hook.stats else None
                out.shadow[kind] = summarize(
                    frame, stats, kind, tp if kind == "tracepoint" else None
                )
        self.section["shadow"] = out.shadow
        manifest.lb = self.section  # type: ignore[attr-defined]  # a section of its own


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
    from kernmlops.lb.shadow import BpfStats

    session = Session(config, on_progress=on_progress, on_attached=on_attached, bpf_dir=bpf_dir)
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
    if variant in ("tracepoint", "both"):
        # with or without a model: its record of each pull is the data set's row
        # (one read of the runqueues for the row and the model)
        hooks.append(LbTracepointHook(**common))
    out = LbCollectResult(path=session.path, variant=variant, model=model, nodes=nodes)
    section: dict[str, Any] = {
        "variant": variant,
        "attach": attach,
        "cpu_node": nodes,
        "migration_cost_ns": migration_cost_ns,
        # what the kernel itself used (None: unreadable), to check the features' value
        "kernel_migration_cost_ns": kernel_migration_cost_ns(),
        "model": model_meta,
        "shadow": None,
    }
    # The lb hooks are the session's own (drained by its loop into its sink, in its
    # manifest); they are started here first so that a kernel that cannot run them
    # fails the command before anything is collected.
    session.extra_hooks.extend(hooks)
    session.participants.append(_LbManifest(out, hooks, section))
    ctx = HookContext(session.collection_id, None, os.getpid(), bpf_dir)
    with BpfStats():
        started: list[LbHook] = []
        try:
            for hook in hooks:
                hook.start(ctx)
                started.append(hook)
        except BaseException:
            for hook in started:
                hook.close()
            raise
        out.result = session.run()
    out.hooks = {h.name: h.status for h in hooks}
    return out


def _read_table(path: Path, table: str) -> pl.DataFrame | None:
    """``table`` of the collection being finished in ``path`` (None: no part), each
    part opened once as read_collection opens it: no FIFO put at a part's name is
    waited on."""
    from kernmlops.data import IncompleteCollectionWarning, read_collection

    with warnings.catch_warnings():
        # on disk the manifest still says running: this is part of its final write
        warnings.simplefilter("ignore", IncompleteCollectionWarning)
        collection = read_collection(path, lazy=True)
    return collection.read(table) if table in collection else None


def _build_tracepoint(
    path: Path, manifest: Manifest, out: LbCollectResult
) -> tuple[dict[str, Any], pl.DataFrame]:
    """Rebuild the tracepoint decisions of the finished collection (its tables are
    complete; its manifest is the one being finalised); with the kprobe variant
    beside it, compare the two. The summary and the decisions."""
    from kernmlops.data import IncompleteCollectionWarning, read_collection
    from kernmlops.lb.dataset import from_kprobe_records
    from kernmlops.lb.tracepoint import compare_with_kprobe, tracepoint_decisions

    with warnings.catch_warnings():
        # on disk the manifest still says running: this is part of its final write
        warnings.simplefilter("ignore", IncompleteCollectionWarning)
        collection = read_collection(path)
    tp = tracepoint_decisions(collection, out.nodes)
    table = "lb_decisions_tracepoint" if out.variant == "both" else TABLE
    sink = ParquetSink(path, collection.collection_id)
    sink.write(table, tp.drop("collection_id"))
    written = sink.close()
    out.rows.update(written)
    for name, n in written.items():
        files = sorted(p.name for p in (path / name).glob("*.parquet"))
        manifest.tables = {**manifest.tables, name: TableRecord(rows=n, files=files)}
    info: dict[str, Any] = {
        "table": table,
        "rows": tp.height,
        "positives": int((tp["can_migrate"] == 1).sum()) if tp.height else 0,
        # pulls whose row is the lb_tp program's record (the rest: sched_migrate's read)
        "positives_observed": (
            int(tp.filter(pl.col("can_migrate") == 1)["model_pred"].is_not_null().sum())
            if "model_pred" in tp.columns
            else 0
        ),
    }
    if out.variant == "both" and TABLE in collection:
        kp = collection[TABLE]
        if "src_nid" not in kp.columns:
            kp = from_kprobe_records(kp)
        info["vs_kprobe"] = compare_with_kprobe(tp, kp)
    return info, tp
