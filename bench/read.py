"""Reading a one-hour collection: parts finished at every flush vs one part per table.

A collection flushes durably every ``collector.flush_interval_s`` (5 s): each flush
finishes the open parts, so an hour leaves 720 parts per busy table until the session
compacts them into one file per table at stop (``collector.compact``). This builds such a
collection with the real ParquetSink (durable flushes, synthetic rows shaped like
quanta_runtime, memory_usage and process_trace), the same collection compacted (and the
time compaction takes), and the same rows written with one flush at the end, then times
the readers users have: read_collection, a lazy polars scan with a filter, and DuckDB
over the Hive folder. read_collection checks every page's checksum before polars reads
it (kernmlops.collect.pagecheck): ``lazy_collected_s`` is the same read without that
check (each table scanned with ``pages=False`` and collected), ``lazy_checked_s`` the
lazy read as it is by default (the pages checked, then collected), ``page_check_s`` the
check alone.

    python -m bench read                 # 1 h at 5 s flushes, 2k quanta rows/s
    python -m bench read --rate 20000    # a busier hour
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import polars as pl

from bench import harness
from bench.harness import save
from kernmlops.collect.manifest import write_manifest
from kernmlops.collect.pagecheck import page_damage
from kernmlops.collect.parquet import ParquetSink
from kernmlops.data import read_collection

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; a compacted collection reads no slower than one written at once"

RESULTS = Path(__file__).parent / "results"


def frames(second: int, seconds: int, rate: int, rng: np.random.Generator) -> dict:
    n = rate * seconds
    ts = np.sort(rng.integers(second * 10**6, (second + seconds) * 10**6, n)).astype(np.uint64)
    quanta = pl.DataFrame(
        {
            "ts_uptime_us": ts,
            "cpu": rng.integers(0, 2, n).astype(np.uint32),
            "pid": rng.integers(1000, 1200, n).astype(np.uint32),
            "tgid": rng.integers(1000, 1050, n).astype(np.uint32),
            "quanta_run_length_us": rng.exponential(300, n).astype(np.uint64),
        }
    )
    memory = pl.DataFrame(
        {"ts_uptime_us": np.arange(second, second + seconds, 0.1).astype(np.uint64) * 10**6}
        | {f"field_{i}_bytes": rng.integers(0, 1 << 34, seconds * 10) for i in range(50)}
    )
    trace = pl.DataFrame(
        {
            "ts_uptime_us": ts[:: max(1, n // (seconds * 5))],
            "pid": np.uint32(7),
            "kind": "fork",
        }
    )
    return {"quanta_runtime": quanta, "memory_usage": memory, "process_trace": trace}


def build(
    folder: Path, hours: float, flush_s: int, rate: int, durable: bool, compact: bool = False
) -> tuple[int, float]:
    """Write the collection; rows written and the seconds compaction took at stop."""
    rng = np.random.default_rng(1)
    sink = ParquetSink(folder, folder.name.removeprefix("collection_id="))
    total = int(hours * 3600)
    for second in range(0, total, flush_s):
        for table, frame in frames(second, flush_s, rate, rng).items():
            sink.write(table, frame)
        sink.flush(durable=durable)
    rows = sink.close()
    t = time.perf_counter()
    if compact:
        assert set(sink.compact().values()) == {"compacted"}
    compact_s = time.perf_counter() - t
    write_manifest(folder, {"collection_id": folder.name, "state": "completed"})
    return sum(rows.values()), compact_s


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--flush-s", type=int, default=5)
    ap.add_argument("--rate", type=int, default=2000, help="quanta_runtime rows per second")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "read.json")
    args = ap.parse_args(argv)
    import duckdb

    root = Path(tempfile.mkdtemp(prefix="kmo-read-"))
    results = {}
    try:
        layouts = (("flushed", True, False), ("compacted", True, True), ("one-part", False, False))
        for layout, durable, compact in layouts:
            folder = root / layout / "benchmark=bench" / f"collection_id={layout}"
            t = time.perf_counter()
            rows, compact_s = build(folder, args.hours, args.flush_s, args.rate, durable, compact)
            write_s = time.perf_counter() - t
            parts = len(list(folder.glob("*/part-*.parquet")))

            def read_all(folder: Path = folder) -> None:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    read_collection(folder)

            def read_lazily(folder: Path = folder) -> None:
                # the same read without the page check: polars alone, as before it
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    lazy = read_collection(folder, lazy=True, pages=False)
                    for name in lazy:
                        lazy[name].collect()

            def read_lazily_checked(folder: Path = folder) -> None:
                # a lazy read as users have it: every page checked, then collected
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    lazy = read_collection(folder, lazy=True)
                    for name in lazy:
                        lazy[name].collect()

            def check_pages(folder: Path = folder) -> None:
                for part in sorted(folder.glob("*/part-*.parquet")):
                    assert page_damage(str(part)) is None

            def scan_filter(folder: Path = folder) -> None:
                files = sorted((folder / "quanta_runtime").glob("part-*.parquet"))
                pl.scan_parquet(files).filter(pl.col("tgid") == 1007).group_by("pid").agg(
                    pl.col("quanta_run_length_us").sum()
                ).collect()

            glob = f"{folder.parent.parent}/benchmark=*/collection_id=*/quanta_runtime/*.parquet"

            def duck(glob: str = glob) -> None:
                duckdb.sql(
                    f"select tgid, sum(quanta_run_length_us) from read_parquet('{glob}', "
                    "hive_partitioning=true) group by tgid"
                ).fetchall()

            results[layout] = {
                "rows": rows,
                "parts": parts,
                "bytes": sum(p.stat().st_size for p in folder.rglob("*.parquet")),
                "write_s": round(write_s, 3),
                "compact_s": round(compact_s, 3),
                "read_collection_s": round(timed(read_all, args.repeat), 4),
                "lazy_collected_s": round(timed(read_lazily, args.repeat), 4),
                "lazy_checked_s": round(timed(read_lazily_checked, args.repeat), 4),
                "page_check_s": round(timed(check_pages, args.repeat), 4),
                "polars_scan_filter_s": round(timed(scan_filter, args.repeat), 4),
                "duckdb_group_by_s": round(timed(duck, args.repeat), 4),
            }
            print(layout, json.dumps(results[layout]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = ("read_collection_s", "polars_scan_filter_s", "duckdb_group_by_s", "bytes")
    base = results["one-part"]
    ratios = {
        f"{layout} / one-part": {k: round(results[layout][k] / base[k], 2) for k in keys}
        for layout in ("flushed", "compacted")
    }
    for name, r in ratios.items():
        print(f"{name}:", json.dumps(r))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(
        args.out,
        {"args": {k: str(v) for k, v in vars(args).items()}, "results": results, "ratios": ratios},
    )
