"""``duet run --collect``: the kernel collector watches each trial.

Each trial runs as the benchmark of one kernmlops collection (library API:
``kernmlops.collect.session.Session`` with the ``command`` benchmark), in a
child process (``python -m kernmlops.duet.trial``) that starts both sides. The
collection's process-tree filter follows that child and everything it starts,
so the kernel programs see both sides and nothing else on the machine. Rows
are attributed afterwards: a side is the process tree rooted at its pid (the
runner records it), rebuilt from process_trace's fork events.

Per side and trial (``kernel_stats``): CPU time (sum of on-CPU quanta),
run-queue latency (mean and p99 of the waits from wake-up to running),
migrations, context switches (quanta that ended), page faults. A side is a part of
the collection's traced tasks, so its page faults are the kernel's exact count of
each of its processes (``hooks.page_faults.count_by_tgid``, on in these collections:
the table ``page_fault_counts``); a collection without it (made before) gives the
side's rows × the hook's ``sample_every``, ``page_faults_estimated`` where that is > 1.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.clitools import require_bpf_privileges
from kernmlops.duet.config import DuetSuite
from kernmlops.duet.runner import DuetError, SideRecord, Trial, TrialRecord
from kernmlops.errors import KernmlopsError
from kernmlops.stats import quantile

HOOKS = ("process_trace", "quanta_runtime", "sched_migrate", "page_faults")
KERNEL_SCHEMA: dict[str, pl.DataType] = {
    "suite": pl.String(),
    "benchmark": pl.String(),
    "kind": pl.String(),
    "runid": pl.Int64(),
    "order": pl.String(),
    "pair": pl.String(),
    "processes": pl.Int64(),
    "cpu_time_ms": pl.Float64(),
    "runq_latency_mean_us": pl.Float64(),
    "runq_latency_p99_us": pl.Float64(),
    "migrations": pl.Int64(),
    "context_switches": pl.Int64(),
    "page_faults": pl.Int64(),
    "page_faults_estimated": pl.Boolean(),
    "collection_id": pl.String(),
}


class Collector:
    """Runs trials under kernel collections (needs root and BPF)."""

    def __init__(self, hooks: tuple[str, ...] = HOOKS, bpf_dir: Path | None = None) -> None:
        require_bpf_privileges("duet run --collect", DuetError)
        from kernmlops.ebpf.build import build

        build(bpf_dir)
        self.hooks = hooks
        self.bpf_dir = bpf_dir

    def run_trial(
        self, trial: Trial, suite: DuetSuite, folder: Path, layout: str = "kernmlops"
    ) -> TrialRecord:
        from kernmlops.collect.session import Session
        from kernmlops.config import load_config

        duet_suite = next(d.suite for d in suite.duets if d.name == trial.duet)
        label = trial.label(duet_suite) + (f".{trial.pair}" if trial.pair else "")
        work = folder / "work"
        work.mkdir(parents=True, exist_ok=True)
        spec, out = work / f"{label}.spec.json", work / f"{label}.record.json"
        spec.write_text(
            json.dumps(
                {
                    "config": suite.raw,
                    "source": suite.source,
                    "trial": asdict(trial),
                    "folder": str(folder),
                    "layout": layout,
                },
                default=str,
            )
        )
        config = load_config(
            {
                "collector": {
                    "output_dir": str(folder / "collections"),
                    "hooks": list(self.hooks),
                    "filter": "tree",
                    "progress": False,
                },
                # each side's faults exactly, whatever the rows (a side is a part of
                # the traced tasks: the manifest's counters are of them all)
                "hooks": {"page_faults": {"count_by_tgid": True}},
                "benchmark": {
                    "name": "command",
                    "command": {
                        "argv": [sys.executable, "-m", "kernmlops.duet.trial", str(spec), str(out)]
                    },
                },
            }
        )
        session = Session(config, bpf_dir=self.bpf_dir)
        try:
            result = session.run()
        except KernmlopsError as err:
            raise DuetError(f"{label}: the collection failed: {err}") from err
        if out.exists():
            rec = TrialRecord.from_dict(json.loads(out.read_text()))
        else:  # the trial process died: record it, keep the collection
            rec = TrialRecord(
                label=label, suite=duet_suite, benchmark=trial.duet, kind=trial.kind,
                runid=trial.runid, order=trial.order, aa=False, timeout_s=None,
                started_at=result.started_at.isoformat(),
                sides={p: SideRecord(p, "", None, status="error",
                                     error=f"trial process ended with {result.benchmark_exit}")
                       for p in trial.pairs},
            )  # fmt: skip
        rec.collection = {
            "path": str(result.path.relative_to(folder)),
            "collection_id": result.collection_id,
            "ended_by": result.ended_by,
            "hooks": {
                n: ("attached" if st.attached else f"not attached: {st.reason}")
                for n, st in result.hooks.items()
            },
        }
        return rec


def descendants(process_trace: pl.DataFrame, root: int) -> set[int]:
    """The tgids of ``root`` and every process forked below it."""
    forks = process_trace.filter(
        (pl.col("kind") == "fork") & (pl.col("pid") == pl.col("tgid"))
    ).select("ppid", "tgid")
    children: dict[int, list[int]] = {}
    for parent, child in forks.iter_rows():
        children.setdefault(int(parent), []).append(int(child))
    seen, todo = {root}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def kernel_stats(
    tables: dict[str, pl.DataFrame], roots: dict[str, int], fault_every: int = 1
) -> dict[str, dict[str, Any]]:
    """Per side (pair -> its root pid): what the kernel did for its process tree. Page
    faults: the sum of the tree's processes' counts in ``page_fault_counts`` where
    given, else its ``page_faults`` rows × ``fault_every`` (the hook's sample_every),
    ``page_faults_estimated`` where that is > 1."""
    from kernmlops.hooks.page_faults import COUNTS_TABLE  # the hook's libraries: not at import

    pt = tables.get("process_trace")
    counts = tables.get(COUNTS_TABLE)
    out: dict[str, dict[str, Any]] = {}
    for pair, root in roots.items():
        tgids = descendants(pt, root) if pt is not None else {root}
        mine = pl.col("tgid").is_in(list(tgids))

        def rows(name: str, mine: pl.Expr = mine) -> pl.DataFrame | None:
            t = tables.get(name)
            return None if t is None else t.filter(mine)

        quanta, queued = rows("quanta_runtime"), rows("quanta_queued_time")
        migr, faults = rows("sched_migrate"), rows("page_faults")
        waits = queued["quanta_queued_time_us"].to_numpy() if queued is not None else None
        out[pair] = {
            "processes": len(tgids),
            "cpu_time_ms": (
                float(quanta["quanta_run_length_us"].sum()) / 1000 if quanta is not None else None
            ),
            "runq_latency_mean_us": float(waits.mean())
            if waits is not None and len(waits)
            else None,
            "runq_latency_p99_us": (
                quantile(waits, 0.99) if waits is not None and len(waits) else None
            ),
            "migrations": migr.height if migr is not None else None,
            "context_switches": quanta.height if quanta is not None else None,
            **_faults(counts, faults, mine, fault_every),
        }
    return out


def _faults(
    counts: pl.DataFrame | None, rows: pl.DataFrame | None, mine: pl.Expr, every: int
) -> dict[str, Any]:
    """A side's page faults: counted by the kernel, or its rows × every."""
    from kernmlops.hooks.page_faults import KINDS, kind_counter

    if counts is not None:
        mine_counted = counts.filter(mine).select(kind_counter(k) for k in KINDS)
        return {"page_faults": int(mine_counted.sum().sum_horizontal().item()),
                "page_faults_estimated": False}  # fmt: skip
    if rows is None:
        return {"page_faults": None, "page_faults_estimated": None}
    return {"page_faults": rows.height * every, "page_faults_estimated": every > 1}


_EMPTY = {
    "quanta_runtime": ("quanta_runtime", "quanta_run_length_us"),
    "quanta_queued_time": ("quanta_runtime", "quanta_queued_time_us"),
    "sched_migrate": ("sched_migrate", "orig_cpu"),
    "page_faults": ("page_faults", "address"),
}


def kernel_stats_for_suite(folder: Path, index: dict[str, Any]) -> pl.DataFrame:
    """One row per trial and side, from the collections ``--collect`` left."""
    from kernmlops.confined import confined
    from kernmlops.data import read_collection
    from kernmlops.hooks.page_faults import COUNTER_NOT_BY_TGID, COUNTS_TABLE, KINDS, kind_counter

    rows = []
    for trial in index.get("trials", []):
        coll = trial.get("collection")
        if not coll:
            continue
        # the index names the collection: it must be one of this folder's
        c = read_collection(confined(folder, coll["path"], what="collection"))
        pf_config = ((c.manifest.get("config") or {}).get("hooks") or {}).get("page_faults") or {}
        roots = {p: s["pid"] for p, s in trial["sides"].items() if s.get("pid")}
        tables = dict(c.tables)
        attached = {n for n, st in (coll.get("hooks") or {}).items() if st == "attached"}
        for table, (hook, value) in _EMPTY.items():
            if hook in attached and table not in tables:  # attached, saw nothing: zero rows
                tables[table] = pl.DataFrame(schema={"tgid": pl.UInt32, value: pl.UInt64})
        pf_counters = ((c.manifest.get("hooks") or {}).get("page_faults") or {}).get("counters")
        if "page_faults" in attached and pf_config.get("count_by_tgid") and pf_counters:
            if pf_counters.get(COUNTER_NOT_BY_TGID):  # some processes not counted: the rows
                tables.pop(COUNTS_TABLE, None)
            elif COUNTS_TABLE not in tables:  # no process faulted
                tables[COUNTS_TABLE] = pl.DataFrame(
                    schema={"tgid": pl.UInt32, **{kind_counter(k): pl.UInt64 for k in KINDS}}
                )
        else:  # not asked for, or the collection ended before its counts: the rows
            tables.pop(COUNTS_TABLE, None)
        stats = kernel_stats(tables, roots, int(pf_config.get("sample_every") or 1))
        for pair, st in stats.items():
            rows.append({
                "suite": trial["suite"], "benchmark": trial["benchmark"], "kind": trial["kind"],
                "runid": trial["runid"], "order": trial["order"], "pair": pair, **st,
                "collection_id": coll["collection_id"],
            })  # fmt: skip
    return pl.DataFrame(rows, schema=KERNEL_SCHEMA, orient="row")
