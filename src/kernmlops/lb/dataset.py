"""The load-balancing data set: decisions from collections, MLLB dumps and rules.

Every source ends as rows of the canonical decision columns
(:data:`kernmlops.lb.features.DECISION_SCHEMA`) in a table named
``lb_decisions`` inside a collection folder, so a data set is any set of
collections and ``read_parquet_dir`` reads a whole folder of them.

Sources:

* ``kprobe`` - exact: what ``can_migrate_task`` saw and returned, read by
  the ``lb_kprobe`` BPF object (fexit, or kprobe + kretprobe);
* ``tracepoint`` - approximate, for kernels without kprobes
  (:mod:`kernmlops.lb.tracepoint`);
* ``mllb`` - a dump in the MLLB study's CSV format
  (:mod:`kernmlops.lb.mllb_import`);
* ``synthetic`` - rows drawn at random and labelled by the kernel's rule
  (:func:`synthetic_decisions`), for tests and sanity checks.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import polars as pl

from kernmlops.errors import CollectionError, KernmlopsWarning
from kernmlops.lb.features import (
    DECISION_SCHEMA,
    LABEL,
    MIGRATION_COST_NS,
    conform,
    float_features,
    rule_decision,
)

TABLE = "lb_decisions"

#: Columns of the lb_kprobe record kept beside the canonical ones.
KPROBE_EXTRA = (
    "tgid", "comm", "src_nid", "dst_nid", "numa_preferred_nid", "numa_faults",
    "src_faults", "dst_faults", "sd_flags", "lb_flags", "affine_ok", "pcpu_kthread",
    "numa_faults_on", "model_pred", "model_out", "infer_ns",
)  # fmt: skip


def from_kprobe_records(frame: pl.DataFrame, collection_id: str = "") -> pl.DataFrame:
    """lb_kprobe ring records (as polars) -> canonical decisions plus extras."""
    if frame.height == 0:
        return conform(pl.DataFrame()).clear()
    derived = frame.with_columns(
        pl.lit(collection_id, pl.String).alias("collection_id"),
        pl.lit("kprobe", pl.String).alias("variant"),
        (pl.col("src_nid") == pl.col("dst_nid")).cast(pl.Int8).alias("same_node"),
        (pl.col("numa_preferred_nid") == pl.col("src_nid")).cast(pl.Int8).alias("prefer_src"),
        (pl.col("numa_preferred_nid") == pl.col("dst_nid")).cast(pl.Int8).alias("prefer_dst"),
        (pl.col("dst_faults").cast(pl.Int64) - pl.col("src_faults").cast(pl.Int64)).alias(
            "delta_faults"
        ),
    )
    out = conform(derived)
    keep = [c for c in KPROBE_EXTRA if c in derived.columns]
    return out.select(*DECISION_SCHEMA, *keep)


def load_decisions(paths: list[Path] | list[str]) -> pl.DataFrame:
    """Every ``lb_decisions`` row under the given collection folders or roots
    (a root holds ``curated/`` or ``benchmark=*/collection_id=*/`` folders)."""
    frames = []
    for p in map(Path, paths):
        if not p.exists():
            raise CollectionError(f"{p}: no such folder")
        root = p / "curated" if (p / "curated").is_dir() else p
        if (root / TABLE).is_dir():  # one collection folder
            from kernmlops.data import read_collection

            # that table alone, each part opened once (a FIFO at its name refused, not
            # waited on); as root no link a user planted followed
            frame = read_collection(root, lazy=True).read(TABLE)
        else:
            from kernmlops.data import read_parquet_dir

            frame = read_parquet_dir(root, TABLE)
            frame = frame.drop("benchmark") if "benchmark" in frame.columns else frame
        frames.append(conform(frame))
    if not frames:
        raise CollectionError("no data given: name collection folders or roots")
    out = pl.concat(frames, how="diagonal_relaxed")
    if out.height == 0:
        raise CollectionError(f"no load-balancing decisions in {', '.join(map(str, paths))}")
    return out


def _unread(manifest: Path, why: str) -> None:
    """Say (one warning line) a manifest ``recorded_cost`` leaves out: the cost it may
    hold is not weighed, and the default may be used where it was the only one."""
    warnings.warn(f"{manifest}: not read ({why}): its recorded migration cost is left out",
                  KernmlopsWarning, stacklevel=3)  # fmt: skip


def recorded_costs(paths: list[Path] | list[str]) -> dict[str, int]:
    """collection id -> the migration cost its manifest's lb section records, for the
    collections under ``paths`` that record one; each manifest not read is named in
    one warning line."""
    from kernmlops.collect.manifest import MANIFEST_NAME
    from kernmlops.spool.collection import read_manifest_bytes

    costs: dict[str, int] = {}
    for p in map(Path, paths):
        for m in [p / MANIFEST_NAME, *p.glob(f"**/collection_id=*/{MANIFEST_NAME}")]:
            if m.is_file():
                try:  # read once, as every manifest is: a plain file, bounded, no link
                    raw = read_manifest_bytes(m.parent, owner=os.stat(m.parent).st_uid)
                    doc = json.loads(raw)
                    lb = doc.get("lb") or {}
                except OSError as err:
                    _unread(m, err.strerror or str(err))
                    continue
                except (ValueError, AttributeError, RecursionError):  # not JSON, not an object
                    _unread(m, "not a JSON object")
                    continue
                if isinstance(lb, dict) and isinstance(lb.get("migration_cost_ns"), int):
                    cid = doc.get("collection_id")
                    name = cid if isinstance(cid, str) else m.parent.name
                    costs[name.removeprefix("collection_id=")] = lb["migration_cost_ns"]
    return costs


def recorded_cost(paths: list[Path] | list[str]) -> int | None:
    """The migration cost the collections under ``paths`` were recorded with
    (their manifests' lb section), when they agree on one; None when none says."""
    costs = set(recorded_costs(paths).values())
    if len(costs) > 1:
        raise CollectionError(
            f"the collections were recorded with different migration costs "
            f"({', '.join(f'{c:,}' for c in sorted(costs))} ns): train on one set, or "
            "pass --migration-cost-ns"
        )
    return costs.pop() if costs else None


def check_id(collection_id: str) -> None:
    """CollectionError unless ``collection_id`` is one name: the manifest's rule, checked
    before the id becomes a folder ('../x' would write outside the layout and leave the
    part behind when the manifest refuses it)."""
    from kernmlops.collect.manifest import check_collection_id

    try:
        check_collection_id(collection_id)
    except ValueError as err:
        raise CollectionError(f"bad collection id {collection_id!r}: {err}") from None


def write_decisions(
    frame: pl.DataFrame, out_root: Path, collection_id: str, benchmark: str, manifest: dict
) -> Path:
    """Write decisions as a collection of their own (``lb_decisions`` table and
    a manifest) under ``out_root/curated/benchmark=<b>/collection_id=<id>/``.
    CollectionError, nothing written, when ``collection_id`` is not one name."""
    from kernmlops.collect.manifest import write_manifest
    from kernmlops.collect.parquet import ParquetSink

    check_id(collection_id)
    path = Path(out_root) / "curated" / f"benchmark={benchmark}" / f"collection_id={collection_id}"
    sink = ParquetSink(path, collection_id)
    sink.write(TABLE, frame.drop("collection_id"))
    rows = sink.close()
    write_manifest(
        path,
        {
            "collection_id": collection_id,
            "benchmark": {"name": benchmark},
            **manifest,
            "tables": {
                t: {"rows": n, "files": sink.files_written().get(t, [])} for t, n in rows.items()
            },
        },
    )
    return path


def impute_missing(frame: pl.DataFrame) -> pl.DataFrame:
    """Fill what an approximate source could not know, the way the
    tracepoint shadow program does in the kernel: the idle type from the
    destination's length (an empty destination pulled: newly idle), no
    extra balance failures, no buddy, no NUMA data.

    No NUMA data means no task with a preferred node: the source's
    ``nr_preferred_running`` and ``nr_numa_running`` are 0, as the kernel
    keeps them on one node (NUMA balancing never runs there) and as MLLB's
    dump reads them, so ``src_non_pref_nr`` (src_len > src_preferred_len)
    is 1, not 0."""
    empty_dst = pl.col("dst_len").fill_null(1) == 0
    return frame.with_columns(
        pl.col("cpu_newly_idle").fill_null(empty_dst.cast(pl.Int8)),
        pl.col("cpu_not_idle").fill_null((~empty_dst).cast(pl.Int8)),
        pl.col("cpu_idle").fill_null(0),
        pl.col("nr_balance_failed").fill_null(0),
        pl.col("cache_nice_tries").fill_null(1),
        pl.col("buddy_hot").fill_null(0),
        pl.col("same_node").fill_null(1),
        pl.col("prefer_src").fill_null(0),
        pl.col("prefer_dst").fill_null(0),
        pl.col("delta_faults").fill_null(0),
        pl.col("total_faults").fill_null(0),
        pl.col("src_preferred_len").fill_null(0),
        pl.col("src_numa_len").fill_null(0),
    )


def synthetic_decisions(
    n: int,
    collection_id: str = "synthetic",
    seed: int = 0,
    migration_cost_ns: int = MIGRATION_COST_NS,
) -> pl.DataFrame:
    """``n`` decisions drawn over plausible ranges and labelled by the
    kernel's rule (:func:`kernmlops.lb.features.rule_decision`)."""
    rng = np.random.default_rng(seed)
    src_len = rng.integers(1, 12, n)
    src_pref = rng.integers(0, src_len + 1)
    idle = rng.integers(0, 3, n)
    same = rng.random(n) < 0.5
    # preferred node: none, src's, dst's, or a third node
    pref = rng.choice(4, n, p=[0.4, 0.25, 0.25, 0.1])
    prefer_src = np.where(same, pref == 1, pref == 1)
    prefer_dst = np.where(same, pref == 1, pref == 2)
    total = np.where(rng.random(n) < 0.5, 0, rng.integers(1, 5000, n))
    delta = np.where(total > 0, (rng.random(n) * 2 - 1) * total, 0).astype(np.int64)
    # delta_ns log-uniform from 1 µs to 100 ms, so hot and cold both appear
    delta_ns = (10 ** rng.uniform(3, 8, n)).astype(np.int64)
    frame = pl.DataFrame(
        {
            "collection_id": [collection_id] * n,
            "variant": ["synthetic"] * n,
            "ts_uptime_us": np.arange(n, dtype=np.int64) * 1000,
            "pid": rng.integers(100, 5000, n),
            "src_cpu": rng.integers(0, 8, n),
            "dst_cpu": rng.integers(0, 8, n),
            "imbalance": rng.integers(0, 4000, n),
            "cpu_idle": (idle == 0).astype(np.int8),
            "cpu_not_idle": (idle == 1).astype(np.int8),
            "cpu_newly_idle": (idle == 2).astype(np.int8),
            "src_len": src_len,
            "src_numa_len": rng.integers(0, src_len + 1),
            "src_preferred_len": src_pref,
            "delta_ns": delta_ns,
            "same_node": same.astype(np.int8),
            "prefer_src": prefer_src.astype(np.int8),
            "prefer_dst": prefer_dst.astype(np.int8),
            "delta_faults": delta,
            "total_faults": total,
            "dst_len": rng.integers(0, 8, n),
            "src_load": rng.integers(0, 6000, n),
            "dst_load": rng.integers(0, 6000, n),
            "nr_balance_failed": rng.choice(6, n, p=[0.6, 0.15, 0.1, 0.06, 0.05, 0.04]),
            "cache_nice_tries": rng.choice([0, 1, 2], n, p=[0.2, 0.6, 0.2]),
            "buddy_hot": (rng.random(n) < 0.1).astype(np.int8),
            "throttled": np.zeros(n, dtype=np.int8),
            "p_running": np.zeros(n, dtype=np.int8),
            "test_aggressive": np.ones(n, dtype=np.int8),
            "active_lb": np.zeros(n, dtype=np.int8),
        }
    )
    frame = conform(frame)
    label = rule_decision(float_features(frame, migration_cost_ns))
    return frame.with_columns(pl.Series(LABEL, label, pl.Int8))
