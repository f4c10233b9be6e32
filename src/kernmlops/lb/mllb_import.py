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

Every value is read as text and checked before it is cast, the whole file
alike (no type guessed from its first rows): whole numbers, none empty in a
:data:`REQUIRED` column, the kernel's unsigned values not negative, yes/no
columns (the label ``can_migrate`` too) 0 or 1 (:data:`NON_NEGATIVE`,
:data:`FLAGS`). The first bad value is named with its column, its row and its
line in the file; blank lines are no decision, and are counted as lines; a line
whose fields are not the header's is refused, named.

MLLB's preprocessed files (``post_*.csv``: already the features) are
refused with a hint: the raw dump holds more, and features are computed
here the way the kernel side computes them.
"""

from __future__ import annotations

import errno
import io
from pathlib import Path
from typing import BinaryIO

import polars as pl

from kernmlops.errors import KernmlopsError
from kernmlops.host.pinned import fd_path, open_regular
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


class _Layout:
    """Where a dump's rows lie in its file: the header's line, and the blank lines
    after it (whitespace only: no decision, skipped), so that a row's line is the
    file's, whatever blank lines come before it. MLLB's dumps quote nothing: a line
    is a row."""

    def __init__(self, f: BinaryIO) -> None:
        self.header = 0
        self.blank: list[int] = []
        #: the first line whose fields are not the header's: (line, its fields, the
        #: header's); a CSV reader fills a short one with nulls, and may drop the rest
        #: of a long one
        self.ragged: tuple[int, int, int] | None = None
        width = 0
        f.seek(0)
        for n, line in enumerate(f, 1):
            if line.isspace():
                if self.header:
                    self.blank.append(n)
            elif not self.header:
                self.header, width = n, line.count(b",") + 1
            elif self.ragged is None and line.count(b",") + 1 != width:
                self.ragged = (n, line.count(b",") + 1, width)

    @property
    def plain(self) -> bool:
        """The header on line 1 and no blank line: the file is read as it is."""
        return self.header == 1 and not self.blank

    def line(self, row: int) -> int:
        """The line of data row ``row`` (0 = the first)."""
        n = self.header + 1 + row
        for b in self.blank:  # ascending: each blank line before it moves it one down
            if b > n:
                break
            n += 1
        return n


def _source(f: BinaryIO, layout: _Layout) -> Path | io.BytesIO:
    """What polars reads: the open file (by its descriptor's name: the file already
    opened, whatever is at its path now), or its lines without the blank ones (polars
    makes a blank line a row of nulls, and skips those before the header)."""
    if layout.plain:
        return fd_path(f.fileno())
    f.seek(0)
    return io.BytesIO(b"".join(line for line in f if not line.isspace()))


def read_mllb_csv(path: Path, collection_id: str | None = None) -> pl.DataFrame:
    """An MLLB raw dump as canonical decisions (``variant`` = mllb)."""
    path = Path(path)
    # opened once, a plain file only: a FIFO would hang the open (and it could not be
    # read twice, as the dump is), and every read goes through this descriptor: one put
    # at the name after the check is never read
    try:
        fd = open_regular(path)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise MllbFormatError(f"cannot read {path}: {err.strerror or err}") from None
        raise MllbFormatError(f"{path} is not a plain file: not an MLLB raw dump") from None
    with open(fd, "rb") as f:
        return _read_dump(path, f, collection_id)


def _read_dump(path: Path, f: BinaryIO, collection_id: str | None) -> pl.DataFrame:
    try:
        layout = _Layout(f)
        if not layout.header:
            raise MllbFormatError(f"{path} is empty: no header, no decisions")
        if layout.ragged:
            n, fields, width = layout.ragged
            raise MllbFormatError(f"{path}: line {n} has {fields} fields, the header {width}")
        source = _source(f, layout)
        # the header alone first: the columns kept are read, as what they must be
        raw = pl.read_csv(source, n_rows=0, infer_schema=False)
    except OSError as err:
        raise MllbFormatError(f"cannot read {path}: {err.strerror or err}") from None
    except pl.exceptions.PolarsError as err:
        raise _unreadable(path, err) from None
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
    keep = [c for c in (*REQUIRED, *OPTIONAL) if c in cols]
    frame = _checked(_read(path, source, layout, keep), path, layout).rename(
        {k: v for k, v in RENAME.items() if k in keep}
    )
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


def _read(path: Path, source: Path | io.BytesIO, layout: _Layout, keep: list[str]) -> pl.DataFrame:
    """The ``keep`` columns of the dump: as Int64 (what a dump holds), or, where a value
    of theirs is not an integer, all as text, for :func:`_checked` to name it: never a
    type guessed from the first rows, which makes a bad value further down polars' own
    error.

    Raises:
        MllbFormatError: the file cannot be read as CSV (a line with more fields than
            the header is named), or holds no row.
    """

    def read(dtype: type[pl.DataType]) -> pl.DataFrame:
        if isinstance(source, io.BytesIO):
            source.seek(0)
        return pl.read_csv(source, columns=keep, schema_overrides=dict.fromkeys(keep, dtype))

    try:
        try:
            frame = read(pl.Int64)
        except pl.exceptions.PolarsError:
            frame = read(pl.String)
    except OSError as err:
        raise MllbFormatError(f"cannot read {path}: {err.strerror or err}") from None
    except pl.exceptions.PolarsError as err:
        raise _unreadable(path, err) from None
    if frame.height == 0:
        raise MllbFormatError(f"{path} has a header but no decisions")
    return frame


def _unreadable(path: Path, err: Exception) -> MllbFormatError:
    """A file polars cannot read as CSV (not UTF-8, a quote left open), in one line: the
    first line of polars' reason."""
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return MllbFormatError(f"cannot read {path} as CSV: {reason}")


def _checks(col: str, text: bool) -> list[tuple[pl.Expr, str]]:
    """(an expression true where the column's value is right, what a wrong one is),
    in the order they are said; ``text``: over the column as text (empty: null), else
    over its integers."""
    checks = [(pl.col(col).is_not_null() | (col not in REQUIRED), "empty (a required column)")]
    value = pl.col(col)
    if text:
        ints = pl.col(col).cast(pl.Int64, strict=False)
        floats = pl.col(col).cast(pl.Float64, strict=False)
        as_int = ints.is_not_null() | floats.is_null()  # parsed whole, or no number at all
        checks += [
            (floats.is_not_null() | ints.is_not_null() | pl.col(col).is_null(), "not a number"),
            (as_int | (floats.is_finite() & (floats == floats.floor())), "not a whole number"),
            (as_int | (floats.abs() < 2.0**63), "out of range"),
        ]
        value = _value(col)
    if col in FLAGS:
        checks.append(((value == 0) | (value == 1), "not 0 or 1"))
    elif col in NON_NEGATIVE:
        checks.append((value >= 0, "negative (the kernel's value is unsigned)"))
    return [(ok.fill_null(True), what) for ok, what in checks]


def _value(col: str) -> pl.Expr:
    """The column's text as a whole number: as an integer, or (1.0, 1e3) a whole float."""
    text = pl.col(col)
    return pl.coalesce(
        text.cast(pl.Int64, strict=False),
        text.cast(pl.Float64, strict=False).cast(pl.Int64, strict=False),
    )


def _checked(frame: pl.DataFrame, path: Path, layout: _Layout) -> pl.DataFrame:
    """``frame`` (the kept columns, as Int64, or as text where a value is not an
    integer) as whole numbers (Int64), each checked first; MllbFormatError naming the
    column and the first row (and its line in the file) whose value is empty in a
    required column, is not a whole number, is negative where the kernel's value is
    unsigned, or is not 0/1 in a yes/no column: the cast to the canonical integers
    would truncate 1.5 to 1, a label of 2 or -1 is no decision, and an empty feature
    is none either. An optional column may be empty (null)."""
    text = frame.schema.dtypes()[0] == pl.String if frame.width else False
    if text:
        cell = pl.all().str.strip_chars()
        frame = frame.select(pl.when(cell.str.len_bytes() > 0).then(cell))  # "", "  ": null
    checks = {col: _checks(col, text) for col in frame.columns}
    # one pass over every column's checks; the first wrong value looked for after
    right = frame.select(
        pl.all_horizontal(ok for ok, _ in each).all().alias(col) for col, each in checks.items()
    ).row(0, named=True)
    for col, each in checks.items():
        if right[col]:
            continue
        for ok, what in each:
            bad = frame.select(ok.not_().arg_true().first()).item()
            if bad is not None:
                shown = frame[col][bad]
                said = what if shown is None else f"{shown} is {what}"
                raise MllbFormatError(
                    f"{path}: column {col}, row {bad + 1} (line {layout.line(bad)}): {said}"
                )
    return frame.select(_value(col).alias(col) for col in frame.columns) if text else frame
