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
<order>.<pair>.<file>``, type seqn | duet | syncduet). A file no parser reads
is reported with the reason; the others are still processed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.duet.parsers import Anchor, ParseError, parse_file
from kernmlops.duet.runner import INDEX, DuetError, read_index

RESULTS_NAME = "duet-results"
KERNEL_NAME = "duet-kernel"
RESULT_SCHEMA: dict[str, pl.DataType] = {
    "suite": pl.String(),
    "benchmark": pl.String(),
    "runid": pl.Int64(),
    "kind": pl.String(),
    "order": pl.String(),
    "pair": pl.String(),
    "aa": pl.Boolean(),
    "iteration": pl.Int64(),
    "epoch_start_ms": pl.Int64(),
    "iteration_start_ns": pl.Int64(),
    "iteration_end_ns": pl.Int64(),
    "iteration_time_ns": pl.Int64(),
    "timing": pl.String(),
    "side_status": pl.String(),
    "parser": pl.String(),
    "source_file": pl.String(),
}
RESULT_COLUMNS = tuple(RESULT_SCHEMA)
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


def _suite_folders(folder: Path) -> list[Path]:
    if (folder / INDEX).is_file():
        return [folder]
    found = sorted(p.parent for p in folder.glob(f"*/{INDEX}"))
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


def _artifacts(folder: Path, index: dict[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, entry in (index.get("artifacts") or {}).items():
        path = folder / (entry.get("file") or f"artifacts/{name}")
        if entry.get("file") and path.is_file():
            out[f"artifact_{name}"] = artifact_value(name, path.read_text(errors="replace"))
        else:
            out[f"artifact_{name}"] = None
    return out


def _tag(
    rows: pl.DataFrame, meta: dict[str, Any], artifacts: dict[str, str | None]
) -> pl.DataFrame:
    cols = [pl.lit(meta[k], dtype=RESULT_SCHEMA[k]).alias(k) for k in meta]
    cols += [pl.lit(v, dtype=pl.String).alias(k) for k, v in artifacts.items()]
    return rows.with_columns(cols)


def process_suite(folder: Path) -> Processed:
    """One ``duet run`` suite folder."""
    index = read_index(folder)
    artifacts = _artifacts(folder, index)
    frames: list[pl.DataFrame] = []
    errors: list[str] = []
    files = 0
    for trial in index.get("trials", []):
        for pair, side in trial.get("sides", {}).items():
            if side.get("status") not in ("ok", None):
                why = side.get("error") or side.get("status")
                errors.append(f"{trial['label']}.{pair}: side {side.get('status')}: {why}")
            for name, why in (side.get("missing") or {}).items():
                errors.append(f"{trial['label']}.{pair}: result {name} missing: {why}")
            anchor = Anchor(side.get("release_ns"), side.get("release_epoch_ms"))
            for rel in side.get("results", []):
                files += 1
                try:
                    parser, rows = parse_file(folder / rel, anchor)
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
    kernel = None
    if index.get("collect"):
        from kernmlops.duet.collect import kernel_stats_for_suite

        try:
            kernel = kernel_stats_for_suite(folder, index)
        except Exception as err:  # reported; the iteration table still stands
            errors.append(f"{folder}: kernel data: {err}")
    return Processed(_concat(frames), kernel, errors, files)


def process_original(folder: Path) -> Processed:
    """A folder of result files named by the original asynchronous-duet tool."""
    frames, errors, files = [], [], 0
    art_dir = folder / "artifacts"
    artifacts = (
        {
            f"artifact_{p.name}": artifact_value(p.name, p.read_text(errors="replace"))
            for p in art_dir.iterdir()
        }
        if art_dir.is_dir()
        else {}
    )
    for path in sorted(folder.iterdir()):
        m = _ORIGINAL_NAME.match(path.name)
        if not m:
            continue
        files += 1
        try:
            parser, rows = parse_file(path)
        except ParseError as err:
            errors.append(f"{path}: {err}")
            continue
        kind = "sequential" if m["kind"] in ("seqn", "sequential") else m["kind"]
        meta = {
            "suite": m["suite"],
            "benchmark": m["benchmark"],
            "runid": int(m["runid"]),
            "kind": kind,
            "order": None if m["order"] == "None" else m["order"],
            "pair": m["pair"],
            "aa": None,
            "side_status": None,
            "parser": parser,
            "source_file": path.name,
        }
        frames.append(_tag(rows, meta, artifacts))
    return Processed(_concat(frames), None, errors, files)


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    if not frames:
        return pl.DataFrame(schema=RESULT_SCHEMA)
    out = pl.concat(frames, how="diagonal_relaxed")
    front = [c for c in RESULT_COLUMNS if c in out.columns]
    return out.select(*front, pl.exclude(front))


def process_dirs(folders: list[Path]) -> Processed:
    """Every suite under ``folders``; raises DuetError when nothing is there."""
    results, kernels, errors, files = [], [], [], 0
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise DuetError(f"{folder}: no such folder")
        suites = _suite_folders(folder)
        parts = [process_suite(s) for s in suites]
        if not suites:
            original = process_original(folder)
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
    return Processed(_concat([r for r in results if r.height]), kernel, errors, files)


def write_processed(processed: Processed, out: Path) -> list[Path]:
    """Parquet and CSV of the results (and of the kernel statistics)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    tables = [(RESULTS_NAME, processed.results)]
    if processed.kernel is not None:
        tables.append((KERNEL_NAME, processed.kernel))
    for name, table in tables:
        for ext in ("parquet", "csv"):
            path = out / f"{name}.{ext}"
            tmp = out / f".{name}.{ext}.tmp"
            if ext == "parquet":
                table.write_parquet(tmp)
            else:
                table.write_csv(tmp)
            tmp.replace(path)
            written.append(path)
    return written


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
        raise DuetError(f"{path}: no {RESULTS_NAME}.parquet (run `kernmlops duet process` first)")
    try:
        if main.suffix == ".csv":
            results = pl.read_csv(main, schema_overrides=RESULT_SCHEMA)
        else:
            results = pl.read_parquet(main)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DuetError(f"{main}: cannot read: {err}") from err
    missing = [c for c in RESULT_COLUMNS if c not in results.columns]
    if missing:
        raise DuetError(f"{main}: not a duet results table (missing {', '.join(missing)})")
    kernel_path = folder / f"{KERNEL_NAME}.parquet"
    kernel = pl.read_parquet(kernel_path) if kernel_path.exists() else None
    return results, kernel
