"""Capacity: how many records per second one reader core moves, ring -> spool and
spool -> Parquet, so the machine size where the collector stops keeping up is known.

The producer is not a workload but the kernel itself at full speed: ``capacity.bpf.c``
sends quanta_runtime's batches (64 records of 32 bytes) from a BPF_PROG_TEST_RUN
loop on one CPU, as fast as the ring takes them. Its batches are real: records of a
short ``stress-ng --switch`` storm on this machine, collected first through the hook
itself (4,096 batches, 8.5 MB: more than a frame holds, so compression sees real
data, not a frame repeating itself).

Stages, each measured on its own (rounds of ``--seconds``):

* ``spool-memory``: the native copier (kernmlops.ebpf.copier), pinned to a CPU of its
  own, copies the ring into a tmpfs segment (a collection's first
  ``collector.spool_memory_mib``);
* ``spool-disk``: the same into zstd frames on the collection's disk (past the memory
  budget), the records byte-shuffled at their 32 bytes first, as a hook's spool does
  (kernmlops.spool.frames.shuffle), the segment allocated ahead by the runway thread
  (``collector.spool_runway_s``'s default; its CPU is counted with the copier's);
  ``spool-disk-plain``: the same frames not shuffled (as before), and
  ``spool-disk-no-runway``: shuffled, each write allocating its blocks itself (as
  before the runway), in the same rounds;
* ``spool-memory-2``: ring groups (``hooks.<hook>.ring_groups``): two rings, each
  filled by its own producer and moved by its own copier (one per CPU), into one
  tmpfs spool that both write (a frame each under the spool's lock). On 2 CPUs the
  producers and copiers share the CPUs, so the wall rate says little; the records
  per copier CPU-second say what the shared spool costs each copier (against
  ``spool-memory``'s one);
* ``parquet``: the disk spool read back, split into quanta_runtime and
  quanta_queued_time rows and written by ParquetSink, as a collection makes them
  while it runs (plain parts; ``compaction_s``: what compacting them at stop costs);
* ``parquet-workers``: the same spool made into compact parts by the stop's row
  workers (kernmlops.collect.rowmaking, one per CPU: ``--row-workers``), start-up
  of the processes included; their CPU is the workers' own.

Per stage: records/s on the wall clock, records per second of the reader's own CPU
time (its capacity per core), MB/s of ring bytes, and whether the producer ever found
the ring three quarters full (the reader fell behind). Then the prediction: the
records/s a storm makes at N cores (``--per-core-rate``, default: the 16-core
machine's 8.03M switches/s over 16 CPUs) against the capacity: the reader cores
the copy needs, and the seconds N row workers take at stop per second of storm.

Run (root; clang and bpftool as for ``make bpf``):

    sudo python -m bench capacity --rounds 3 --seconds 3
"""

from __future__ import annotations

import ctypes
import math
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import harness
from bench.harness import save
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.rowmaking import make_spooled_rows
from kernmlops.config import CollectorConfig
from kernmlops.ebpf.btf import unbatch
from kernmlops.ebpf.build import compile_object, default_build_dir
from kernmlops.ebpf.copier import Copier
from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.ebpf.ringbuf import record_stride
from kernmlops.hooks.base import HookContext
from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook
from kernmlops.spool.copy import SYNC_BYTES, RingSpool
from kernmlops.spool.frames import FRAME_RAW
from kernmlops.spool.jobs import SpoolWork
from kernmlops.spool.memory import SpoolMemory

BENCH = Path(__file__).resolve().parent

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "≥ 20M records/s into the spool per reader core (2 vCPUs)"

RING = 1 << 24
#: real batches the producer cycles over: 8.5 MB, more than a frame (1-8 MiB)
TEMPLATES = 4096
RECORDS_PER_BATCH = 64
#: the 16-core machine's storm: 8.03M switches/s untraced on 16 CPUs (issue, device-bench)
PER_CORE_RATE = 8.03e6 / 16


def real_batches(storm: list[str]) -> tuple[bytes, np.dtype, object]:
    """TEMPLATES full batches of quanta records from a real storm on this machine."""
    hook = QuantaRuntimeHook()
    with tempfile.TemporaryDirectory() as tmp:
        hook.start(HookContext("capacity", None, os.getpid(), spool_dir=Path(tmp)))
        subprocess.run(storm, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        hook.detach()
        hook._stop_copier()  # its last copy: the ring is in the spool
        layout = hook.readers()["quanta_switch"][1]
        batches = []
        spool = hook._spools["quanta_switch"]
        for records in spool.records(layout.batch):
            batches.append(records[records["n"] == RECORDS_PER_BATCH])
        hook.close()
    # concatenate drops a structured dtype's padding: back to the ring's layout
    full = np.concatenate(batches).astype(layout.batch)
    if len(full) < TEMPLATES:
        raise SystemExit(f"the storm made {len(full)} full batches, {TEMPLATES} needed")
    return full[:TEMPLATES].tobytes(), layout.batch, layout


def producer(bpf_dir: Path, batch_bytes: int, templates: bytes):
    """The producer object, built once per batch size into bench/build/ (carry it to a
    machine without clang)."""
    src = BENCH / "capacity.bpf.c"
    obj_path = BENCH / "build" / f"capacity-{batch_bytes}-{TEMPLATES}.bpf.o"
    if not obj_path.exists() or obj_path.stat().st_mtime < src.stat().st_mtime:
        flags = (f"-DBATCH_BYTES={batch_bytes}", f"-DTEMPLATES={TEMPLATES}")
        compile_object(src, obj_path, vmlinux_dir=bpf_dir, cflags=flags)
    obj = open_and_load(obj_path, max_entries={"rb": RING})
    tmpl = obj.map("templates")
    for i in range(TEMPLATES):
        tmpl.update(i, templates[i * batch_bytes : (i + 1) * batch_bytes])
    return obj


def state(obj) -> dict[str, int]:
    raw = obj.map("state").lookup(0)
    sent, full, steps, _ = np.frombuffer(raw[:32], "<u8")
    return {"sent": int(sent), "full": int(full), "steps": int(steps)}


def run_producer(obj, seconds: float, cpu: int) -> None:
    """Test runs on ``cpu`` until ``seconds`` passed."""
    os.sched_setaffinity(0, {cpu})
    opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
    fd = obj.programs["produce"].fd
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts)) != 0:
            raise OSError(ctypes.get_errno(), "BPF_PROG_TEST_RUN failed")


#: the runway a hook's copier has by default
RUNWAY_S = CollectorConfig.model_fields["spool_runway_s"].default


def stage_spool(obj, folder: Path, memory: SpoolMemory | None, itemsize: int, seconds: float,
                cpus: tuple[int, int], priority: int, workers: int = 0,
                shuffle: int = 0, runway_s: float = 0.0) -> dict:  # fmt: skip
    # what decodes the records (the row workers read it)
    info = {"hook": "quanta_runtime", "options": QuantaRuntimeHook.Options().model_dump(),
            "ring": "quanta_switch_rb",
            "object": str(default_build_dir() / "quanta_runtime.bpf.o")}  # fmt: skip
    spool = RingSpool(folder, "quanta_switch", itemsize, info, memory=memory, shuffle=shuffle)
    copier = Copier(interval_ms=250, budget=memory.budget if memory else None,
                    frame_raw=max(FRAME_RAW, workers * (512 << 10)), sync_bytes=SYNC_BYTES,
                    workers=workers, runway_s=runway_s)  # fmt: skip
    spool.attach(copier, copier.add("quanta_switch", obj.map("rb").fd, RING, shuffle=shuffle))
    copier.start(priority)
    tid = copier._thread.native_id  # type: ignore[union-attr]
    if not workers:  # zstd's workers inherit the copier's CPUs: leave them free
        os.sched_setaffinity(tid, {cpus[1]})
    before, cpu0, t0 = state(obj), copier.cpu_s, time.monotonic()
    copied0 = copier.rings[0].copied
    run_producer(obj, seconds, cpus[0])
    threads: dict[int, tuple[str, float]] = {}
    harness.thread_cpu(os.getpid(), threads)  # the runway thread, started by the copier's
    runway_cpu = sum(cpu for comm, cpu in threads.values() if comm == "kmo-runway")
    copier.stop()
    wall = time.monotonic() - t0
    cpu = copier.cpu_s - cpu0 + runway_cpu
    after = state(obj)
    copied = copier.rings[0].copied - copied0
    spool.detach()
    copier.close()
    batches = copied // record_stride(itemsize)
    on_disk = sum(p.stat().st_size for p in folder.glob("*.ring"))
    return {
        **_copy_rates(copied, itemsize, wall, cpu),
        "producer_found_full": after["full"] - before["full"],
        "sent_batches": after["sent"] - before["sent"],
        "copied_batches": int(batches),
        "disk_bytes": on_disk,
        "compression": round(copied / on_disk, 2) if on_disk and memory is None else None,
        "priority": copier.priority,
        "zstd_workers": copier.workers,
        "runway": copier.runway if runway_s else None,
        "runway_cpu_s": round(runway_cpu, 4),
    }, spool


def stage_spool_groups(objs: list, folder: Path, memory: SpoolMemory, itemsize: int,
                       seconds: float, priority: int) -> dict:  # fmt: skip
    """Ring groups: a ring per producer, a copier per ring (pinned to CPU i), one spool."""
    info = {"hook": "quanta_runtime", "ring": "quanta_switch_rb"}
    spool = RingSpool(folder, "quanta_switch", itemsize, info, memory=memory)
    copiers = [Copier(interval_ms=250, budget=memory.budget, frame_raw=FRAME_RAW,
                      sync_bytes=SYNC_BYTES) for _ in objs]  # fmt: skip
    rings = [
        c.add("quanta_switch", o.map("rb").fd, RING) for c, o in zip(copiers, objs, strict=True)
    ]
    spool.attach(copiers[0], rings[0], list(zip(copiers[1:], rings[1:], strict=True)))
    ncpu = os.cpu_count() or 1
    for i, c in enumerate(copiers):
        c.start(priority)
        os.sched_setaffinity(c._thread.native_id, {i % ncpu})  # type: ignore[union-attr]
    before = [state(o) for o in objs]
    cpu0, copied0, t0 = [c.cpu_s for c in copiers], [r.copied for r in rings], time.monotonic()
    producers = [threading.Thread(target=run_producer, args=(o, seconds, i % ncpu))
                 for i, o in enumerate(objs)]  # fmt: skip
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    for c in copiers:
        c.stop()
    wall = time.monotonic() - t0
    cpu = sum(c.cpu_s - c0 for c, c0 in zip(copiers, cpu0, strict=True))
    copied = sum(r.copied - c0 for r, c0 in zip(rings, copied0, strict=True))
    full = sum(state(o)["full"] - b["full"] for o, b in zip(objs, before, strict=True))
    spool.detach()
    for c in copiers:
        c.close()
    spool.close()
    spool.remove()
    return {"copiers": len(copiers), **_copy_rates(copied, itemsize, wall, cpu),
            "producer_found_full": full}  # fmt: skip


def _copy_rates(copied: int, itemsize: int, wall: float, cpu: float) -> dict:
    """Records (quanta batches' records) and rates of ``copied`` ring bytes moved in
    ``wall`` seconds with ``cpu`` seconds of the copiers' CPU."""
    records = copied // record_stride(itemsize) * RECORDS_PER_BATCH
    return {
        "records": records,
        "wall_s": round(wall, 3),
        "reader_cpu_s": round(cpu, 3),
        "records_per_s": round(records / wall),
        "records_per_reader_cpu_s": round(records / cpu) if cpu else None,
        "mb_per_s": round(copied / wall / 1e6, 1),
    }


class _Spooled:
    """What the stop's row making asks of a hook, on one spool; the spool is left
    unread, for the one-core stage after."""

    def __init__(self, spool: RingSpool) -> None:
        self.spool = spool
        self.events = 0

    def spool_work(self) -> list[SpoolWork]:
        return [SpoolWork(self.spool.folder, self.spool.key, self.spool.unread())]

    def spool_made(self, key: str, rows: dict[str, int], events: int) -> None:
        self.events = events


def stage_parquet_workers(spool: RingSpool, out: Path, workers: int) -> dict:
    """The disk spool -> compact parts in ``workers`` processes (as at a stop)."""
    hook = _Spooled(spool)
    sink = ParquetSink(out, "capacity", fast_parts=True)
    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = make_spooled_rows(
        [hook], sink, lambda: sink.flush(durable=True), None, min_raw=0, workers=workers
    )  # type: ignore[list-item]
    rows = sink.close()
    wall, c1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    records = hook.events
    return {
        "workers": workers,
        "made": bool(done),
        "records": records,
        "rows": sum(rows.values()),
        "wall_s": round(wall, 3),
        "reader_cpu_s": round(cpu, 3),
        "records_per_s": round(records / wall),
        "records_per_reader_cpu_s": round(records / cpu) if cpu else None,
        "parquet_bytes": sum(p.stat().st_size for p in out.rglob("*.parquet")),
    }


def stage_parquet(spool: RingSpool, layout, out: Path) -> dict:
    """The disk spool -> rows -> Parquet, on this thread (one core)."""
    hook = QuantaRuntimeHook()
    sink = ParquetSink(out, "capacity", fast_parts=True)
    t0, c0 = time.monotonic(), time.thread_time()
    records = rows = 0
    for batch in spool.records(layout.batch):
        recs = unbatch(batch, layout)
        records += len(recs)
        for table, frame in hook.rows_from("quanta_switch", recs, layout):
            sink.write(table, frame)
            rows += frame.num_rows
    sink.close()
    wall, cpu = time.monotonic() - t0, time.thread_time() - c0
    t1 = time.monotonic()
    sink.compact()
    compaction = time.monotonic() - t1
    return {
        "compaction_s": round(compaction, 3),
        "records": records,
        "rows": rows,
        "wall_s": round(wall, 3),
        "reader_cpu_s": round(cpu, 3),
        "records_per_s": round(records / wall),
        "records_per_reader_cpu_s": round(records / cpu),
        "parquet_bytes": sum(p.stat().st_size for p in out.rglob("*.parquet")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--priority", type=int, default=1, help="the copier's SCHED_FIFO priority")
    ap.add_argument("--workers", type=int, default=0, help="zstd workers in spool-disk")
    ap.add_argument("--row-workers", type=int, default=os.cpu_count() or 1,
                    help="processes in parquet-workers (default: one per CPU)")  # fmt: skip
    ap.add_argument("--storm", default="stress-ng --switch 2 -t 2",
                    help="the storm whose records the producer sends")  # fmt: skip
    ap.add_argument(
        "--per-core-rate",
        type=float,
        default=PER_CORE_RATE,
        help="records/s a storm makes per CPU (default: the 16-core machine's)",
    )
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "capacity.json")
    args = ap.parse_args(argv)
    ncpu = os.cpu_count() or 1
    cpus = (0, 1 % ncpu)
    bpf_dir = default_build_dir()
    templates, batch_dtype, layout = real_batches(args.storm.split())
    work = Path(tempfile.mkdtemp(prefix="kmo-capacity-"))
    shm = Path(tempfile.mkdtemp(prefix="kmo-capacity-", dir="/dev/shm"))
    obj = producer(bpf_dir, batch_dtype.itemsize, templates)
    second = producer(bpf_dir, batch_dtype.itemsize, templates)  # ring group 1's
    results: dict[str, list[dict]] = {
        "spool-memory": [], "spool-memory-2": [], "spool-disk": [], "spool-disk-plain": [],
        "spool-disk-no-runway": [], "parquet": [], "parquet-workers": [],
    }  # fmt: skip
    try:
        for r in range(args.rounds):
            mem_folder = shm / f"r{r}"
            mem_folder.mkdir()
            memory = SpoolMemory(mem_folder, limit=shutil.disk_usage(shm).free // 2)
            res, spool = stage_spool(obj, work / f"m{r}", memory, batch_dtype.itemsize,
                                     args.seconds, cpus, args.priority)  # fmt: skip
            spool.close()
            spool.remove()
            shutil.rmtree(mem_folder)
            results["spool-memory"].append(res)
            print("spool-memory", res, flush=True)
            mem_folder.mkdir()
            memory = SpoolMemory(mem_folder, limit=shutil.disk_usage(shm).free // 2)
            res = stage_spool_groups([obj, second], work / f"g{r}", memory,
                                     batch_dtype.itemsize, args.seconds, args.priority)  # fmt: skip
            shutil.rmtree(mem_folder)
            results["spool-memory-2"].append(res)
            print("spool-memory-2", res, flush=True)
            # the frames as before (not shuffled), then as a hook's spool writes them
            res, plain = stage_spool(obj, work / f"q{r}", None, batch_dtype.itemsize,
                                     args.seconds, cpus, args.priority, args.workers,
                                     runway_s=RUNWAY_S)  # fmt: skip
            plain.close()
            plain.remove()
            results["spool-disk-plain"].append(res)
            print("spool-disk-plain", res, flush=True)
            res, bare = stage_spool(obj, work / f"n{r}", None, batch_dtype.itemsize,
                                    args.seconds, cpus, args.priority, args.workers,
                                    shuffle=layout.dtype.itemsize)  # fmt: skip
            bare.close()
            bare.remove()
            results["spool-disk-no-runway"].append(res)
            print("spool-disk-no-runway", res, flush=True)
            res, spool = stage_spool(obj, work / f"d{r}", None, batch_dtype.itemsize,
                                     args.seconds, cpus, args.priority, args.workers,
                                     shuffle=layout.dtype.itemsize, runway_s=RUNWAY_S)  # fmt: skip
            results["spool-disk"].append(res)
            print("spool-disk", res, flush=True)
            res = stage_parquet_workers(spool, work / f"w{r}", args.row_workers)
            shutil.rmtree(work / f"w{r}")
            results["parquet-workers"].append(res)
            print("parquet-workers", res, flush=True)
            os.sched_setaffinity(0, {cpus[1]})
            pq = stage_parquet(spool, layout, work / f"p{r}")
            os.sched_setaffinity(0, set(range(ncpu)))
            spool.remove()
            shutil.rmtree(work / f"p{r}")
            results["parquet"].append(pq)
            print("parquet", pq, flush=True)
    finally:
        obj.close()
        second.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)

    def med(stage: str, key: str) -> float:
        return statistics.median(r[key] for r in results[stage] if r[key] is not None)

    summary = {
        stage: {
            "records_per_s": med(stage, "records_per_s"),
            "records_per_reader_cpu_s": med(stage, "records_per_reader_cpu_s"),
        }
        for stage in results
    }
    for stage in ("spool-disk", "spool-disk-plain", "spool-disk-no-runway"):
        summary[stage]["compression"] = med(stage, "compression")
    prediction = []
    for n in (2, 16, 32, 64, 192):
        need = n * args.per_core_rate
        row = {"cpus": n, "records_per_s": round(need)}
        for stage in ("spool-memory", "spool-disk"):
            capacity = summary[stage]["records_per_reader_cpu_s"]
            row[f"{stage}_reader_cores"] = round(need / capacity, 2)
        # the stop: n row workers make a storm's rows in this share of its length
        per_core = summary["parquet-workers"]["records_per_reader_cpu_s"]
        row["stop_s_per_storm_s"] = round(need / (n * per_core), 2)
        prediction.append(row)
    # the same three keys as before the harness; the harness adds its full record
    machine = {k: harness.machine()[k] for k in ("cpus", "kernel", "cpu_model")}
    # each median's interval over the rounds (order statistics; few rounds: the range)
    intervals = {
        stage: {
            key: harness.summarize([r[key] for r in results[stage] if r[key] is not None]).as_dict(
                3
            )
            for key in ("records_per_s", "records_per_reader_cpu_s")
        }
        for stage in results
    }
    out = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
           "rounds": results, "median": summary, "intervals": intervals, "prediction": prediction,
           "at": time.strftime("%Y-%m-%d")}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args.out, out)
    print("median", summary)
    for row in prediction:
        print("predict", row)
    print(f"wrote {args.out}")
    return 0 if math.isfinite(summary["spool-memory"]["records_per_s"]) else 1
