"""The tracepoint variant: load-balancing decisions rebuilt from scheduler
tables, for kernels where ``can_migrate_task`` cannot be probed.

It is an approximation, built from the ``sched_migrate``, ``quanta_runtime``
and ``quanta_queued_time`` tables of one collection:

* **positives** (``can_migrate`` = 1): tasks moved while queued and decided
  on the destination CPU (``kind == queued`` and ``cpu == dest_cpu``): the
  load balancer's pulls. Active balancing and NUMA/affinity moves run on the
  source CPU and are left out.
* **negatives** (``can_migrate`` = 0): tasks waiting on the source CPU's
  queue at that moment (a ``quanta_queued_time`` wait interval on that CPU
  spans it) that stayed there, once per balance (pulls from one source
  within ``window_us`` are one balance), leaving out the tasks that pass
  moved.

What is known: lengths and loads of both runqueues (sched_migrate reads
them; the source gets the pulled task back: +1), ``delta_ns`` (since the
task last left a CPU, from quanta_runtime), NUMA nodes from the CPU map.

What is not, and stays null (``impute_missing`` fills it for a model): the
idle type, ``nr_balance_failed`` / ``cache_nice_tries``, buddies,
throttling, the preferred node and the NUMA faults on machines with more
than one node, the hard constraints (a pinned task left behind reads as a
negative). A negative may also be a task the balancer never examined
(detach_tasks stops once the imbalance is met). :func:`compare_with_kprobe`
measures all this against the exact variant where both ran (the lab).

Where the collection holds the ``lb_tp`` program's rows (``lb_tp_shadow``:
``lb collect``'s tracepoint variant always runs it), a pull's row is that
program's observation instead, joined to sched_migrate's row of the same
event by pid and ``nr_migrations`` (the task's count before the move, which
both programs read): its runqueue lengths and loads, and
its model's answer (``model_pred``, ``model_out``, ``infer_ns``; -1, 0, 0
without a model; null where the program has no row for the pull, whose
inputs are then sched_migrate's). The shadow model's inputs and the data
set's row are then one read: two programs read the unlocked destination
queue µs apart, and a wake-up between them made them differ. A balance's
negatives take their queues from its pulls' rows.

Every row's ``delta_ns`` is the time since the task last left a CPU, from
quanta_runtime, pulls and negatives alike: the program reads the kernel's own
delta (``rq_clock_task(src) - se.exec_start``, as the kprobe variant does) for
a pull only, and a data set whose positives were measured one way and its
negatives another would let a model learn the label from the method (the two
differ by a median of ~18 µs, and by the whole uptime for a task moved since
it last ran, whose exec_start the kernel zeroes). The program's read is kept
as ``kernel_delta_ns`` (null on negatives): with it, ``model_out`` is the
Q20.11 evaluation of the row's inputs.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import polars.selectors as cs

from kernmlops.data import Collection
from kernmlops.errors import CollectionError
from kernmlops.lb.features import conform

NEEDED = ("sched_migrate", "quanta_runtime", "quanta_queued_time")
#: the lb_tp program's table: its rows are the pulls' observations where present
SHADOW_TABLE = "lb_tp_shadow"
#: what a pull's row takes from the lb_tp program's record (its model's answer)
MODEL_COLUMNS = ("model_pred", "model_out", "infer_ns")
#: the two programs' timestamps of one event are µs apart (tens in the lab's
#: emulated CPUs); the key (pid, nr_migrations) decides, the time only guards
#: against a pid reused within the collection
OBSERVED_WITHIN_US = 1000
#: pulls from one source CPU closer than this are one balance pass (µs)
WINDOW_US = 1000
#: delta_ns for a task never seen leaving a CPU: long ago, so cache cold
NEVER_RAN_NS = 10_000_000_000


def pulls(migrations: pl.DataFrame) -> pl.DataFrame:
    """sched_migrate rows that are load-balancer pulls."""
    return migrations.filter(
        (pl.col("kind") == "queued")
        & (pl.col("cpu") == pl.col("dest_cpu"))
        & (pl.col("orig_cpu") != pl.col("dest_cpu"))
    ).sort("ts_uptime_us")


def observed_pulls(p: pl.DataFrame, shadow: pl.DataFrame | None) -> pl.DataFrame:
    """The pulls with what the lb_tp program read and evaluated at the same
    event, where it has a row: runqueue columns replaced by its (sched_migrate's
    names), ``obs_delta_ns`` its delta (null where it has no row or could not
    read the queues) and its model's columns. Unchanged (sched_migrate's read)
    without the program's rows, or where either table predates the key."""
    key = ["pid", "nr_migrations"]
    if shadow is None or not all(k in c for k in key for c in (p.columns, shadow.columns)):
        return p.with_columns(pl.lit(None, pl.Int64).alias("obs_delta_ns"))
    by = [*key, "orig_cpu", "dest_cpu"]
    as_int = [pl.col(c).cast(pl.Int64) for c in (*by, "ts_uptime_us")]
    read = {  # sched_migrate's name <- the program's record (the source had the task: +1)
        "obs_orig_nr_running": pl.col("src_len") - 1,
        "obs_dest_nr_running": pl.col("dst_len"),
        "obs_orig_load_avg": pl.col("src_load"),
        "obs_dest_load_avg": pl.col("dst_load"),
        "obs_delta_ns": pl.col("delta_ns"),
    }
    obs = shadow.rename({"src_cpu": "orig_cpu", "dst_cpu": "dest_cpu"}).select(
        *as_int,
        pl.col("ts_uptime_us").cast(pl.Int64).alias("obs_ts"),
        pl.col("rq_valid").cast(pl.Boolean).alias("obs_valid"),
        *(e.cast(pl.Int64).alias(name) for name, e in read.items()),
        pl.col("model_pred").cast(pl.Int8),
        pl.col("model_out").cast(pl.Int64),
        pl.col("infer_ns").cast(pl.Int64),
    )
    # the key decides; the nearest time within the bound guards against a reused pid
    # (both sides sorted on time here; polars cannot check that per group)
    joined = (
        p.with_columns(*as_int)
        .with_row_index("_row")
        .sort("ts_uptime_us")
        .join_asof(
            obs.sort("ts_uptime_us"),
            on="ts_uptime_us",
            by=by,
            strategy="nearest",
            tolerance=OBSERVED_WITHIN_US,
            check_sortedness=False,
        )
        .sort("_row")
        .drop("_row")
    )
    seen = pl.col("obs_valid").fill_null(False)
    replaced = [name.removeprefix("obs_") for name in read if name != "obs_delta_ns"]
    return joined.with_columns(
        *(pl.when(seen).then(pl.col(f"obs_{c}")).otherwise(pl.col(c)).alias(c) for c in replaced),
        pl.when(pl.col("obs_ts").is_not_null())
        .then(seen)
        .otherwise(pl.col("rq_valid"))
        .alias("rq_valid"),
        pl.when(seen).then(pl.col("obs_delta_ns")).alias("obs_delta_ns"),
    ).drop(cs.starts_with("obs_").exclude("obs_delta_ns"))


def _balances(p: pl.DataFrame, window_us: int) -> pl.DataFrame:
    """Each pull with the id of its balance pass (same source and destination,
    closer than ``window_us`` to the previous pull)."""
    p = p.sort("orig_cpu", "dest_cpu", "ts_uptime_us")
    gap = (
        (pl.col("orig_cpu") != pl.col("orig_cpu").shift(1))
        | (pl.col("dest_cpu") != pl.col("dest_cpu").shift(1))
        | (pl.col("ts_uptime_us").diff() > window_us)
    ).fill_null(True)
    return p.with_columns(gap.cum_sum().alias("balance"))


def _waiting_at(waits: pl.DataFrame, balances: pl.DataFrame) -> pl.DataFrame:
    """(balance, pid) for every wait interval on a balance's source CPU that
    spans the balance's first pull: swept per CPU with sorted times."""
    out = []
    first = balances.group_by("balance").agg(
        pl.col("ts_uptime_us").min().alias("t"), pl.col("orig_cpu").first()
    )
    for (cpu,), group in first.group_by("orig_cpu"):
        w = waits.filter(pl.col("cpu") == cpu)
        if w.height == 0:
            continue
        g = group.sort("t")
        t = g["t"].to_numpy()
        lo = np.searchsorted(t, w["wait_start"].to_numpy(), side="left")
        hi = np.searchsorted(t, w["ts_uptime_us"].to_numpy(), side="left")
        counts = hi - lo
        if counts.sum() == 0:
            continue
        rows = np.repeat(np.arange(w.height), counts)
        starts = np.repeat(lo, counts)
        offset = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        out.append(
            pl.DataFrame(
                {
                    "balance": g["balance"].to_numpy()[starts + offset],
                    "pid": w["pid"].to_numpy()[rows],
                }
            )
        )
    if not out:
        return pl.DataFrame(schema={"balance": pl.UInt32, "pid": pl.Int64})
    return pl.concat(out).with_columns(pl.col("pid").cast(pl.Int64)).unique()


def tracepoint_decisions(
    collection: Collection,
    cpu_node: list[int] | None = None,
    window_us: int = WINDOW_US,
) -> pl.DataFrame:
    """The approximate decisions of one collection, canonical columns
    (``variant`` = tracepoint) plus ``balance`` (the balance pass id)."""
    missing = [t for t in NEEDED if t not in collection]
    if missing:
        raise CollectionError(
            f"{collection.path}: the tracepoint variant needs the tables {', '.join(NEEDED)}; "
            f"missing {', '.join(missing)} (collect with hooks sched_migrate, quanta_runtime)"
        )
    p = pulls(collection["sched_migrate"])
    if p.height == 0:
        return conform(pl.DataFrame()).clear()
    shadow = collection.get(SHADOW_TABLE)
    p = observed_pulls(p, shadow)
    extras = [c for c in ("nr_migrations", *MODEL_COLUMNS) if c in p.columns]
    nodes = cpu_node or []
    single_node = len(set(nodes)) <= 1
    node = lambda c: (  # noqa: E731
        pl.col(c).replace_strict(list(range(len(nodes))), nodes, default=0) if nodes else pl.lit(0)
    )
    b = _balances(p, window_us)
    moved = b.select("balance", pl.col("pid").cast(pl.Int64)).unique()
    waits = collection["quanta_queued_time"].with_columns(
        (pl.col("ts_uptime_us") - pl.col("quanta_queued_time_us")).alias("wait_start")
    )
    stayed = _waiting_at(waits, b).join(moved, on=["balance", "pid"], how="anti")
    context = b.group_by("balance").agg(
        pl.col("ts_uptime_us").min(),
        pl.col("orig_cpu").first(),
        pl.col("dest_cpu").first(),
        pl.col("orig_nr_running").max(),
        pl.col("dest_nr_running").min(),
        pl.col("orig_load_avg").first(),
        pl.col("dest_load_avg").first(),
        pl.col("rq_valid").all(),
    )
    pos = b.select(
        "balance", "ts_uptime_us", pl.col("pid").cast(pl.Int64), "orig_cpu", "dest_cpu",
        "orig_nr_running", "dest_nr_running", "orig_load_avg", "dest_load_avg", "rq_valid",
        "obs_delta_ns", *extras, pl.lit(1, pl.Int8).alias("can_migrate"),
    )  # fmt: skip
    neg = stayed.join(context, on="balance").with_columns(pl.lit(0, pl.Int8).alias("can_migrate"))
    # a negative was not observed by the program: no delta of its own, no model
    rows = pl.concat([pos, neg], how="diagonal_relaxed")
    # delta: since the task last left a CPU (se.exec_start is stamped then)
    ran = (
        collection["quanta_runtime"]
        .select(pl.col("pid").cast(pl.Int64), pl.col("ts_uptime_us").alias("last_ran_us"))
        .sort("last_ran_us")
    )
    rows = rows.sort("ts_uptime_us").join_asof(
        ran,
        left_on="ts_uptime_us",
        right_on="last_ran_us",
        by="pid",
        strategy="backward",
        check_sortedness=False,  # both sides are sorted on time above
    )
    valid = pl.col("rq_valid")
    frame = rows.select(
        pl.lit(collection.collection_id, pl.String).alias("collection_id"),
        pl.lit("tracepoint", pl.String).alias("variant"),
        "ts_uptime_us",
        "pid",
        pl.col("orig_cpu").alias("src_cpu"),
        pl.col("dest_cpu").alias("dst_cpu"),
        pl.when(valid).then(pl.col("orig_nr_running") + 1).alias("src_len"),
        pl.when(valid).then(pl.col("dest_nr_running")).alias("dst_len"),
        pl.when(valid).then(pl.col("orig_load_avg")).alias("src_load"),
        pl.when(valid).then(pl.col("dest_load_avg")).alias("dst_load"),
        # every row's delta is measured one way (a negative has no kernel read):
        # a class told apart by how its delta was measured would teach a model that
        pl.coalesce(
            (pl.col("ts_uptime_us") - pl.col("last_ran_us")) * 1000,
            pl.lit(NEVER_RAN_NS),
        ).alias("delta_ns"),
        # what the lb_tp program read and gave its model at the pull
        pl.col("obs_delta_ns").alias("kernel_delta_ns"),
        (node("orig_cpu") == node("dest_cpu")).cast(pl.Int8).alias("same_node"),
        *(
            [
                pl.lit(0, pl.Int8).alias("prefer_src"),
                pl.lit(0, pl.Int8).alias("prefer_dst"),
                pl.lit(0, pl.Int64).alias("delta_faults"),
                pl.lit(0, pl.Int64).alias("total_faults"),
                # no task prefers a node: the kernel's counts are 0 (MLLB's columns)
                pl.lit(0, pl.Int64).alias("src_preferred_len"),
                pl.lit(0, pl.Int64).alias("src_numa_len"),
            ]
            if single_node  # NUMA balancing never runs on one node
            else []
        ),
        pl.lit(0, pl.Int8).alias("p_running"),
        pl.lit(0, pl.Int8).alias("active_lb"),
        "can_migrate",
        pl.col("balance").cast(pl.Int64),
        *extras,
    )
    return conform(frame).sort("ts_uptime_us")


def compare_with_kprobe(
    tp: pl.DataFrame, kp: pl.DataFrame, window_us: int = 20_000
) -> dict[str, object]:
    """How the tracepoint rows agree with the exact decisions of the same run.

    A tracepoint row matches the kprobe decisions about the same task and
    source CPU within ``window_us`` before it (the probe fires first). A
    positive agrees when such a decision answered 1; a negative when every
    matched decision answered 0. Unmatched negatives are tasks the balancer
    did not examine."""
    k = kp.select(
        pl.col("pid").cast(pl.Int64), pl.col("src_cpu").cast(pl.Int64),
        pl.col("dst_cpu").cast(pl.Int64).alias("k_dst"), pl.col("ts_uptime_us").alias("k_ts"),
        pl.col("can_migrate").alias("k_can"),
    )  # fmt: skip
    t = tp.select(
        pl.int_range(pl.len()).alias("row"), pl.col("pid").cast(pl.Int64),
        pl.col("src_cpu").cast(pl.Int64), pl.col("dst_cpu").cast(pl.Int64), "ts_uptime_us",
        "can_migrate",
    )  # fmt: skip
    joined = t.join(k, on=["pid", "src_cpu"]).filter(
        (pl.col("k_ts") <= pl.col("ts_uptime_us") + 10)
        & (pl.col("k_ts") >= pl.col("ts_uptime_us") - window_us)
    )
    same_dst_yes = (pl.col("k_can") == 1) & (pl.col("k_dst") == pl.col("dst_cpu"))
    per_row = joined.group_by("row").agg(
        pl.col("k_can").cast(pl.Int64).max().alias("any_yes"),
        same_dst_yes.any().alias("yes_same_dst"),
    )
    rows = t.join(per_row, on="row", how="left")
    pos = rows.filter(pl.col("can_migrate") == 1)
    neg = rows.filter(pl.col("can_migrate") == 0)
    pos_matched = pos.filter(pl.col("any_yes").is_not_null())
    neg_matched = neg.filter(pl.col("any_yes").is_not_null())
    pos_agree = int(pos.filter(pl.col("yes_same_dst").fill_null(False)).height)
    neg_agree = int(neg_matched.filter(pl.col("any_yes") == 0).height)
    return {
        "positives": pos.height,
        "positives_matched": pos_matched.height,
        "positives_agree": pos_agree,
        "negatives": neg.height,
        "negatives_examined": neg_matched.height,
        "negatives_agree": neg_agree,
        "label_agreement_examined": (
            (pos_agree + neg_agree) / (pos.height + neg_matched.height)
            if pos.height + neg_matched.height
            else None
        ),
        "kprobe_decisions": kp.height,
        "kprobe_migrations": int((kp["can_migrate"] == 1).sum()) if kp.height else 0,
    }
