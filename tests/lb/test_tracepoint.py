"""The tracepoint variant rebuilt from hand-made scheduler tables: which
migrations are pulls, who was left waiting, and the comparison with kprobe."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from kernmlops.data import Collection
from kernmlops.errors import CollectionError
from kernmlops.lb.dataset import impute_missing
from kernmlops.lb.features import float_features
from kernmlops.lb.names import FEATURES
from kernmlops.lb.tracepoint import NEVER_RAN_NS, compare_with_kprobe, tracepoint_decisions


def _migrate(rows: list[tuple]) -> pl.DataFrame:
    cols = ("ts_uptime_us", "pid", "orig_cpu", "dest_cpu", "cpu", "kind", "orig_nr_running",
            "dest_nr_running", "orig_load_avg", "dest_load_avg", "rq_valid")  # fmt: skip
    return pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


def _waits(rows: list[tuple]) -> pl.DataFrame:
    """(pid, cpu, waited from, ran at)"""
    return pl.DataFrame(
        {
            "ts_uptime_us": [r[3] for r in rows],
            "quanta_queued_time_us": [r[3] - r[2] for r in rows],
            "cpu": [r[1] for r in rows],
            "pid": [r[0] for r in rows],
        }
    )


@pytest.fixture
def collection() -> Collection:
    # CPU 1 pulls A (1) and B (2) from CPU 0 at 1000/1005 (one balance) and H
    # (8) at 5000. Waiting on CPU 0 at 1000: C (3), G (7) -> negatives; D (4)
    # came later, E (5) ran before, F (6) waited on CPU 2. I (9) waits on CPU 0
    # at 5000. A wake-up placement and a move decided on the source CPU
    # (affinity/NUMA, the stopper) are not pulls.
    migrate = _migrate(
        [
            (1000, 1, 0, 1, 1, "queued", 3, 0, 2048, 0, True),
            (1005, 2, 0, 1, 1, "queued", 2, 1, 1024, 1024, True),
            (1100, 4, 2, 3, 3, "wakeup", 1, 0, 0, 0, True),
            (1200, 3, 0, 2, 0, "queued", 3, 0, 0, 0, True),
            (5000, 8, 0, 1, 1, "queued", 1, 0, 1000, 0, True),
        ]
    )
    waits = _waits(
        [
            (1, 0, 950, 1020), (2, 0, 960, 1030), (3, 0, 900, 1500), (4, 0, 1010, 1200),
            (5, 0, 800, 999), (6, 2, 900, 1300), (7, 0, 900, 2000), (9, 0, 4000, 6000),
        ]
    )  # fmt: skip
    ran = pl.DataFrame(
        {
            "ts_uptime_us": [500, 800, 4000, 4500],
            "quanta_run_length_us": [10, 10, 10, 10],
            "cpu": [0, 0, 0, 0],
            "pid": [1, 3, 8, 7],
        }
    )
    return Collection(
        path=Path("/nonexistent/collection_id=tp"),
        manifest={"collection_id": "tp"},
        tables={"sched_migrate": migrate, "quanta_queued_time": waits, "quanta_runtime": ran},
    )


def test_positives_and_negatives(collection: Collection) -> None:
    d = tracepoint_decisions(collection, cpu_node=[0, 0, 1, 1])
    got = {(r["pid"], r["ts_uptime_us"], r["can_migrate"]) for r in d.iter_rows(named=True)}
    assert got == {(1, 1000, 1), (2, 1005, 1), (8, 5000, 1), (3, 1000, 0), (7, 1000, 0),
                   (9, 5000, 0)}  # fmt: skip
    assert set(d["variant"]) == {"tracepoint"} and set(d["collection_id"]) == {"tp"}
    by_pid = {r["pid"]: r for r in d.iter_rows(named=True)}
    # the source gets the pulled task back; a balance's negatives see its longest queue
    assert by_pid[1]["src_len"] == 4 and by_pid[2]["src_len"] == 3 and by_pid[3]["src_len"] == 4
    assert by_pid[1]["dst_len"] == 0 and by_pid[3]["dst_len"] == 0
    assert by_pid[1]["src_load"] == 2048
    # delta: since the task last left a CPU (ns); never seen -> long ago
    assert by_pid[1]["delta_ns"] == 500_000
    assert by_pid[3]["delta_ns"] == 200_000
    assert by_pid[9]["delta_ns"] == NEVER_RAN_NS
    assert by_pid[7]["delta_ns"] == NEVER_RAN_NS  # it ran at 4500, after 1000
    # two nodes: CPUs 0 and 1 share node 0; what the tracepoint cannot know is null
    assert by_pid[1]["same_node"] == 1
    assert by_pid[1]["cpu_idle"] is None and by_pid[1]["nr_balance_failed"] is None
    assert by_pid[1]["prefer_src"] is None  # NUMA balancing may run on two nodes
    assert by_pid[1]["p_running"] == 0


def test_single_node_knows_there_is_no_numa_data(collection: Collection) -> None:
    d = tracepoint_decisions(collection, cpu_node=[0, 0, 0, 0])
    assert set(d["prefer_src"]) == {0} and set(d["total_faults"]) == {0}
    # no task prefers a node: the kernel's rq->nr_preferred_running and
    # nr_numa_running are 0 (MLLB's src_preferred_len, src_numa_len)
    assert set(d["src_preferred_len"]) == {0} and set(d["src_numa_len"]) == {0}


def test_imputed_src_non_pref_nr_is_the_kernels(collection: Collection) -> None:
    """MLLB's feature 0 is src_len > src_preferred_len, the latter the source's
    nr_preferred_running: 0 without NUMA data, so the feature is 1 for every row
    (the kernel's value, which the tracepoint shadow program computes too)."""
    for nodes in ([0, 0, 0, 0], [0, 0, 1, 1]):
        rows = impute_missing(tracepoint_decisions(collection, cpu_node=nodes))
        assert set(rows["src_preferred_len"]) == {0}
        x = float_features(rows)
        assert (x[:, FEATURES.index("src_non_pref_nr")] == 1).all()


def test_compare_with_kprobe(collection: Collection) -> None:
    tp = tracepoint_decisions(collection, cpu_node=[0, 0, 1, 1])
    kp = pl.DataFrame(
        {
            "pid": [1, 2, 3, 9],
            "src_cpu": [0, 0, 0, 0],
            "dst_cpu": [1, 1, 1, 1],
            "ts_uptime_us": [998, 1003, 999, 4999],
            "can_migrate": [1, 1, 0, 1],
        }
    )
    c = compare_with_kprobe(tp, kp)
    assert c["positives"] == 3 and c["positives_agree"] == 2  # H was not seen
    assert c["negatives"] == 3 and c["negatives_examined"] == 2  # G was not examined
    assert c["negatives_agree"] == 1  # C; I was a "yes" the balancer then skipped
    assert c["label_agreement_examined"] == pytest.approx(3 / 5)


def test_needs_the_scheduler_tables(collection: Collection) -> None:
    partial = Collection(collection.path, collection.manifest,
                         {"sched_migrate": collection["sched_migrate"]})  # fmt: skip
    with pytest.raises(CollectionError, match="quanta_runtime"):
        tracepoint_decisions(partial)


def _shadow(rows: list[tuple]) -> pl.DataFrame:
    """lb_tp records: (ts, pid, nr_migrations, src, dst, src_len, dst_len, src_load,
    dst_load, delta_ns, rq_valid, model_out)"""
    cols = ("ts_uptime_us", "pid", "nr_migrations", "src_cpu", "dst_cpu", "src_len", "dst_len",
            "src_load", "dst_load", "delta_ns", "rq_valid", "model_out")  # fmt: skip
    frame = pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])
    return frame.with_columns(
        (pl.col("model_out") > 0).cast(pl.Int8).alias("model_pred"),
        pl.lit(300).alias("infer_ns"),
    )


def test_a_pull_is_the_lb_tp_programs_observation(collection: Collection) -> None:
    """Where the lb_tp program recorded a pull, the data set's row holds what it read
    and gave its model (one read of the unlocked destination queue, not two), matched
    by the task and its migration count; elsewhere sched_migrate's read."""
    migrate = collection["sched_migrate"].with_columns(pl.Series("nr_migrations", [5, 9, 0, 3, 2]))
    shadow = _shadow(
        [
            # A (pid 1): a wake-up landed on CPU 1 between the two programs' reads
            (1000, 1, 5, 0, 1, 4, 1, 2050, 700, 123_000, 1, 77),
            # B (pid 2): same task and CPUs, another migration count: not this event
            (1006, 2, 8, 0, 1, 9, 9, 9, 9, 1, 1, -5),
            # H (pid 8): its queues unreadable: no lengths, the quanta delta
            (5001, 8, 2, 0, 1, 1, 0, 0, 0, 0, 0, 12),
            # a pid reused long after, with the same count: not this event either
            (9000, 1, 5, 0, 1, 3, 3, 3, 3, 3, 1, 1),
        ]
    )
    tables = {**collection.tables, "sched_migrate": migrate, "lb_tp_shadow": shadow}
    d = tracepoint_decisions(Collection(collection.path, collection.manifest, tables), [0] * 4)
    by_pid = {r["pid"]: r for r in d.iter_rows(named=True)}
    a, b, h = by_pid[1], by_pid[2], by_pid[8]
    assert (a["src_len"], a["dst_len"], a["src_load"], a["dst_load"]) == (4, 1, 2050, 700)
    # the delta every row has (since A last ran, as for the negatives), and the
    # kernel's own read the program gave its model beside it
    assert (a["delta_ns"], a["kernel_delta_ns"]) == (500_000, 123_000)
    assert (a["model_out"], a["model_pred"], a["infer_ns"], a["nr_migrations"]) == (77, 1, 300, 5)
    # B: sched_migrate's read, the quanta delta, no model answer of its own
    assert (b["src_len"], b["dst_len"], b["src_load"], b["dst_load"]) == (3, 1, 1024, 1024)
    assert b["delta_ns"] == NEVER_RAN_NS and b["model_out"] is None and b["model_pred"] is None
    assert b["nr_migrations"] == 9 and b["kernel_delta_ns"] is None
    # H: the program evaluated it (on its fill values), the data set cannot know the queues
    assert h["src_len"] is None and h["dst_len"] is None and h["model_out"] == 12
    assert h["delta_ns"] == 1_000_000  # 5000 - 4000 µs
    # the balance's negatives see its pulls' observed queues: A's destination held 1
    negatives = d.filter(pl.col("can_migrate") == 0, pl.col("ts_uptime_us") == 1000)
    assert set(negatives["pid"]) == {3, 7}
    assert set(negatives["dst_len"]) == {1} and set(negatives["src_len"]) == {4}
    assert negatives["model_out"].is_null().all() and negatives["nr_migrations"].is_null().all()
    assert negatives["kernel_delta_ns"].is_null().all()


def test_tables_without_the_key_keep_sched_migrates_read(collection: Collection) -> None:
    """A collection recorded before nr_migrations: the pulls are sched_migrate's, as
    they were (a time-only match could pair two moves of one task)."""
    shadow = _shadow([(1000, 1, 5, 0, 1, 4, 1, 2050, 700, 123_000, 1, 77)])
    tables = {**collection.tables, "lb_tp_shadow": shadow}
    d = tracepoint_decisions(Collection(collection.path, collection.manifest, tables), [0] * 4)
    a = d.filter(pl.col("pid") == 1, pl.col("can_migrate") == 1).row(0, named=True)
    assert (a["dst_len"], a["delta_ns"]) == (0, 500_000)
    assert "model_out" not in d.columns
