"""CPU cost of each stage of the ring buffer -> Parquet path, without the kernel.

Replays a synthetic ring of ingest records (the struct of bench/ingest.bpf.c)
through what a BPF hook does every poll: ringbuf.decode (the numpy batch
decode behind RingBuffer.drain), frames.records_to_table (Arrow, what the
collector's hooks hand over; records_to_frame, polars, beside it) and ParquetSink.write
(+ close) with zstd (the default) and snappy. Prints CPU milliseconds
per million records for each stage, best of ``--repeat``, so the live numbers
of bench/ingest.py can be explained (and a src change checked) on a machine
that other people are using. No root needed (clang is, to build the object).

Run: ``python -m bench stages --help``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import harness, ingest
from bench.harness import save

BENCH = Path(__file__).resolve().parent

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; CPU per million records of each ring → Parquet stage"

# The allocator the kernmlops command picks (cli.main), read when pyarrow loads.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")


def synthetic_ring(dtype: np.dtype, size: int, count: int) -> np.ndarray:
    """A ring's data area (mapped twice, 2 * size bytes) holding ``count`` committed records."""
    from kernmlops.ebpf.ringbuf import HEADER_SIZE, record_stride

    stride = record_stride(dtype.itemsize)
    data = np.zeros(2 * size, np.uint8)
    rows = data[: count * stride].reshape(count, stride)
    rows[:, :4] = np.frombuffer(np.uint32(dtype.itemsize).tobytes(), np.uint8)
    rec = np.zeros(count, dtype)
    rng = np.random.default_rng(0)
    rec["ts_uptime_ns"] = 10**12 + np.cumsum(rng.integers(150, 250, count))
    rec["pid"] = rec["tgid"] = 4242
    rec["syscall_id"] = 110
    rec["cpu"] = rng.integers(0, 2, count)
    rec["seq"] = np.arange(count)
    rows[:, HEADER_SIZE : HEADER_SIZE + dtype.itemsize] = rec.view(np.uint8).reshape(count, -1)
    return data


def best_cpu(fn: Callable[[], object], repeat: int) -> float:
    """Least process CPU seconds of ``repeat`` calls (threads included)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__, defaults_in_help=True)
    parser.add_argument("--records", type=int, default=2_000_000, help="records per stage")
    parser.add_argument(
        "--batch", type=int, default=10_000, help="records per poll (10k: 1M/s every 10 ms)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="best of this many")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "stages.json")
    args = parser.parse_args(argv)

    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.ebpf.frames import records_to_frame, records_to_table
    from kernmlops.ebpf.ringbuf import decode, record_stride
    from kernmlops.ebpf.spec import ring_layouts

    _, obj = ingest.build()
    layout = ring_layouts(obj)[ingest.RING]
    size = 32 << 20
    stride = record_stride(layout.itemsize)
    per_pass = (size // stride) // args.batch * args.batch
    data = synthetic_ring(layout.dtype, size, per_pass)

    def decode_all() -> list[np.ndarray]:
        out, cons, left = [], 0, args.records
        while left > 0:
            n = min(args.batch, left)
            if cons + n * stride > per_pass * stride:
                cons = 0  # start the synthetic ring over
            batch = decode(data, size, cons, cons + n * stride, layout.dtype)
            out.append(batch.records)
            cons, left = batch.consumed, left - n
        return out

    batches = decode_all()
    frames = [records_to_table(b, layout) for b in batches]

    sizes: dict[int, int] = {}  # id(run) -> Parquet bytes written

    def sink_run(make: Callable[[Path], ParquetSink]) -> Callable[[], None]:
        def run() -> None:
            folder = Path(tempfile.mkdtemp(prefix="kmo-stages-"))
            try:
                sink = make(folder)
                for f in frames:
                    sink.write(ingest.TABLE, f)
                sink.close()
                sizes[id(run)] = sum(p.stat().st_size for p in folder.rglob("*.parquet"))
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        return run

    stages: dict[str, Callable[[], object]] = {
        "decode (RingBuffer.drain)": decode_all,
        "records_to_table (Arrow)": lambda: [records_to_table(b, layout) for b in batches],
        "records_to_frame (polars)": lambda: [records_to_frame(b, layout) for b in batches],
        "ParquetSink zstd (default)": sink_run(lambda d: ParquetSink(d, "stages")),
        "ParquetSink snappy": sink_run(lambda d: ParquetSink(d, "stages", compression="snappy")),
        "ParquetSink none": sink_run(lambda d: ParquetSink(d, "stages", compression="none")),
    }
    sink_run(lambda d: ParquetSink(d, "warm-up"))()  # first-use costs out of the way

    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"CPU per 1M records, {args.batch:,}-record polls, best of {args.repeat}",
        title_justify="left",
    )
    table.add_column("stage")
    table.add_column("ms CPU / 1M records", justify="right")
    table.add_column("one core's limit", justify="right")
    table.add_column("Parquet bytes/row", justify="right")
    results = {}
    for name, fn in stages.items():
        ms = 1000 * best_cpu(fn, args.repeat) * 1e6 / args.records
        per_row = sizes[id(fn)] / args.records if id(fn) in sizes else None
        results[name] = {"ms_per_1M": round(ms, 1), "bytes_per_row": per_row}
        size = f"{per_row:.2f}" if per_row is not None else "-"
        table.add_row(name, f"{ms:.1f}", f"{1e3 / ms:.1f}M/s", size)
    Console(width=110).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {**vars(args), "out": str(args.out)}
    save(args.out, {"settings": settings, "stages": results}, indent=None)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
