"""What each part of quanta_runtime's sched_switch program costs (kernel.bpf_stats).

``hotpath.bpf.c`` is the program built up in steps (see its header): step 0 is the
floor (count the switch), step 10 has quanta_runtime's parts (its record is 32 bytes
there, 48 here), step 9 is step 10 as it was with the task-storage record. Every step
is built as its own object, all are attached to ``sched_switch`` at once, and a switch
storm (``stress-ng --switch 2``) runs; the kernel times each program's runs. The
attach order turns every round, so no step always runs first (warm caches).
Step 6's ring is emptied every 10 ms by moving its consumer position, unread.

Each step's median ns per run over the rounds, and what it adds to the step
before, are printed; the JSON has every round. bpf_stats itself adds two clock
reads to every run, the same for every step: compare differences, not totals.

Run (root, built objects not needed; clang and bpftool as for ``make bpf``):

    sudo python -m bench hotpath --rounds 6 --seconds 3
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

from bench import harness
from bench.harness import save
from bench.overhead import discard_rings, enable_bpf_stats

BENCH = Path(__file__).resolve().parent

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "quanta_runtime's switch program (switch_btf) ≤ 200 ns per run"

SOURCE = BENCH / "hotpath.bpf.c"
STEPS = {
    0: "count the switch (the floor)",
    1: "read pids, tgids, CPU time; per-CPU on-CPU state",
    2: "next's run-queue wait (last_queued, rq clock)",
    3: "bpf_ktime_get_ns()",
    4: "fill a record in the per-CPU batch (ns)",
    5: "the record in us (three divisions)",
    6: "send the batch whole (KMO_BATCH_RECORDS records; quanta_runtime before step 7)",
    7: "step 6, the time from the rq clock (kmo_switch_time: quanta_runtime)",
    8: "step 7 and a ktime per record (how far apart: map apart)",
    9: "step 7, the quantum from task storage at every switch out (until the slots)",
    10: "step 7, the quantum from the task's slot, else its storage (quanta_runtime)",
}
RING, RING_BYTES = "hot_rb", 8 << 20
APART_BUCKETS = 64  # hotpath.bpf.c


def build(step: int, out: Path) -> Path:
    from kernmlops.ebpf.build import compile_object

    obj = out / f"hotpath-{step}.bpf.o"
    if not obj.exists() or obj.stat().st_mtime < SOURCE.stat().st_mtime:
        compile_object(SOURCE, obj, cflags=(f"-DSTEP={step}",))
    return obj


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=3, help="storm per round")
    parser.add_argument(
        "--alone",
        action="store_true",
        help="attach one step per storm (each pays its own cache misses, as a program "
        "alone on the tracepoint does) instead of all at once",
    )
    parser.add_argument(
        "--steps", default=",".join(map(str, STEPS)), help="comma-separated steps to run"
    )
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "hotpath.json")
    args = parser.parse_args(argv)
    steps = [int(s) for s in args.steps.split(",")]
    if unknown := set(steps) - set(STEPS):
        sys.exit(f"no such step: {sorted(unknown)}")
    if os.geteuid() != 0:
        sys.exit("needs root (BPF)")
    from kernmlops.ebpf.objects import open_and_load

    out = BENCH / "build"
    objs = {}
    for step in steps:
        objs[step] = open_and_load(
            build(step, out),
            globals_={"kmo_self_tgid": os.getpid()},
            max_entries={RING: RING_BYTES},
        )
    stop = threading.Event()
    drains = [threading.Thread(target=discard_rings, args=([objs[s]], RING, stop), daemon=True)
              for s in steps if s >= 6]  # fmt: skip
    for drain in drains:
        drain.start()
    stats_fd = enable_bpf_stats()
    rounds: list[dict[int, float]] = []
    try:
        for r, order in harness.rotations(steps, args.rounds):
            groups = [[step] for step in order] if args.alone else [order]
            ns: dict[int, float] = {}
            for group in groups:
                ns.update(_storm(objs, group, args.seconds))
            rounds.append(ns)
            print(f"round {r + 1}/{args.rounds} (first: step {order[0]}): "
                  + "  ".join(f"{s}:{ns[s]:.0f}" for s in steps), flush=True)  # fmt: skip
    finally:
        os.close(stats_fd)
        stop.set()
        for drain in drains:
            drain.join()
        apart = _apart(objs[8]) if 8 in objs else None
        for obj in objs.values():
            obj.close()
    med = {s: statistics.median(r[s] for r in rounds) for s in steps}
    interval = {s: harness.summarize([r[s] for r in rounds]).as_dict(1) for s in steps}
    print("\nstep  ns/run (median)  added  what")
    for i, s in enumerate(steps):
        added = med[s] - med[steps[i - 1]] if i else 0.0
        print(f"{s:4d}  {med[s]:14.0f}  {added:+5.0f}  {STEPS[s]}")
    if apart is not None:
        print(
            f"\nstep 8: bpf_ktime_get_ns() - step 7's time, over {apart['records']:,} records: "
            f"{apart['within_1us']:.4%} within 1 us; quantiles (ns) {apart['quantiles_ns']}"
        )
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "steps": STEPS, "median_ns": med,
              "interval_ns": interval, "rounds": rounds, "apart": apart}  # fmt: skip
    save(args.out, result, indent=1)
    print(f"-> {args.out}")
    return 0


def _storm(objs: dict, group: list[int], seconds: int) -> dict[int, float]:
    """Attach ``group``'s steps (in that order), run one storm, detach: ns per run."""
    for step in group:
        objs[step].attach_all()
    before = {step: harness.prog_runs(objs[step]) for step in group}
    storm = subprocess.run(
        ["stress-ng", "--switch", "2", "--timeout", f"{seconds}s"],
        capture_output=True,
        text=True,
    )
    after = {step: harness.prog_runs(objs[step]) for step in group}
    for step in group:
        objs[step].detach()
    if storm.returncode != 0:
        sys.exit(f"stress-ng failed: {storm.stderr.strip()[-300:]}")
    return {s: (after[s][0] - before[s][0]) / max(1, after[s][1] - before[s][1]) for s in group}


def _apart(obj) -> dict:
    """Step 8's histogram: how far bpf_ktime_get_ns() is from step 7's time."""
    hist = obj.map("apart")
    counts = [hist.percpu_total(b) for b in range(APART_BUCKETS)]
    total = sum(counts)

    def edge(b: int) -> int:  # ns at the low edge of bucket b
        return (b - APART_BUCKETS // 2) * 250

    quantiles, seen, qs = {}, 0, [0.001, 0.01, 0.5, 0.99, 0.999]
    for b, c in enumerate(counts):
        seen += c
        while qs and total and seen >= qs[0] * total:
            quantiles[str(qs.pop(0))] = edge(b)
    within = sum(c for b, c in enumerate(counts) if -1000 <= edge(b) < 1000)
    return {
        "records": total,
        "bucket_ns": 250,
        "low_edges_ns": [edge(b) for b in range(APART_BUCKETS)],
        "counts": counts,
        "quantiles_ns": quantiles,
        "within_1us": within / total if total else 0.0,
    }
