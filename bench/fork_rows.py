"""What a fork storm's rows cost process_metadata's poll: system calls and CPU per row.

The hook runs in this process with the tree filter on ``stress-ng --fork N`` (held at a
gate until the hook is attached), polled as the session polls it: at its
``next_poll`` time, at least every 10 ms and at most every 100 ms. The polling
thread's system calls are counted by the ``raw_syscalls:sys_enter`` tracepoint on
that thread alone (perf), its CPU by ``time.thread_time``; the rows (``fork`` and
``exec``), the drops and the rows without a command line come from the hook. With
``--baseline TREE`` the same runs alternate with another source tree (a checkout
with its BPF objects built in its ``build/bpf``), each run a process of its own.

    sudo python -m bench fork-rows --rounds 3 --seconds 5 --baseline /path/to/tree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "no system call per row; 0 drops"

POLL_MIN_S, POLL_MAX_S = 0.010, 0.100


def run_once(seconds: float, forkers: int) -> dict[str, Any]:
    """One measured run in this process (``--child``)."""
    import polars as pl

    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.perf_counters import open_counter, resolve
    from kernmlops.hooks.base import HookContext
    from kernmlops.hooks.process_metadata import ProcessMetadataHook

    counter = open_counter(resolve("raw_syscalls:sys_enter"), cpu=-1, pid=0)

    def syscalls() -> int:
        return int.from_bytes(os.read(counter, 24)[:8], "little")

    argv = ["stress-ng", "--fork", str(forkers), "-t", f"{seconds}s", "--quiet"]
    flt = ProcessFilter(follow_children=True)
    gate = subprocess.Popen(["sh", "-c", 'read _; exec "$@"', "sh", *argv], stdin=subprocess.PIPE)
    hook = ProcessMetadataHook()
    frames = []
    try:
        flt.add(gate.pid)
        hook.start(HookContext("bench", process_filter=flt, self_tgid=os.getpid()))
        frames += [f for _, f in hook.poll()]  # the start snapshot
        assert gate.stdin is not None
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
    finally:
        frames += [f for _, f in hook.stop()]
        flt.close()
        os.close(counter)
    table = pl.concat([f if isinstance(f, pl.DataFrame) else pl.from_arrow(f) for f in frames])
    rows = table.filter(pl.col("snapshot").is_in(["fork", "exec"]))
    n = max(rows.height, 1)
    return {
        "rows": rows.height,
        "drops": hook.status.drops,
        "cmdline_null": rows["cmdline"].null_count(),
        "polls": polls,
        "syscalls": calls,
        "syscalls_per_row": calls / n,
        "poll_cpu_s": cpu,
        "cpu_us_per_row": cpu / n * 1e6,
    }


def one(tree: Path | None, seconds: float, forkers: int) -> dict[str, Any]:
    """A run in a process of its own, with ``tree``'s kernmlops and objects."""
    env = {**harness.child_env(), **harness.tree_env(tree)}
    if tree is not None:
        env["KERNMLOPS_BPF_DIR"] = str(tree / "build" / "bpf")
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(harness.ROOT)])
    argv = [sys.executable, "-m", "bench", "fork-rows", "--child",
            "--seconds", str(seconds), "--forkers", str(forkers)]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"fork-rows run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="stress-ng's run time")
    ap.add_argument("--forkers", type=int, default=2, help="stress-ng --fork N")
    ap.add_argument("--baseline", type=Path, help="another source tree, alternated")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one run
    ap.add_argument("--out", type=Path, default=harness.result_path("fork-rows"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_once(args.seconds, args.forkers)))
        return
    trees: dict[str, Path | None] = {"this": None}
    if args.baseline:
        trees["baseline"] = args.baseline.resolve()
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for label, tree in trees.items():
            run = one(tree, args.seconds, args.forkers)
            runs[label].append(run)
            print(f"round {r + 1} {label:8s} {run['rows']:6d} rows, {run['drops']} dropped, "
                  f"{run['syscalls_per_row']:.3f} syscalls and {run['cpu_us_per_row']:.1f} us "
                  f"of CPU a row, {run['cmdline_null']} without a cmdline", flush=True)  # fmt: skip
    summary = {
        label: {
            key: statistics.median(run[key] for run in rs)
            for key in ("rows", "syscalls_per_row", "cpu_us_per_row", "cmdline_null")
        }
        | {"drops": [run["drops"] for run in rs]}
        for label, rs in runs.items()
    }
    print(f"\nmedians of {args.rounds}: {json.dumps(summary, indent=1)}")
    body = {"seconds": args.seconds, "forkers": args.forkers, "rounds": args.rounds}
    harness.save(args.out, {**body, "summary": summary, "runs": runs}, indent=1)
    print(f"wrote {args.out}")
