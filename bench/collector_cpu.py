"""What the collector itself costs while the workload keeps every CPU busy.

``kernmlops collect -b faux`` (default hooks, the whole system) runs under
``stress-ng --cpu <ncpu>`` (``--load cpu``), under the switch storm
(``--load switch``: ``stress-ng --switch <ncpu>``) or on an idle machine
(``--load idle``); after a
settling time, the run time of each of its threads is read from
``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds the thread ran, and how many
times it was switched in) over a window. With ``--baseline TREE`` the same runs
alternate with another source tree (``git worktree add /tmp/base <commit>``),
whose BPF objects are built in its own ``build/bpf``.

    sudo python -m bench collector-cpu --rounds 4 --baseline /tmp/base

Prints ms of CPU per second per thread (by Python thread name), the records the
rings dropped, and writes JSON.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none; explains the collector's share of `overhead`'s stress-ng --cpu figure"

ROOT = Path(__file__).resolve().parents[1]
MARK = "probes attached"


def threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (name, ns run, times switched in)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ran, _, slices = (task / "schedstat").read_text().split()
            name = (task / "comm").read_text().strip()
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (name, int(ran), int(slices))
    return out


def thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name, from py-spy when it is on the PATH (else comm)."""
    try:
        dump = subprocess.run(
            ["py-spy", "dump", "-p", str(pid)], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(t): n for t, n in re.findall(r"Thread (\d+) \(\w+\): \"([^\"]+)\"", dump)}


def drops(out: str) -> int:
    """Records the hooks' rings dropped (the stopped collection's manifest)."""
    total = 0
    for path in Path(out).glob("curated/*/*/manifest.json"):
        for hook in json.loads(path.read_text()).get("hooks", {}).values():
            total += hook.get("drops", 0) if hook.get("variant") != "procfs" else 0
    return total


def one(tree: Path | None, settle: float, window: float, load_kind: str) -> dict[str, list[float]]:
    env = {**os.environ, **harness.tree_env(tree)}
    if tree is not None:
        env["KERNMLOPS_BPF_DIR"] = str(tree / "build" / "bpf")
    load = None
    if load_kind != "idle":
        duration = f"{settle + window + 30}s"
        load = subprocess.Popen(
            ["stress-ng", f"--{load_kind}", str(os.cpu_count()), "--timeout", duration],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    out = tempfile.mkdtemp(prefix="kmo-ccpu-")
    argv = [sys.executable, "-m", "kernmlops", "collect", "-b", "faux", "--no-progress", "-o", out]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    per: dict[str, list[float]] = {}
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if MARK in line:
                break
        else:
            raise RuntimeError(f"collector did not attach (exit {proc.wait()})")
        time.sleep(settle)
        names = thread_names(proc.pid)
        t0, a = time.monotonic(), threads(proc.pid)
        time.sleep(window)
        b, wall = threads(proc.pid), time.monotonic() - t0
        for tid, (comm, ran, slices) in b.items():
            before = a.get(tid, (comm, 0, 0))
            name = names.get(tid, comm)
            acc = per.setdefault(name, [0.0, 0.0])
            acc[0] += (ran - before[1]) / 1e6 / wall
            acc[1] += (slices - before[2]) / wall
        per["total"] = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        if load is not None:
            load.kill()
            load.wait()
        per["ring drops"] = [float(drops(out)), 0.0]
        subprocess.run(["rm", "-rf", out], check=False)
    return per


def main(argv: list[str] | None = None) -> None:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--settle", type=float, default=8.0, help="seconds after attach")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured")
    ap.add_argument("--load", choices=["cpu", "switch", "idle"], default="cpu",
                    help="stress-ng --cpu, the switch storm, or nothing")  # fmt: skip
    ap.add_argument("--baseline", type=Path, help="another source tree, alternated")
    ap.add_argument("--out", type=Path, default=harness.result_path("collector-cpu"))
    args = ap.parse_args(argv)
    trees: dict[str, Path | None] = {"this": None}
    if args.baseline:
        trees["baseline"] = args.baseline.resolve()
    runs: dict[str, list[dict[str, list[float]]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for label, tree in trees.items():
            per = one(tree, args.settle, args.window, args.load)
            runs[label].append(per)
            print(f"round {r + 1} {label:8s} total {per['total'][0]:6.2f} ms/s "
                  f"({per['total'][1]:5.1f} switches-in/s), "
                  f"{per['ring drops'][0]:.0f} dropped", flush=True)  # fmt: skip
    print(f"\nms of CPU per second, median of {args.rounds} (load: {args.load})")
    summary = {}
    for label, rs in runs.items():
        names = sorted(
            {n for per in rs for n in per if n != "ring drops"}, key=lambda n: (n == "total", n)
        )
        summary[label] = {
            n: {
                "ms_per_s": statistics.median(per.get(n, [0, 0])[0] for per in rs),
                "switches_in_per_s": statistics.median(per.get(n, [0, 0])[1] for per in rs),
            }
            for n in names
        }
        summary[label]["ring drops"] = {"runs": [per["ring drops"][0] for per in rs]}
        print(f"[{label}]  ring drops per run: {summary[label]['ring drops']['runs']}")
        for n, v in summary[label].items():
            if n == "ring drops":
                continue
            print(f"  {n:28s} {v['ms_per_s']:6.2f} ms/s  {v['switches_in_per_s']:6.1f}/s")
    body = {"load": args.load, "rounds": args.rounds, "window_s": args.window}
    harness.save(args.out, {**body, "summary": summary, "runs": runs}, indent=1)
    print(f"wrote {args.out}")
