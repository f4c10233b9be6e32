"""What each state adds to a context switch: the storm tasks' own CPU per switch-in.

One switch storm (``stress-ng --switch``, or ``--storm PROGRAM``) runs for the whole
benchmark; the states are attached to ``sched_switch`` in turn, in an order that turns
every round (``harness.rotations``), each for ``--dwell`` seconds: untraced (``off``),
the count-only floor (``bench/floor.bpf.c``), quanta_runtime's programs with their
records thrown away unread (``programs``, as ``overhead``'s state of that name), and any
``--object NAME=PATH`` (a variant of a program built by hand, its ring emptied the same
way). For each state the storm tasks' CPU time and arrivals on a CPU are read from
their ``/proc/<tid>/schedstat`` before and after: CPU ns per switch-in. What a state
adds is its figure less the round's ``off``, paired by round.

``overhead``'s storm measures the same cost as throughput, a fresh storm a state;
where its pairs land on the two CPUs moves a run by ±5-10 points, several times the
floor's slowdown. Here one storm carries every state and the measure is CPU per unit
of work, which a busy machine disturbs less: a state's cost comes out within about
±10-20 ns a switch in 50 rounds on a quiet VM (±50-90 ns in a busy hour of the shared
2-vCPU VM: compare states within one run, and rerun when the floor's interval is
wide). The program's time in the tracepoint is charged to the task switched in, so
it is in the figure, as are its indirect costs (caches, the ring's memory).

``--bpf-stats`` adds a ``+stats`` state for every program state (``floor+stats``,
``programs+stats``, each ``--object``'s): the same with the kernel timing every program
run (``kernel.bpf_stats_enabled``, as ``hotpath`` and ``overhead --bpf-stats`` time
them), to price that timing itself, and the state's own run time in ns a run
(``run_time_ns / run_cnt`` over its dwell). The own run times price an A/B of two
builds within a few ns (the timing's two clock reads are in every state alike) where
the CPU per switch-in only within ±20-45 ns; the difference between the two is what a
program costs outside its own run (caches, the ring's memory).

Run (root; built BPF objects, stress-ng):

    sudo nice -n -10 python -m bench switch-cost --rounds 50
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import harness
from bench.harness import save

BENCH = Path(__file__).resolve().parent

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "none: prices each state per switch (explains overhead's storm ratio)"


def storm_tasks(root: int) -> list[int]:
    """The thread ids of ``root`` and every process below it."""
    tids, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            tids.append(int(tid))
            with contextlib.suppress(OSError):  # gone meanwhile
                kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                todo += [int(c) for c in kids]
    return tids


def cpu_and_arrivals(tids: list[int]) -> tuple[int, int]:
    """The tasks' CPU ns and arrivals on a CPU (schedstat's first and third fields)."""
    cpu = arrivals = 0
    for tid in tids:
        try:
            fields = Path(f"/proc/{tid}/schedstat").read_text().split()
        except OSError:
            continue  # gone: its counts leave both readings alike
        cpu += int(fields[0])
        arrivals += int(fields[2])
    return cpu, arrivals


def interval(m: dict) -> str:
    return f"{m['median']:+7.1f} ns  [{m['median_low']:+.1f}, {m['median_high']:+.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--dwell", type=float, default=1.0, help="seconds a state, a round")
    parser.add_argument("--pairs", type=int, default=2, help="storm pairs (stress-ng --switch)")
    parser.add_argument(
        "--storm", help="a storm program taking PAIRS SECONDS (bench/switch_storm.c) instead"
    )
    parser.add_argument(
        "--object",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another state: a BPF object whose programs attach to sched_switch and whose "
        "ring (quanta_runtime's) is emptied unread; repeatable",
    )
    parser.add_argument(
        "--bpf-stats",
        action="store_true",
        help="also each program state timed by the kernel (STATE+stats): its cost with the "
        "timing, and its own ns a run",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        help="unix time: no round starts that would end after it (the rounds run are kept)",
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "switch-cost.json")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("needs root (BPF)")
    from bench.overhead import (
        PROGRAMS_HOOK,
        PROGRAMS_RING,
        build_floor,
        discard_rings,
        enable_bpf_stats,
        open_programs,
    )
    from kernmlops.ebpf.build import object_path
    from kernmlops.ebpf.objects import open_and_load

    objs = {
        "floor": open_and_load(build_floor()),
        "programs": open_programs(object_path(PROGRAMS_HOOK)),
    }
    for spec in args.object:
        name, _, path = spec.partition("=")
        if not name or not path or name in objs or name == "off":
            sys.exit(f"--object wants NAME=PATH with a new name: {spec!r}")
        objs[name] = open_programs(Path(path))
    states = ["off", *objs]
    if args.bpf_stats:
        states += [f"{name}+stats" for name in objs]
    stop = threading.Event()
    drain = threading.Thread(
        target=discard_rings,
        args=([o for n, o in objs.items() if n != "floor"], PROGRAMS_RING, stop),
    )
    drain.start()
    storm_argv = (
        [args.storm, str(args.pairs), "86400"]
        if args.storm
        else ["stress-ng", "--switch", str(args.pairs), "--timeout", "86400"]
    )
    storm = subprocess.Popen(storm_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rounds: list[dict[str, float]] = []
    #: STATE+stats -> its programs' own ns a run, a round
    own: dict[str, list[float]] = {s: [] for s in states if s.endswith("+stats")}
    try:
        time.sleep(2)  # every storm process forked and switching
        tids = storm_tasks(storm.pid)
        print(f"storm: {' '.join(storm_argv)}, {len(tids)} tasks", flush=True)
        slowest = len(states) * (args.dwell + 0.5)  # a guess until a round is timed
        for r, order in harness.rotations(states, args.rounds):
            if args.deadline and time.time() + slowest > args.deadline:
                print(f"(deadline: {r} of {args.rounds} rounds run)", flush=True)
                break
            began = time.monotonic()
            row = {}
            for state in order:
                name, _, stats = state.partition("+")
                stats_fd = enable_bpf_stats() if stats else None
                if name != "off":
                    objs[name].attach_all()
                time.sleep(0.1)  # attached on every CPU before the reading
                runs0 = harness.prog_runs(objs[name]) if stats else (0, 0)
                cpu0, n0 = cpu_and_arrivals(tids)
                time.sleep(args.dwell)
                cpu1, n1 = cpu_and_arrivals(tids)
                if stats:
                    runs1 = harness.prog_runs(objs[name])
                    ns, count = (b - a for a, b in zip(runs0, runs1, strict=True))
                    own[state].append(ns / max(1, count))
                if name != "off":
                    objs[name].detach()
                if stats_fd is not None:
                    os.close(stats_fd)
                row[state] = (cpu1 - cpu0) / max(1, n1 - n0)
            rounds.append(row)
            slowest = max(slowest if r else 0, time.monotonic() - began)
            if (r + 1) % 10 == 0 or r + 1 == args.rounds:
                print(f"round {r + 1}/{args.rounds}: " + "  ".join(
                    f"{s} {row[s] - row['off']:+.0f}" for s in states[1:]), flush=True)  # fmt: skip
    finally:
        storm.terminate()
        storm.wait()
        stop.set()
        drain.join()
        for obj in objs.values():
            obj.close()
    if not rounds:
        sys.exit("switch-cost: no round fits before --deadline")
    added = {s: [row[s] - row["off"] for row in rounds] for s in states[1:]}
    summary = {s: harness.summarize(v).as_dict(1) for s, v in added.items()}
    floor = statistics.median(added["floor"])
    print(f"\nstorm tasks' CPU per switch-in, untraced: "
          f"{statistics.median(r['off'] for r in rounds):.0f} ns; added by each state "
          f"(median of {len(rounds)} rounds, 95% interval):")  # fmt: skip
    for s in states[1:]:
        m = summary[s]
        ratio = f"  {m['median'] / floor:.2f}x the floor" if floor > 0 else ""
        print(f"  {s:16s} {interval(m)}{ratio}")
    # a variant against the real programs, paired by round
    versus = {}
    for s in [n for n in objs if n not in ("floor", "programs")]:
        d = [a - b for a, b in zip(added[s], added["programs"], strict=True)]
        versus[s] = harness.summarize(d).as_dict(1)
        m = versus[s]
        print(f"  {s} - programs: {interval(m)}")
    own_summary, own_versus = {}, {}
    if own:
        print("own run time (kernel's timing, ns a run), against the floor's:")
        for s, v in own.items():
            own_summary[s] = harness.summarize(v).as_dict(1)
            line = f"  {s:16s} {own_summary[s]['median']:7.1f} ns"
            if s != "floor+stats":
                d = [a - b for a, b in zip(v, own["floor+stats"], strict=True)]
                own_versus[s] = harness.summarize(d).as_dict(1)
                line += f"  less the floor's {interval(own_versus[s])}"
            print(line)
        for s in [f"{n}+stats" for n in objs if n not in ("floor", "programs")]:
            d = [a - b for a, b in zip(own[s], own["programs+stats"], strict=True)]
            own_versus[f"{s} - programs+stats"] = m = harness.summarize(d).as_dict(1)
            print(f"  {s} - programs+stats: {interval(m)}")
    result = {
        "machine": {"kernel": os.uname().release, "cpus": os.cpu_count()},
        "args": {k: str(v) for k, v in vars(args).items()},
        "storm_argv": storm_argv,
        "tasks": len(tids),
        "untraced_ns_per_switch_in": statistics.median(r["off"] for r in rounds),
        "added_ns_per_switch_in": summary,
        "less_programs_ns": versus,
        "own_ns_per_run": own_summary,
        "own_less_floor_ns_per_run": own_versus,
        "rounds": rounds,
    }
    save(args.out, result, indent=1)
    print(f"-> {args.out}")
    return 0
