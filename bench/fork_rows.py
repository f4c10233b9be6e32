"""What a fork storm's rows cost process_metadata: the poll's system calls and CPU per
row, and with ``--bpf-stats`` its kernel programs' nanoseconds per fork and exec.

The hook runs in this process with the tree filter on ``stress-ng --fork N`` (or
``--exec N``: fork and exec; run as ``nobody``, since stress-ng refuses it to root),
held at a gate until the hook is attached, polled as the session polls it: at its
``next_poll`` time, at least every 10 ms and at most every 100 ms. The polling
thread's system calls are counted by the ``raw_syscalls:sys_enter`` tracepoint on
that thread alone (perf), its CPU by ``time.thread_time``; the rows (``fork`` and
``exec``), the drops and the rows without a command line come from the hook. The
workload's own count (stress-ng's bogo ops) and CPU (its reaped tree's rusage) give
its operations per second and CPU per operation.

``--bpf-stats`` has the kernel time every BPF program run (two clock reads a run,
the same for every program: compare differences) and reports each program's ns per
run and run time per workload operation; ``--untraced`` adds runs without the hook
(the workload's own CPU per operation, the anchor), ``--no-cmdline`` runs of this
tree with the hook's ``cmdline`` off (no argument block read: what the read costs).
With ``--baseline TREE`` the same runs alternate with another source tree (a
checkout with its BPF objects built in its ``build/bpf``). Each run is a process of
its own; the states turn order each round.

    sudo python -m bench fork-rows --rounds 3 --seconds 5 --baseline /path/to/tree
    sudo python -m bench fork-rows --stressor exec --bpf-stats --untraced --no-cmdline
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "no system call per row; 0 drops; the programs ≤ 2% of what a fork or exec costs"

POLL_MIN_S, POLL_MAX_S = 0.010, 0.100

#: stress-ng's metrics line: "stress-ng: metrc: [PID] fork  12345  5.00 ..."
METRIC = re.compile(r"metrc: \[\d+\] (\w+)\s+(\d+)\s+([\d.]+)")


def workload_argv(stressor: str, workers: int, seconds: float) -> list[str]:
    """stress-ng's command line; ``exec`` as ``nobody`` where this is root."""
    # whole seconds: stress-ng reads "0.5s" as 0, which runs it until killed
    run_s = max(1, round(seconds))
    argv = ["stress-ng", f"--{stressor}", str(workers), "-t", f"{run_s}s", "--metrics-brief"]
    if stressor == "exec" and os.geteuid() == 0:
        who = pwd.getpwnam("nobody")
        ids = [f"--reuid={who.pw_uid}", f"--regid={who.pw_gid}", "--clear-groups"]
        # its temporary files where nobody may write, not in the working folder
        argv = ["setpriv", *ids, *argv, "--temp-path", tempfile.gettempdir()]
    return argv


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _workload(out: str, stressor: str, cpu_s: float) -> dict[str, Any]:
    """The workload's own account: stress-ng's bogo ops, its tree's CPU per op."""
    found = [m for m in METRIC.finditer(out) if m.group(1) == stressor]
    if not found:
        raise SystemExit(f"fork-rows: no metrics line from stress-ng:\n{out[-2000:]}")
    ops, wall = int(found[-1].group(2)), float(found[-1].group(3))
    return {
        "ops": ops,
        "ops_per_s": ops / wall if wall else 0.0,
        "workload_cpu_s": cpu_s,
        "workload_cpu_us_per_op": cpu_s / max(ops, 1) * 1e6,
    }


def run_once(
    seconds: float, workers: int, stressor: str, *, hook_on: bool = True,
    cmdline: bool = True, stats: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One measured run in this process (``--child``)."""
    argv = workload_argv(stressor, workers, seconds)
    gate_argv = ["sh", "-c", 'read _; exec "$@"', "sh", *argv]
    if not hook_on:  # the workload alone: the anchor
        cpu = _children_cpu_s()
        gate = subprocess.Popen(gate_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        out, _ = gate.communicate()
        return _workload(out, stressor, _children_cpu_s() - cpu)

    import polars as pl

    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.perf_counters import open_counter, resolve
    from kernmlops.hooks.base import HookContext
    from kernmlops.hooks.process_metadata import ProcessMetadataHook, ProcessMetadataOptions

    counter = open_counter(resolve("raw_syscalls:sys_enter"), cpu=-1, pid=0)

    def syscalls() -> int:
        return int.from_bytes(os.read(counter, 24)[:8], "little")

    flt = ProcessFilter(follow_children=True)
    gate = subprocess.Popen(gate_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    hook = ProcessMetadataHook(ProcessMetadataOptions(cmdline=cmdline))
    frames = []
    progs: dict[str, list[int]] = {}
    try:
        flt.add(gate.pid)
        hook.start(HookContext("bench", process_filter=flt, self_tgid=os.getpid()))
        frames += [f for _, f in hook.poll()]  # the start snapshot
        if stats:
            from bench.storm_tree import program_ns

            progs0 = program_ns(os.getpid())  # the start snapshot's iterator runs out
        assert gate.stdin is not None and gate.stdout is not None
        workload_cpu = _children_cpu_s()
        gate.stdin.close()  # the workload runs
        calls, cpu, polls = syscalls(), time.thread_time(), 0
        while gate.poll() is None:
            frames += [f for _, f in hook.poll()]
            polls += 1
            now = time.monotonic()
            due = hook.next_poll(now)
            wait = POLL_MIN_S if due is None else min(max(due - now, POLL_MIN_S), POLL_MAX_S)
            time.sleep(wait)
        frames += [f for _, f in hook.poll()]
        polls += 1
        calls, cpu = syscalls() - calls, time.thread_time() - cpu
        workload_cpu = _children_cpu_s() - workload_cpu
        if stats:
            progs = {
                name: [ns - progs0.get(name, [0, 0])[0], cnt - progs0.get(name, [0, 0])[1]]
                for name, (ns, cnt) in program_ns(os.getpid()).items()
            }
        out = gate.stdout.read()
    finally:
        frames += [f for _, f in hook.stop()]
        flt.close()
        os.close(counter)
    table = pl.concat([f if isinstance(f, pl.DataFrame) else pl.from_arrow(f) for f in frames])
    rows = table.filter(pl.col("snapshot").is_in(["fork", "exec"]))
    n = max(rows.height, 1)
    run = {
        "rows": rows.height,
        "fork_rows": rows.filter(pl.col("snapshot") == "fork").height,
        "exec_rows": rows.filter(pl.col("snapshot") == "exec").height,
        "drops": hook.status.drops,
        "cmdline_null": rows["cmdline"].null_count(),
        "polls": polls,
        "syscalls": calls,
        "syscalls_per_row": calls / n,
        "poll_cpu_s": cpu,
        "cpu_us_per_row": cpu / n * 1e6,
        **_workload(out, stressor, workload_cpu),
    }
    if stats:
        run["programs"] = {
            name: {
                "run_time_ns": ns,
                "run_cnt": cnt,
                "ns_per_run": ns / cnt if cnt else None,
                "ns_per_op": ns / max(run["ops"], 1),
            }
            for name, (ns, cnt) in sorted(progs.items())
        }
    return run


def one(tree: Path | None, seconds: float, workers: int, stressor: str,
        extra: list[str]) -> dict[str, Any]:  # fmt: skip
    """A run in a process of its own, with ``tree``'s kernmlops and objects."""
    env = {**harness.child_env(), **harness.tree_env(tree)}
    if tree is not None:
        env["KERNMLOPS_BPF_DIR"] = str(tree / "build" / "bpf")
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(harness.ROOT)])
    argv = [sys.executable, "-m", "bench", "fork-rows", "--child", "--seconds", str(seconds),
            "--forkers", str(workers), "--stressor", stressor, *extra]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"fork-rows run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


#: process_metadata's fork and exec programs (either variant), and the tree filter's
#: fork program, which every traced fork also runs
PROGRAMS = ("fork_btf", "exec_btf", "fork_raw", "exec_raw")
FILTER_PROGRAMS = ("filter_fork_btf", "filter_fork_raw")


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict[str, Any]], untraced_us: float | None) -> dict[str, Any]:
    """Medians over a state's runs; with BPF stats, each program's ns per run and per
    workload operation (the programs that ran), and the hook's fork and exec programs'
    share of the untraced workload's CPU per operation (``untraced_us``)."""
    keys = ("ops_per_s", "workload_cpu_us_per_op")
    if runs and "rows" in runs[0]:
        keys = ("rows", "syscalls_per_row", "cpu_us_per_row", "cmdline_null", *keys)
    out: dict[str, Any] = {key: _median([run[key] for run in runs]) for key in keys}
    if runs and "drops" in runs[0]:
        out["drops"] = [run["drops"] for run in runs]
    if not runs or "programs" not in runs[0]:
        return out
    names = sorted({n for run in runs for n, p in run["programs"].items() if p["run_cnt"]})
    out["ns_per_run"] = {n: _median(_per_run(runs, n)) for n in names}
    out["ns_per_op"] = {
        n: _median([run["programs"].get(n, {}).get("ns_per_op", 0.0) for run in runs])
        for n in names
    }
    hook_ns = [_events_ns_per_op(run, PROGRAMS) for run in runs]
    out["hook_events_ns_per_op"] = _median(hook_ns)
    out["filter_ns_per_op"] = _median([_events_ns_per_op(run, FILTER_PROGRAMS) for run in runs])
    if untraced_us:
        out["hook_events_share_of_untraced_op"] = _median(hook_ns) / (untraced_us * 1e3)
    return out


def _per_run(runs: list[dict[str, Any]], name: str) -> list[float]:
    return [p["ns_per_run"] for run in runs if (p := run["programs"].get(name)) and p["run_cnt"]]


def _events_ns_per_op(run: dict[str, Any], names: tuple[str, ...]) -> float:
    return sum(p["ns_per_op"] for n, p in run["programs"].items() if n in names)


def paired(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per program, the median over rounds of a's ns per run less b's in the same round
    (runs of one round are close in time: the machine's drift falls on both)."""
    if not a or not b or "programs" not in a[0] or "programs" not in b[0]:
        return {}
    out: dict[str, float | None] = {}
    for name in PROGRAMS:
        diffs = [
            x["ns_per_run"] - y["ns_per_run"]
            for ra, rb in zip(a, b, strict=False)
            if (x := ra["programs"].get(name, {})).get("run_cnt")
            and (y := rb["programs"].get(name, {})).get("run_cnt")
        ]
        if diffs:
            out[name] = _median(diffs)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="stress-ng's run time")
    ap.add_argument("--forkers", type=int, default=2, help="stress-ng --fork N (or --exec N)")
    ap.add_argument("--stressor", choices=("fork", "exec"), default="fork",
                    help="stress-ng's fork (fork and exit) or exec (fork, exec and exit) "
                    "stressor")  # fmt: skip
    ap.add_argument("--baseline", type=Path, help="another source tree, alternated")
    ap.add_argument("--bpf-stats", action="store_true",
                    help="time every BPF program run (costs two clock reads a run): each "
                    "program's ns per run and per workload operation")  # fmt: skip
    ap.add_argument(
        "--untraced",
        action="store_true",
        help="also runs without the hook: the workload's own CPU per operation",
    )
    ap.add_argument("--no-cmdline", action="store_true",
                    help="also runs of this tree with the hook's cmdline off (no argument "
                    "block read)")  # fmt: skip
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one run
    ap.add_argument("--hook-off", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=harness.result_path("fork-rows"))
    args = ap.parse_args(argv)
    if args.child:
        run = run_once(args.seconds, args.forkers, args.stressor, hook_on=not args.hook_off,
                       cmdline=not args.no_cmdline, stats=args.bpf_stats)  # fmt: skip
        print(json.dumps(run))
        return
    stats = ["--bpf-stats"] if args.bpf_stats else []
    #: label -> (tree, the child's options)
    states: dict[str, tuple[Path | None, list[str]]] = {"this": (None, stats)}
    if args.baseline:
        states["baseline"] = (args.baseline.resolve(), stats)
    if args.no_cmdline:
        states["this-no-cmdline"] = (None, [*stats, "--no-cmdline"])
    if args.untraced:
        states["untraced"] = (None, ["--hook-off"])
    stats_fd = -1
    if args.bpf_stats:
        from bench.overhead import enable_bpf_stats

        stats_fd = enable_bpf_stats()  # on while this process holds it
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in states}
    try:
        for r, order in harness.rotations(list(states), args.rounds):
            for label in order:
                tree, extra = states[label]
                run = one(tree, args.seconds, args.forkers, args.stressor, extra)
                runs[label].append(run)
                _print(r, label, run)
    finally:
        if stats_fd >= 0:
            os.close(stats_fd)
    untraced = _median([run["workload_cpu_us_per_op"] for run in runs.get("untraced", [])])
    summary: dict[str, Any] = {label: summarize(rs, untraced) for label, rs in runs.items()}
    # what the argument block's read adds to each program, and the change against the
    # baseline tree's program, paired by round
    if args.bpf_stats and "this-no-cmdline" in runs:
        summary["args_read_ns_per_run"] = paired(runs["this"], runs["this-no-cmdline"])
    if args.bpf_stats and "baseline" in runs:
        summary["this_less_baseline_ns_per_run"] = paired(runs["this"], runs["baseline"])
    print(f"\nmedians of {args.rounds}: {json.dumps(summary, indent=1)}")
    body = {"seconds": args.seconds, "forkers": args.forkers, "stressor": args.stressor,
            "rounds": args.rounds, "bpf_stats": args.bpf_stats}  # fmt: skip
    harness.save(args.out, {**body, "summary": summary, "runs": runs}, indent=1)
    print(f"wrote {args.out}")


def _print(r: int, label: str, run: dict[str, Any]) -> None:
    line = (f"round {r + 1} {label:15s} {run['ops_per_s']:8.0f} ops/s, "
            f"{run['workload_cpu_us_per_op']:7.1f} us of the workload's CPU an op")  # fmt: skip
    if "rows" in run:
        line += (f"; {run['rows']:6d} rows, {run['drops']} dropped, "
                 f"{run['syscalls_per_row']:.3f} syscalls and {run['cpu_us_per_row']:.1f} us "
                 f"of poll CPU a row, {run['cmdline_null']} without a cmdline")  # fmt: skip
    for name, p in (run.get("programs") or {}).items():
        if p["run_cnt"]:
            line += f"\n    {name:15s} {p['ns_per_run']:7.0f} ns/run, {p['run_cnt']:7d} runs"
    print(line, flush=True)
