"""Compaction's memory: how much RSS ``ParquetSink.compact`` adds at the end of a collection.

A collection's lifetime peak is reached at stop, when the flushed parts of a long
run are rewritten into full files (bench/README.md, `memory`). This script writes
a switch-like table through the real ``ParquetSink`` (``--parts`` flushes of
``--rows`` rows each), closes it, gives freed memory back as the session does,
then samples VmRSS every 20 ms while ``compact()`` runs. No kernel needed.

Run: ``python -m bench compaction --help``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

# as the kernmlops command sets it (cli.main), before pyarrow loads
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

import numpy as np
import pyarrow as pa

from bench import harness
from bench.harness import save
from kernmlops.collect.parquet import ParquetSink

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; the RSS compaction adds to a collection's lifetime peak (`memory`)"

BENCH = Path(__file__).resolve().parent
MIB = 1 << 20


def status_mib() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def write_collection(folder: Path, parts: int, rows: int, seed: int = 0) -> ParquetSink:
    """``parts`` flushed parts of a quanta_runtime-like table (growing timestamps,
    a few CPUs, pids and tgids, short run lengths), written as the collector does."""
    rng = np.random.default_rng(seed)
    sink = ParquetSink(folder, collection_id="0" * 36)
    t0, batch = 0, 50_000
    for _ in range(parts):
        for _ in range(max(1, rows // batch)):
            ts = t0 + np.cumsum(rng.integers(0, 5, batch))
            t0 = int(ts[-1])
            sink.write(
                "quanta_runtime",
                pa.table(
                    {
                        "ts_uptime_us": ts.astype(np.uint64),
                        "quanta_run_length_us": rng.integers(0, 50, batch).astype(np.uint64),
                        "cpu": rng.integers(0, 2, batch).astype(np.uint32),
                        "pid": rng.integers(1000, 1010, batch).astype(np.uint32),
                        "tgid": rng.integers(1000, 1004, batch).astype(np.uint32),
                    }
                ),
            )
        sink.flush()
    sink.close()
    return sink


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--parts", type=int, default=20, help="flushed parts (default: 20)")
    parser.add_argument("--rows", type=int, default=1_500_000, help="rows per part")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "compaction.json")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="kmo-compaction-"))
    try:
        sink = write_collection(folder, args.parts, args.rows)
        ctypes.CDLL(None).malloc_trim(0)  # as Session does before compacting
        pa.default_memory_pool().release_unused()
        before = status_mib()
        peak = [before["VmRSS"]]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                peak[0] = max(peak[0], status_mib()["VmRSS"])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0, c0 = time.monotonic(), time.process_time()
        outcome = sink.compact()
        took, cpu = time.monotonic() - t0, time.process_time() - c0
        done.set()
        sampler.join()
        after = status_mib()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {
        "parts": args.parts,
        "rows": args.parts * args.rows,
        "outcome": outcome,
        "seconds": round(took, 2),
        "cpu_s": round(cpu, 2),
        "rss_before_mib": round(before["VmRSS"], 1),
        # sampled: VmHWM would include writing the parts
        "rss_peak_mib": round(peak[0], 1),
        "added_mib": round(peak[0] - before["VmRSS"], 1),
        "anon_file_before_mib": [round(before["RssAnon"], 1), round(before["RssFile"], 1)],
        "anon_file_after_mib": [round(after["RssAnon"], 1), round(after["RssFile"], 1)],
    }
    print(
        f"{result['rows']:,} rows in {args.parts} parts: RSS {result['rss_before_mib']} MiB "
        f"before compaction, peak {result['rss_peak_mib']} MiB "
        f"(+{result['added_mib']} MiB), {took:.1f} s ({cpu:.1f} s CPU), {outcome}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args.out, result)
    print(f"wrote {args.out}")
    return 0
