"""Read decisions dumped in the MLLB study's format (its ``dump_lb.py``).

The raw dump (``raw_<tag>.csv``) has one row per ``can_migrate_task`` call
with a header naming its columns; versions of the dumper differ a little
(``curr_pid``, ``test_aggressive`` and the perf counters ``pc_0``/``pc_1``
come and go), so columns are found by name:

=================  ====================================  =================
MLLB column        meaning                               canonical column
=================  ====================================  =================
ts                 bpf_ktime_get_ns() (ns)               ts_uptime_us (/1000)
pid, src_cpu, ...  as named                              same name
delta              rq_clock_task(src) - exec_start       delta_ns
nr_fails           sd->nr_balance_failed                 nr_balance_failed
test_aggressive    hard constraints passed               test_aggressive
delta_faults       dst node faults - src node faults     delta_faults
=================  ====================================  =================

MLLB's preprocessed files (``post_*.csv``: already the features) are
refused with a hint: the raw dump holds more, and features are computed
here the way the kernel side computes them.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from kernmlops.errors import KernmlopsError
from kernmlops.lb.features import FEATURES, conform

#: MLLB name -> canonical name, where they differ
RENAME = {"delta": "delta_ns", "nr_fails": "nr_balance_failed"}
REQUIRED = (
    "src_len", "src_preferred_len", "delta", "cpu_idle", "cpu_not_idle", "cpu_newly_idle",
    "same_node", "prefer_src", "prefer_dst", "delta_faults", "total_faults", "dst_len",
    "src_load", "dst_load", "nr_fails", "cache_nice_tries", "buddy_hot", "can_migrate",
)  # fmt: skip
OPTIONAL = (
    "ts", "pid", "src_cpu", "dst_cpu", "imbalance", "src_numa_len", "throttled", "p_running",
    "test_aggressive",
)  # fmt: skip


class MllbFormatError(KernmlopsError):
    """The file is not an MLLB raw dump."""


def read_mllb_csv(path: Path, collection_id: str | None = None) -> pl.DataFrame:
    """An MLLB raw dump as canonical decisions (``variant`` = mllb)."""
    path = Path(path)
    try:
        raw = pl.read_csv(path, infer_schema_length=10000)
    except (OSError, pl.exceptions.PolarsError) as err:
        raise MllbFormatError(f"cannot read {path} as CSV: {err}") from err
    cols = set(raw.columns)
    if "delta" not in cols and set(FEATURES) <= cols:
        raise MllbFormatError(
            f"{path} holds MLLB's preprocessed features (a post_*.csv), not the raw dump: "
            "import the raw_*.csv it was made from"
        )
    missing = [c for c in REQUIRED if c not in cols]
    if missing:
        raise MllbFormatError(
            f"{path} is not an MLLB raw dump: no column {', '.join(missing)} "
            f"(has {', '.join(raw.columns)})"
        )
    if raw.height == 0:
        raise MllbFormatError(f"{path} has a header but no decisions")
    bad = [c for c in REQUIRED if raw[c].dtype not in (pl.Int64, pl.Int32, pl.Float64)]
    if bad:
        raise MllbFormatError(f"{path}: columns {', '.join(bad)} are not numbers")
    keep = [c for c in (*REQUIRED, *OPTIONAL) if c in cols]
    frame = raw.select(keep).rename({k: v for k, v in RENAME.items() if k in keep})
    if "ts" in frame.columns:
        frame = frame.with_columns((pl.col("ts") // 1000).alias("ts_uptime_us")).drop("ts")
    cid = collection_id or f"mllb-{path.stem}"
    frame = frame.with_columns(
        pl.lit(cid, pl.String).alias("collection_id"), pl.lit("mllb", pl.String).alias("variant")
    )
    try:
        return conform(frame)
    except pl.exceptions.PolarsError as err:
        raise MllbFormatError(f"{path}: a column does not hold whole numbers: {err}") from err
