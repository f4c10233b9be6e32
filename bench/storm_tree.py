"""`kernmlops collect -- STORM` on the storm's own process tree, default config: what a
user sees at scale.

Per run: events and drops per hook, the collector's peak RSS (VmHWM, sampled every
0.1 s), the peak growth of /dev/shm (the memory spool) and the output folder's disk
use every 50 ms from a thread (apparent and allocated, by kind: the disk spool, its
runway's blocks allocated ahead included; tables; the row workers' staging; the
compaction's copy), its peak while the storm ran and during the stop, against the
collection's final size, CPU seconds per collector
thread by name (at the storm's end and at exit: ``kmo-copier`` is the ring copier
and zstd's workers), the time from the storm's end to the collector's exit (rows
made, parts compacted) and what ``read_collection`` then reads.

The storm is any command that takes ``PAIRS SECONDS`` and prints one JSON line
with ``round_trips`` at its end (the 16-core recipe's static ``storm``); without
``--storm``, ``stress-ng --switch PAIRS -t SECONDS`` (its end is then its "run
completed" line).

    sudo python -m bench storm-tree --storm ./storm --seconds 5 15
    sudo python -m bench storm-tree --seconds 4 --rounds 6 --bpf-stats --baseline /tmp/old-site
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = (
    "0 drops at every CPU count; collector RSS ≤ 200 MB at 16 CPUs; storm end to a "
    "readable collection ≤ the storm's duration"
)


def hwm_kb(pid: int) -> int:
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1])
    except OSError:
        pass
    return 0


def children_rss_kb(pid: int) -> int:
    """RSS of every process below ``pid`` but the storm's (the row workers at stop)."""
    total, todo = 0, [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except OSError:
                continue
            for kid in kids:
                try:
                    status = Path(f"/proc/{kid}/status").read_text()
                except OSError:
                    continue
                if "\nName:\tpython" not in "\n" + status and not status.startswith(
                    "Name:\tpython"
                ):
                    continue  # the storm and its tree are not the collector's
                todo.append(kid)
                for ln in status.splitlines():
                    if ln.startswith("VmRSS:"):
                        total += int(ln.split()[1])
    return total


def shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (the collection, its disk spool and staging)."""
    return sum(disk_use(root)[0].values())


#: what the files of a collection are, by their top folder (the rest: "tables")
_KINDS = {".spool": "spool", ".rows-": "staging", ".compact-": "compact"}


def disk_use(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes of the files under ``root`` by kind (spool, tables, staging, compact),
    apparent (st_size) and allocated (st_blocks: what the disk gives, the runway's
    blocks allocated ahead of the spool's writes included)."""
    size: dict[str, int] = {}
    used: dict[str, int] = {}
    for folder, _, files in os.walk(root):
        top = Path(folder).relative_to(root).parts[:1]
        kind = next((k for p, k in _KINDS.items() if top and top[0].startswith(p)), "tables")
        for f in files:
            with contextlib.suppress(OSError):  # gone meanwhile (a frame read, a part moved)
                st = os.lstat(os.path.join(folder, f))
                size[kind] = size.get(kind, 0) + st.st_size
                used[kind] = used.get(kind, 0) + st.st_blocks * 512
    return size, used


class DiskSampler:
    """The output folder's disk use every ``period_s`` from a thread of its own:
    (seconds since ``t0``, apparent bytes by kind, allocated bytes by kind)."""

    def __init__(self, root: Path, t0: float, period_s: float = 0.05) -> None:
        self.samples: list[tuple[float, dict[str, int], dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(root, t0, period_s), daemon=True)
        self._thread.start()

    def _run(self, root: Path, t0: float, period_s: float) -> None:
        while not self._stop.wait(period_s):
            found = list(root.glob("curated/*/*"))
            if found:
                size, used = disk_use(found[0])
                self.samples.append((time.monotonic() - t0, size, used))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peaks(self, storm_end: float | None) -> dict:
        """The allocated and the written (apparent) peak while the storm ran and during
        the stop, each with its kinds; what was allocated at the storm's end: MiB."""

        def mib(kinds: dict[str, int]) -> dict[str, float]:
            return {k: round(v / 2**20, 1) for k, v in sorted(kinds.items())}

        out: dict = {"disk_samples": len(self.samples)}
        if self.samples:
            out["output_peak_mb"] = max(sum(s.values()) for _, s, _ in self.samples) / 2**20
        end = storm_end if storm_end is not None else math.inf
        for phase, part in (
            ("run", [x for x in self.samples if x[0] <= end]),
            ("stop", [x for x in self.samples if x[0] > end]),
        ):
            if part:
                t, _, used = max(part, key=lambda x: sum(x[2].values()))
                out[f"disk_peak_{phase}_mb"] = round(sum(used.values()) / 2**20, 1)
                out[f"disk_peak_{phase}"] = {"at_s": round(t, 2), **mib(used)}
                # what was written (st_size): the runway's blocks ahead left out
                t, size, _ = max(part, key=lambda x: sum(x[1].values()))
                out[f"written_peak_{phase}"] = {"at_s": round(t, 2), **mib(size)}
        before = [x for x in self.samples if x[0] <= end]
        if before and storm_end is not None:
            out["disk_at_storm_end"] = mib(before[-1][2])
        return out


def storm_argv(storm: str | None, pairs: int, seconds: float) -> list[str]:
    if storm:
        return [storm, str(pairs), f"{seconds:g}"]
    return ["stress-ng", "--switch", str(pairs), "-t", f"{seconds:g}", "--metrics-brief"]


def _ended(line: str) -> bool:
    """The storm's end: its result line, stress-ng's last line, or the collector's
    note that it makes rows from the spool (the benchmark has ended)."""
    return (
        (line.startswith("{") and "round_trips" in line)
        or "run completed in" in line
        or "making rows from" in line
    )


def program_ns(pid: int) -> dict[str, list[int]]:
    """name -> [run_time_ns, run_cnt] of the BPF programs process ``pid`` holds (with
    the kernel's run-time statistics on: ``--bpf-stats``)."""
    from bench.overhead import bpf_prog_stats

    out: dict[str, list[int]] = {}
    for name, ns, cnt in bpf_prog_stats(pid).values():
        acc = out.setdefault(name, [0, 0])
        acc[0] += ns
        acc[1] += cnt
    return out


class Neighbour:
    """Another process writing to the collection's filesystem while a run goes on:
    `dd` of NEIGHBOUR_MB with fsync, back to back (as CI's idle lane writes beside
    the storm test). Its journal commits and writeback are what a storm keeps off
    the CPU while the spool's disk writes wait for them."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "neighbour.dat"
        self.writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            subprocess.run(["dd", "if=/dev/zero", f"of={self.path}", "bs=1M",
                            f"count={NEIGHBOUR_MB}", "conv=fsync", "status=none"],
                           check=False)  # fmt: skip
            self.writes += 1

    def stop(self) -> int:
        """Stop after the write under way; the writes made."""
        self._stop.set()
        self._thread.join()
        self.path.unlink(missing_ok=True)
        return self.writes


#: what the neighbour writes at a time
NEIGHBOUR_MB = 300


def one(
    storm: str | None, pairs: int, seconds: float, extra: list[str],
    env: dict[str, str] | None = None, stats: bool = False, read: str = "full",
    keep: Path | None = None, neighbour: bool = False,
) -> dict:  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="kmo-tree-", dir=keep))
    beside = Neighbour(out.parent) if neighbour else None
    argv = [
        sys.executable,
        "-m",
        "kernmlops",
        "collect",
        "--no-progress",
        "-o",
        str(out),
        *extra,
        "--",
        *storm_argv(storm, pairs, seconds),
    ]
    shm0 = shm_used()
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def log() -> None:  # not ``read``: that is how the collection is read back
        assert p.stdout is not None
        for ln in p.stdout:
            lines.append((time.monotonic() - t0, ln.rstrip()))

    th = threading.Thread(target=log, daemon=True)
    th.start()
    disk = DiskSampler(out, t0)
    peak_rss = peak_shm = peak_children = 0
    threads: dict[int, tuple[str, float]] = {}
    at_end: dict[str, float] | None = None
    progs: dict[str, list[int]] = {}
    while p.poll() is None:
        peak_rss = max(peak_rss, hwm_kb(p.pid))
        peak_shm = max(peak_shm, shm_used() - shm0)
        peak_children = max(peak_children, children_rss_kb(p.pid))
        harness.thread_cpu(p.pid, threads)
        if stats and at_end is None:
            progs = program_ns(p.pid) or progs  # the last reading before the storm's end
        if at_end is None and any(_ended(ln) for _, ln in lines):
            at_end = {}
            for comm, cpu in threads.values():
                at_end[comm] = at_end.get(comm, 0.0) + cpu
        time.sleep(0.1)
    t_exit = time.monotonic() - t0
    disk.stop()
    th.join(5)
    neighbour_writes = beside.stop() if beside is not None else None
    by_comm: dict[str, float] = {}
    for comm, cpu in threads.values():
        by_comm[comm] = by_comm.get(comm, 0.0) + cpu
    rec_threads = {
        "cpu_s_by_thread_name": by_comm,
        "cpu_s_at_storm_end": at_end,
        "threads": len(threads),
    }
    rec: dict = {
        **rec_threads,
        "argv": argv,
        "rc": p.returncode,
        "exit_s": t_exit,
        "collector_peak_rss_mb": peak_rss / 1024,
        "row_workers_peak_rss_mb": peak_children / 1024,
        "shm_peak_mb": peak_shm / 2**20,
        "bpf_ns_per_run": {n: ns / cnt for n, (ns, cnt) in progs.items() if cnt},
        "bpf_runs": {n: cnt for n, (_, cnt) in progs.items()},
        # the disk neighbour's writes of NEIGHBOUR_MB (None: none ran)
        "neighbour_writes": neighbour_writes,
    }
    # the storm prints one JSON line at its end: that time is the benchmark's end
    storm_end = next((t for t, ln in lines if _ended(ln)), None)
    attached = next((t for t, ln in lines if "probes attached" in ln), None)
    rec["attached_s"] = attached
    rec["storm_end_s"] = storm_end
    rec["end_to_exit_s"] = (t_exit - storm_end) if storm_end is not None else None
    rec.update(disk.peaks(storm_end))
    rec["storm"] = next(
        (json.loads(ln) for _, ln in lines if ln.startswith("{") and "round_trips" in ln), None
    )
    rec["log_tail"] = [f"{t:7.2f} {ln}" for t, ln in lines[-25:]]
    found = sorted(out.glob("**/manifest.json"))
    if found:
        m = json.loads(found[0].read_text())
        rec["hooks"] = {
            n: {
                k: h.get(k)
                for k in ("attached", "events", "drops", "missed", "rows", "copier")
                if k in h
            }
            for n, h in (m.get("hooks") or {}).items()
            if isinstance(h, dict)
        }
        rec["state"] = m.get("state")
        du = sum(f.stat().st_size for f in found[0].parent.rglob("*") if f.is_file())
        rec["collection_mb"] = du / 2**20
        rec["collection_disk_mb"] = round(sum(disk_use(found[0].parent)[1].values()) / 2**20, 1)
        t = time.monotonic()
        try:
            if read == "footers":
                rec["read_rows"] = read_rows(found[0].parent)
            else:
                got = child_read(found[0].parent, read)
                rec["read_rows"], rec["read_max_rss_mb"] = got["rows"], got["max_rss_mb"]
        except Exception as err:
            rec["read_error"] = f"{type(err).__name__}: {err}"
        rec["read_collection_s"] = time.monotonic() - t
        rec["read"] = read
    if keep is None:
        harness.remove_output(out)
    else:
        rec["kept"] = str(out)
    return rec


#: a reader in its own process (its peak RSS is the read's): the collection read
#: into memory (``full``), or scanned with every row of every table summed,
#: streaming (``lazy``)
CHILD_READ = """
import json, sys
import polars.selectors as cs
from kernmlops.data import len64, read_collection
if sys.argv[2] == "full":
    c = read_collection(sys.argv[1])
    rows = {name: c[name].height for name in c}
else:
    c = read_collection(sys.argv[1], lazy=True)
    rows = {}
    for name in c:  # rows counted in 64 bits: pl.len() fails past 2^32 - 1
        got = c[name].select(len64().alias("__rows"), cs.numeric().sum())
        rows[name] = got.collect(engine="streaming")["__rows"][0]
# VmHWM, this process's own peak: ru_maxrss keeps the parent's from before the exec
hwm = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
print(json.dumps({"rows": rows, "max_rss_mb": int(hwm.split()[1]) / 1024}))
"""


def child_read(collection: Path, how: str) -> dict:
    """Rows per table and the reader's peak RSS: ``read_collection`` (``full``), or a
    streaming scan that reads every column of every row (``lazy``: what a user does
    with a collection larger than memory), in a process of its own."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_READ, str(collection), how],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout.splitlines()[-1])


def read_rows(collection: Path) -> dict[str, int]:
    """Rows per table from every finished part's Parquet footer (``footers``: nothing
    read but the footers)."""
    import pyarrow.parquet as pq

    rows: dict[str, int] = {}
    for part in sorted(collection.glob("*/part-*.parquet")):
        table = part.parent.name
        rows[table] = rows.get(table, 0) + pq.ParquetFile(part).metadata.num_rows
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--storm", help="a storm program taking PAIRS SECONDS (default: stress-ng)")
    ap.add_argument("--pairs", type=int, default=0, help="default: the CPUs allowed")
    ap.add_argument("--seconds", type=float, nargs="+", default=[5.0])
    ap.add_argument("--collect-args", default="", help="more `collect` options, one string")
    ap.add_argument("--row-workers", nargs="+", default=[],
                    help="collector.spool_row_workers settings to compare, interleaved per "
                    "duration (e.g. `1 null`)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=1, help="runs of each setting and duration")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="unix time: no run starts that would end after it")  # fmt: skip
    ap.add_argument("--baseline", type=Path,
                    help="another tree (a checkout, or a folder a wheel was installed into "
                    "with pip --target): its runs alternate with this tree's")  # fmt: skip
    ap.add_argument("--bpf-stats", action="store_true",
                    help="time every BPF program run (costs two clock reads a run): each "
                    "program's ns per run until the storm's end")  # fmt: skip
    ap.add_argument("--read", choices=("full", "lazy", "footers"), default="full",
                    help="the collection read back whole (read_collection), or scanned "
                    "and summed by a streaming reader (read_collection(lazy=True): storms "
                    "longer than memory holds), each in a process of its own whose peak "
                    "RSS is kept; or its parts' footers only")  # fmt: skip
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="keep each run's collection in a new folder under DIR (to look "
                    "at where its drops or missed samples fall), not delete it")  # fmt: skip
    ap.add_argument("--neighbour", action="store_true",
                    help=f"another process writes to the collection's filesystem meanwhile "
                    f"(dd of {NEIGHBOUR_MB} MB with fsync, back to back): what the spool's "
                    "disk writes then wait for")  # fmt: skip
    ap.add_argument("--out", type=Path, default=harness.result_path("storm-tree"))
    a = ap.parse_args(argv)
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
    trees: dict[str, dict[str, str] | None] = {"this": None}
    if a.baseline:
        trees["baseline"] = {**os.environ, **harness.tree_env(a.baseline.resolve())}
    stats_fd = -1
    if a.bpf_stats:
        from bench.overhead import enable_bpf_stats

        stats_fd = enable_bpf_stats()
    pairs = a.pairs or len(os.sched_getaffinity(0))
    extra = a.collect_args.split()
    body: dict = {"pairs": pairs, "cpus": len(os.sched_getaffinity(0)), "runs": []}
    settings: list[str | None] = list(a.row_workers) or [None]
    configs: dict[str | None, list[str]] = {None: []}
    for w in a.row_workers:
        path = Path(tempfile.mkstemp(prefix="kmo-rows-", suffix=".yaml")[1])
        path.write_text(f"collector:\n  spool_row_workers: {w}\n")
        configs[w] = ["-c", str(path)]
    runs = [(s, w, t) for s in a.seconds for _ in range(a.rounds) for w in settings for t in trees]
    for s, w, t in runs:
        # a run takes the storm, then up to as long again to make its rows (16 CPUs,
        # row workers) and to read them back
        if a.deadline and time.time() + s * 2 + 25 > a.deadline:
            body.setdefault("skipped", []).append(s)
            print(f"[storm-tree] {s:g} s: skipped (deadline)", flush=True)
            continue
        rec = one(a.storm, pairs, s, extra + configs[w], trees[t], a.bpf_stats, a.read, a.keep,
                  a.neighbour)  # fmt: skip
        rec["seconds"] = s
        rec["row_workers"] = w
        rec["tree"] = t if t == "this" else str(a.baseline)
        body["runs"].append(rec)
        harness.save(a.out, body)
        hooks = rec.get("hooks") or {}
        drops = {n: (h.get("drops") or 0) + (h.get("missed") or 0) for n, h in hooks.items()}
        storm = rec.get("storm") or {}
        print(f"[storm-tree] {t}: {pairs} pairs {s:g} s, row workers {w}: rc {rec['rc']}, "
              f"{storm.get('round_trips_per_s', 0):,.0f} round trips/s, "
              f"switch_btf {rec['bpf_ns_per_run'].get('switch_btf', 0):.0f} ns, "
              f"exit {rec['exit_s']:.1f} s, "
              f"end->exit {rec['end_to_exit_s']}, rss {rec['collector_peak_rss_mb']:.0f} MB "
              f"(row workers {rec['row_workers_peak_rss_mb']:.0f} MB), "
              f"shm {rec['shm_peak_mb']:.0f} MB, "
              f"output peak {rec.get('output_peak_mb', 0):.0f} MB, "
              f"disk peak run {rec.get('disk_peak_run')} stop {rec.get('disk_peak_stop')} "
              f"written peak stop {rec.get('written_peak_stop')} "
              f"(at the storm's end {rec.get('disk_at_storm_end')}), collection on disk "
              f"{rec.get('collection_disk_mb')} MB, "
              f"read ({rec.get('read')}) {rec.get('read_collection_s')} s, "
              f"reader rss {rec.get('read_max_rss_mb')} MB, "
              f"events {sum((h.get('events') or 0) for h in hooks.values())}, drops {drops}, "
              f"rows {rec.get('read_rows')}", flush=True)  # fmt: skip
        copier = {n: {k: h["copier"][k] for k in ("longest_write_ms", "longest_pass_gap_ms",
                                                  "queue_peak_bytes") if k in h["copier"]}
                  for n, h in hooks.items() if h.get("copier")}  # fmt: skip
        print(f"    copiers {copier}, neighbour writes {rec['neighbour_writes']}", flush=True)
        print(f"    threads' CPU s at the storm's end {rec['cpu_s_at_storm_end']}, at exit "
              f"{rec['cpu_s_by_thread_name']}", flush=True)  # fmt: skip
    if stats_fd >= 0:
        os.close(stats_fd)
    harness.save(a.out, body)
    print(f"wrote {a.out}")
    return 0
