"""MLLB's 15 features, its filter, and the kernel rule they stand for.

A *decision* row holds what ``can_migrate_task(p, env)`` saw (the canonical
columns of :data:`DECISION_SCHEMA`) and what it returned (``can_migrate``).
The features are MLLB's (Chen et al., APSys'20), computed the way its kernel
patch computes them, so a model trained here runs unchanged there:

=====  ===============  ==================================================
index  feature          from the decision
=====  ===============  ==================================================
0      src_non_pref_nr  src_len > src_preferred_len
1      delta_hot        delta_ns < migration cost (sysctl, 500 µs)
2-4    cpu_idle, ...    env->idle is CPU_IDLE / CPU_NOT_IDLE / CPU_NEWLY_IDLE
5      same_node        src and dst CPU on one NUMA node
6, 7   prefer_src/dst   the task's preferred NUMA node is src's / dst's
8      src_len          src runqueue length - 2 (MLLB centres it so)
9, 10  src/dst_load     runqueue cfs load_avg / 1000
11     dst_len          dst runqueue length
12     delta_faults     (dst node faults - src node faults) / total faults
13     extra_fails      sd->nr_balance_failed > sd->cache_nice_tries
14     buddy_hot        dst busy and the task is its cfs_rq's next/last buddy
=====  ===============  ==================================================

The fixed-point features (:func:`fixed_features`) are Q20.11 integers with
the same truncations as MLLB's ``CONFIG_JC_SCHED_FXDPT`` code (and as
``bpf/lb_model.h``), so Python, the exported C header and the in-kernel BPF
model compute identical integers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from kernmlops.errors import KernmlopsError
from kernmlops.lb.names import FBITS, FEATURES, NR_FEATURES, ONE, Q_LIMIT

LABEL = "can_migrate"

#: sysctl_sched_migration_cost's default (ns): a task that ran more recently is cache hot.
MIGRATION_COST_NS = 500_000
#: Where the running kernel keeps it: debugfs since 5.13, a sysctl before.
MIGRATION_COST_FILES = (
    Path("/sys/kernel/debug/sched/migration_cost_ns"),
    Path("/proc/sys/kernel/sched_migration_cost_ns"),
)


def kernel_migration_cost_ns(files: tuple[Path, ...] = MIGRATION_COST_FILES) -> int | None:
    """The running kernel's sched migration cost (ns), or None where it cannot be
    read (debugfs not mounted, not root): the features' hot window must be the
    one the kernel used, or the labels look like noise."""
    for f in files:
        try:
            return int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


#: The canonical decision columns every source (kprobe, tracepoint, MLLB dump,
#: rule-generated) writes; a column a source cannot know is null.
DECISION_SCHEMA: dict[str, pl.DataType] = {
    "collection_id": pl.String(),
    "variant": pl.String(),
    "ts_uptime_us": pl.Int64(),
    "pid": pl.Int64(),
    "src_cpu": pl.Int64(),
    "dst_cpu": pl.Int64(),
    "imbalance": pl.Int64(),
    "cpu_idle": pl.Int8(),
    "cpu_not_idle": pl.Int8(),
    "cpu_newly_idle": pl.Int8(),
    "src_len": pl.Int64(),
    "src_numa_len": pl.Int64(),
    "src_preferred_len": pl.Int64(),
    "delta_ns": pl.Int64(),
    "same_node": pl.Int8(),
    "prefer_src": pl.Int8(),
    "prefer_dst": pl.Int8(),
    "delta_faults": pl.Int64(),
    "total_faults": pl.Int64(),
    "dst_len": pl.Int64(),
    "src_load": pl.Int64(),
    "dst_load": pl.Int64(),
    "nr_balance_failed": pl.Int64(),
    "cache_nice_tries": pl.Int64(),
    "buddy_hot": pl.Int8(),
    "throttled": pl.Int8(),
    "p_running": pl.Int8(),
    #: the hard constraints passed (not throttled, not a per-CPU kthread, dst
    #: allowed by affinity, not running): the rest of the decision is the
    #: cache-hotness test the features describe. MLLB's ``test_aggressive``.
    "test_aggressive": pl.Int8(),
    #: active balance (LBF_ACTIVE_LB) skips the hotness test: always 1
    "active_lb": pl.Int8(),
    LABEL: pl.Int8(),
}

#: Columns the features need (null in any of them: the row cannot be featurized).
FEATURE_INPUTS: tuple[str, ...] = (
    "src_len", "src_preferred_len", "delta_ns", "cpu_idle", "cpu_not_idle", "cpu_newly_idle",
    "same_node", "prefer_src", "prefer_dst", "src_load", "dst_load", "dst_len",
    "delta_faults", "total_faults", "nr_balance_failed", "cache_nice_tries", "buddy_hot",
)  # fmt: skip


class FeatureError(KernmlopsError):
    """Decisions that cannot be turned into features (missing columns)."""


def conform(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with every canonical column (missing ones null), cast to the
    canonical types, canonical columns first and extra columns kept after."""
    exprs = []
    for name, dtype in DECISION_SCHEMA.items():
        if name in frame.columns:
            exprs.append(pl.col(name).cast(dtype))
        else:
            exprs.append(pl.lit(None, dtype).alias(name))
    extra = [c for c in frame.columns if c not in DECISION_SCHEMA]
    return frame.select(*exprs, *extra)


def mllb_filter(frame: pl.DataFrame) -> pl.DataFrame:
    """MLLB's filter: the task is not running and the hard constraints passed
    (``test_aggressive``); active balances are left out too, since their
    answer (always 1) does not depend on the features. A null (a source that
    cannot know) keeps the row."""
    keep = (
        (pl.col("p_running").fill_null(0) == 0)
        & (pl.col("test_aggressive").fill_null(1) == 1)
        & (pl.col("active_lb").fill_null(0) == 0)
    )
    return frame.filter(keep)


def _require(frame: pl.DataFrame) -> None:
    missing = [c for c in FEATURE_INPUTS if c not in frame.columns]
    if missing:
        raise FeatureError(f"decisions lack the columns {', '.join(missing)}")
    nulls = [c for c in FEATURE_INPUTS if frame[c].null_count()]
    if nulls:
        # which collections: a file that lacks the column reads as nulls (conform)
        where = ""
        if "collection_id" in frame.columns:
            ids = frame.filter(pl.col(nulls[0]).is_null())["collection_id"].unique(
                maintain_order=True
            )
            shown = ", ".join(str(i) for i in ids.head(3))
            where = f" in collection {shown}" + (
                f" and {len(ids) - 3} more" if len(ids) > 3 else ""
            )
        raise FeatureError(
            f"{frame[nulls[0]].null_count()} decisions{where} have no {nulls[0]} "
            f"(null in {', '.join(nulls)}): their lb_decisions lack it or leave it empty "
            "(in Python, dataset.impute_missing fills what the tracepoint variant cannot know)"
        )


def _col(frame: pl.DataFrame, name: str) -> np.ndarray:
    return frame[name].cast(pl.Int64).to_numpy()


def _flag(values: np.ndarray) -> np.ndarray:
    return (values != 0).astype(np.int64)


def integer_parts(
    frame: pl.DataFrame, migration_cost_ns: int = MIGRATION_COST_NS
) -> dict[str, np.ndarray]:
    """The integer quantities both feature forms start from."""
    _require(frame)
    src_len = _col(frame, "src_len")
    return {
        "src_non_pref_nr": (src_len > _col(frame, "src_preferred_len")).astype(np.int64),
        "delta_hot": (_col(frame, "delta_ns") < migration_cost_ns).astype(np.int64),
        "cpu_idle": _flag(_col(frame, "cpu_idle")),
        "cpu_not_idle": _flag(_col(frame, "cpu_not_idle")),
        "cpu_newly_idle": _flag(_col(frame, "cpu_newly_idle")),
        "same_node": _flag(_col(frame, "same_node")),
        "prefer_src": _flag(_col(frame, "prefer_src")),
        "prefer_dst": _flag(_col(frame, "prefer_dst")),
        "src_len": src_len,
        "src_load": _col(frame, "src_load"),
        "dst_load": _col(frame, "dst_load"),
        "dst_len": _col(frame, "dst_len"),
        "delta_faults": _col(frame, "delta_faults"),
        "total_faults": _col(frame, "total_faults"),
        "extra_fails": (_col(frame, "nr_balance_failed") > _col(frame, "cache_nice_tries")).astype(
            np.int64
        ),
        "buddy_hot": _flag(_col(frame, "buddy_hot")),
    }


def float_features(frame: pl.DataFrame, migration_cost_ns: int = MIGRATION_COST_NS) -> np.ndarray:
    """``(rows, 15)`` float64 features, MLLB's definitions."""
    p = integer_parts(frame, migration_cost_ns)
    total = p["total_faults"]
    delta_faults = np.where(
        total != 0, p["delta_faults"] / np.where(total == 0, 1, total), p["delta_faults"]
    )
    cols = {
        **{k: p[k].astype(np.float64) for k in FEATURES},
        "src_len": (p["src_len"] - 2).astype(np.float64),
        "src_load": p["src_load"] / 1000.0,
        "dst_load": p["dst_load"] / 1000.0,
        "delta_faults": delta_faults.astype(np.float64),
    }
    return np.column_stack([cols[k] for k in FEATURES]) if len(frame) else np.zeros((0, 15))


def _div_trunc(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """C's integer division (truncation toward zero); den > 0."""
    q = np.abs(num) // den
    return np.where(num < 0, -q, q)


def fixed_features(frame: pl.DataFrame, migration_cost_ns: int = MIGRATION_COST_NS) -> np.ndarray:
    """``(rows, 15)`` int64 Q20.11 features, exactly as the kernel side computes
    them: flags and lengths shifted by 11 bits, loads ``load * 2048 / 1000``
    and faults ``delta * 2048 / total`` truncated toward zero (C division)."""
    p = integer_parts(frame, migration_cost_ns)
    clamp = lambda v: np.clip(v, -Q_LIMIT, Q_LIMIT)  # noqa: E731
    cols = {k: clamp(p[k]) << FBITS for k in FEATURES}
    cols["src_len"] = (clamp(p["src_len"]) - 2) << FBITS
    cols["src_load"] = clamp(p["src_load"]) * ONE // 1000  # loads are >= 0
    cols["dst_load"] = clamp(p["dst_load"]) * ONE // 1000
    total = clamp(p["total_faults"])
    delta = clamp(p["delta_faults"])
    safe = np.where(total > 0, total, 1)
    cols["delta_faults"] = np.where(total > 0, _div_trunc(delta * ONE, safe), delta << FBITS)
    if not len(frame):
        return np.zeros((0, NR_FEATURES), dtype=np.int64)
    return np.column_stack([cols[k] for k in FEATURES]).astype(np.int64)


def rule_decision(features: np.ndarray) -> np.ndarray:
    """CFS's can_migrate_task (6.1) after its hard constraints, written on the
    15 features: a task moves if it is not cache hot, or if balancing failed
    more often than the domain's cache_nice_tries. Hot is NUMA locality
    (migrate_degrades_locality) where the nodes differ and NUMA data exist,
    else task_hot (next/last buddy, or ran within the migration cost).

    Used to label rule-generated data and to check collected decisions
    against the kernel's own answer. Works on float or fixed features."""
    f = {name: features[:, i] for i, name in enumerate(FEATURES)}
    numa = (f["same_node"] == 0) & (
        (f["prefer_src"] != 0) | (f["prefer_dst"] != 0) | (f["delta_faults"] != 0)
    )
    return _decision(f, numa)


def _decision(f: dict[str, np.ndarray], numa: np.ndarray) -> np.ndarray:
    """can_migrate_task's answer from the features ``f`` where ``numa`` says which
    moves NUMA locality decides (migrate_degrades_locality), the others task_hot."""
    task_hot = (f["buddy_hot"] != 0) | (f["delta_hot"] != 0)
    degrades = np.where(
        f["prefer_src"] != 0,
        np.where(f["src_non_pref_nr"] != 0, True, task_hot),
        np.where(
            f["prefer_dst"] != 0,
            False,
            np.where(f["cpu_idle"] != 0, task_hot, f["delta_faults"] < 0),
        ),
    )
    hot = np.where(numa, degrades, task_hot)
    return ((~hot) | (f["extra_fails"] != 0)).astype(np.int8)


def kernel_decision(frame: pl.DataFrame, migration_cost_ns: int = MIGRATION_COST_NS) -> np.ndarray:
    """can_migrate_task's answer (6.1) after the hard constraints, from the
    raw columns rather than the features: NUMA locality counts only when the
    task has NUMA fault statistics (``numa_faults_on`` where recorded, else
    ``total_faults`` > 0), which MLLB's features cannot tell apart from
    "statistics, but none yet". An independent check of collected data."""
    x = float_features(frame, migration_cost_ns)
    if "numa_faults_on" in frame.columns and frame["numa_faults_on"].null_count() == 0:
        numa_on = frame["numa_faults_on"].cast(pl.Int64).to_numpy() != 0
    else:
        numa_on = frame["total_faults"].fill_null(0).to_numpy() > 0
    f = {name: x[:, i] for i, name in enumerate(FEATURES)}
    return _decision(f, (f["same_node"] == 0) & numa_on)
