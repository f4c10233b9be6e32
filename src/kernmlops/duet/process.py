"""``duet process``: every suite's result files into one table.

One row per iteration, columns (``RESULT_COLUMNS``, then ``artifact_<name>``
for each artifact of the suite's run: one line of it, e.g. lscpu's model and
CPU count, meminfo's MemTotal; the whole text stays in ``artifacts/``):

    suite, benchmark, runid, kind (duet | sequential | syncduet), order (AB | BA,
    null for sequential), pair (A | B), aa (B is A), iteration, epoch_start_ms,
    iteration_start_ns, iteration_end_ns, iteration_time_ns, timing,
    side_status, parser, source_file

A folder is a ``duet run`` suite folder (with ``duet-run.json``), a folder
holding such folders, or a folder of result files named as the original
asynchronous-duet tool names them (``<suite>.<benchmark>.<runid>.<type>.
<order>.<pair>.<file>``, type seqn | duet | syncduet), with its
``artifacts/`` (``date`` anchors older DaCapo/ScalaBench files, as the original
anchors them). Which duets are A/A cannot be told from such names: say so with
``aa`` (benchmark names) or give the config (a duet without B is A/A). A file
no parser reads is reported with the reason; the others are still processed.

``read_results`` also reads the CSV or JSON that the original's ``process.py``
writes (column ``type`` instead of ``kind``), and ``write_processed`` can write
the table in that form (``original=True``) for the original's analysis.

A folder may come from someone else, and ``duet process`` often runs as root:
every path a folder names (in ``duet-run.json``, or as a link) is read only
when it stays inside the folder (kernmlops.confined), a result file only up
to ``max_bytes`` (``--max-file-mb``), an artifact up to ``ARTIFACT_MAX_BYTES``;
anything else is named in the errors and left unread.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.confined import MIB, UnsafePathError, confined, read_confined
from kernmlops.duet.parsers import (
    ITERATION_SCHEMA,
    MAX_FILE_BYTES,
    Anchor,
    ParseError,
    parse_file,
    read_open,
)
from kernmlops.duet.runner import FILE_KIND, INDEX, DuetError, none_left, read_index
from kernmlops.host.pinned import open_regular

RESULTS_NAME = "duet-results"
KERNEL_NAME = "duet-kernel"
#: what names one trial: its suite, benchmark, run and the duet's shape
TRIAL_SCHEMA: dict[str, pl.DataType] = {
    "suite": pl.String(),
    "benchmark": pl.String(),
    "runid": pl.Int64(),
    "kind": pl.String(),
    "order": pl.String(),
    "pair": pl.String(),
}
RESULT_SCHEMA: dict[str, pl.DataType] = {
    **TRIAL_SCHEMA,
    "aa": pl.Boolean(),
    **ITERATION_SCHEMA,  # what each parser gives, between the side and how it ended
    "side_status": pl.String(),
    "parser": pl.String(),
    "source_file": pl.String(),
}
RESULT_COLUMNS = tuple(RESULT_SCHEMA)
#: an artifact gives the table one line: uname, lscpu, meminfo are a few KiB
ARTIFACT_MAX_BYTES = 1 * MIB
_ORIGINAL_NAME = re.compile(
    r"^(?P<suite>[A-Za-z0-9_+-]+)\.(?P<benchmark>[A-Za-z0-9_+-]+)\.(?P<runid>\d+)\."
    r"(?P<kind>duet|seqn|sequential|syncduet)\.(?P<order>AB|BA|None)\.(?P<pair>[AB])\.(?P<file>.+)$"
)


@dataclass
class Processed:
    results: pl.DataFrame
    kernel: pl.DataFrame | None
    errors: list[str] = field(default_factory=list)
    files: int = 0


def _suite_folders(folder: Path, errors: list[str]) -> list[Path]:
    if (folder / INDEX).is_file():
        return [folder]
    found = []
    for index in sorted(folder.glob(f"*/{INDEX}")):
        try:  # a suite linked in from elsewhere is not this folder's
            found.append(confined(folder, index.parent.name, what="suite folder"))
        except UnsafePathError as err:
            errors.append(str(err))
    return found


def artifact_value(name: str, text: str) -> str | None:
    """One line per artifact for the table (the whole text stays in artifacts/):
    lscpu's model and CPU count, meminfo's MemTotal, else the first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if name == "lscpu":
        fields = dict(ln.split(":", 1) for ln in lines if ":" in ln)
        model = fields.get("Model name", "").strip()
        cpus = fields.get("CPU(s)", "").strip()
        return f"{model}, {cpus} CPU(s)" if model or cpus else (lines[0] if lines else None)
    if name == "meminfo":
        total = next((ln for ln in lines if ln.startswith("MemTotal:")), None)
        return " ".join(total.split()[1:]) if total else None
    return lines[0] if lines else None


def read_artifact(folder: Path, rel: object, name: str) -> str:
    """An artifact's text, confined to ``folder`` and at most ARTIFACT_MAX_BYTES;
    UnsafePathError or OSError with the reason otherwise."""
    hint = " (the table takes one line of it)"
    data = read_confined(folder, rel, ARTIFACT_MAX_BYTES, what=f"artifact {name}", hint=hint)
    return data.decode("utf-8", errors="replace")


def _artifacts(folder: Path, index: dict[str, Any], errors: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    artifacts = index.get("artifacts") or {}
    if not isinstance(artifacts, dict):
        errors.append(f"{folder / INDEX}: artifacts is not an object: none read")
        return out
    for name, entry in artifacts.items():
        out[f"artifact_{name}"] = None
        if not isinstance(entry, dict):
            errors.append(f"{folder / INDEX}: artifact {name} is not an object: not read")
            continue
        rel = entry.get("file")
        if not rel:  # an artifact that could not be captured has no file
            continue
        try:
            out[f"artifact_{name}"] = artifact_value(name, read_artifact(folder, rel, name))
        except UnsafePathError as err:
            errors.append(str(err))
        except OSError as err:
            errors.append(f"{folder}: artifact {name} {rel!r}: {err.strerror or err}")
    return out


def _tag(
    rows: pl.DataFrame, meta: dict[str, Any], artifacts: dict[str, str | None]
) -> pl.DataFrame:
    cols = [pl.lit(meta[k], dtype=RESULT_SCHEMA[k]).alias(k) for k in meta]
    cols += [pl.lit(v, dtype=pl.String).alias(k) for k, v in artifacts.items()]
    return rows.with_columns(cols)


def process_suite(
    folder: Path, max_bytes: int = MAX_FILE_BYTES, on_file: Callable[[], None] | None = None
) -> Processed:
    """One ``duet run`` suite folder; DuetError when its index is damaged. ``on_file``
    is called after each result file."""
    index = read_index(folder)
    try:
        return _process_suite(folder, index, max_bytes, on_file)
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        # a hand-edited or damaged index: one line, not a traceback
        raise DuetError(f"{folder / INDEX}: damaged ({type(err).__name__}: {err})") from None


def _result_names(index: dict[str, Any]) -> list[Any]:
    """The result files a ``duet run`` index names, in the order they are read."""
    return [
        rel
        for trial in index.get("trials", [])
        for side in trial.get("sides", {}).values()
        for rel in side.get("results", [])
    ]


def _process_suite(
    folder: Path, index: dict[str, Any], max_bytes: int, on_file: Callable[[], None] | None = None
) -> Processed:
    errors: list[str] = []
    artifacts = _artifacts(folder, index, errors)
    frames: list[pl.DataFrame] = []
    files = 0
    for trial in index.get("trials", []):
        for pair, side in trial.get("sides", {}).items():
            if side.get("status") not in ("ok", None):
                why = side.get("error") or side.get("status")
                errors.append(f"{trial['label']}.{pair}: side {side.get('status')}: {why}")
            missing = side.get("missing") or {}
            if side.get("status") == "failed" and side.get("error") == none_left(missing):
                missing = {}  # the side's line above names them all
            for name, why in missing.items():
                errors.append(f"{trial['label']}.{pair}: result {name} missing: {why}")
            anchor = Anchor(side.get("release_ns"), side.get("release_epoch_ms"))
            for rel in side.get("results", []):
                files += 1
                if on_file is not None and files > 1:
                    on_file()  # the one before is done
                try:
                    path = confined(folder, rel, what="result")
                    parser, rows = parse_file(path, anchor, max_bytes=max_bytes)
                except UnsafePathError as err:
                    errors.append(str(err))
                    continue
                except ParseError as err:
                    errors.append(f"{folder / rel}: {err}")
                    continue
                meta = {
                    "suite": trial["suite"],
                    "benchmark": trial["benchmark"],
                    "runid": trial["runid"],
                    "kind": trial["kind"],
                    "order": trial["order"],
                    "pair": pair,
                    "aa": bool(trial.get("aa")),
                    "side_status": side.get("status"),
                    "parser": parser,
                    "source_file": rel,
                }
                frames.append(_tag(rows, meta, artifacts))
    if on_file is not None and files:
        on_file()
    errors += _unlisted(folder, index)
    kernel = None
    if index.get("collect"):
        from kernmlops.duet.collect import kernel_stats_for_suite

        try:
            kernel = kernel_stats_for_suite(folder, index)
        except Exception as err:  # reported; the iteration table still stands
            errors.append(f"{folder}: kernel data: {err}")
    return Processed(_concat(frames), kernel, errors, files)


def _unlisted(folder: Path, index: dict[str, Any]) -> list[str]:
    """Result files in the suite's folder that no trial of its index names: those
    of the trial a stopped run (Ctrl+C, SIGTERM, a hangup) was in. Not read (that
    trial is not in the index), but named, not left out in silence."""
    listed = {str(rel) for rel in _result_names(index)}
    # a listed name may be a link to a file of another name, which is read then
    read = {os.path.realpath(folder / rel) for rel in listed}
    out = []
    for sub in ("results", ""):
        where = folder / sub if sub else folder
        if not where.is_dir():
            continue
        for entry in sorted(where.iterdir()):
            rel = f"{sub}/{entry.name}" if sub else entry.name
            if not _ORIGINAL_NAME.match(entry.name) or rel in listed:
                continue
            if os.path.realpath(entry) not in read:
                out.append(
                    f"{folder / rel}: no trial in {INDEX} names it (the run was stopped "
                    "during its trial?): not read"
                )
    return out


def date_ns(text: str) -> int | None:
    """The ``date`` artifact (``date``'s output, or ISO 8601) as Unix ns; a
    time without a zone is read as UTC, as the original's pandas reads it."""
    from datetime import UTC

    from dateutil import parser as dateparser

    try:
        when = dateparser.parse(text.strip())
    except (ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


def process_original(
    folder: Path,
    aa: frozenset[str] = frozenset(),
    max_bytes: int = MAX_FILE_BYTES,
    on_file: Callable[[], None] | None = None,
) -> Processed:
    """A folder of result files named by the original asynchronous-duet tool;
    ``on_file`` is called after each."""
    frames: list[pl.DataFrame] = []
    errors: list[str] = []
    files = 0
    artifacts: dict[str, str | None] = {}
    texts: dict[str, str] = {}
    if (folder / "artifacts").is_dir():
        for p in sorted((folder / "artifacts").iterdir()):
            if p.is_dir():
                continue
            try:
                texts[p.name] = read_artifact(folder, f"artifacts/{p.name}", p.name)
            except UnsafePathError as err:
                errors.append(str(err))
                continue
            except OSError as err:
                errors.append(f"{p}: artifact {p.name}: {err.strerror or err}")
                continue
            artifacts[f"artifact_{p.name}"] = artifact_value(p.name, texts[p.name])
    date = texts.get("date")
    anchor = Anchor(date_ns=date_ns(date)) if date is not None else None
    for entry in sorted(folder.iterdir()):
        m = _ORIGINAL_NAME.match(entry.name)
        if not m:
            continue
        files += 1
        if on_file is not None and files > 1:
            on_file()  # the one before is done
        try:
            path = confined(folder, entry.name, what="result")
            parser, rows = parse_file(path, anchor, max_bytes=max_bytes)
        except UnsafePathError as err:
            errors.append(str(err))
            continue
        except ParseError as err:
            errors.append(f"{entry}: {err}")
            continue
        kind = "sequential" if m["kind"] in ("seqn", "sequential") else m["kind"]
        meta = {
            "suite": m["suite"],
            "benchmark": m["benchmark"],
            "runid": int(m["runid"]),
            "kind": kind,
            "order": None if m["order"] == "None" else m["order"],
            "pair": m["pair"],
            "aa": m["benchmark"] in aa if aa else None,
            "side_status": None,
            "parser": parser,
            "source_file": entry.name,
        }
        frames.append(_tag(rows, meta, artifacts))
    if on_file is not None and files:
        on_file()
    return Processed(_concat(frames), None, errors, files)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    if not frames:
        return pl.DataFrame(schema=RESULT_SCHEMA)
    out = pl.concat(frames, how="diagonal_relaxed")
    front = [c for c in RESULT_COLUMNS if c in out.columns]
    return out.select(*front, pl.exclude(front))


def _count_files(folder: Path) -> int:
    """The result files under ``folder`` that :func:`process_dirs` reads (a progress's
    total: what cannot be read counts 0, and is named when it is processed)."""
    if not folder.is_dir():
        return 0
    suites = _suite_folders(folder, [])
    if not suites:
        try:
            return sum(bool(_ORIGINAL_NAME.match(e.name)) for e in folder.iterdir())
        except OSError:
            return 0
    total = 0
    for suite in suites:
        with contextlib.suppress(DuetError, AttributeError, TypeError):
            total += len(_result_names(read_index(suite)))
    return total


def process_dirs(
    folders: list[Path],
    aa: frozenset[str] = frozenset(),
    max_bytes: int = MAX_FILE_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> Processed:
    """Every suite under ``folders``; raises DuetError when nothing is there.

    ``aa``: benchmarks that are A/A duets (for original-named folders, whose
    names do not say; a ``duet run`` folder's index does). ``max_bytes``: the
    largest result file (or result folder) read; larger ones are named in the
    errors. ``progress`` is told (result files read, result files in all)."""
    results: list[pl.DataFrame] = []
    kernels: list[pl.DataFrame] = []
    errors: list[str] = []
    files = 0
    read = [0, sum(_count_files(Path(f)) for f in folders) if progress is not None else 0]

    def one_read() -> None:
        read[0] += 1
        if progress is not None:
            progress(read[0], max(read))

    if progress is not None:
        progress(*read)
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise DuetError(f"{folder}: no such folder")
        suites = _suite_folders(folder, errors)
        parts = [process_suite(s, max_bytes, one_read) for s in suites]
        if not suites:
            original = process_original(folder, aa, max_bytes, one_read)
            if original.files == 0:
                raise DuetError(
                    f"{folder}: no duet results ({INDEX} of `duet run`, or result files named "
                    "<suite>.<benchmark>.<runid>.<type>.<order>.<pair>.<file>)"
                )
            parts = [original]
        for p in parts:
            results.append(p.results)
            if p.kernel is not None:
                kernels.append(p.kernel)
            errors += p.errors
            files += p.files
    kernel = pl.concat(kernels, how="diagonal_relaxed") if kernels else None
    table = _concat([r for r in results if r.height])
    if aa and table.height:
        table = table.with_columns(
            pl.when(pl.col("benchmark").is_in(sorted(aa)))
            .then(True)
            .otherwise(pl.col("aa"))
            .alias("aa")
        )
    return Processed(table, kernel, errors, files)


#: how each side of each trial ended (side_outcomes)
SIDE_SCHEMA: dict[str, pl.DataType] = {
    **TRIAL_SCHEMA,
    "status": pl.String(),
    "error": pl.String(),
    #: its stderr's file (the suite's folder joined), where it had one
    "stderr": pl.String(),
}


def side_outcomes(folder: Path) -> pl.DataFrame:
    """How each side of each trial ended (``status``, ``error``: "exit status 1"),
    from the ``duet-run.json`` of every suite in ``folder`` (the folder ``duet
    process`` read, where it writes the table by default). A side with no
    iteration has no row in the results table: this is where its reason is.
    Empty for an original-named folder; a damaged or unsafe index is skipped
    (``duet process`` names it)."""

    def text(value: object) -> str | None:
        return None if value is None else str(value)

    def log(suite: Path, value: object) -> str | None:
        # named in a message only, never opened: as duet-run.json gives it
        return None if not value else str(suite / str(value))

    rows: list[tuple[Any, ...]] = []
    for suite in _suite_folders(Path(folder), []):
        try:
            index = read_index(suite)
            rows += [
                (str(trial["suite"]), str(trial["benchmark"]), int(trial["runid"]),
                 str(trial["kind"]), text(trial.get("order")), str(pair),
                 text(side.get("status")), text(side.get("error")),
                 log(suite, side.get("stderr")))
                for trial in index.get("trials", [])
                for pair, side in trial.get("sides", {}).items()
            ]  # fmt: skip
        except (DuetError, KeyError, TypeError, AttributeError, ValueError):
            continue
    return pl.DataFrame(rows, schema=SIDE_SCHEMA, orient="row")


#: the original's artifact columns (named by the artifact, no prefix)
ORIGINAL_ARTIFACTS = ("date", "hostname", "lscpu", "meminfo", "uname")


def to_original(results: pl.DataFrame) -> pl.DataFrame:
    """The table in the columns the original's ``process.py parse`` writes (and
    its analysis reads): ``type`` (duet | syncduet | seqn), ``order``, the
    artifacts as ``date``, ``hostname``, ... ; iterations numbered as its
    parsers number them (DaCapo/ScalaBench from 1)."""
    first = pl.col("parser").fill_null("") == "dacapo"
    arts = [
        (pl.col(f"artifact_{a}") if f"artifact_{a}" in results.columns else pl.lit(None))
        .cast(pl.String)
        .alias(a)
        for a in ORIGINAL_ARTIFACTS
    ]
    return results.select(
        "suite",
        "benchmark",
        pl.col("kind").replace_strict(FILE_KIND, default=pl.col("kind")).alias("type"),
        pl.col("order").fill_null("None"),
        "pair",
        "runid",
        (pl.col("iteration") + pl.when(first).then(1).otherwise(0)).alias("iteration"),
        "iteration_start_ns",
        "iteration_end_ns",
        "iteration_time_ns",
        *arts,
    )


def _columns_json(table: pl.DataFrame) -> str:
    """pandas' default JSON orientation ({column: {row: value}}), which the
    original's ``--json`` writes and ``pandas.read_json`` reads by default."""
    import json

    return json.dumps(
        {c: {str(i): v for i, v in enumerate(table[c].to_list())} for c in table.columns}
    )


def write_processed(
    processed: Processed, out: Path, *, json: bool = False, original: bool = False
) -> list[Path]:
    """Parquet and CSV of the results (and of the kernel statistics); with
    ``json`` also JSON (one object per row); with ``original`` also the table
    in the original tool's form (``duet-results.original.csv``, and ``.json``
    in pandas' orientation with ``json``)."""
    from kernmlops.fileio import write_atomic
    from kernmlops.host.pinned import create_new

    out.mkdir(parents=True, exist_ok=True)
    written = []
    tables = [(RESULTS_NAME, processed.results)]
    if processed.kernel is not None:
        tables.append((KERNEL_NAME, processed.kernel))
    for name, table in tables:
        for ext in ("parquet", "csv", *(("json",) if json else ())):
            path = out / f"{name}.{ext}"
            tmp = out / f".{name}.{ext}.tmp"
            # a new file, never through a link planted under the temporary name
            try:
                with open(create_new(tmp), "wb") as f:
                    if ext == "parquet":
                        table.write_parquet(f)
                    elif ext == "csv":
                        table.write_csv(f)
                    else:
                        table.write_json(f)
                tmp.replace(path)
            except BaseException:
                tmp.unlink(missing_ok=True)  # no half-written table left behind
                raise
            written.append(path)
    if original:
        table = to_original(processed.results)
        path = out / f"{RESULTS_NAME}.original.csv"
        write_atomic(path, table.write_csv())
        written.append(path)
        if json:
            path = out / f"{RESULTS_NAME}.original.json"
            write_atomic(path, _columns_json(table))
            written.append(path)
    return written


def _to_int(table: pl.DataFrame, name: str) -> pl.Expr:
    """An integer column; pandas writes integers as floats once a column has a
    gap (108078259.0): those are rounded (integers are never sent through a
    float, which would cost epoch nanoseconds their last digits)."""
    dtype = table.schema[name]
    if dtype.is_integer():
        return pl.col(name).cast(pl.Int64)
    return pl.col(name).cast(pl.Float64).round(0).cast(pl.Int64)


def from_original(table: pl.DataFrame) -> pl.DataFrame:
    """A table the original's ``process.py`` wrote, in our columns."""
    need = ("suite", "benchmark", "type", "runid", "pair", "iteration_time_ns")
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise DuetError(f"not a duet results table (missing {', '.join(missing)})")
    kind = {v: k for k, v in FILE_KIND.items()}
    parser = {"dacapo": "dacapo", "scalabench": "dacapo", "renaissance": "renaissance",
              "speccpu": "spec"}  # fmt: skip
    cols = table.columns

    def num(name: str) -> pl.Expr:
        if name not in cols:
            return pl.lit(None, dtype=pl.Int64).alias(name)
        return _to_int(table, name)

    order = pl.col("order").cast(pl.String) if "order" in cols else pl.lit(None, pl.String)
    out = table.select(
        pl.col("suite").cast(pl.String),
        pl.col("benchmark").cast(pl.String),
        num("runid"),
        pl.col("type").cast(pl.String).replace_strict(kind, default=None).alias("kind"),
        pl.when(order.is_in(["AB", "BA"])).then(order).otherwise(None).alias("order"),
        pl.col("pair").cast(pl.String),
        pl.lit(None, pl.Boolean).alias("aa"),
        num("iteration"),
        num("epoch_start_ms"),
        num("iteration_start_ns"),
        num("iteration_end_ns"),
        num("iteration_time_ns"),
        pl.lit("original").alias("timing"),
        pl.lit(None, pl.String).alias("side_status"),
        pl.col("suite").cast(pl.String).replace_strict(parser, default=None).alias("parser"),
        pl.lit(None, pl.String).alias("source_file"),
        *[pl.col(a).cast(pl.String).alias(f"artifact_{a}") for a in ORIGINAL_ARTIFACTS
          if a in cols],
    )  # fmt: skip
    bad = out.filter(pl.col("kind").is_null())
    if bad.height:
        raise DuetError(
            f"not a duet results table (type {bad['kind'].head(1)}: want duet, syncduet, seqn)"
        )
    # DaCapo/ScalaBench rows are numbered from 1 by the original: ours from 0
    first = pl.col("parser").fill_null("") == "dacapo"
    return out.with_columns(
        (pl.col("iteration") - pl.when(first).then(1).otherwise(0)).alias("iteration")
    )


def _opened(path: Path) -> Any:
    """``path`` opened once, a plain file only (kernmlops.host.pinned.open_regular:
    without blocking, then checked by its descriptor): a FIFO put at its name, even
    right after a look at it, would block a reader for ever, waiting for a writer.
    Whatever reads it reads this open file, never the name again."""
    return os.fdopen(open_regular(path), "rb")


#: a results table (CSV, JSON, or Parquet and the kernel table beside it), read whole
#: into memory before it is parsed (a few times its size again): 1 GiB is some 3M rows
#: in JSON, 6M in CSV (about 330 and 170 bytes a row), more in Parquet, far more
#: iterations than a duet suite runs, and still parses on a machine of a few GiB
RESULTS_MAX_BYTES = 1 << 30


def _read_parquet(path: Path, what: str) -> pl.DataFrame:
    """The Parquet file ``path`` (``what`` names it in the refusal), opened once and
    read whole, at most :data:`RESULTS_MAX_BYTES` (one larger, even sparse, is refused
    in one line before a byte is read)."""
    with _opened(path) as f:
        return pl.read_parquet(read_open(f, path, RESULTS_MAX_BYTES, what=what, hint=""))


def _read_any(path: Path) -> pl.DataFrame:
    if path.suffix == ".parquet":
        return _read_parquet(path, "results table")
    with _opened(path) as f:
        data = read_open(f, path, RESULTS_MAX_BYTES, what="results table", hint="")
        if path.suffix == ".json":
            from kernmlops.jsonfile import loads

            doc = loads(data)
            if isinstance(doc, dict):  # pandas' orientation: {column: {row: value}}
                rows = sorted({k for col in doc.values() for k in col}, key=int)
                return pl.DataFrame({c: [doc[c].get(r) for r in rows] for c in doc}, strict=False)
            return pl.DataFrame(doc, infer_schema_length=None)
        return pl.read_csv(data, infer_schema_length=None)


def read_table(path: Path) -> pl.DataFrame:
    """A results table: ours (Parquet, CSV, JSON) or the original tool's
    processed CSV/JSON; DuetError with one line for anything else."""
    try:
        table = _read_any(path)
    except (pl.exceptions.PolarsError, OSError, ValueError, TypeError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DuetError(f"{path}: not a duet results table ({why})") from err
    if "type" in table.columns and "kind" not in table.columns:
        try:
            return from_original(table)
        except DuetError as err:
            raise DuetError(f"{path}: {err}") from None
        except pl.exceptions.PolarsError as err:
            raise DuetError(f"{path}: not a duet results table ({err})") from None
    missing = [c for c in RESULT_COLUMNS if c not in table.columns]
    if missing:
        raise DuetError(f"{path}: not a duet results table (missing {', '.join(missing)})")
    try:
        return table.with_columns(
            _to_int(table, c) if t == pl.Int64() else pl.col(c).cast(t)
            for c, t in RESULT_SCHEMA.items()
        )
    except pl.exceptions.PolarsError as err:
        why = str(err).strip().splitlines()[0]
        raise DuetError(f"{path}: not a duet results table ({why})") from None


def nothing_found(processed: Processed) -> str:
    """What `duet process` found where it found no iteration: the files, and the first
    of its warnings (a side that failed, a file no parser reads) with their count."""
    files = f"{processed.files} result file{'s' * (processed.files != 1)}"
    if not processed.errors:
        return files
    n = len(processed.errors)
    first = "its warning" if n == 1 else f"the first of its {n} warnings"
    return f"{files}; {first}: {processed.errors[0]}"


def no_table(path: Path) -> str:
    """Why ``path`` has no results table, for ``duet analyze``: what ``duet process``
    finds there (it is run again, writing nothing): no iterations and why, iterations
    (then it was not run), or nothing it can read."""
    missing = f"{path}: no {RESULTS_NAME}.parquet"
    if not Path(path).is_dir():
        return f"{missing} (run `kernmlops duet process` first)"
    try:
        found = process_dirs([Path(path)])
    except DuetError as err:
        return f"{missing}, and nothing `kernmlops duet process` could read: {err}"
    if found.results.height == 0:
        return (
            f"{missing}: `kernmlops duet process` finds no iterations there "
            f"({nothing_found(found)})"
        )
    return (
        f"{missing}: run `kernmlops duet process {path}` first (it finds "
        f"{found.results.height} iterations in {found.files} result file(s))"
    )


def read_results(path: Path) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The tables ``duet process`` wrote (a folder, or its .parquet/.csv file)."""
    path = Path(path)
    if path.is_dir():
        folder = path
        main = path / f"{RESULTS_NAME}.parquet"
        if not main.exists() and (path / f"{RESULTS_NAME}.csv").exists():
            main = path / f"{RESULTS_NAME}.csv"
    else:
        folder, main = path.parent, path
    if not main.exists():
        raise DuetError(no_table(path))
    results = read_table(main)
    kernel_path = folder / f"{KERNEL_NAME}.parquet"
    kernel = None
    if kernel_path.exists():
        try:
            kernel = _read_parquet(kernel_path, "kernel table")
        except (pl.exceptions.PolarsError, OSError) as err:
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise DuetError(f"{kernel_path}: not a duet kernel table ({why})") from None
    return results, kernel
