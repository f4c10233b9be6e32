"""Block-I/O benchmark: what the block_io hook costs fio, and whether it sees every I/O.

fio (O_DIRECT random 4 KiB reads and writes, libaio, several jobs) on a file of
its own in a scratch folder on a real disk, run untraced (``off``), under
``kernmlops collect -b faux --hooks block_io`` (``block_io``) and under the
default hooks (``default``: ``collect -b faux``), each collector started in the
background before fio and stopped after it. Every round runs every state once,
the order turning by one each round. With ``--baseline TREE`` a fourth state,
``baseline``, runs another source tree's block_io hook in the same rounds (a
worktree of an older commit: its ``src`` first on ``PYTHONPATH``).

Per state, medians over rounds with 95% intervals (``harness.summarize``):

* IOPS (fio's own, reads + writes) and the slowdown against the same round's
  untraced run (time per I/O, traced / untraced - 1);
* the collector's CPU (all its threads) while fio ran, in % of a CPU; fio's own
  CPU and the whole machine's busy CPU, in µs per I/O (others' work included:
  the machine may be shared);
* drops (the manifest's, all hooks);
* rows against the workload's own counts, two independent ones: the block_io
  rows whose sector lies in the fio file's extents (FIEMAP) against fio's
  ``total_ios``; and the rows of the file's disk that completed while fio ran
  against the disk's completed requests in /proc/diskstats over the same
  window (reads, writes, discards, flushes: every process's I/O, a few
  requests at the window's edges may fall either way); with the hook's counted
  losses (``missed_completions``, ``unknown_completions``), and what the hook
  itself found never seen against /proc/diskstats over its collection
  (``completions_not_seen``, the manifest's ``hooks.block_io.reconciliation``),
  and the rows its programs wrote that the collection lacks
  (``rows_not_in_collection``);
* bytes a row: the collection's block_io Parquet files over their rows.

``--bpf-stats`` has the kernel time the programs (two clock reads more a run:
off for the cost figures) and adds their ns per run and per I/O.

Needs root, fio (``apt-get install fio``) and a scratch folder on a disk with
O_DIRECT (``--dir``, default /var/tmp; not a tmpfs, not a device-mapper or md
volume: rows are matched by the disk's sectors). Run from the repository root:
``sudo nice -n -10 python -m bench block-io --help``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import harness
from bench.overhead import (
    Collector,
    CollectorLost,
    bpf_prog_stats,
    enable_bpf_stats,
    machine_busy_s,
    process_cpu_s,
    quiet_wait,
)

#: what this benchmark is held to (python -m bench list shows it)
TARGET = (
    "block_io alone ≤ 5% fewer IOPS (median), 0 drops, "
    "rows in the fio file = fio's total_ios in every run"
)

STATES = ("off", "block_io", "default", "baseline")
TABLE = "block_io"
SECTOR = 512
#: FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap): the file's extents on its device
FS_IOC_FIEMAP = 0xC020660B
FIEMAP_HEAD = struct.Struct("=QQIIII")  # start, length, flags, mapped, count, reserved
FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
#: /proc/diskstats: the completed requests' fields (after major, minor, name)
DISKSTATS_FIELDS = {"READ": 3, "WRITE": 7, "DISCARD": 14, "FLUSH": 18}


# --- the disk under the scratch folder --------------------------------------------------
@dataclass(frozen=True)
class Disk:
    """The whole disk a folder's file system lies on, as block_io's rows name it."""

    name: str
    major: int
    minor: int
    #: the partition's first sector on the disk (0 for a whole disk)
    start_sector: int


def disk_of(folder: Path) -> Disk:
    """The disk under ``folder``; SystemExit with one line where rows cannot be
    matched by sector (a tmpfs, a device-mapper or md volume)."""
    dev = os.stat(folder).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sysdev = Path(f"/sys/dev/block/{major}:{minor}")
    if major == 0 or not sysdev.exists():
        raise SystemExit(f"error: --dir {folder}: not on a block device (a tmpfs?)")
    real = sysdev.resolve()
    if (real / "dm").exists() or (real / "md").exists() or any((real / "slaves").glob("*")):
        raise SystemExit(
            f"error: --dir {folder}: on {real.name}, a volume over other disks; give a folder "
            "on a plain disk or partition (rows are matched by the disk's sectors)"
        )
    if (real / "partition").exists():
        start = int((real / "start").read_text())
        real = real.parent
        major, minor = (int(x) for x in (real / "dev").read_text().split(":"))
    else:
        start = 0
    return Disk(real.name, major, minor, start)


def file_extents(path: Path, disk: Disk) -> list[tuple[int, int]]:
    """The file's extents on its disk, as [first sector, end sector) pairs, from
    the file system's own map (FIEMAP): fio's requests land in these."""
    out: list[tuple[int, int]] = []
    start, per_call = 0, 256
    with path.open("rb") as f:
        while True:
            buf = bytearray(FIEMAP_HEAD.size + per_call * FIEMAP_EXTENT.size)
            FIEMAP_HEAD.pack_into(buf, 0, start, (1 << 64) - 1 - start, FIEMAP_FLAG_SYNC, 0,
                                  per_call, 0)  # fmt: skip
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf, True)
            mapped = FIEMAP_HEAD.unpack_from(buf, 0)[3]
            last = False
            for i in range(mapped):
                logical, physical, length, *_, flags, _r1, _r2, _r3 = FIEMAP_EXTENT.unpack_from(
                    buf, FIEMAP_HEAD.size + i * FIEMAP_EXTENT.size
                )
                first = disk.start_sector + physical // SECTOR
                out.append((first, first + length // SECTOR))
                start = logical + length
                last = bool(flags & FIEMAP_EXTENT_LAST)
            if last or mapped == 0:
                return sorted(out)


def diskstats(disk: Disk) -> dict[str, int]:
    """The disk's completed requests so far, by kind (/proc/diskstats)."""
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if f[2] == disk.name:
            return {op: int(f[i]) if i < len(f) else 0 for op, i in DISKSTATS_FIELDS.items()}
    raise SystemExit(f"error: {disk.name} is not in /proc/diskstats")


# --- the workload ---------------------------------------------------------------------------
def fio_argv(args: argparse.Namespace, file: Path, seconds: float, out: Path) -> list[str]:
    return [
        "fio", "--name=blockio", f"--filename={file}", f"--size={args.size}",
        f"--rw={args.rw}", f"--bs={args.bs}", "--direct=1", f"--ioengine={args.engine}",
        f"--iodepth={args.iodepth}", f"--numjobs={args.jobs}", "--time_based",
        f"--runtime={seconds:g}", "--group_reporting", "--output-format=json", f"--output={out}",
    ]  # fmt: skip


@dataclass
class Fio:
    iops: float
    total_ios: int
    #: fio's own CPU (its jobs are its children: their rusage reaches it)
    cpu_s: float
    wall_s: float


def run_fio(argv: list[str]) -> Fio:
    out = Path(argv[-1].removeprefix("--output="))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"error: fio failed (exit {proc.returncode}): {proc.stderr.strip()}")
    jobs = json.loads(out.read_text())["jobs"]
    kinds = ("read", "write", "trim")
    return Fio(
        iops=sum(j[k]["iops"] for j in jobs for k in kinds),
        total_ios=sum(j[k]["total_ios"] for j in jobs for k in kinds),
        cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        wall_s=wall,
    )


# --- the collector ---------------------------------------------------------------------------
@dataclass
class Window:
    """What fio's run is matched against: the disk, the file's sectors, the time."""

    disk: Disk
    extents: list[tuple[int, int]]
    t0_us: int = 0
    t1_us: int = 0


class BlockCollector(Collector):
    """``collect -b faux`` in the background (``--hooks`` given, else the default
    set), of this tree or another; run from the scratch folder so that no
    overrides.yaml changes its hooks. Before its collection is deleted it counts
    the block_io rows against the window."""

    def __init__(
        self, hooks: list[str] | None, settle_s: float, tree: Path | None, cwd: Path, win: Window
    ) -> None:
        super().__init__(hooks, settle_s)
        self.env = {**os.environ, **harness.tree_env(tree)}
        self.cwd = cwd
        self.win = win
        self.rows: dict = {}

    def _popen(self, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=self.env, cwd=self.cwd,
        )  # fmt: skip

    def _result(self) -> dict:
        manifest = super()._result()
        parts = sorted(self.out.glob(f"curated/*/*/{TABLE}/*.parquet")) if self.out else []
        if parts:
            self.rows = count_rows(parts, self.win)
        return manifest


def count_rows(parts: list[Path], win: Window) -> dict:
    """The table's rows and bytes, its rows in the fio file's extents, and its rows
    of the disk completed in the window, by op."""
    import numpy as np
    import polars as pl

    df = pl.read_parquet(parts, columns=["ts_uptime_us", "major", "minor", "sector", "op"])
    on_disk = df.filter((pl.col("major") == win.disk.major) & (pl.col("minor") == win.disk.minor))
    firsts = np.array([a for a, _ in win.extents], dtype=np.int64)
    ends = np.array([b for _, b in win.extents], dtype=np.int64)
    sectors = on_disk["sector"].to_numpy().astype(np.int64)
    at = np.searchsorted(firsts, sectors, side="right") - 1
    in_file = (at >= 0) & (sectors < ends[np.clip(at, 0, None)])
    window = on_disk.filter(pl.col("ts_uptime_us").is_between(win.t0_us, win.t1_us))
    by_op = dict(window.group_by("op").len().iter_rows())
    return {
        "rows": df.height,
        "bytes": sum(p.stat().st_size for p in parts),
        "rows_in_file": int(in_file.sum()),
        "rows_in_window": {op: int(by_op.pop(op, 0)) for op in DISKSTATS_FIELDS}
        | {"other": int(sum(by_op.values()))},
    }


# --- one run, the rounds ----------------------------------------------------------------------
@dataclass
class Run:
    state: str
    iops: float
    total_ios: int
    fio_cpu_s: float
    wall_s: float
    machine_busy_s: float
    collector_cpu_s: float = 0.0
    drops: int = 0
    rows: dict = field(default_factory=dict)
    diskstats: dict = field(default_factory=dict)
    #: program name -> [run_time_ns, run_cnt] over fio's run (--bpf-stats)
    bpf: dict = field(default_factory=dict)
    others_cpu_s: float = 0.0
    #: block_io's own counts of requests without a row (the manifest's counters)
    counters: dict = field(default_factory=dict)
    #: block_io's own setting of the disk against /proc/diskstats over the whole
    #: collection (the manifest's reconciliation.disks["major:minor"]): the kernel's
    #: count, rows, counted losses, completions_not_seen and surplus
    reconciled: dict = field(default_factory=dict)
    #: block_io's events and rows by its manifest (the rows its table holds)
    events: int = 0
    manifest_rows: int = 0


def manifest_drops(manifest: dict) -> int:
    return sum(
        h.get("drops", 0)
        for h in manifest.get("hooks", {}).values()
        if h.get("variant") != "procfs"
    )


def prog_delta(before: dict, after: dict) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for pid, (name, ns, cnt) in after.items():
        _, ns0, cnt0 = before.get(pid, (name, 0, 0))
        acc = out.setdefault(name, [0, 0])
        acc[0] += ns - ns0
        acc[1] += cnt - cnt0
    return out


def one_run(
    state: str, args: argparse.Namespace, fio: list[str], win: Window, scratch: Path
) -> Run:
    coll: BlockCollector | None = None
    if state != "off":
        hooks = None if state == "default" else [TABLE]
        tree = args.baseline if state == "baseline" else None
        coll = BlockCollector(hooks, args.settle, tree, scratch, win)
        coll.start()
    try:
        pid = coll.proc.pid if coll and coll.proc else None
        progs0 = bpf_prog_stats(pid) if pid and args.bpf_stats else {}
        cpu0 = process_cpu_s(pid) if pid else 0.0
        disk0, busy0 = diskstats(win.disk), machine_busy_s()
        win.t0_us = time.monotonic_ns() // 1000
        done = run_fio(fio)
        win.t1_us = time.monotonic_ns() // 1000
        disk1, busy1 = diskstats(win.disk), machine_busy_s()
        cpu1 = process_cpu_s(pid) if pid else 0.0
        progs1 = bpf_prog_stats(pid) if pid and args.bpf_stats else {}
        if coll and coll.proc and coll.proc.poll() is not None:
            raise CollectorLost(f"collector exited during the run:\n{''.join(coll.lines[-20:])}")
    finally:
        if coll:
            coll.stop()
    run = Run(
        state=state, iops=done.iops, total_ios=done.total_ios, fio_cpu_s=done.cpu_s,
        wall_s=done.wall_s, machine_busy_s=busy1 - busy0,
        diskstats={op: disk1[op] - disk0[op] for op in disk0},
    )  # fmt: skip
    if coll:
        run.collector_cpu_s = cpu1 - cpu0
        run.drops = manifest_drops(coll.manifest)
        run.rows = coll.rows
        run.bpf = prog_delta(progs0, progs1)
        hook = coll.manifest.get("hooks", {}).get(TABLE, {})
        run.counters = hook.get("counters", {})
        disks = (hook.get("reconciliation") or {}).get("disks") or {}
        run.reconciled = disks.get(f"{win.disk.major}:{win.disk.minor}", {})
        run.events = hook.get("events", 0)
        run.manifest_rows = (hook.get("rows") or {}).get(TABLE, 0)
    run.others_cpu_s = run.machine_busy_s - run.fio_cpu_s - run.collector_cpu_s
    return run


def summarize_state(runs: list[Run], offs: list[Run]) -> dict:
    """A state's medians over rounds (each round's slowdown against its own off run)."""

    def summ(values: list[float]) -> dict | None:
        return harness.summarize(values).as_dict(4) if values else None

    slow = [off.iops / r.iops - 1 for r, off in zip(runs, offs, strict=True)] if offs else []
    out: dict = {
        "runs": len(runs),
        "iops": summ([r.iops for r in runs]),
        "slowdown": summ(slow) if runs[0].state != "off" else None,
        "fio_cpu_us_per_io": summ([1e6 * r.fio_cpu_s / r.total_ios for r in runs]),
        "machine_cpu_us_per_io": summ([1e6 * r.machine_busy_s / r.total_ios for r in runs]),
        "others_cpu_pct": summ([100 * r.others_cpu_s / r.wall_s for r in runs]),
    }
    if runs[0].state == "off":
        return out
    out["collector_cpu_pct"] = summ([100 * r.collector_cpu_s / r.wall_s for r in runs])
    out["drops"] = sum(r.drops for r in runs)
    counted = [r for r in runs if r.rows]
    if counted:
        out["rows_in_file_minus_total_ios"] = [
            r.rows["rows_in_file"] - r.total_ios for r in counted
        ]
        out["rows_in_window_minus_diskstats"] = [
            sum(r.rows["rows_in_window"].values()) - sum(r.diskstats.values()) for r in counted
        ]
        # rows + the hook's counted losses (missed and unknown completions, over
        # the whole collection: a few more than the window's) against diskstats
        out["rows_and_counted_minus_diskstats"] = [
            sum(r.rows["rows_in_window"].values())
            + r.counters.get("missed_completions", 0)
            + r.counters.get("unknown_completions", 0)
            - sum(r.diskstats.values())
            for r in counted
        ]
        out["missed_completions"] = [r.counters.get("missed_completions", 0) for r in counted]
        # what no row nor count holds, by the hook's own reading of /proc/diskstats
        # over its collection (None: not reported, a tree before the reconciliation)
        out["completions_not_seen"] = [
            r.reconciled.get("completions_not_seen") if r.reconciled else None for r in counted
        ]
        # rows the programs wrote that the collection lacks, no drop counting them
        out["rows_not_in_collection"] = [r.counters.get("rows_not_in_collection") for r in counted]
        out["bytes_per_row"] = summ([r.rows["bytes"] / r.rows["rows"] for r in counted])
    timed = [r for r in runs if r.bpf]
    if timed:
        ns = [sum(v[0] for v in r.bpf.values()) for r in timed]
        cnt = [sum(v[1] for v in r.bpf.values()) for r in timed]
        out["bpf_ns_per_run"] = summ([n / c for n, c in zip(ns, cnt, strict=True) if c])
        out["bpf_ns_per_io"] = summ([n / r.total_ios for n, r in zip(ns, timed, strict=True)])
    return out


def verdict(summary: dict) -> str:
    s = summary.get("block_io")
    if not s or not s.get("slowdown"):
        return "not measured (no block_io state)"
    ok_rows = all(d == 0 for d in s.get("rows_in_file_minus_total_ios", [1]))
    met = s["slowdown"]["median"] <= 0.05 and s["drops"] == 0 and ok_rows
    return "met" if met else "not met"


def print_summary(summary: dict) -> None:
    print()
    for state, s in summary.items():
        if not isinstance(s, dict) or "iops" not in s:
            continue
        line = f"{state:9s} {s['iops']['median']:>9,.0f} IOPS"
        if s.get("slowdown"):
            sl = s["slowdown"]
            line += (
                f"  {100 * sl['median']:+5.1f}% slower (95% {100 * sl['median_low']:+.1f}.."
                f"{100 * sl['median_high']:+.1f})"
            )
        line += (
            f"  fio {s['fio_cpu_us_per_io']['median']:.1f} µs/IO"
            f"  machine {s['machine_cpu_us_per_io']['median']:.1f} µs/IO"
        )
        if "collector_cpu_pct" in s:
            line += f"  collector {s['collector_cpu_pct']['median']:.1f}% CPU  drops {s['drops']}"
        print(line)
        if "rows_in_file_minus_total_ios" in s:
            print(
                f"{'':9s} rows in the file - fio's I/Os: {s['rows_in_file_minus_total_ios']}; "
                f"rows of the disk - diskstats: {s['rows_in_window_minus_diskstats']}; "
                f"missed: {s['missed_completions']}; rows + counted - diskstats: "
                f"{s['rows_and_counted_minus_diskstats']}; "
                f"never seen: {s['completions_not_seen']}; "
                f"rows not in the collection: {s['rows_not_in_collection']}; "
                f"{s['bytes_per_row']['median']:.2f} bytes a row"
            )
        if "bpf_ns_per_io" in s:
            print(
                f"{'':9s} programs {s['bpf_ns_per_run']['median']:.0f} ns/run, "
                f"{s['bpf_ns_per_io']['median']:.0f} ns per I/O"
            )
    print(f"target ({TARGET}): {summary.get('verdict')}")


def tree_commit(tree: Path) -> str:
    """The baseline tree's commit (its path is this machine's, not the result's)."""
    proc = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or tree.name


def build_objects(tree: Path | None, cwd: Path) -> None:
    """Each tree's BPF objects built before the rounds (a build is no collector's start)."""
    env = {**os.environ, **harness.tree_env(tree)}
    argv = [sys.executable, "-m", "kernmlops", "build-bpf"]
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        where = tree or "this tree"
        raise SystemExit(f"error: kernmlops build-bpf ({where}) failed: {proc.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__name__, __doc__, defaults_in_help=True)
    ap.add_argument("--rounds", type=int, default=8, help="rounds, every state once each")
    ap.add_argument("--seconds", type=float, default=10, help="fio's run per state")
    ap.add_argument(
        "--states",
        default="off,block_io,default",
        help="comma-separated, of off, block_io, default (and baseline with --baseline); "
        "off is always run",
    )
    ap.add_argument("--baseline", type=Path, help="another source tree's block_io, same rounds")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"), help="scratch folder's parent")
    ap.add_argument("--size", default="1G", help="fio's file")
    ap.add_argument("--rw", default="randrw", help="fio's --rw")
    ap.add_argument("--bs", default="4k", help="fio's --bs")
    ap.add_argument("--engine", default="libaio", help="fio's --ioengine (libaio, io_uring)")
    ap.add_argument("--iodepth", type=int, default=32, help="fio's --iodepth")
    ap.add_argument("--jobs", type=int, default=2, help="fio's --numjobs")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds after attach")
    ap.add_argument("--quiet-busy", type=float, default=25.0, help="percent of one CPU")
    ap.add_argument("--quiet-wait", type=float, default=10.0, help="seconds, at most")
    ap.add_argument(
        "--bpf-stats",
        action="store_true",
        help="time every BPF program run (ns per run and per I/O); adds two clock reads to "
        "every run: off for the cost figures",
    )
    ap.add_argument("--out", type=Path, default=harness.result_path("block-io"))
    args = ap.parse_args(argv)
    states = [s.strip() for s in args.states.split(",") if s.strip()]
    if "off" not in states:
        states.insert(0, "off")
    if args.baseline and "baseline" not in states:
        states.append("baseline")
    unknown = set(states) - set(STATES)
    if unknown:
        print(f"error: --states: unknown {sorted(unknown)}; known: {', '.join(STATES)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if "baseline" in states and not args.baseline:
        print("error: the baseline state needs --baseline TREE", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("error: needs root (BPF)", file=sys.stderr)
        return 2
    if not shutil.which("fio"):
        print("error: fio not found (apt-get install fio)", file=sys.stderr)
        return 2
    if args.baseline:
        args.baseline = args.baseline.resolve()
        harness.tree_env(args.baseline)  # one line if it holds no kernmlops
    if not args.dir.is_dir():
        print(f"error: --dir {args.dir}: no such folder", file=sys.stderr)
        return 2
    stats_fd = enable_bpf_stats() if args.bpf_stats else None
    scratch = Path(tempfile.mkdtemp(prefix="kmo-block-io-", dir=args.dir))
    try:
        return measure(args, states, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if stats_fd is not None:
            os.close(stats_fd)


def measure(args: argparse.Namespace, states: list[str], scratch: Path) -> int:
    disk = disk_of(scratch)
    file, out_json = scratch / "fio.dat", scratch / "fio.json"
    # lay the file out and warm up: not measured
    print(f"laying out {args.size} in {scratch} ({disk.name})", flush=True)
    run_fio(fio_argv(args, file, 2, out_json))
    win = Window(disk, file_extents(file, disk))
    fio = fio_argv(args, file, args.seconds, out_json)
    build_objects(None, scratch)
    if "baseline" in states:
        build_objects(args.baseline, scratch)
    rounds: list[dict[str, Run]] = []

    def body() -> dict:
        summary: dict = {}
        offs = [r["off"] for r in rounds]
        for st in states:
            summary[st] = summarize_state([r[st] for r in rounds], offs)
        summary["verdict"] = verdict(summary)
        return {
            # the scratch folder's name is made anew each run: not kept
            "workload_argv": [
                "--filename=SCRATCH/fio.dat" if a.startswith("--filename=") else a
                for a in fio
                if not a.startswith("--output=")
            ],
            "disk": asdict(disk),
            "file_extents": len(win.extents),
            "states": states,
            "baseline": tree_commit(args.baseline) if args.baseline else None,
            "bpf_stats": args.bpf_stats,
            "summary": summary,
            "rounds": [{k: asdict(v) for k, v in r.items()} for r in rounds],
        }

    print(f"workload: {shlex.join(fio[:-1])}", flush=True)
    for r, order in harness.rotations(states, args.rounds):
        runs: dict[str, Run] = {}
        for state in order:
            quiet_wait(args.quiet_busy, args.quiet_wait)
            for attempt in range(3):
                try:
                    runs[state] = one_run(state, args, fio, win, scratch)
                    break
                except CollectorLost as err:
                    print(f"  (retrying {state}: {str(err).splitlines()[0]})", flush=True)
                    if attempt == 2:
                        raise SystemExit(f"error: {state}: the collector failed 3 times") from err
        rounds.append(runs)
        off = runs["off"].iops
        parts = []
        for st in states:
            x = runs[st]
            text = f"{st} {x.iops:,.0f}"
            if st != "off":
                text += f" ({100 * (off / x.iops - 1):+.1f}%, drops {x.drops}"
                if x.rows:
                    text += f", rows-ios {x.rows['rows_in_file'] - x.total_ios:+d}"
                text += ")"
            parts.append(text)
        print(f"round {r + 1}/{args.rounds} IOPS: " + "  ".join(parts), flush=True)
        harness.save(args.out, body())  # a run cut short keeps its rounds
    result = body()
    print_summary(result["summary"])
    harness.save(args.out, result)
    print(f"wrote {args.out}")
    return 0
