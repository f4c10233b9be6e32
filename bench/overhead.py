"""Overhead benchmark: how much slower workloads run while kernmlops collects.

Two workloads, each run with no collector ("off") and with
``kernmlops collect -b faux`` tracing the whole system in the background
("on"), alternating in the same run (off, on, then on, off, … so a drift of
the machine falls on both sides):

* a context-switch storm: ``hackbench -p`` (process groups talking through
  pipes; rt-tests). Score: its own ``Time:`` (seconds, lower is better).
  Target with the default hook set: at most 10% slower.
* ``stress-ng --cpu 2 --metrics-brief``. Score: bogo ops/s (real time,
  higher is better). Target with the default hook set: at most 2% slower.

"x% slower" is the ratio of time per unit of work, on / off, minus one:
``t_on / t_off`` for hackbench, ``ops_off / ops_on`` for stress-ng. Each
off/on pair gives one ratio; the report gives their median, mean and range.

Configurations: the default hook set (``collect`` without ``--hooks``), and
each hook alone (``--hooks X``), so the cost of each hook shows.

This is a 2-vCPU machine that others use too. Before each run the script
waits (up to ``--quiet-wait`` s) for the machine's busy time to fall below
``--quiet-busy`` percent, and it records for each run the CPU used by
*others*: the machine's busy time minus the workload's CPU (its rusage) and
the collector's (its /proc stat). Pairs where either side had others above
``--max-others`` percent of one CPU are left out of the "clean" statistics
(all pairs are in the JSON).

The kernel's timing of BPF programs (``--bpf-stats``: the ns/run figures) is off
unless asked for: it adds two clock reads to every run of every program, the
floor's too, which lowers the storm's ratio to the floor below what collecting
costs a user (on the 2-vCPU VM the floor's cost a switch-in nearly doubled: 85 to
162 ns). ``python -m bench hotpath`` times the programs.

Needs root, hackbench (``apt-get install rt-tests``), stress-ng and built BPF
objects. Run: ``sudo python -m bench overhead --help``.

Where stress-ng is missing or the machine is large, ``--storm PROGRAM`` runs the
switch storm with a program of its own (``bench/switch_storm.c``, built static:
``gcc -O2 -static -o storm bench/switch_storm.c``), one pair per CPU by default;
``--deadline`` keeps a run to a budget (the results are saved after each round).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from bench import harness
from bench.harness import remove_output, save

#: what this benchmark is held to (python -m bench list shows it)
TARGET = (
    "storm: default hooks ≤ 1.5× the floor's slowdown, 0 drops; "
    "hackbench ≤ 5%, stress-ng --cpu ≤ 1% slower"
)

BENCH = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
MARK = "probes attached"


# --- CPU accounting ---------------------------------------------------------------
def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle (all CPUs, since boot)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    rest = stat[stat.rindex(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / CLK_TCK


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def enable_bpf_stats() -> int:
    """Have the kernel time every BPF program run (run_time_ns, run_cnt) for as
    long as the returned fd stays open. Costs two clock reads per run."""
    from kernmlops.ebpf.libbpf import lib

    fd = lib.bpf_enable_stats(0)  # BPF_STATS_RUN_TIME
    if fd < 0:
        raise RuntimeError("BPF_ENABLE_STATS failed")
    return fd


def bpf_prog_stats(pid: int) -> dict[int, tuple[str, int, int]]:
    """prog id -> (name, run_time_ns, run_cnt) of the BPF programs a process holds."""
    import ctypes

    from kernmlops.ebpf.libbpf import lib, prog_info

    get_fd = lib.bpf_prog_get_fd_by_id
    get_fd.argtypes, get_fd.restype = [ctypes.c_uint32], ctypes.c_int
    out: dict[int, tuple[str, int, int]] = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            info = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                if ":\t" in line
            )
        except OSError:
            continue
        prog_id = int(info["prog_id"])
        own = get_fd(prog_id)
        name = prog_info(own).name.decode() if own >= 0 else "?"
        if own >= 0:
            os.close(own)
        out[prog_id] = (name, int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0)))
    return out


def quiet_wait(max_busy_pct: float, max_wait_s: float) -> float:
    """Wait until the machine's busy share over one second is below the
    threshold (percent of one CPU), at most max_wait_s; return the last share."""
    deadline = time.monotonic() + max_wait_s
    while True:
        b0, t0 = machine_busy_s(), time.monotonic()
        time.sleep(1.0)
        busy = 100 * (machine_busy_s() - b0) / (time.monotonic() - t0)
        if busy < max_busy_pct or time.monotonic() >= deadline:
            return busy


def quiet_cap(args: argparse.Namespace, states: int, now: float) -> float:
    """The longest quiet wait a storm state may take: ``--quiet-wait``, less where
    ``--deadline`` leaves no room for it beside the round's own runs (each about the
    storm's seconds and 8 s of a collector's start and stop): on a busy machine the
    waits took a short phase's whole budget before its first round ended."""
    if not args.deadline:
        return args.quiet_wait
    room = args.deadline - now - states * (args.storm_s + 8)
    return max(0.0, min(args.quiet_wait, room / states))


# --- the collector ------------------------------------------------------------------
def kernmlops_cmd() -> list[str]:
    script = Path(sys.executable).parent / "kernmlops"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kernmlops"]


class CollectorLost(RuntimeError):
    """The collector failed to attach or died during the run (e.g. a signal
    from someone else's clean-up on a shared machine): the run is retried."""


class Collector:
    """``kernmlops collect -b faux`` in the background, until stopped."""

    #: extra arguments for every `collect` (--collect-args)
    extra: ClassVar[list[str]] = []

    def __init__(self, hooks: list[str] | None, settle_s: float) -> None:
        self.hooks = hooks
        self.settle_s = settle_s
        self.out: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.manifest: dict = {}

    @staticmethod
    def argv(hooks: list[str] | None, out: str) -> list[str]:
        argv = [*kernmlops_cmd(), "collect", "-b", "faux", "--no-progress", "-o", out]
        argv += Collector.extra
        return [*argv, "--hooks", ",".join(hooks)] if hooks else argv

    def start(self) -> None:
        attached = threading.Event()
        self.out = Path(tempfile.mkdtemp(prefix="kmo-overhead-"))
        self.proc = self._popen(self.argv(self.hooks, str(self.out)))

        def read() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                if MARK in line:
                    attached.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 60
        while not attached.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise CollectorLost(f"collector did not attach:\n{''.join(self.lines[-20:])}")
        time.sleep(self.settle_s)  # past start-up work (first snapshots, first polls)

    def _popen(self, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.manifest = self._result()
        if self.out is not None:
            remove_output(self.out)
        self.proc = None

    def _result(self) -> dict:
        """What the stopped collector reported: its collection's manifest."""
        found = sorted(self.out.glob("curated/*/*/manifest.json")) if self.out else []
        return json.loads(found[0].read_text()) if found else {}


FLOOR_SOURCE = BENCH / "floor.bpf.c"
FLOOR_OBJECT = BENCH / "build" / "floor.bpf.o"


def build_floor() -> Path:
    """Compile bench/floor.bpf.c (kernmlops' own build) when it changed; where
    there is no clang (a machine the wheel was installed on), the object built
    elsewhere and carried along."""
    from kernmlops.ebpf.build import SOURCE_DIR, compile_object

    if FLOOR_OBJECT.exists() and not shutil.which("clang"):
        return FLOOR_OBJECT
    newest = max(f.stat().st_mtime for f in (FLOOR_SOURCE, *SOURCE_DIR.glob("*.h")))
    if not FLOOR_OBJECT.exists() or FLOOR_OBJECT.stat().st_mtime < newest:
        compile_object(FLOOR_SOURCE, FLOOR_OBJECT)
    return FLOOR_OBJECT


def floor_child(obj_path: Path) -> int:
    """Run by the Floor collector: attach the count-only program, say so, wait
    for SIGINT/SIGTERM, print the switches it counted as JSON."""
    from kernmlops.ebpf.objects import open_and_load

    obj = open_and_load(obj_path)
    obj.attach_all()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"floor: {MARK}", file=sys.stderr, flush=True)
    stop.wait()
    obj.detach()
    counted = int(obj.map("switches").lookup_percpu(0).sum())
    obj.close()
    print(json.dumps({"hooks": {"floor": {"events": counted, "drops": 0}}}), flush=True)
    return 0


#: the default hook on the scheduler, its ring and the ring's size (its default ring_kib)
PROGRAMS_HOOK, PROGRAMS_RING, PROGRAMS_RING_BYTES = "quanta_runtime", "quanta_switch_rb", 8 << 20


def open_programs(obj_path: Path):
    """quanta_runtime's object (or a build of it) loaded as ``programs`` runs it: not
    following this process, its ring at the default size."""
    from kernmlops.ebpf.objects import open_and_load

    return open_and_load(
        obj_path,
        globals_={"kmo_self_tgid": os.getpid()},
        max_entries={PROGRAMS_RING: PROGRAMS_RING_BYTES},
    )


def discard_rings(objs: list, ring: str, stop: threading.Event) -> int:
    """The cheapest reader there is: every 10 ms each object's ring consumer position
    jumps to its producer's, so the records are thrown away unread, until ``stop``.
    The bytes thrown away, in all."""
    import mmap

    views, maps, discarded = [], [], 0
    for obj in objs:
        fd, page = obj.map(ring).fd, mmap.PAGESIZE
        cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        prod = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        maps += [cons, prod]
        # one 8-byte store each (struct.pack_into zeroes the position first: refused batches)
        views.append((memoryview(cons)[:8].cast("Q"), memoryview(prod)[:8].cast("Q")))
    while not stop.wait(0.01):
        for tail, head in views:
            now = head[0]
            discarded += now - tail[0]
            tail[0] = now
    for tail, head in views:
        tail.release()
        head.release()
    for m in maps:
        m.close()
    return discarded


def programs_child(obj_path: Path) -> int:
    """Run by the Programs collector: the default scheduler hook's own programs
    (quanta_runtime, every record streamed into its ring as in a collection) with
    the cheapest reader there is (discard_rings). What this costs beyond the
    floor is the programs' and the ring's share; what the full collector costs
    beyond this is user space's (decoding, Arrow, Parquet)."""
    obj = open_programs(obj_path)
    obj.attach_all()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"programs: {MARK}", file=sys.stderr, flush=True)
    discarded = discard_rings([obj], PROGRAMS_RING, stop)
    obj.detach()
    drops = int(obj.map("drops").lookup_percpu(0).sum())
    obj.close()
    # "events" here are ring bytes (batches of records), not rows
    print(json.dumps({"hooks": {PROGRAMS_HOOK: {"events": discarded, "drops": drops}}}), flush=True)
    return 0


class Floor(Collector):
    """The floor: a process of ours holding only bench/floor.bpf.c's program."""

    child_flag = "--floor-child"

    def __init__(self, settle_s: float) -> None:
        super().__init__(None, settle_s)

    def argv(self, hooks: list[str] | None, out: str) -> list[str]:  # type: ignore[override]
        return [sys.executable, "-m", "bench", "overhead", self.child_flag, str(self.object)]

    @property
    def object(self) -> Path:
        return FLOOR_OBJECT

    def start(self) -> None:
        self._stdout = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in stop)
        super().start()

    def _popen(self, argv: list[str]) -> subprocess.Popen:
        # the child finds the bench package from whatever folder the run started in
        return subprocess.Popen(
            argv, stdout=self._stdout, stderr=subprocess.PIPE, text=True, env=harness.child_env()
        )

    def _result(self) -> dict:
        """The floor child prints its count as JSON on stdout at exit."""
        self._stdout.seek(0)
        text = self._stdout.read().strip()
        self._stdout.close()
        return json.loads(text) if text else {}


class Programs(Floor):
    """quanta_runtime's programs streaming into their ring, records discarded unread."""

    child_flag = "--programs-child"

    @property
    def object(self) -> Path:
        from kernmlops.ebpf.build import object_path

        return object_path(PROGRAMS_HOOK)


# --- workloads ----------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    argv: list[str]
    #: True: the score is a throughput (higher is better); False: a time
    higher_is_better: bool

    def score(self, stdout: str, stderr: str) -> tuple[float, float]:
        """(score, units of work done): hackbench does a fixed amount (1), a
        stress-ng run the bogo ops it reports."""
        text = stdout + stderr
        if self.name == "hackbench":
            found = re.search(r"^Time:\s*([\d.]+)", text, re.M)
            if found:
                return float(found.group(1)), 1.0
        else:
            # stress-ng: metrc: [pid] <stressor> <ops> <real s> <usr s> <sys s> <ops/s real> ...
            stressor = self.argv[self.argv.index("stress-ng") + 1].lstrip("-")
            pattern = rf"\]\s+{stressor}\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)"
            found = re.search(pattern, text)
            if found:
                return float(found.group(2)), float(found.group(1))
        raise RuntimeError(f"{self.name}: no score in its output:\n{text[-2000:]}")


def hackbench(args: str) -> Workload:
    return Workload("hackbench", ["hackbench", *shlex.split(args)], higher_is_better=False)


def stress_cpu(timeout_s: int) -> Workload:
    argv = ["stress-ng", "--cpu", "2", "--timeout", f"{timeout_s}s", "--metrics-brief"]
    return Workload("stress-ng-cpu", argv, higher_is_better=True)


def switch_storm(timeout_s: int, program: str | None = None, pairs: int = 2) -> Workload:
    """Pairs of processes bouncing a pipe: the scheduler's hottest path (every
    switch and wake-up runs the scheduler hooks). stress-ng's score is its
    switches/s; a storm program's (PAIRS SECONDS, one JSON line at its end) its
    round trips/s: either way the slowdown is the time per unit of work."""
    if program:
        return StormProgram("switch-storm", [program, str(pairs), str(timeout_s)], True)
    argv = ["stress-ng", "--switch", str(pairs), "--timeout", f"{timeout_s}s", "--metrics-brief"]
    return Workload("switch-storm", argv, higher_is_better=True)


class StormProgram(Workload):
    """A storm program's JSON line: ``round_trips_per_s`` and ``round_trips``."""

    def score(self, stdout: str, stderr: str) -> tuple[float, float]:
        for line in reversed(stdout.splitlines()):
            if line.startswith("{"):
                got = json.loads(line)
                return float(got["round_trips_per_s"]), float(got["round_trips"])
        raise RuntimeError(f"{self.argv[0]}: no result line:\n{(stdout + stderr)[-2000:]}")


@dataclass
class Run:
    state: str  # off | on
    score: float
    units: float
    wall_s: float
    workload_cpu_s: float
    collector_cpu_s: float
    #: CPU others used meanwhile, percent of one CPU
    others_pct: float
    #: CPU the collector's BPF programs ran (kernel stats), and their runs
    bpf_cpu_s: float = 0.0
    bpf_runs: int = 0
    #: program name -> [run_time_ns, run_cnt] during the run
    bpf_progs: dict[str, list[int]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)


def run_once(w: Workload, collector: Collector | None) -> Run:
    if collector is not None:
        collector.start()
    try:
        cpid = collector.proc.pid if collector and collector.proc else None
        c0 = process_cpu_s(cpid) if cpid else 0.0
        p0 = bpf_prog_stats(cpid) if cpid else {}
        w0, b0, t0 = children_cpu_s(), machine_busy_s(), time.monotonic()
        proc = subprocess.run(w.argv, capture_output=True, text=True)
        wall = time.monotonic() - t0
        busy = machine_busy_s() - b0
        work = children_cpu_s() - w0
        coll = (process_cpu_s(cpid) - c0) if cpid else 0.0
        p1 = bpf_prog_stats(cpid) if cpid else {}
        bpf_ns = sum(p1[i][1] - p0[i][1] for i in p1 if i in p0)
        bpf_runs = sum(p1[i][2] - p0[i][2] for i in p1 if i in p0)
        progs: dict[str, list[int]] = {}
        for i in p1:
            if i in p0:
                acc = progs.setdefault(p1[i][0], [0, 0])
                acc[0] += p1[i][1] - p0[i][1]
                acc[1] += p1[i][2] - p0[i][2]
        if (
            collector is not None
            and collector.proc is not None
            and collector.proc.poll() is not None
        ):
            raise CollectorLost(
                f"collector exited during the run:\n{''.join(collector.lines[-20:])}"
            )
    finally:
        if collector is not None:
            collector.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(w.argv)} exited {proc.returncode}:\n{proc.stderr}")
    hooks = collector.manifest.get("hooks", {}) if collector else {}
    score, units = w.score(proc.stdout, proc.stderr)
    return Run(
        state="on" if collector else "off",
        score=score,
        units=units,
        wall_s=wall,
        workload_cpu_s=work,
        collector_cpu_s=coll,
        others_pct=max(0.0, 100 * (busy - work - coll) / wall),
        bpf_cpu_s=bpf_ns / 1e9,
        bpf_runs=bpf_runs,
        bpf_progs=progs,
        events={h: s.get("events", 0) for h, s in hooks.items()},
        drops={h: s.get("drops", 0) + s.get("missed", 0) for h, s in hooks.items()},
    )


def slowdown(w: Workload, off: Run, on: Run) -> float:
    """Time per unit of work, on / off."""
    return off.score / on.score if w.higher_is_better else on.score / off.score


def added_cpu(on: Run) -> float:
    """CPU the collection added, over the workload's own CPU, in one "on" run:
    (BPF programs + collector process) / (workload CPU - BPF programs). The
    BPF programs run in the traced tasks' time, so they are inside the
    workload's CPU. Needs no "off" run, so others' load hardly moves it; it
    misses indirect costs (caches, locks, wake-ups)."""
    own = on.workload_cpu_s - on.bpf_cpu_s
    return (on.bpf_cpu_s + on.collector_cpu_s) / own if own > 0 else float("nan")


def cpu_cost(off: Run, on: Run) -> float:
    """CPU per unit of work, on (the workload's, BPF programs included, plus
    the collector's) / off. Others' load changes it far less than wall time."""
    return ((on.workload_cpu_s + on.collector_cpu_s) / on.units) / (off.workload_cpu_s / off.units)


@dataclass
class Result:
    config: str
    workload: str
    argv: list[str]
    collector_argv: list[str]
    pairs: list[tuple[Run, Run]]
    ratios: list[float]
    clean: list[float]

    def summary(self) -> dict:
        use = self.clean if len(self.clean) >= 2 else self.ratios
        offs = [off.score for off, _ in self.pairs]
        ons = [on.score for _, on in self.pairs]
        coll = [on.collector_cpu_s / on.wall_s * 100 for _, on in self.pairs]
        events = [sum(on.events.values()) / on.wall_s for _, on in self.pairs]
        cost = [cpu_cost(off, on) for off, on in self.pairs]
        return {
            "config": self.config,
            "workload": self.workload,
            "pairs": len(self.ratios),
            "clean_pairs": len(self.clean),
            "median_ratio": statistics.median(use),
            "mean_ratio": statistics.fmean(use),
            "min_ratio": min(use),
            "max_ratio": max(use),
            "median_ratio_all": statistics.median(self.ratios),
            "median_cpu_cost_ratio": statistics.median(cost),
            "median_added_cpu": statistics.median(added_cpu(on) for _, on in self.pairs),
            "bpf_ns_per_run": (  # None: not timed (--bpf-stats)
                sum(on.bpf_cpu_s for _, on in self.pairs)
                * 1e9
                / sum(on.bpf_runs for _, on in self.pairs)
                if sum(on.bpf_runs for _, on in self.pairs)
                else None
            ),
            "bpf_runs_per_s": statistics.median(on.bpf_runs / on.wall_s for _, on in self.pairs),
            "bpf_cpu_pct": statistics.median(
                100 * on.bpf_cpu_s / on.wall_s for _, on in self.pairs
            ),
            "median_off": statistics.median(offs),
            "median_on": statistics.median(ons),
            "collector_cpu_pct": statistics.median(coll),
            "events_per_s": statistics.median(events),
            "drops": sum(sum(on.drops.values()) for _, on in self.pairs),
        }


def measure(
    config: str,
    hooks: list[str] | None,
    w: Workload,
    rounds: int,
    args: argparse.Namespace,
) -> Result:
    pairs: list[tuple[Run, Run]] = []
    for r in range(rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        runs: dict[str, Run] = {}
        for state in order:
            quiet_wait(args.quiet_busy, quiet_cap(args, len(order), time.time()))
            for attempt in range(3):
                coll = Collector(hooks, args.settle) if state == "on" else None
                try:
                    runs[state] = run_once(w, coll)
                    break
                except CollectorLost as err:
                    print(f"  (retrying: {str(err).splitlines()[0]})", flush=True)
                    if attempt == 2:
                        raise
        off, on = runs["off"], runs["on"]
        pairs.append((off, on))
        print(
            f"  {config:20s} {w.name:14s} round {r + 1}/{rounds}: off {off.score:10.3f} "
            f"on {on.score:10.3f}  ratio {slowdown(w, off, on):6.3f}  "
            f"cpu cost {cpu_cost(off, on):6.3f}  added {100 * added_cpu(on):5.1f}%  "
            f"bpf {100 * on.bpf_cpu_s / on.wall_s:5.1f}%  "
            f"others {off.others_pct:5.1f}%/{on.others_pct:5.1f}%  "
            f"collector {on.collector_cpu_s / on.wall_s * 100:5.1f}%",
            flush=True,
        )
    ratios = [slowdown(w, off, on) for off, on in pairs]
    clean = [
        slowdown(w, off, on)
        for off, on in pairs
        if off.others_pct <= args.max_others and on.others_pct <= args.max_others
    ]
    coll_argv = Collector.argv(hooks, "<tmp>")
    return Result(config, w.name, w.argv, coll_argv, pairs, ratios, clean)


@dataclass
class StormResult:
    """The switch storm untraced, under the floor, under quanta_runtime's programs
    alone (records discarded unread) and under the default hooks, interleaved: per
    round one run of each, the order rotating."""

    argv: list[str]
    rounds: list[dict[str, Run]]

    def summary(self) -> dict:
        def slow(state: str) -> list[float]:
            return [r["off"].score / r[state].score - 1 for r in self.rounds]

        floor, default = slow("floor"), slow("default")
        programs = slow("programs") if all("programs" in r for r in self.rounds) else []
        pr = [r["programs"].bpf_progs.get("switch_btf", [0, 0]) for r in self.rounds if programs]
        progs: dict[str, list[int]] = {}
        for r in self.rounds:
            for name, (ns, cnt) in r["default"].bpf_progs.items():
                acc = progs.setdefault(name, [0, 0])
                acc[0] += ns
                acc[1] += cnt
        fl = [r["floor"].bpf_progs.get("floor_switch", [0, 0]) for r in self.rounds]
        return {
            "rounds": len(self.rounds),
            "off_switches_per_s": statistics.median(r["off"].score for r in self.rounds),
            "floor_slowdown": statistics.median(floor),
            "default_slowdown": statistics.median(default),
            # medians over the interleaved rounds; undefined while the floor is
            # lost in the noise (then the difference says it)
            "default_over_floor": (
                statistics.median(default) / statistics.median(floor)
                if statistics.median(floor) > 0.01
                else None
            ),
            "default_minus_floor": statistics.median(default) - statistics.median(floor),
            # the same ratio from the rounds' means, and where it lies: rounds drawn
            # with replacement (the rounds are the unit: each is one run of each state)
            **ratio_interval(default, floor),
            # quanta_runtime's programs alone, records discarded unread: the kernel's
            # share of the default hooks' slowdown; the rest is the collector's
            "programs_slowdown": statistics.median(programs) if programs else None,
            "programs_ns_per_run": (  # None: not timed (--bpf-stats)
                sum(x[0] for x in pr) / sum(x[1] for x in pr)
                if programs and sum(x[1] for x in pr)
                else None
            ),
            "programs_drops": sum(r["programs"].drops.get(PROGRAMS_HOOK, 0) for r in self.rounds)
            if programs
            else None,
            "floor_throughput_change": statistics.median(1 / (1 + f) - 1 for f in floor),
            "default_throughput_change": statistics.median(1 / (1 + d) - 1 for d in default),
            "floor_ns_per_run": (
                sum(x[0] for x in fl) / sum(x[1] for x in fl) if sum(x[1] for x in fl) else None
            ),
            "default_ns_per_run": {n: ns / cnt for n, (ns, cnt) in progs.items() if cnt},
            "default_runs_per_s": {
                n: cnt / sum(r["default"].wall_s for r in self.rounds)
                for n, (_, cnt) in progs.items()
            },
            "collector_cpu_pct": statistics.median(
                100 * r["default"].collector_cpu_s / r["default"].wall_s for r in self.rounds
            ),
            "events_per_s": statistics.median(
                sum(r["default"].events.values()) / r["default"].wall_s for r in self.rounds
            ),
            "drops": sum(sum(r["default"].drops.values()) for r in self.rounds),
        }


def ratio_interval(
    default: list[float], floor: list[float], draws: int = 10_000, seed: int = 0
) -> dict:
    """mean(default) / mean(floor) over the rounds and its 95% percentile-bootstrap
    interval (rounds resampled whole). None where the floor's mean is not above
    zero in the data or in 5% of the draws: the ratio is then not defined."""
    import random

    def ratio(idx: list[int]) -> float | None:
        f = statistics.fmean(floor[i] for i in idx)
        return statistics.fmean(default[i] for i in idx) / f if f > 0 else None

    n = len(floor)
    point = ratio(list(range(n)))
    rng = random.Random(seed)
    got = [ratio([rng.randrange(n) for _ in range(n)]) for _ in range(draws)]
    kept = sorted(r for r in got if r is not None)
    if point is None or len(kept) < 0.95 * draws:
        return {"mean_ratio": point, "mean_ratio_ci95": None}
    lo = kept[int(0.025 * len(kept))]
    hi = kept[min(len(kept) - 1, int(0.975 * len(kept)))]
    return {"mean_ratio": point, "mean_ratio_ci95": [lo, hi]}


STORM_STATES = ("off", "floor", "programs", "default")


def measure_storm(
    rounds: int, seconds: int, args: argparse.Namespace, save_round: Callable[[StormResult], None]
) -> StormResult:
    w = switch_storm(seconds, args.storm, args.storm_pairs)
    states = [st for st in STORM_STATES if st in args.storm_states]
    out: list[dict[str, Run]] = []
    slowest = 0.0
    for r in range(rounds):
        # a round is one run of each state, each with its collector's start and stop
        if args.deadline and out and time.time() + slowest > args.deadline:
            print(f"  (deadline: {r} of {rounds} rounds run)", flush=True)
            break
        began = time.monotonic()
        order = states[r % len(states) :] + states[: r % len(states)]
        runs: dict[str, Run] = {}
        for state in order:
            quiet_wait(args.quiet_busy, quiet_cap(args, len(order), time.time()))
            for attempt in range(3):
                coll: Collector | None = None
                if state == "floor":
                    coll = Floor(args.settle)
                elif state == "programs":
                    coll = Programs(args.settle)
                elif state == "default":
                    coll = Collector(None, args.settle)
                try:
                    runs[state] = run_once(w, coll)
                    runs[state].state = state
                    break
                except CollectorLost as err:
                    print(f"  (retrying: {str(err).splitlines()[0]})", flush=True)
                    if attempt == 2:
                        raise
        out.append(runs)
        off = runs["off"].score
        print(
            f"  switch storm round {r + 1}/{rounds}: off {off:,.0f}/s  "
            f"floor {runs['floor'].score:,.0f}/s ({100 * (off / runs['floor'].score - 1):+.1f}%)  "
            + (
                f"programs {runs['programs'].score:,.0f}/s "
                f"({100 * (off / runs['programs'].score - 1):+.1f}%)  "
                if "programs" in runs
                else ""
            )
            + f"default {runs['default'].score:,.0f}/s "
            f"({100 * (off / runs['default'].score - 1):+.1f}%)  "
            f"collector {100 * runs['default'].collector_cpu_s / runs['default'].wall_s:.1f}%  "
            f"drops {sum(runs['default'].drops.values())}",
            flush=True,
        )
        slowest = max(slowest, time.monotonic() - began)
        save_round(StormResult(w.argv, out))
    return StormResult(w.argv, out)


def ns_per_run(ns: float | None) -> str:
    return f"{ns:.0f} ns/run" if ns is not None else "ns/run not timed (--bpf-stats)"


def print_storm(res: StormResult) -> None:
    s = res.summary()
    over = s["default_over_floor"]
    ratio = f"{over:.2f}x" if over is not None else "n/a (floor within noise)"
    print(
        f"\nswitch storm ({shlex.join(res.argv)}), {s['rounds']} rounds, "
        f"untraced {s['off_switches_per_s']:,.0f} switches/s:\n"
        f"  slowdown = time per switch, traced / untraced - 1 (throughput: floor "
        f"{100 * s['floor_throughput_change']:+.1f}%, default "
        f"{100 * s['default_throughput_change']:+.1f}%)\n"
        f"  floor (count-only)  {100 * s['floor_slowdown']:+.1f}%  "
        f"{ns_per_run(s['floor_ns_per_run'])}\n"
        + (
            f"  programs only       {100 * s['programs_slowdown']:+.1f}%  "
            f"{ns_per_run(s['programs_ns_per_run'])} (quanta_runtime, records discarded unread; "
            f"{s['programs_drops']} drops)\n"
            if s["programs_slowdown"] is not None
            else ""
        )
        + f"  default hooks       {100 * s['default_slowdown']:+.1f}%  "
        f"= {ratio} the floor's slowdown ({100 * s['default_minus_floor']:+.1f} points); "
        f"collector {s['collector_cpu_pct']:.1f}% of a CPU, "
        f"{s['events_per_s']:,.0f} events/s, {s['drops']} drops\n"
        + (
            f"  ratio of the rounds' means {s['mean_ratio']:.2f}x, 95% "
            f"{s['mean_ratio_ci95'][0]:.2f}x..{s['mean_ratio_ci95'][1]:.2f}x (rounds resampled)"
            if s["mean_ratio_ci95"]
            else "  ratio of the rounds' means: not defined (the floor is within the noise)"
        )
    )
    for name, ns in sorted(s["default_ns_per_run"].items()):
        print(f"    {name:24s} {ns:6.0f} ns/run  {s['default_runs_per_s'][name]:10,.0f} runs/s")


def print_table(results: list[Result]) -> None:
    head = (
        f"{'config':20s} {'workload':14s} {'slower':>8s} {'mean':>7s} {'range':>16s} {'cpu':>7s} "
        f"{'added':>7s} {'pairs':>7s} {'coll.CPU':>8s} {'bpf CPU':>8s} {'ns/run':>7s} "
        f"{'runs/s':>10s} {'drops':>6s}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for res in results:
        s = res.summary()
        print(
            f"{s['config']:20s} {s['workload']:14s} {100 * (s['median_ratio'] - 1):+7.1f}% "
            f"{100 * (s['mean_ratio'] - 1):+6.1f}% "
            f"{100 * (s['min_ratio'] - 1):+6.1f}..{100 * (s['max_ratio'] - 1):+6.1f}% "
            f"{100 * (s['median_cpu_cost_ratio'] - 1):+6.1f}% "
            f"{100 * s['median_added_cpu']:6.1f}% "
            f"{s['clean_pairs']:>3d}/{s['pairs']:<3d} {s['collector_cpu_pct']:7.1f}% "
            + (
                f"{s['bpf_cpu_pct']:7.2f}% {s['bpf_ns_per_run']:7.0f} "
                if s["bpf_ns_per_run"] is not None
                else f"{'-':>8s} {'-':>7s} "  # not timed (--bpf-stats)
            )
            + f"{s['bpf_runs_per_s']:10.0f} {s['drops']:6d}"
        )


def main(argv: list[str] | None = None) -> int:
    from kernmlops.hooks import DEFAULT_HOOKS, REGISTRY

    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=5, help="off/on pairs, default hook set")
    parser.add_argument("--hook-rounds", type=int, default=3, help="off/on pairs per hook alone")
    parser.add_argument(
        "--hooks-alone",
        default="all",
        help="comma-separated hooks to measure alone ('all': every hook, 'none': skip)",
    )
    parser.add_argument("--skip-default", action="store_true", help="skip the default hook set")
    parser.add_argument("--hackbench", default="-p -g 8 -l 1000", help="hackbench arguments")
    parser.add_argument("--stress-s", type=int, default=10, help="stress-ng seconds (default)")
    parser.add_argument("--hook-stress-s", type=int, default=5, help="stress-ng seconds per hook")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after attach")
    parser.add_argument("--quiet-busy", type=float, default=25.0, help="percent of one CPU")
    parser.add_argument("--quiet-wait", type=float, default=20.0, help="seconds, at most")
    parser.add_argument("--max-others", type=float, default=15.0, help="percent of one CPU")
    parser.add_argument(
        "--collect-args", default="", help="extra arguments for collect, e.g. '-c my.yaml'"
    )
    parser.add_argument("--storm-rounds", type=int, default=5, help="switch storm rounds (0: skip)")
    parser.add_argument("--storm-s", type=int, default=5, help="switch storm seconds per run")
    parser.add_argument(
        "--storm",
        help="a storm program taking PAIRS SECONDS and printing one JSON line with round_trips "
        "and round_trips_per_s (bench/switch_storm.c) instead of stress-ng --switch",
    )
    parser.add_argument(
        "--storm-pairs",
        type=int,
        help="storm pairs (default: 2 for stress-ng, one per CPU allowed for --storm)",
    )
    parser.add_argument(
        "--storm-states",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=list(STORM_STATES),
        help="the storm's states, comma-separated: off, floor and default always run; "
        "programs (quanta_runtime's programs, records unread) may be left out "
        "(default: all four)",
    )
    parser.add_argument(
        "--deadline", type=float, help="unix time: no storm round starts that would end after it"
    )
    parser.add_argument(
        "--bpf-stats",
        action="store_true",
        help="time every BPF program run (kernel.bpf_stats_enabled: the ns/run figures). It "
        "adds two clock reads to every run of every program, the floor's too, so the storm's "
        "ratio to the floor reads lower than what collecting costs a user (on the 2-vCPU VM "
        "it nearly doubled the floor's cost a switch): off for the cost target",
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "overhead.json")
    parser.add_argument("--floor-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--programs-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_child:
        return floor_child(args.floor_child)
    if args.programs_child:
        return programs_child(args.programs_child)
    if os.geteuid() != 0:
        print("error: needs root (BPF)", file=sys.stderr)
        return 2
    unknown = set(args.storm_states) - set(STORM_STATES)
    if unknown or not {"off", "floor", "default"} <= set(args.storm_states):
        print(f"error: --storm-states: off,floor,default and optionally programs, not "
              f"{','.join(args.storm_states)}", file=sys.stderr)  # fmt: skip
        return 2
    if args.storm_pairs is None:
        args.storm_pairs = len(os.sched_getaffinity(0)) if args.storm else 2
    if args.storm and not shutil.which(args.storm):
        print(f"error: {args.storm}: no such program", file=sys.stderr)
        return 2
    needed = [("stress-ng", "stress-ng")] if args.storm_rounds > 0 and not args.storm else []
    if not args.skip_default or args.hooks_alone != "none":
        needed = [("hackbench", "rt-tests"), ("stress-ng", "stress-ng")]
    for tool, pkg in needed:
        if not shutil.which(tool):
            print(f"error: {tool} not found (apt-get install {pkg})", file=sys.stderr)
            return 2
    if args.hooks_alone == "all":
        alone = list(REGISTRY)
    elif args.hooks_alone == "none":
        alone = []
    else:
        alone = [h.strip() for h in args.hooks_alone.split(",") if h.strip()]
        unknown = [h for h in alone if h not in REGISTRY]
        if unknown:
            print(f"error: unknown hooks {unknown}; known: {', '.join(REGISTRY)}", file=sys.stderr)
            return 2
    configs: list[tuple[str, list[str] | None, int, int]] = []
    if not args.skip_default:
        configs.append(("default", None, args.rounds, args.stress_s))
    configs += [(h, [h], args.hook_rounds, args.hook_stress_s) for h in alone]

    Collector.extra = shlex.split(args.collect_args)
    # closed at exit: stats go off again
    stats_fd = enable_bpf_stats() if args.bpf_stats else None
    print(f"default hook set: {', '.join(DEFAULT_HOOKS)}")
    results: list[Result] = []
    t0 = time.monotonic()
    storm: StormResult | None = None

    def body() -> dict:
        return {
            "machine": {"kernel": os.uname().release, "cpus": os.cpu_count()},
            "default_hooks": list(DEFAULT_HOOKS),
            "args": {k: str(v) for k, v in vars(args).items()},
            "storm": (
                {
                    **storm.summary(),
                    "workload_argv": storm.argv,
                    "rounds": [{k: asdict(v) for k, v in r.items()} for r in storm.rounds],
                }
                if storm
                else None
            ),
            "results": [
                {
                    **r.summary(),
                    "workload_argv": r.argv,
                    "collector_argv": r.collector_argv,
                    "ratios": r.ratios,
                    "runs": [[asdict(off), asdict(on)] for off, on in r.pairs],
                }
                for r in results
            ],
        }

    def save_round(so_far: StormResult) -> None:
        # a run cut short (a budget, a lost machine) keeps every round it finished
        nonlocal storm
        storm = so_far
        save(args.out, body())

    if args.storm_rounds > 0:
        build_floor()
        storm = measure_storm(args.storm_rounds, args.storm_s, args, save_round)
        if storm.rounds:
            print_storm(storm)
    for config, hooks, rounds, stress_s in configs:
        for w in (hackbench(args.hackbench), stress_cpu(stress_s)):
            results.append(measure(config, hooks, w, rounds, args))
    print_table(results)
    print(f"\n{time.monotonic() - t0:.0f} s in all")
    save(args.out, body())
    print(f"wrote {args.out}")
    if stats_fd is not None:
        os.close(stats_fd)
    return 0
