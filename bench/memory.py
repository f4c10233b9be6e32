"""Memory benchmark: the collector's RSS during a long system-wide collection.

Runs ``kernmlops collect -b faux --no-progress -d SECONDS -o <tmp>`` (the default
hooks: process_trace, quanta_runtime, memory_usage, system_info; faux traces
the whole system) while a context-switch storm (``stress-ng --switch``, pipes
between processes: every switch is a quanta_runtime row and a
quanta_queued_time row) runs beside it. Samples the collector's RSS (psutil)
every second; reports the peak, the growth over the run, and the events and
rows the manifest counts. The collection is deleted afterwards.

Run: ``sudo python -m bench memory --help`` (``--seconds 60`` for a quick run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench import harness
from bench.harness import save

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "collector RSS ≤ 150 MB under stress-ng --switch 2 for 300 s, 0 drops"

BENCH = Path(__file__).resolve().parent
MIB = 1 << 20


def kernmlops_cmd(seconds: float, out: Path, config: Path | None = None) -> list[str]:
    script = Path(sys.executable).parent / "kernmlops"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "kernmlops"]
    extra = ["-c", str(config)] if config else []
    return [*head, "collect", "-b", "faux", "--no-progress", "-d", str(seconds), "-o", str(out),
            *extra]  # fmt: skip


def load_cmd(kind: str, seconds: float, workers: int) -> list[str] | None:
    if kind == "switch":
        return ["stress-ng", "--switch", str(workers), "--timeout", f"{int(seconds)}s", "-q"]
    return None


STATUS_KEYS = ("VmHWM", "RssAnon", "RssFile", "RssShmem", "Pss")


def status(pid: int) -> dict[str, int]:
    """Bytes of VmHWM (the kernel's own peak RSS, catching spikes between samples) and
    of RSS by kind: anonymous (heaps), file (libraries; ring buffers count here), shmem;
    and the proportional set size."""
    out = dict.fromkeys(STATUS_KEYS, 0)
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    try:  # PSS counts a ring buffer's data once (RSS counts both of its mappings)
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def running_drops(data: Path) -> int | None:
    """Drops so far by the running manifest (written every flush): when they happen."""
    for path in data.glob("curated/benchmark=faux/collection_id=*/manifest.json"):
        try:
            hooks = json.loads(path.read_text()).get("hooks", {})
        except (OSError, ValueError):
            return None
        return sum(h.get("drops", 0) for h in hooks.values())
    return None


def slope_mib_per_min(samples: list[tuple[float, int]]) -> float:
    """Least-squares RSS growth over the second half of the run (a leak shows here)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return 0.0
    n = len(half)
    mt = sum(t for t, _ in half) / n
    mr = sum(r for _, r in half) / n
    num = sum((t - mt) * (r - mr) for t, r in half)
    den = sum((t - mt) ** 2 for t, _ in half) or 1.0
    return num / den * 60 / MIB


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__, defaults_in_help=True)
    parser.add_argument("--seconds", type=float, default=300.0, help="collection length")
    parser.add_argument("--load", choices=("switch", "none"), default="switch")
    parser.add_argument("--workers", type=int, default=2, help="stress-ng --switch workers")
    parser.add_argument("--interval", type=float, default=1.0, help="RSS sampling period")
    parser.add_argument("--target-mb", type=float, default=150.0, help="RSS target (MB)")
    parser.add_argument(
        "--nice", type=int, default=0, help="run the collector at this niceness (-20..19)"
    )
    parser.add_argument(
        "--config", type=Path, help="overrides for the collection (kernmlops collect -c)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the collection")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "memory.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root to load BPF programs")
    if args.load == "switch" and not shutil.which("stress-ng"):
        parser.error("stress-ng is not installed (apt-get install stress-ng)")

    data = Path(tempfile.mkdtemp(prefix="kmo-memory-"))
    cmd = kernmlops_cmd(args.seconds, data, args.config)
    t0 = time.monotonic()
    collector = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=(lambda: os.nice(args.nice)) if args.nice else None,
    )
    assert collector.stderr is not None
    log: list[str] = []
    attached = threading.Event()

    def read_stderr() -> None:  # keep the pipe drained; note when probes are attached
        assert collector.stderr is not None
        for line in collector.stderr:
            log.append(line)
            if "probes attached" in line:
                attached.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    if not attached.wait(60):
        collector.kill()
        raise SystemExit("collector did not attach within 60 s:\n" + "".join(log))
    attach_at = time.monotonic() - t0
    load = None
    lcmd = load_cmd(args.load, args.seconds, args.workers)
    if lcmd:
        load = subprocess.Popen(lcmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    proc = psutil.Process(collector.pid)
    samples: list[tuple[float, int]] = []
    # per sample: seconds, RSS anon and file, VmHWM (MiB), drops so far (running manifest)
    kinds: list[tuple[float, float, float, float, int | None]] = []
    peaks = dict.fromkeys(STATUS_KEYS, 0)
    cpu = 0.0
    while collector.poll() is None:
        try:
            rss = proc.memory_info().rss
            now = status(collector.pid)
            for key, value in now.items():
                peaks[key] = max(peaks[key], value)
            times = proc.cpu_times()
            cpu = times.user + times.system
        except psutil.NoSuchProcess:
            break
        t = time.monotonic() - t0
        samples.append((t, rss))
        kinds.append((round(t, 1), round(now["RssAnon"] / MIB, 1), round(now["RssFile"] / MIB, 1),
                      round(now["VmHWM"] / MIB, 1), running_drops(data)))  # fmt: skip
        if len(samples) % 30 == 0:
            peak = peaks["VmHWM"] / MIB
            print(f"{t:6.0f} s  RSS {rss / MIB:7.1f} MiB, peak {peak:.1f}", file=sys.stderr)
        time.sleep(args.interval)
    rc = collector.wait()
    wall = time.monotonic() - t0
    if load is not None:
        load.terminate()
        load.wait()

    manifests = list(data.glob("curated/benchmark=faux/collection_id=*/manifest.json"))
    if rc != 0 or not manifests:
        raise SystemExit(f"collect failed (exit {rc}):\n" + "".join(log))
    manifest = json.loads(manifests[0].read_text())
    hooks = manifest["hooks"]
    rows = {t: v["rows"] for t, v in manifest["tables"].items()}
    disk = sum(f.stat().st_size for f in manifests[0].parent.rglob("*.parquet"))
    if not args.keep:
        shutil.rmtree(data, ignore_errors=True)

    rss_values = [r for _, r in samples]
    result = {
        "command": " ".join("<tmp>" if c == str(data) else c for c in cmd),
        "load": " ".join(lcmd) if lcmd else None,
        "nice": args.nice,
        "config": str(args.config) if args.config else None,
        "seconds": args.seconds,
        "wall_s": round(wall, 1),
        "to_attached_s": round(attach_at, 3),  # spawn to "probes attached"
        "rss_max_mib": round(max(rss_values) / MIB, 1),
        "rss_peak_vmhwm_mib": round(peaks["VmHWM"] / MIB, 1),
        "rss_max_by_kind_mib": {k: round(peaks[k] / MIB, 1) for k in STATUS_KEYS[1:4]},
        "pss_max_mib": round(peaks["Pss"] / MIB, 1),
        "rss_first_mib": round(rss_values[0] / MIB, 1),
        "rss_last_mib": round(rss_values[-1] / MIB, 1),
        "rss_growth_second_half_mib_per_min": round(slope_mib_per_min(samples), 2),
        "collector_cpu_pct": round(100 * cpu / wall, 1),
        "events": {h: v["events"] for h, v in hooks.items()},
        "drops": {h: v["drops"] for h, v in hooks.items()},
        "rows": rows,
        "rows_total": sum(rows.values()),
        "parquet_bytes": disk,
        "samples": [(round(t, 1), r) for t, r in samples],
        "samples_anon_file_hwm_mib_drops": kinds,
    }
    events = sum(result["events"].values())

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"collector memory, {args.seconds:g} s, load: {args.load}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("max RSS (1 s samples)", f"{result['rss_max_mib']:.1f} MiB")
    table.add_row("peak RSS (VmHWM)", f"{result['rss_peak_vmhwm_mib']:.1f} MiB")
    kinds = ", ".join(f"{k[3:].lower()} {v:.0f}" for k, v in result["rss_max_by_kind_mib"].items())
    table.add_row("max RSS by kind", f"{kinds} MiB")
    table.add_row("max PSS (rings counted once)", f"{result['pss_max_mib']:.1f} MiB")
    first_last = f"{result['rss_first_mib']} / {result['rss_last_mib']} MiB"
    table.add_row("RSS first / last sample", first_last)
    table.add_row("growth, second half", f"{result['rss_growth_second_half_mib_per_min']} MiB/min")
    table.add_row("collector CPU", f"{result['collector_cpu_pct']}% of one core")
    table.add_row("events (all hooks)", f"{events:,} ({events / args.seconds:,.0f}/s)")
    table.add_row("drops", f"{sum(result['drops'].values()):,}")
    for name, n in rows.items():
        table.add_row(f"rows {name}", f"{n:,}")
    table.add_row("Parquet on disk", f"{disk / MIB:,.1f} MiB")
    Console(width=100).print(table)
    peak_mb = max(result["rss_max_mib"], result["rss_peak_vmhwm_mib"]) * MIB / 1e6
    ok = peak_mb <= args.target_mb
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}  peak RSS {peak_mb:.0f} MB (target <= {args.target_mb:g} MB)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args.out, result)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
