"""Exporter benchmark: scrape time of ~1,000 series, and CPU while idle.

Targets: a scrape of 1,000 series in at most 5 ms (median);
the exporter's CPU between scrapes below 1 % of a core.

Scrape: the exporter is loaded in this process with one set, restricted to an
idle process (``--tgid`` of a ``sleep``), so the kernel adds nothing; its map is
then filled from user space with synthetic keys:

* ``counters``: set syscalls_comm, 1,000 (comm, syscall) keys -> 1,000 series;
* ``histograms``: set biolatency, 34 (device, op) keys x 30 series each
  (28 buckets, _sum, _count) -> 1,020 series.

Each is scraped over HTTP from the exporter's server (the whole request:
connect, read and decode the maps, write the text, transfer) and in process
(``Exporter.render()``: wall and thread CPU time). The first scrape decodes
every key and is reported apart (cold); later ones find the labels cached.

Idle: ``kernmlops export`` (every default set, system-wide) runs as a child;
its CPU time (user + system, from /proc) is read over a window with no scrape,
then over a window with one scrape a second, as Prometheus would. BPF program
time is spent by the traced tasks, not the exporter, and is not in this number.

Needs root and the built objects (``kernmlops build-bpf``).
Run: ``sudo python -m bench exporter [--scrapes 200] [--idle-s 30]``.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from bench import harness
from bench.harness import save
from kernmlops.ebpf import libbpf
from kernmlops.exporter.config import resolve_sets
from kernmlops.exporter.core import Exporter, JobFilter
from kernmlops.exporter.server import MetricsServer

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "1,000 series scraped in ≤ 5 ms (median); exporter CPU ≤ 1% of a core"

BENCH = Path(__file__).resolve().parent
TARGET_SCRAPE_MS = 5.0
TARGET_IDLE_PCT = 1.0


def percpu(value: int) -> bytes:
    """A per-CPU u64 value: the same count on CPU 0, zero elsewhere."""
    ncpu = libbpf.num_possible_cpus()
    return value.to_bytes(8, "little") + bytes(8 * (ncpu - 1))


def fill_counters(exporter: Exporter, n: int) -> None:
    bpf_map = exporter.sets[0].obj.map("syscalls_total")  # type: ignore[union-attr]
    for i in range(n):
        comm = f"bench-{i // 40:04d}".encode().ljust(16, b"\0")
        key = comm + (i % 40).to_bytes(4, "little")
        bpf_map.update(key, percpu(1000 + i))


def fill_histograms(exporter: Exporter, n: int) -> None:
    bpf_map = exporter.sets[0].obj.map("block_io_latency")  # type: ignore[union-attr]
    words = bpf_map.value_size // 8  # 28 slots and the sum
    stride = bpf_map.value_size
    ncpu = libbpf.num_possible_cpus()
    for i in range(n):
        key = ((8 << 20) | i).to_bytes(4, "little") + (i % 2).to_bytes(4, "little")
        slots = [(i + s) % 7 for s in range(words - 1)]
        one = b"".join(v.to_bytes(8, "little") for v in [*slots, sum(slots) * 100])
        bpf_map.update(key, one + bytes(stride * (ncpu - 1)))


def summary(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values_s)
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
        "min_ms": round(ms[0], 3),
        "max_ms": round(ms[-1], 3),
    }


def scrape_case(name: str, set_name: str, keys: int, scrapes: int, idle_pid: int) -> dict:
    exporter = Exporter(resolve_sets([set_name]), job=JobFilter(tgid=idle_pid))
    try:
        (status,) = exporter.start()
        if status.error:
            raise SystemExit(f"{set_name}: {status.error}")
        (fill_counters if name == "counters" else fill_histograms)(exporter, keys)
        t0 = time.perf_counter()
        first = exporter.render()
        cold_s = time.perf_counter() - t0
        series = sum(
            1
            for line in first.decode().splitlines()
            if line and not line.startswith(("#", "kernmlops_exporter_"))
        )
        wall, cpu = [], []
        for _ in range(scrapes):
            t0, c0 = time.perf_counter(), time.thread_time()
            exporter.render()
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - t0)
        with MetricsServer(exporter.render, "127.0.0.1", 0) as server:
            http = []
            for _ in range(scrapes):
                t0 = time.perf_counter()
                with urllib.request.urlopen(server.url, timeout=10) as resp:
                    body = resp.read()
                http.append(time.perf_counter() - t0)
        return {
            "set": set_name,
            "series": series,
            "body_bytes": len(body),
            "cold_first_scrape_ms": round(cold_s * 1000, 3),
            "render_wall": summary(wall),
            "render_cpu": summary(cpu),
            "http": summary(http),
        }
    finally:
        exporter.close()


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def idle_case(idle_s: float) -> dict:
    port = 19000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}/metrics"
    child = subprocess.Popen(
        [sys.executable, "-m", "kernmlops.exporter", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the exporter did not start") from None
                time.sleep(0.2)
        proc = psutil.Process(child.pid)
        time.sleep(2)  # let the start settle
        c0, t0 = cpu_s(proc), time.monotonic()
        time.sleep(idle_s)
        idle = (cpu_s(proc) - c0) / (time.monotonic() - t0) * 100
        c0, t0 = cpu_s(proc), time.monotonic()
        sizes = []
        while time.monotonic() - t0 < idle_s:
            tick = time.monotonic()
            sizes.append(len(urllib.request.urlopen(url, timeout=10).read()))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        scraped = (cpu_s(proc) - c0) / (time.monotonic() - t0) * 100
        return {
            "window_s": idle_s,
            "idle_cpu_pct_of_core": round(idle, 3),
            "scraped_every_1s_cpu_pct_of_core": round(scraped, 3),
            "body_bytes": sizes[-1],
            "rss_mib": round(proc.memory_info().rss / 2**20, 1),
        }
    finally:
        child.terminate()
        child.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per case")
    parser.add_argument("--idle-s", type=float, default=30.0, help="each CPU window, seconds")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "exporter.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root (loads BPF programs)")
    idle_target = subprocess.Popen(["sleep", "3600"])
    try:
        pid, n = idle_target.pid, args.scrapes
        cases = {
            "counters": scrape_case("counters", "syscalls_comm", 1000, n, pid),
            "histograms": scrape_case("histograms", "biolatency", 34, n, pid),
        }
    finally:
        idle_target.kill()
        idle_target.wait()
    idle = idle_case(args.idle_s)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "targets": {"scrape_ms": TARGET_SCRAPE_MS, "idle_cpu_pct": TARGET_IDLE_PCT},
        "scrape": cases,
        "idle": idle,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args.out, result)
    for name, case in cases.items():
        print(
            f"{name:10s} {case['series']:5d} series: http median {case['http']['median_ms']} ms "
            f"(p95 {case['http']['p95_ms']}), render cpu median "
            f"{case['render_cpu']['median_ms']} ms, cold first scrape "
            f"{case['cold_first_scrape_ms']} ms"
        )
    print(
        f"idle: {idle['idle_cpu_pct_of_core']} % of a core; scraped every 1 s: "
        f"{idle['scraped_every_1s_cpu_pct_of_core']} %  -> {args.out}"
    )
    return 0
