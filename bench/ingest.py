"""Ring-buffer ingest benchmark: how many events/s reach user space, at what CPU cost.

A BPF program on sys_enter (bench/ingest.bpf.c) streams one 32-byte record per
getppid() of a load generator (bench/storm.c) through a KMO_RING ring buffer.
The generator storms at a controlled rate; for every (reader, rate) pair this
reports events drained per second, drops (the object's ``drops`` map) and the
reader's CPU time. Readers:

* ``drain``: kernmlops RingBuffer.drain() every 10 ms, counting only;
* ``parquet``: the same, then records_to_frame and ParquetSink.write (checks
  that the Parquet files hold exactly the drained rows);
* ``callback``: libbpf's ring_buffer__new with a per-event ctypes callback
  that struct.unpack()s each record, consumed every 10 ms
  (ring_buffer__consume: records are submitted with BPF_RB_NO_WAKEUP, so
  ring_buffer__poll would never be woken);
* ``callback-poll`` (optional): the same callback, but records are submitted
  with wake-ups and read with ring_buffer__poll (epoll), libbpf's usual way.

Needs root. Run: ``sudo .venv/bin/python bench/ingest.py --help``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
BUILD = BENCH / "build"
RING = "ingest_rb"
TABLE = "ingest"
READERS = ("drain", "parquet", "callback", "callback-poll")


# --- building ------------------------------------------------------------------------
def _stale(out: Path, *srcs: Path) -> bool:
    return not out.exists() or any(s.stat().st_mtime > out.stat().st_mtime for s in srcs)


def build() -> tuple[Path, Path]:
    """Compile the load generator (gcc) and the BPF object (kernmlops' build)."""
    from kernmlops.ebpf.build import SOURCE_DIR, compile_object

    storm, obj = BUILD / "storm", BUILD / "ingest.bpf.o"
    BUILD.mkdir(exist_ok=True)
    if _stale(storm, BENCH / "storm.c"):
        cmd = ["gcc", "-O2", "-Wall", "-pthread", "-o", str(storm), str(BENCH / "storm.c")]
        subprocess.run(cmd, check=True)
    if _stale(obj, BENCH / "ingest.bpf.c", *SOURCE_DIR.glob("*.h")):
        compile_object(BENCH / "ingest.bpf.c", obj)
    return storm, obj


# --- readers ---------------------------------------------------------------------------
class Reader:
    """Consumes the ring; ``poll`` is called every period, ``close`` once at the end."""

    timer = True  # False: poll() blocks by itself (epoll), no sleep between calls

    def poll(self) -> int:
        """Consume what is there; return the number of records taken."""
        raise NotImplementedError

    def close(self) -> dict[str, int]:
        """Release everything; return extra facts (e.g. rows written)."""
        return {}


class DrainReader(Reader):
    """kernmlops RingBuffer.drain(): numpy batches, counted and thrown away."""

    def __init__(self, map_fd: int, size: int, layout) -> None:
        from kernmlops.ebpf.ringbuf import RingBuffer

        self.ring = RingBuffer(map_fd, size, layout.dtype, RING)
        self.layout = layout

    def poll(self) -> int:
        return len(self.ring.drain())

    def close(self) -> dict[str, int]:
        self.ring.close()
        return {}


class ParquetReader(DrainReader):
    """drain() -> records_to_frame -> ParquetSink.write, as a BPF hook feeds a session."""

    def __init__(self, map_fd: int, size: int, layout) -> None:
        from kernmlops.collect.sinks import ParquetSink

        super().__init__(map_fd, size, layout)
        self.dir = Path(tempfile.mkdtemp(prefix="kmo-ingest-"))
        self.sink = ParquetSink(self.dir, "ingest-bench")

    def poll(self) -> int:
        from kernmlops.ebpf.frames import records_to_frame

        records = self.ring.drain()
        if len(records):
            self.sink.write(TABLE, records_to_frame(records, self.layout))
        return len(records)

    def close(self) -> dict[str, int]:
        import pyarrow.parquet as pq

        rows = self.sink.close().get(TABLE, 0)
        super().close()
        # Count what is really in the files, not what the sink says it wrote.
        in_files = sum(pq.ParquetFile(f).metadata.num_rows for f in self.dir.rglob("*.parquet"))
        size = sum(f.stat().st_size for f in self.dir.rglob("*.parquet"))
        shutil.rmtree(self.dir, ignore_errors=True)
        return {"rows_written": rows, "rows_in_files": in_files, "parquet_bytes": size}


# libbpf's callback API, declared here on a private handle of the same library.
_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def _libbpf_ringbuf_api() -> ctypes.CDLL:
    from kernmlops.ebpf.libbpf import lib as shared

    lib = ctypes.CDLL(shared._name, use_errno=True)
    lib.ring_buffer__new.restype = ctypes.c_void_p
    lib.ring_buffer__new.argtypes = [ctypes.c_int, _SAMPLE_FN, ctypes.c_void_p, ctypes.c_void_p]
    lib.ring_buffer__poll.restype = ctypes.c_int
    lib.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.ring_buffer__consume.restype = ctypes.c_int
    lib.ring_buffer__consume.argtypes = [ctypes.c_void_p]
    lib.ring_buffer__free.restype = None
    lib.ring_buffer__free.argtypes = [ctypes.c_void_p]
    return lib


class CallbackReader(Reader):
    """libbpf ring_buffer__consume on a timer, one Python call + struct.unpack per record."""

    def __init__(self, map_fd: int, size: int, layout) -> None:
        self.lib = _libbpf_ringbuf_api()
        unpack = struct.Struct("<QIIqII").unpack  # struct ingest_event
        assert layout.itemsize == 32
        self.count = 0
        self.last: tuple = ()

        def sample(_ctx: int, data: int, size: int) -> int:
            self.last = unpack(ctypes.string_at(data, size))
            self.count += 1
            return 0

        self._cb = _SAMPLE_FN(sample)  # keep a reference: libbpf holds the pointer
        self.rb = self.lib.ring_buffer__new(map_fd, self._cb, None, None)
        if not self.rb:
            raise OSError(ctypes.get_errno(), "ring_buffer__new failed")

    def _consume(self) -> int:
        return self.lib.ring_buffer__consume(self.rb)

    def poll(self) -> int:
        before = self.count
        rc = self._consume()
        if rc < 0:
            raise OSError(-rc, "ring_buffer__consume/poll failed")
        return self.count - before

    def close(self) -> dict[str, int]:
        self.lib.ring_buffer__free(self.rb)
        return {}


class CallbackPollReader(CallbackReader):
    """The same callback, woken through epoll (ring_buffer__poll, 10 ms timeout)."""

    timer = False

    def _consume(self) -> int:
        return self.lib.ring_buffer__poll(self.rb, 10)


MAKERS: dict[str, Callable[..., Reader]] = {
    "drain": DrainReader,
    "parquet": ParquetReader,
    "callback": CallbackReader,
    "callback-poll": CallbackPollReader,
}


# --- one run ---------------------------------------------------------------------------
@dataclass
class Run:
    reader: str
    offered_per_s: float  # 0: as fast as the generator goes
    generated: int = 0  # getppid() calls the generator made
    generated_per_s: float = 0.0
    seen: int = 0  # calls the BPF program saw (per-CPU counter)
    drained: int = 0
    drained_per_s: float = 0.0
    drops: int = 0
    reader_cpu_s: float = 0.0
    reader_cpu_pct: float = 0.0  # of one core, over the storm
    wall_s: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        """Every event accounted for (and, for Parquet, every row in the files)."""
        ok = self.seen == self.generated == self.drained + self.drops
        if "rows_in_files" in self.extra:
            ok = ok and self.extra["rows_in_files"] == self.extra["rows_written"] == self.drained
        return ok


def run_one(
    storm: Path,
    obj_path: Path,
    reader_name: str,
    rate: float,
    args: argparse.Namespace,
) -> Run:
    from kernmlops.ebpf.btf import ring_layouts
    from kernmlops.ebpf.objects import open_and_load

    layout = ring_layouts(obj_path)[RING]
    ring_size = args.ring_mib << 20
    pin_gen = set(range(1, os.cpu_count() or 1)) if args.pin else None
    gen = subprocess.Popen(
        [str(storm), str(rate), str(args.duration), str(args.threads), str(args.batch)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, pin_gen)) if pin_gen else None,
    )
    assert gen.stdin is not None and gen.stdout is not None
    _, tgid, nr = gen.stdout.readline().split()
    obj = open_and_load(
        obj_path,
        globals_={
            "target_tgid": int(tgid),
            "target_syscall": int(nr),
            "wakeup": reader_name == "callback-poll",
        },
        max_entries={RING: ring_size},
    )
    run = Run(reader_name, rate)
    try:
        obj.attach_all()
        reader = MAKERS[reader_name](obj.map(RING).fd, ring_size, layout)
        period = args.poll_ms / 1000
        cpu0, t0 = time.process_time(), time.monotonic()
        gen.stdin.write("go\n")
        gen.stdin.flush()
        while gen.poll() is None:
            tick = time.monotonic()
            run.drained += reader.poll()
            if reader.timer:
                time.sleep(max(0.0, period - (time.monotonic() - tick)))
        while (n := reader.poll()) > 0:  # what is left once the storm is over
            run.drained += n
        run.extra = reader.close()  # the Parquet footer and last row groups count too
        run.reader_cpu_s = time.process_time() - cpu0
        run.wall_s = time.monotonic() - t0
        _, count, elapsed = gen.stdout.read().split()
        run.generated, gen_s = int(count), float(elapsed)
        run.generated_per_s = run.generated / gen_s
        run.drained_per_s = run.drained / gen_s
        run.reader_cpu_pct = 100 * run.reader_cpu_s / run.wall_s
        run.seen = int(obj.map("seen").lookup_percpu(0).sum())
        run.drops = int(obj.map("drops").lookup_percpu(0).sum())
    finally:
        if gen.poll() is None:
            gen.kill()
        gen.wait()
        obj.close()
    return run


# --- report ----------------------------------------------------------------------------
def _rate(x: float) -> str:
    return "max" if x == 0 else f"{x / 1e6:g}M"


def parse_rates(text: str) -> list[float]:
    """'0.5,1,2,max' (millions per second) -> [500000.0, 1e6, 2e6, 0.0]."""
    return [0.0 if r.strip() == "max" else float(r) * 1e6 for r in text.split(",") if r.strip()]


def show(runs: list[Run]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ring-buffer ingest (32-byte records)", title_justify="left")
    for col in ("reader", "offered", "generated/s", "drained/s", "drops", "drop %", "reader CPU"):
        table.add_column(col, justify="left" if col == "reader" else "right")
    table.add_column("accounted")
    for r in runs:
        pct = 100 * r.drops / r.seen if r.seen else 0.0
        table.add_row(
            r.reader,
            _rate(r.offered_per_s),
            f"{r.generated_per_s / 1e6:.2f}M",
            f"{r.drained_per_s / 1e6:.2f}M",
            f"{r.drops:,}",
            f"{pct:.1f}",
            f"{r.reader_cpu_pct:.1f}%",
            "yes" if r.consistent else "[red]NO[/]",
        )
    Console().print(table)


def targets(runs: list[Run]) -> dict[str, dict]:
    """The README's targets, judged on these runs."""

    def best(reader: str) -> float:
        ok = [r.drained_per_s for r in runs if r.reader == reader and not r.drops and r.consistent]
        return max(ok, default=0.0)

    def cpu_at_1m(reader: str) -> float | None:
        at = [r.reader_cpu_pct for r in runs if r.reader == reader and r.offered_per_s == 1e6]
        return at[0] if at else None

    out: dict[str, dict] = {
        "drain >= 5M/s, 0 drops": {"value": best("drain"), "ok": best("drain") >= 5e6},
        "parquet >= 2M/s, 0 drops": {"value": best("parquet"), "ok": best("parquet") >= 2e6},
    }
    for reader in ("drain", "parquet"):
        cpu = cpu_at_1m(reader)
        if cpu is not None:
            out[f"{reader} CPU <= 25% at 1M/s"] = {"value": cpu, "ok": cpu <= 25}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--readers", default="drain,parquet,callback", help=f"comma-separated, of {READERS}"
    )
    parser.add_argument(
        "--rates", default="0.5,1,2,3,4,5,max", help="offered rates, millions/s ('max': no limit)"
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    parser.add_argument("--ring-mib", type=int, default=32, help="ring size (power of two)")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="drain period")
    parser.add_argument("--threads", type=int, default=1, help="generator threads")
    parser.add_argument("--batch", type=int, default=512, help="syscalls between rate checks")
    parser.add_argument(
        "--pin", action="store_true", help="reader on CPU 0, generator on the other CPUs"
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "ingest.json")
    args = parser.parse_args(argv)
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    for r in readers:
        if r not in READERS:
            parser.error(f"unknown reader {r!r}; choose from {', '.join(READERS)}")
    if args.ring_mib < 1 or args.ring_mib & (args.ring_mib - 1):
        parser.error("--ring-mib must be a power of two")
    if os.geteuid() != 0:
        parser.error("needs root to load BPF programs")
    if args.pin:
        os.sched_setaffinity(0, {0})

    storm, obj = build()
    runs: list[Run] = []
    for reader in readers:
        for rate in parse_rates(args.rates):
            run = run_one(storm, obj, reader, rate, args)
            runs.append(run)
            print(
                f"{reader:>13} {_rate(rate):>5}: drained {run.drained_per_s / 1e6:.2f}M/s, "
                f"drops {run.drops:,}, reader {run.reader_cpu_pct:.1f}% CPU",
                file=sys.stderr,
            )
    show(runs)
    verdict = targets(runs)
    for name, v in verdict.items():
        value = f"{v['value'] / 1e6:.2f}M/s" if "/s," in name else f"{v['value']:.1f}%"
        print(f"{'PASS' if v['ok'] else 'FAIL'}  {name}: {value}")

    from kernmlops.ebpf import libbpf

    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "ingest",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "libbpf": libbpf.version(),
            "python": platform.python_version(),
        },
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "runs": [{**asdict(r), "consistent": r.consistent} for r in runs],
        "targets": verdict,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
