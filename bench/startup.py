"""Start-up benchmark: from `kernmlops collect` starting to "probes attached".

Runs ``kernmlops collect -b faux -d 1 --no-progress -o <tmp>`` several times
and reports, median / min / max:

* wall time from spawning the command to its "probes attached" line on stderr
  (interpreter start, imports, config, the BPF build check, load and attach);
* ``attach_s`` from the collection's manifest (session start to attached:
  load and attach only);
* the whole command's wall time (1 s of collecting, the final flush, the
  manifest, exit);
* the CPU time (user + system) the command had used when the line came, and
  bpftrace's: on a machine shared with other work, wall times stretch with the
  others' load (Python's start more than bpftrace's), CPU times much less.

With ``--baseline TREE`` a second source tree of kernmlops (a worktree of an
older commit) is measured the same way in the same rounds, its ``src`` first on
``PYTHONPATH`` (the venv is this one): before and after in the same rounds.

With ``--profile`` it also prints the slowest imports (``python -X importtime
-c 'import kernmlops.cli, kernmlops.collect.session'``) and the top functions of
one run under cProfile (up to exit). Needs root; the BPF objects should be
built already (``kernmlops build-bpf``), as the target assumes.

Run: ``sudo python -m bench startup --help``.
"""

from __future__ import annotations

import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.harness import save

#: what this benchmark is held to (python -m bench list shows it)
TARGET = 'spawn → "probes attached" ≤ bpftrace attaching one tracepoint (median)'

BENCH = Path(__file__).resolve().parent
MARK = "probes attached"
#: What a collect imports before it attaches anything.
IMPORTS = "import kernmlops.cli, kernmlops.collect.session"


def bytecode_env() -> dict[str, str]:
    """This environment with Python's bytecode cache on: an installed package has
    its .pyc files, and a shell with PYTHONDONTWRITEBYTECODE=1 would otherwise
    measure compiling every module from source on each run."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def collect_args(out: Path) -> list[str]:
    return ["collect", "-b", "faux", "-d", "1", "--no-progress", "-o", str(out)]


def command(out: Path) -> list[str]:
    """The measured command line: the console script, as a user runs it."""
    script = Path(sys.executable).parent / "kernmlops"
    if script.exists():
        return [str(script), *collect_args(out)]
    return [sys.executable, "-m", "kernmlops", *collect_args(out)]


def one_run(tree: Path | None = None) -> dict[str, float]:
    """One collect (of ``tree``, else this checkout): seconds to the marker line,
    attach_s, and the whole command."""
    out = Path(tempfile.mkdtemp(prefix="kmo-startup-"))
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            command(out),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # COLUMNS: keep rich from wrapping the line
            env={**bytecode_env(), "COLUMNS": "200", **harness.tree_env(tree)},
        )
        assert proc.stderr is not None
        to_mark = None
        cpu_mark = None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if to_mark is None and MARK in line:
                to_mark = time.perf_counter() - t0
                cpu_mark = process_cpu_s(proc.pid)
        rc = proc.wait()
        total = time.perf_counter() - t0
        if rc != 0 or to_mark is None:
            raise RuntimeError(f"collect failed (exit {rc}):\n{''.join(lines)}")
        manifest = next(out.glob("curated/benchmark=faux/collection_id=*/manifest.json"))
        attach_s = json.loads(manifest.read_text())["attach_s"]
        return {
            "to_attached_s": to_mark,
            "attach_s": attach_s,
            "total_s": total,
            "cpu_to_attached_s": cpu_mark,
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a running process has used so far: on a
    machine shared with other work, CPU time says more than wall time about the work
    done. Read when the marker line arrives; the collector may have gone on a few ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: The anchor: bpftrace attaching one tracepoint program and leaving at its first run.
BPFTRACE = ["bpftrace", "-e", "tracepoint:sched:sched_switch { exit(); }"]


def bpftrace_time() -> tuple[float, float] | None:
    """Wall and CPU seconds of BPFTRACE (start, parse, compile, load, attach, first
    event, exit); None when bpftrace is not installed."""
    exe = shutil.which(BPFTRACE[0])
    if exe is None:
        return None
    cpu0 = children_cpu_s()
    t0 = time.perf_counter()
    # stderr: bpftrace warns about RLIMIT_MEMLOCK on kernels that no longer use it
    subprocess.run(
        [exe, *BPFTRACE[1:]], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - t0, children_cpu_s() - cpu0


def spawn_time(code: str) -> float:
    """Wall seconds of ``python -c code`` in a fresh process."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=bytecode_env())
    return time.perf_counter() - t0


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def import_times(top: int) -> list[tuple[str, float, float]]:
    """(module, self ms, cumulative ms) of the slowest imports, by cumulative time."""
    cmd = [sys.executable, "-X", "importtime", "-c", IMPORTS]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=bytecode_env())
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        self_us, cum_us, name = line.removeprefix("import time:").split("|")
        rows.append((name.rstrip(), int(self_us) / 1000, int(cum_us) / 1000))
    return sorted(rows, key=lambda r: -r[2])[:top]


#: (label, file suffix, function) of the steps of a collect, for the phase table.
PHASES = (
    ("import kernmlops.cli", "kernmlops/cli.py", "<module>"),
    ("import kernmlops.collect.session", "collect/session.py", "<module>"),
    ("import kernmlops.config", "kernmlops/config.py", "<module>"),
    ("load_config", "kernmlops/config.py", "load_config"),
    ("build() (objects up to date)", "ebpf/build.py", "build"),
    ("Session.__init__", "collect/session.py", "__init__"),
    ("BpfHook.start (load + attach)", "hooks/bpf.py", "start"),
    ("open_and_load", "ebpf/objects.py", "open_and_load"),
    ("ring_layouts (BTF from the ELF)", "ebpf/btf.py", "ring_layouts"),
    ("ProcessFilter (tree/tgid only)", "collect/filter.py", "__init__"),
    ("PollLoop.run (1 s)", "collect/loop.py", "run"),
    ("ParquetSink.close", "collect/parquet.py", "close"),
    ("RunningManifest.save", "collect/running.py", "save"),
    ("system_info", "host/sysinfo.py", "system_info"),
)


def phases(stats: pstats.Stats) -> list[tuple[str, float]]:
    """Cumulative seconds of each phase (recursion counted once)."""
    out = []
    table = stats.stats  # type: ignore[attr-defined]
    for label, suffix, func in PHASES:
        total = sum(
            ct
            for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in table.items()
            if name == func and file.endswith(suffix)
        )
        if total:
            out.append((label, total))
    return out


def profile_run(top: int) -> tuple[str, list[tuple[str, float]]]:
    """Top functions (cumulative) of one collect under cProfile, and its phases."""
    prof = Path(tempfile.mkdtemp(prefix="kmo-prof-")) / "collect.prof"
    out = prof.parent / "data"
    # cProfile runs a script: the package's __main__.py.
    main = Path(__import__("kernmlops").__file__).parent / "__main__.py"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), str(main), *collect_args(out)]
    subprocess.run(
        cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=bytecode_env()
    )
    import io

    text = io.StringIO()
    stats = pstats.Stats(str(prof), stream=text)
    stats.sort_stats("cumulative").print_stats(top)
    shutil.rmtree(prof.parent, ignore_errors=True)
    return text.getvalue(), phases(stats)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__, defaults_in_help=True)
    parser.add_argument("--runs", type=int, default=5, help="measured runs")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs first")
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="seconds to probes attached (default: bpftrace's median, measured here)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="also measure this source tree (e.g. a worktree of main), interleaved",
    )
    parser.add_argument("--profile", action="store_true", help="import times and cProfile")
    parser.add_argument("--top", type=int, default=25, help="lines of each profile")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "startup.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root to load BPF programs")

    if args.baseline is not None and not (args.baseline / "src" / "kernmlops").is_dir():
        parser.error(f"--baseline {args.baseline}: no src/kernmlops there")
    for _ in range(args.warmup):
        one_run()
        if args.baseline is not None:
            one_run(args.baseline)  # also builds its BPF objects, the first time
    runs = []
    base_runs = []
    anchor: list[float] = []
    anchor_cpu: list[float] = []
    for i in range(args.runs):
        # interleaved, so a drift of the machine falls on each alike
        b = one_run(args.baseline) if args.baseline is not None else None
        r = one_run()
        runs.append(r)
        bt_cpu = bpftrace_time()
        bt = None
        if bt_cpu is not None:
            bt, cpu = bt_cpu
            anchor.append(bt)
            anchor_cpu.append(cpu)
        if b is not None:
            base_runs.append(b)
        print(
            f"run {i + 1}: probes attached after {r['to_attached_s']:.3f} s "
            f"(CPU {r['cpu_to_attached_s']:.2f} s, attach_s {r['attach_s']:.3f} s), "
            f"command {r['total_s']:.3f} s"
            + (
                f"; baseline {b['to_attached_s']:.3f} s (CPU {b['cpu_to_attached_s']:.2f} s)"
                if b is not None
                else ""
            )
            + (f"; bpftrace {bt:.3f} s (CPU {cpu:.2f} s)" if bt is not None else ""),
            file=sys.stderr,
        )
    result = {key: summary([r[key] for r in runs]) for key in runs[0]}
    if base_runs:
        result["baseline_to_attached_s"] = summary([r["to_attached_s"] for r in base_runs])
        result["baseline_attach_s"] = summary([r["attach_s"] for r in base_runs])
        result["baseline_cpu_to_attached_s"] = summary([r["cpu_to_attached_s"] for r in base_runs])
    if anchor:
        result["bpftrace_s"] = summary(anchor)
        result["bpftrace_cpu_s"] = summary(anchor_cpu)
    # The same interpreter doing nothing, and only the imports a collect needs.
    result["python_s"] = summary([spawn_time("pass") for _ in range(args.runs)])
    result["imports_s"] = summary([spawn_time(IMPORTS) for _ in range(args.runs)])

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kernmlops collect -b faux -d 1, {args.runs} runs", title_justify="left")
    for col in ("measure", "median", "min", "max"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    names = {
        "baseline_to_attached_s": "baseline: spawn -> 'probes attached'",
        "baseline_attach_s": "baseline: manifest attach_s",
        "baseline_cpu_to_attached_s": "baseline: CPU to 'probes attached'",
        "to_attached_s": "spawn -> 'probes attached'",
        "cpu_to_attached_s": "CPU to 'probes attached'",
        "attach_s": "manifest attach_s",
        "total_s": "whole command",
        "python_s": "python -c pass",
        "imports_s": f"python -c '{IMPORTS}'",
        "bpftrace_s": f"{' '.join(BPFTRACE[:2])} '{BPFTRACE[2]}'",
        "bpftrace_cpu_s": "bpftrace's CPU",
    }
    for key, label in names.items():
        if key not in result:
            continue
        s = result[key]
        table.add_row(label, *(f"{s[k]:.3f} s" for k in ("median", "min", "max")))
    console = Console(width=120)
    console.print(table)
    target = args.target
    if target is None:
        target = result["bpftrace_s"]["median"] if "bpftrace_s" in result else 1.0
    ok = result["to_attached_s"]["median"] <= target
    print(
        f"{'PASS' if ok else 'FAIL'}  median spawn -> probes attached "
        f"{result['to_attached_s']['median']:.3f} s (target <= {target:.3f} s"
        + (", bpftrace's median)" if args.target is None and "bpftrace_s" in result else ")")
    )

    report: dict = {"command": " ".join(command(Path("<tmp>"))), "runs": runs, "summary": result}
    if base_runs:
        commit = subprocess.run(
            ["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        report["baseline"] = {"commit": commit or None, "runs": base_runs}
    if args.profile:
        imports = import_times(args.top)
        report["imports_ms"] = [
            {"module": m.strip(), "self": s, "cumulative": c} for m, s, c in imports
        ]
        print("\nslowest imports (ms, cumulative; indentation = nesting):")
        for name, self_ms, cum_ms in imports:
            print(f"  {cum_ms:8.1f}  {self_ms:7.1f} self  {name}")
        text, steps = profile_run(args.top)
        report["cprofile"] = text
        report["phases_s"] = dict(steps)
        print("\none run under cProfile (profiling slows it), by cumulative time:")
        print(text)
        print("phases of that run (cumulative, seconds):")
        for label, secs in steps:
            print(f"  {secs:7.3f}  {label}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args.out, report)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
