"""A run's Parquet parts: bytes and CPU per row of each way to encode them.

With ``collector.compact`` (the default) the parts written while the workload runs
are rewritten compactly at stop, so they are encoded for the collector's CPU, not
for size (``kernmlops.collect.parts.RUN``); until the stop they are on disk. This
writes the same rows through the real ``ParquetSink`` (``fast_parts``: batches of
``--batch`` rows as a hook hands them over, a part finished every ``--part-rows``, as
a flush does) once per candidate encoding, and prints the process CPU per million
rows (best of ``--repeat``, candidates alternated in each repeat) and the bytes per
row on disk. The rows are a real collection's (``--collection DIR``, e.g. one kept by
``storm-tree --keep DIR``: each table of ``--min-rows`` rows or more), else a
synthetic quanta-like table. No kernel needed.

Run: ``python -m bench parts --help``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# as the kernmlops command sets it (cli.main), before pyarrow loads
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench import harness
from bench.harness import save
from kernmlops.collect import parts
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.parts import Encoding

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; the run's parts: the least bytes per row for the least collector CPU"

BENCH = Path(__file__).resolve().parent

#: the candidates for a run's parts (None: compact, as the parts are for good); pyarrow
#: writes "lz4" as Parquet's LZ4_RAW
CANDIDATES: dict[str, Encoding | None] = {
    "plain": Encoding("none", dictionaries=False, deltas=False),
    "plain+lz4": Encoding("lz4", dictionaries=False, deltas=False),
    "plain+snappy": Encoding("snappy", dictionaries=False, deltas=False),
    "dict": Encoding("none", dictionaries=True, deltas=False),
    "dict+lz4": Encoding("lz4", dictionaries=True, deltas=False),
    "delta": Encoding("none", dictionaries=False, deltas=True),
    "delta+lz4": Encoding("lz4", dictionaries=False, deltas=True),
    "dict+delta": Encoding("none", dictionaries=True, deltas=True),
    "dict+delta+lz4": Encoding("lz4", dictionaries=True, deltas=True),
    "compact (zstd)": None,
}


def collection_tables(folder: Path, min_rows: int, most: int) -> dict[str, pa.Table]:
    """Each table of the collection in ``folder`` with ``min_rows`` rows or more (its
    first ``most``), without collection_id, as a hook hands rows over."""
    if not folder.is_dir():
        raise SystemExit(f"--collection {folder}: not a folder")
    out = {}
    for table_dir in sorted(p for p in folder.iterdir() if p.is_dir() and p.name[0] != "."):
        files = sorted(table_dir.glob("part-*.parquet"))
        if not files or sum(pq.ParquetFile(f).metadata.num_rows for f in files) < min_rows:
            continue
        tables, rows = [], 0
        for f in files:
            t = pq.read_table(f, partitioning=None)
            tables.append(t.drop_columns([c for c in ("collection_id",) if c in t.column_names]))
            rows += t.num_rows
            if rows >= most:
                break
        out[table_dir.name] = pa.concat_tables(tables).slice(0, most).combine_chunks()
    return out


def synthetic_quanta(rows: int, seed: int = 0) -> dict[str, pa.Table]:
    """A quanta_runtime-like table: growing timestamps, two CPUs, a few pids."""
    rng = np.random.default_rng(seed)
    return {
        "quanta_runtime": pa.table(
            {
                "cpu": rng.integers(0, 2, rows).astype(np.uint32),
                "pid": rng.integers(1000, 1010, rows).astype(np.uint32),
                "tgid": rng.integers(1000, 1004, rows).astype(np.uint32),
                "quanta_end_uptime_us": np.cumsum(rng.integers(0, 9, rows)).astype(np.uint64),
                "quanta_run_length_us": rng.integers(0, 50, rows).astype(np.uint64),
            }
        )
    }


def write_run(tables: dict[str, pa.Table], how: Encoding | None, batch: int, part_rows: int,
              folder: Path) -> tuple[float, int]:  # fmt: skip
    """The rows through a ParquetSink as a run writes them (``how``: the run's
    encoding; None: compact): process CPU seconds and bytes of the parts."""
    saved = parts.RUN
    if how is not None:
        parts.RUN = how  # what the sink's run parts are written with
    try:
        t0 = time.process_time()
        sink = ParquetSink(folder, "0" * 36, fast_parts=how is not None)
        for name, table in tables.items():
            since = 0
            for start in range(0, table.num_rows, batch):
                sink.write(name, table.slice(start, batch))
                since += batch
                if since >= part_rows:
                    sink.flush()  # a part finished (the run's flush)
                    since = 0
        sink.close()
        cpu = time.process_time() - t0
    finally:
        parts.RUN = saved
    return cpu, sum(p.stat().st_size for p in folder.rglob("*.parquet"))


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__, defaults_in_help=True)
    parser.add_argument("--collection", type=Path, help="a collection's folder (its rows)")
    parser.add_argument("--min-rows", type=int, default=100_000, help="tables this big")
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows per table, at most")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per hand-over")
    parser.add_argument("--part-rows", type=int, default=500_000, help="rows per run part")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many")
    parser.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), help="candidates")
    parser.add_argument("--out", type=Path, default=harness.result_path("parts"))
    args = parser.parse_args(argv)

    if args.collection:
        tables = collection_tables(args.collection, args.min_rows, args.rows)
        if not tables:
            raise SystemExit(f"{args.collection}: no table of {args.min_rows} rows or more")
    else:
        tables = synthetic_quanta(args.rows)
    rows = sum(t.num_rows for t in tables.values())
    names = args.only or list(CANDIDATES)
    scratch = Path(tempfile.mkdtemp(prefix="kmo-parts-"))
    best: dict[str, float] = {}
    size: dict[str, int] = {}
    try:
        write_run(tables, None, args.batch, args.part_rows, scratch / "warm-up")
        for r in range(args.repeat):
            for name in names if r % 2 == 0 else names[::-1]:  # alternated
                folder = scratch / f"{name}-{r}"
                cpu, size[name] = write_run(tables, CANDIDATES[name], args.batch,
                                            args.part_rows, folder)  # fmt: skip
                best[name] = min(best.get(name, float("inf")), cpu)
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    from rich.console import Console
    from rich.table import Table

    shown = Table(
        title=f"{rows:,} rows of {', '.join(tables)}; best of {args.repeat}",
        title_justify="left",
    )
    for col in ("encoding", "ms CPU / 1M rows", "bytes / row", "x plain's size"):
        shown.add_column(col, justify="left" if col == "encoding" else "right")
    results = {}
    plain = size.get("plain")
    for name in names:
        ms = 1000 * best[name] * 1e6 / rows
        per_row = size[name] / rows
        results[name] = {"ms_per_1M_rows": round(ms, 1), "bytes_per_row": round(per_row, 3)}
        ratio = f"{size[name] / plain:.3f}" if plain else "-"
        shown.add_row(name, f"{ms:.1f}", f"{per_row:.2f}", ratio)
    Console(width=110).print(shown)
    schema = {name: [f"{f.name}:{f.type}" for f in t.schema] for name, t in tables.items()}
    settings = {**vars(args), "out": str(args.out), "collection": str(args.collection)}
    save(args.out, {"settings": settings, "rows": rows, "tables": schema, "encodings": results})
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
