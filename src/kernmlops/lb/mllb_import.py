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

Values are checked before they are cast: whole numbers, the kernel's unsigned
values not negative, yes/no columns (the label ``can_migrate`` too) 0 or 1
(:data:`NON_NEGATIVE`, :data:`FLAGS`).

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

#: the kernel's unsigned values (runqueue lengths, loads, counts, CPUs, pids, time):
#: never negative. MLLB's signed ones are delta (rq_clock_task(src) - exec_start,
#: s64), delta_faults (dst - src, s64) and imbalance (long): any whole number.
NON_NEGATIVE = (
    "ts", "pid", "src_cpu", "dst_cpu", "src_len", "src_numa_len", "src_preferred_len",
    "dst_len", "src_load", "dst_load", "total_faults", "nr_fails", "cache_nice_tries",
)  # fmt: skip
#: yes/no columns, the label can_migrate among them: 0 or 1
FLAGS = (
    "cpu_idle", "cpu_not_idle", "cpu_newly_idle", "same_node", "prefer_src", "prefer_dst",
    "buddy_hot", "throttled", "p_running", "test_aggressive", "can_migrate",
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
    _check_values(raw.select(keep), path)
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


def _check_values(raw: pl.DataFrame, path: Path) -> None:
    """MllbFormatError naming the column and the first row (and its line in the file)
    whose value is not a whole number, is negative where the kernel's value is unsigned,
    or is not 0/1 in a yes/no column: the cast to the canonical integers would truncate
    1.5 to 1, and a label of 2 or -1 is no decision. Empty fields (null) pass."""
    for col in raw.columns:
        shown = raw[col]
        values = shown if shown.dtype.is_numeric() else shown.cast(pl.Float64, strict=False)
        checks = [(values.is_not_null() | shown.is_null(), "not a number")]
        if values.dtype.is_float():
            whole = values.is_finite() & (values == values.floor())
            checks += [(whole, "not a whole number"), (values.abs() < 2.0**63, "out of range")]
        if col in FLAGS:
            checks.append(((values == 0) | (values == 1), "not 0 or 1"))
        elif col in NON_NEGATIVE:
            checks.append((values >= 0, "negative (the kernel's value is unsigned)"))
        for ok, what in checks:
            bad = (~ok).fill_null(False).arg_true()
            if len(bad):
                row = int(bad[0])
                raise MllbFormatError(
                    f"{path}: column {col}, row {row + 1} (line {row + 2}): {shown[row]} is {what}"
                )
