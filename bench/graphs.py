"""Graphs benchmark: drawing every graph of a large collection.

Writes a synthetic collection shaped as the hooks write theirs (millions of
quanta, faults and RSS changes; see ``--scale``), then times, wall and CPU, in a
process of its own (so its peak RSS is theirs alone, not the writer's):

* scanning it (``kernmlops.data.read_collection(lazy=True)``) and preparing it
  (``kernmlops.graphs.load``: names, markers, time span);
* each graph, drawn and saved as PNG;
* the whole HTML report.

Target: every graph of a 10-million-row collection in <= 60 s on 2 vCPUs, each
graph collecting only what it draws. Several scales (``--scale 0.5,1,2``) show
whether the peak RSS grows with the rows (it should not).
No root needed. Run: ``python -m bench graphs --help``.
"""

from __future__ import annotations

import multiprocessing
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from bench import harness
from bench.harness import save

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "every graph of a 10-million-row collection in ≤ 60 s on 2 vCPUs"

BENCH = Path(__file__).resolve().parent
T0 = 1_000_000_000
#: rows per table at --scale 1
ROWS = {
    "quanta_runtime": 4_000_000,
    "quanta_queued_time": 4_000_000,
    "page_faults": 1_000_000,
    "mm_rss_stat": 500_000,
    "block_io": 300_000,
    "sched_migrate": 200_000,
    "process_trace": 50_000,
    "syscalls": 50_000,
}


MEMINFO = (
    "mem_total_bytes",
    "mem_free_bytes",
    "mem_available_bytes",
    "buffers_bytes",
    "cached_bytes",
    "anon_pages_bytes",
    "slab_bytes",
)


def build(folder: Path, scale: float, duration_s: float, cpus: int) -> dict[str, int]:
    rng = np.random.default_rng(0)
    span = int(duration_s * 1e6)

    def n(table: str) -> int:
        return max(int(ROWS[table] * scale), 10)

    def ts(k: int) -> np.ndarray:
        return np.sort(rng.integers(T0, T0 + span, k)).astype(np.uint64)

    tgids = rng.integers(1000, 1400, 10_000).astype(np.uint32)
    tables: dict[str, pl.DataFrame] = {}
    k = n("quanta_runtime")
    cpu = rng.integers(0, cpus, k).astype(np.uint32)
    # per CPU, back-to-back quanta that end at sorted timestamps
    frame = pl.DataFrame({"ts_uptime_us": ts(k), "cpu": cpu}).sort("cpu", "ts_uptime_us")
    gap = frame.select(pl.col("ts_uptime_us").diff().over("cpu").fill_null(1).alias("g"))["g"]
    tables["quanta_runtime"] = frame.with_columns(
        quanta_run_length_us=pl.Series(np.maximum(gap.to_numpy() // 2, 1).astype(np.uint64)),
        pid=pl.Series(rng.choice(tgids, k)),
    ).with_columns(tgid=pl.col("pid"))
    k = n("quanta_queued_time")
    tables["quanta_queued_time"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "quanta_queued_time_us": rng.lognormal(3, 2, k).astype(np.uint64),
            "cpu": rng.integers(0, cpus, k).astype(np.uint32),
            "pid": rng.choice(tgids, k),
        }
    ).with_columns(tgid=pl.col("pid"))
    k = n("page_faults")
    tables["page_faults"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "pid": rng.choice(tgids, k),
            "cpu": rng.integers(0, cpus, k).astype(np.uint32),
            "kind": rng.choice(["user", "kernel"], k),
        }
    ).with_columns(tgid=pl.col("pid"))
    k = n("mm_rss_stat")
    tables["mm_rss_stat"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "size_bytes": (rng.integers(1, 50_000, k) * 4096).astype(np.int64),
            "pid": rng.choice(tgids, k),
            "member": rng.choice(["anon", "file", "shmem", "swap"], k),
        }
    ).with_columns(tgid=pl.col("pid"), mm_tgid=pl.col("pid"))
    k = n("block_io")
    tables["block_io"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "bytes": rng.choice([4096, 65536, 1 << 20], k).astype(np.uint32),
            "op": rng.choice(["READ", "WRITE", "FLUSH"], k, p=[0.6, 0.39, 0.01]),
            "queue_to_issue_us": rng.integers(1, 50, k).astype(np.uint64),
            "issue_to_complete_us": rng.lognormal(5, 1, k).astype(np.uint64),
            "tgid": rng.choice(tgids, k),
            "comm": "worker",
        }
    )
    k = n("sched_migrate")
    tables["sched_migrate"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "pid": rng.choice(tgids, k),
            "orig_cpu": rng.integers(0, cpus, k).astype(np.uint32),
            "dest_cpu": rng.integers(0, cpus, k).astype(np.uint32),
            "kind": rng.choice(["wakeup", "queued"], k),
            "comm": "worker",
        }
    ).with_columns(tgid=pl.col("pid"))
    k = n("process_trace")
    tables["process_trace"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "pid": rng.choice(tgids, k),
            "ppid": np.full(k, 1, np.uint32),
            "kind": rng.choice(["fork", "exec", "exit"], k),
            "comm": rng.choice(["worker", "bash", "make", "cc1"], k),
        }
    ).with_columns(tgid=pl.col("pid"))
    k = n("syscalls")
    tables["syscalls"] = pl.DataFrame(
        {
            "ts_uptime_us": ts(k),
            "tgid": rng.choice(tgids, k),
            "syscall": rng.choice([f"sys{i}" for i in range(60)], k),
            "count": rng.integers(1, 1000, k).astype(np.uint64),
            "errors": rng.integers(0, 3, k).astype(np.uint64),
            "completed": rng.integers(1, 1000, k).astype(np.uint64),
            "total_latency_ns": rng.integers(1000, 10**7, k).astype(np.uint64),
            "latency_log2_hist": pl.Series(rng.integers(0, 50, (k, 32)).astype(np.uint64)).cast(
                pl.List(pl.UInt64)
            ),
        }
    )
    samples = int(duration_s * 10)
    t = np.repeat(T0 + np.arange(samples) * 100_000, cpus).astype(np.uint64)
    step = np.repeat(np.arange(samples), cpus).astype(np.uint64)
    tables["perf_counters"] = pl.DataFrame(
        {
            "ts_uptime_us": t,
            "cpu": np.tile(np.arange(cpus), samples).astype(np.uint32),
            **{
                f"{e}{suffix}": step * 100_000_000
                for e in ("task_clock_ns", "context_switches", "minor_faults")
                for suffix in ("", "_enabled_ns", "_running_ns")
            },
        }
    ).rename({"task_clock_ns_enabled_ns": "task_clock_enabled_ns",
              "task_clock_ns_running_ns": "task_clock_running_ns"})  # fmt: skip
    gib = 1 << 30
    tables["memory_usage"] = pl.DataFrame(
        {
            "ts_uptime_us": T0 + np.arange(samples) * 100_000,
            **{c: rng.integers(gib, 8 * gib, samples) for c in MEMINFO},
        }
    )
    from kernmlops.collect.manifest import write_manifest

    for name, frame in tables.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        frame.with_columns(collection_id=pl.lit("bench")).write_parquet(
            folder / name / "part-00000.parquet"
        )
    write_manifest(
        folder,
        {
            "collection_id": "bench",
            "benchmark": {"name": "bench", "pid": None},
            "system": {"logical_cpus": cpus},
            "hooks": {},
        },
    )
    return {name: frame.height for name, frame in tables.items()}


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def measure(folder: Path, with_report: bool) -> dict[str, Any]:
    """Scan, load, draw every graph, write the report; the times and this process's
    peak RSS (run it in a fresh process)."""
    from kernmlops.data import read_collection
    from kernmlops.graphs import graph_registry, load, report
    from kernmlops.graphs._render import draw, png_bytes

    col, read_s, read_cpu = timed(lambda: read_collection(folder, lazy=True))
    data, load_s, load_cpu = timed(lambda: load(col))
    results: dict[str, Any] = {"read_s": read_s, "load_s": load_s, "graphs": {}}
    print(f"{'step':<26}{'wall s':>9}{'cpu s':>9}{'png KiB':>9}")
    print(f"{'read_collection (lazy)':<26}{read_s:>9.2f}{read_cpu:>9.2f}")
    print(f"{'load (names, markers)':<26}{load_s:>9.2f}{load_cpu:>9.2f}")
    graphs_wall = 0.0
    for name, graph in graph_registry().items():
        if not graph.applies(data.tables):
            continue
        png, wall, cpu = timed(lambda graph=graph: png_bytes(draw(graph, data)))
        graphs_wall += wall
        results["graphs"][name] = {"wall_s": wall, "cpu_s": cpu, "png_bytes": len(png)}
        print(f"{name:<26}{wall:>9.2f}{cpu:>9.2f}{len(png) / 1024:>9.0f}")
    print(f"{'all graphs':<26}{graphs_wall:>9.2f}")
    results["all_graphs_s"] = graphs_wall
    if with_report:
        page, wall, cpu = timed(lambda: report([folder], folder.parent / "report.html"))
        results["report_s"] = wall
        results["report_bytes"] = page.stat().st_size
        print(f"{'report (scan + draw)':<26}{wall:>9.2f}{cpu:>9.2f}"
              f"{page.stat().st_size / 1024:>9.0f}")  # fmt: skip
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


def _in_child(fn, *args: Any) -> Any:
    """``fn(*args)`` in a fresh process (spawned: nothing of this one's memory)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(fn, *args).result()


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument(
        "--scale",
        default="1",
        help="rows x this (1: ~10M rows); several, comma-separated, run one after another",
    )
    ap.add_argument("--duration", type=float, default=300.0, help="seconds the data spans")
    ap.add_argument("--cpus", type=int, default=16, help="CPUs in the synthetic machine")
    ap.add_argument("--no-report", action="store_true", help="skip the HTML report")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "graphs.json")
    args = ap.parse_args(argv)
    scales = [float(x) for x in args.scale.split(",") if x.strip()]

    runs = []
    for scale in scales:
        with tempfile.TemporaryDirectory(prefix="kmo-graphs-") as tmp:
            folder = Path(tmp) / "curated" / "benchmark=bench" / "collection_id=bench"
            rows, build_s, _ = timed(
                lambda scale=scale, folder=folder: _in_child(
                    build, folder, scale, args.duration, args.cpus
                )
            )
            total_rows = sum(rows.values())
            print(f"scale {scale:g}: synthetic collection of {total_rows:,} rows "
                  f"in {build_s:.1f} s")  # fmt: skip
            run = {"scale": scale, "rows": rows, "total_rows": total_rows}
            run.update(_in_child(measure, folder, not args.no_report))
        total = run["read_s"] + run["load_s"] + run["all_graphs_s"]
        verdict = "PASS" if total <= 60 * max(scale, 1) else "FAIL"
        print(f"peak RSS {run['peak_rss_mib']:.0f} MiB; read + load + every graph "
              f"{total:.1f} s (target <= 60 s for ~10M rows): {verdict}\n")  # fmt: skip
        runs.append(run)
    if len(runs) > 1:
        print(f"{'rows':>14}{'all graphs s':>14}{'report s':>10}{'peak RSS MiB':>14}")
        for run in runs:
            report_s = run.get("report_s", float("nan"))
            print(f"{run['total_rows']:>14,}{run['all_graphs_s']:>14.1f}{report_s:>10.1f}"
                  f"{run['peak_rss_mib']:>14.0f}")  # fmt: skip
    # the first run's figures at the top (the target's 10M rows by default), as one
    # scale's file has them; every run's in "runs"
    results = {**runs[0], "runs": runs} if len(runs) > 1 else runs[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args.out, results)
    print(f"wrote {args.out}")
