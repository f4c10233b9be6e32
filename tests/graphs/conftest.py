"""Collections for the graph tests: small hand-built ones (no root needed), one real
one made by `kernmlops collect` once per session, and headless Chromium."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.collect.manifest import write_manifest
from kernmlops.data import Collection, read_collection

#: CLOCK_MONOTONIC of the synthetic collections' first event, µs.
T0 = 5_000_000_000
BENCH_PID, WORKER, KWORKER = 100, 101, 7
BENCH_START = T0 + 100_000  # exec of the benchmark's pid
BENCH_STOP = T0 + 2_000_000  # its exit
BOOT_UNIX = 1_700_000_000
REAL_HOOKS = (
    "process_trace,quanta_runtime,memory_usage,system_info,syscalls,page_faults,sched_migrate,perf"
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: graph -> the tables it is drawn from, written out here rather than read from the code
EXPECTED = {
    "quanta_timeline": {"quanta_runtime"},
    "quanta_run_length": {"quanta_runtime"},
    "quanta_queued_time_cdf": {"quanta_queued_time"},
    "migrations_by_cpu_pair": {"sched_migrate"},
    "process_events": {"process_trace"},
    "syscalls_top": {"syscalls"},
    "syscalls_latency": {"syscalls"},
    "memory_usage": {"memory_usage"},
    "rss_over_time": {"mm_rss_stat"},
    "page_fault_rate": {"page_faults"},
    "block_io_rate": {"block_io"},
    "block_io_latency": {"block_io"},
    "block_io_queue": {"block_io"},
    "perf_rate": {"perf_counters"},
    "perf_cumulative": {"perf_counters"},
}


def _ts(seconds: np.ndarray) -> np.ndarray:
    return (T0 + np.asarray(seconds) * 1_000_000).astype(np.uint64)


def synthetic_tables(seed: int = 1) -> dict[str, pl.DataFrame]:
    """Every table a graph draws, shaped as the hooks write them."""
    rng = np.random.default_rng(seed)
    trace = pl.DataFrame(
        {
            "ts_uptime_us": np.array(
                [T0, BENCH_START, T0 + 200_000, T0 + 250_000, T0 + 1_500_000, BENCH_STOP],
                dtype=np.uint64,
            ),
            "pid": np.array([KWORKER, BENCH_PID, WORKER, WORKER, WORKER, BENCH_PID], np.uint32),
            "tgid": np.array([KWORKER, BENCH_PID, WORKER, WORKER, WORKER, BENCH_PID], np.uint32),
            "ppid": np.array([2, 1, BENCH_PID, BENCH_PID, BENCH_PID, 1], np.uint32),
            "kind": ["fork", "exec", "fork", "exec", "exit", "exit"],
            "comm": ["kworker/0:1", "bench", "bench", "worker", "worker", "bench"],
        }
    )
    # Quanta: back to back on each CPU, 2 ms each, over 2 s; tgid by turns.
    n = 1000
    ends = np.arange(1, n + 1) * 2000
    quanta = pl.DataFrame(
        {
            "ts_uptime_us": np.concatenate([T0 + ends, T0 + ends]).astype(np.uint64),
            "quanta_run_length_us": np.full(2 * n, 2000, np.uint64),
            "cpu": np.repeat(np.array([0, 1], np.uint32), n),
            "pid": np.tile(np.array([BENCH_PID, WORKER, KWORKER, WORKER], np.uint32), n // 2),
            "tgid": np.tile(np.array([BENCH_PID, WORKER, KWORKER, WORKER], np.uint32), n // 2),
        }
    )
    queued = quanta.select(
        "ts_uptime_us",
        "cpu",
        "pid",
        "tgid",
        quanta_queued_time_us=pl.Series(rng.lognormal(3, 1.5, 2 * n).astype(np.uint64)),
    )
    k = 20
    t_mem = _ts(np.linspace(0, 2, k))
    gib = 1 << 30
    memory = pl.DataFrame(
        {
            "ts_uptime_us": t_mem.astype(np.int64),
            "mem_total_bytes": np.full(k, 8 * gib),
            "mem_free_bytes": np.linspace(6, 5, k) * gib,
            "mem_available_bytes": np.linspace(7, 6, k) * gib,
            "buffers_bytes": np.full(k, 10 << 20),
            "cached_bytes": np.full(k, gib),
            "anon_pages_bytes": np.linspace(0.5, 1.5, k) * gib,
            "slab_bytes": np.full(k, 200 << 20),
        }
    ).with_columns(pl.exclude("ts_uptime_us").cast(pl.Int64))
    rss = pl.DataFrame(
        {
            "ts_uptime_us": _ts([0.3, 0.4, 0.5, 1.0, 1.2]),
            "size_bytes": [100 << 20, 50 << 20, 300 << 20, 1 << 20, 0],
            "pid": np.array([WORKER] * 5, np.uint32),
            "tgid": np.array([WORKER] * 5, np.uint32),
            "mm_tgid": np.array([WORKER, WORKER, WORKER, BENCH_PID, WORKER], np.uint32),
            "member": ["anon", "file", "anon", "anon", "anon"],
        }
    )
    faults = pl.DataFrame(
        {
            "ts_uptime_us": _ts(np.sort(rng.uniform(0, 2, 500))),
            "pid": np.full(500, WORKER, np.uint32),
            "tgid": np.full(500, WORKER, np.uint32),
            "cpu": rng.integers(0, 2, 500).astype(np.uint32),
            "kind": rng.choice(["user", "kernel"], 500),
        }
    )
    samples = 11
    t_perf = np.repeat(_ts(np.linspace(0, 2, samples)), 2)
    cpu = np.tile(np.array([0, 1], np.uint32), samples)
    step = np.repeat(np.arange(samples), 2)
    perf = pl.DataFrame(
        {
            "ts_uptime_us": t_perf,
            "cpu": cpu,
            # one CPU's worth of task-clock per second on each CPU
            "task_clock_ns": (step * 200_000_000).astype(np.uint64),
            "task_clock_enabled_ns": (step * 200_000_000).astype(np.uint64),
            "task_clock_running_ns": (step * 200_000_000).astype(np.uint64),
            # 100 switches per read on CPU 0, 50 on CPU 1: 750 per second in all
            "context_switches": (step * np.where(cpu == 0, 100, 50)).astype(np.uint64),
            "context_switches_enabled_ns": (step * 200_000_000).astype(np.uint64),
            "context_switches_running_ns": (step * 200_000_000).astype(np.uint64),
        }
    )
    migrate = pl.DataFrame(
        {
            "ts_uptime_us": _ts([0.2, 0.4, 0.6, 0.8, 1.0]),
            "pid": np.array([WORKER] * 5, np.uint32),
            "tgid": np.array([WORKER] * 5, np.uint32),
            "orig_cpu": np.array([0, 0, 1, 0, 1], np.uint32),
            "dest_cpu": np.array([1, 1, 0, 1, 0], np.uint32),
            "kind": ["wakeup", "queued", "wakeup", "wakeup", "queued"],
            "comm": ["worker"] * 5,
        }
    )
    hist = np.zeros((4, 32), np.uint64)
    hist[0, 10], hist[1, 12], hist[2, 20], hist[3, 11] = 30, 5, 2, 7
    syscalls = pl.DataFrame(
        {
            "ts_uptime_us": _ts([1.0, 1.0, 2.0, 2.0]),
            "tgid": np.array([WORKER, WORKER, WORKER, BENCH_PID], np.uint32),
            "syscall": ["read", "openat", "read", "write"],
            "count": np.array([20, 5, 12, 7], np.uint64),
            "errors": np.array([0, 2, 0, 0], np.uint64),
            "completed": np.array([20, 5, 12, 7], np.uint64),
            "total_latency_ns": np.array([30_000, 25_000, 2_000_000, 14_000], np.uint64),
            "latency_log2_hist": [list(map(int, row)) for row in hist],
        }
    )
    m = 60
    block = pl.DataFrame(
        {
            "ts_uptime_us": _ts(np.linspace(0.1, 1.9, m)),
            "bytes": np.full(m, 1 << 20, np.uint32),
            "op": ["READ"] * 40 + ["WRITE"] * 18 + ["FLUSH"] * 2,
            "queue_to_issue_us": [3, 5, None] * (m // 3),  # None: issued without a queue
            "issue_to_complete_us": rng.integers(50, 5000, m).astype(np.uint64),
            # two disks; the queue at each issue (a flush's parent: never issued)
            "device": ["254:0", "7:1"] * (m // 2),
            "inflight": [*rng.integers(1, 9, m - 2).tolist(), None, None],
            "inflight_4k_ios": [*rng.integers(1, 300, m - 2).tolist(), None, None],
            "pid": np.full(m, WORKER, np.uint32),
            "tgid": np.full(m, WORKER, np.uint32),
            "comm": ["worker"] * m,
        }
    )
    system = pl.DataFrame({"hostname": ["synthetic"], "logical_cpus": [2]})
    results = pl.DataFrame({"key": ["run"], "metric": ["runtime"], "value": [1.9], "unit": ["s"]})
    return {
        "process_trace": trace,
        "quanta_runtime": quanta,
        "quanta_queued_time": queued,
        "memory_usage": memory,
        "mm_rss_stat": rss,
        "page_faults": faults,
        "perf_counters": perf,
        "sched_migrate": migrate,
        "syscalls": syscalls,
        "block_io": block,
        "system_info": system,
        "benchmark_result": results,
    }


HOOK_OF = {
    "process_trace": "process_trace",
    "quanta_runtime": "quanta_runtime",
    "quanta_queued_time": "quanta_runtime",
    "memory_usage": "memory_usage",
    "mm_rss_stat": "mm_rss_stat",
    "page_faults": "page_faults",
    "perf_counters": "perf",
    "sched_migrate": "sched_migrate",
    "syscalls": "syscalls",
    "block_io": "block_io",
    "system_info": "system_info",
}


def write_collection(
    root: Path,
    tables: dict[str, pl.DataFrame],
    *,
    cid: str = "synthetic-1",
    benchmark: str = "synthetic",
    pid: int | None = BENCH_PID,
    extra: dict | None = None,
) -> Path:
    """A collection folder as the collector lays it out, with a manifest."""
    folder = root / "curated" / f"benchmark={benchmark}" / f"collection_id={cid}"
    for name, frame in tables.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        frame.with_columns(collection_id=pl.lit(cid)).write_parquet(
            folder / name / "part-00000.parquet"
        )
    hooks: dict[str, dict] = {}
    for table, frame in tables.items():
        hook = HOOK_OF.get(table)
        if hook is None:
            continue
        h = hooks.setdefault(
            hook,
            {"attached": True, "reason": None, "variant": "btf", "programs": [], "events": 0,
             "drops": 0, "missed": 0, "rows": {}, "unsupported": {}},
        )  # fmt: skip
        h["events"] += frame.height
        h["rows"][table] = frame.height
    hooks["cpu_profile"] = {"attached": False, "reason": "needs perf_event with stacks"}
    if "perf" in hooks:
        hooks["perf"]["programs"] = ["task-clock", "context-switches"]
        hooks["perf"]["unsupported"] = {"cycles": "not supported on this machine"}
    if "syscalls" in hooks:
        hooks["syscalls"]["drops"] = 3
    manifest = {
        "collection_id": cid,
        "benchmark": {"name": benchmark, "description": f"{benchmark} run", "pid": pid},
        "started_at": "2023-11-14T22:13:25+00:00",
        "stopped_at": "2023-11-14T22:13:28+00:00",
        "duration_s": 3.0,
        "attach_s": 0.25,
        "ended_by": "completed",
        "exit_code": 0,
        "filter": {"mode": "tree", "tgid": None},
        "system": {"hostname": "synthetic", "kernel_release": "6.1.0-test", "logical_cpus": 2,
                   "memory_bytes": 8 << 30, "boot_time_unix": BOOT_UNIX, "cpu_model": "Test CPU"},
        "config": {"collector": {"hooks": sorted(hooks)}, "benchmark": {"name": benchmark}},
        "versions": {"kernmlops": "0.1.0"},
        "hooks": hooks,
    }  # fmt: skip
    manifest.update(extra or {})
    write_manifest(folder, manifest)
    return folder


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    root = tmp_path_factory.mktemp("synthetic")
    return read_collection(write_collection(root, synthetic_tables()))


# -- the real collection ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    """`kernmlops collect` of the whole system for 2 s with the hooks graphs draw,
    while a shell starts a few processes (a fresh machine may start none by itself)."""
    out = tmp_path_factory.mktemp("real")
    work = "for i in 1 2 3 4 5 6 7 8; do ls / > /dev/null; sleep 0.25; done"
    cmd = [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(out),
           "--system-wide", "--hooks", REAL_HOOKS, "--", "sh", "-c", work]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = sorted((out / "curated").glob("benchmark=command/collection_id=*"))
    assert len(found) == 1, found
    return read_collection(found[0])


# -- checks ------------------------------------------------------------------------------------


def assert_png(data: bytes, *, min_width: int = 600, min_height: int = 250) -> tuple[int, int]:
    """A decodable PNG of at least this size with something drawn on it."""
    from io import BytesIO

    from PIL import Image

    assert data[:8] == PNG_MAGIC
    with Image.open(BytesIO(data)) as image:
        image.load()
        width, height = image.size
        pixels = np.asarray(image.convert("RGB"))
    assert width >= min_width and height >= min_height, (width, height)
    ink = np.any(pixels < 200, axis=2).mean()
    assert ink > 0.01, f"only {ink:.2%} of the image is not white"
    return width, height


def chromium() -> str:
    """The headless browser (Debian package chromium; `make` installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is not installed: apt-get install chromium"
    return found


def run_chromium(args: list[str], profile: Path, timeout: float = 90) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             "--disable-extensions", f"--user-data-dir={profile}"]  # fmt: skip
    proc = subprocess.run(
        [chromium(), *flags, *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


#: Appended to a copy of the page: after load, write what the browser made of it.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = Array.from(document.images);
  const row = document.querySelector('.row');
  const cells = row ? Array.from(row.children).map(c => c.getBoundingClientRect()) : [];
  const out = document.createElement('pre');
  out.id = 'kmo-probe';
  out.textContent = JSON.stringify({
    images: imgs.length,
    decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    widths: imgs.map(i => i.naturalWidth),
    cells: cells.map(r => [Math.round(r.left), Math.round(r.right)]),
    title: document.title,
  });
  document.body.appendChild(out);
});
</script>"""


def browser_view(
    page: Path, tmp: Path, width: int = 1600, height: int = 1200, screenshot: Path | None = None
) -> dict:
    """Open a copy of ``page`` with PROBE in Chromium; what PROBE wrote. ``screenshot``:
    the same window also saved there as a PNG (one browser started, not two; PROBE's
    line is the last thing on the page)."""
    probe = tmp / f"probe-{page.name}"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    shot = [] if screenshot is None else ["--hide-scrollbars", f"--screenshot={screenshot}"]
    dom = run_chromium(
        [f"--window-size={width},{height}", "--virtual-time-budget=5000", *shot, "--dump-dom",
         probe.as_uri()],
        tmp / "profile",
    )  # fmt: skip
    found = re.search(r'<pre id="kmo-probe">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


def assert_self_contained(text: str) -> list[bytes]:
    """No external resource, no script; returns the embedded PNGs."""
    assert "<script" not in text and "<link" not in text and "@import" not in text
    assert "url(" not in text
    refs = re.findall(r'\b(?:src|href)="([^"]*)"', text)
    assert all(r.startswith(("data:image/png;base64,", "#")) for r in refs), [
        r[:40] for r in refs if not r.startswith(("data:", "#"))
    ]
    return [
        base64.b64decode(r.removeprefix("data:image/png;base64,"), validate=True)
        for r in refs
        if r.startswith("data:")
    ]
