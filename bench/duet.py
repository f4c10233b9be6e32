"""Duet vs sequential benchmarking on this machine, with equal time budgets.

The workload is a CPU-bound C loop (``loop N``: N multiply-adds, about 20 ms
for N = 20M), timed per execution by the built-in harness. Each experiment is
one suite with randomized, interleaved trials:

* duet: ``--runs`` runs of A and B at the same time, ``--run-s`` seconds each;
* sequential: ``--runs / 2`` repetitions of A alone then B alone (or B then
  A), ``--run-s`` seconds each side: the same wall-clock time as the duets.

Per experiment and kind, ``kernmlops.duet.analysis`` gives the verdict (95 %
interval of the geometric-mean ratio over runs: sign-flip by default) and the minimum detectable
slowdown (0-15 % injected into B). Over ``--experiments`` A/A experiments:

* false-positive rate: share of A/A experiments whose CI excludes 1;
* MDS: median (and quartiles) over experiments.

``--setups swap,pin,nopin`` runs each experiment once per setup, in a
shuffled order (the setups meet the same machine): ``default`` is what
``kernmlops duet run`` does unless told (as root on 2 CPUs: ``swap-nice``);
``swap`` pins the sides to CPUs 0 and 1 and has them trade CPUs every
``--swap-ms``; ``swap-nice`` also runs them (and their sessions' scheduling
groups) at nice -10; ``pin`` keeps each on its CPU for the whole run;
``nopin`` lets the scheduler place them. All but the first run at nice 0.

With ``--real PCT`` (e.g. 3) it also runs experiments where B's loop does PCT %
more work, and reports how often each kind detects it (power), as a check of
the injected MDS against a real slowdown.

Run (about (2 x runs x run_s) s per experiment, plus analysis):

    python -m bench duet --experiments 20 --runs 10 --run-s 2 --real 3
    python -m bench duet --experiments 10 --runs 20 --run-s 1 \
        --no-sequential --setups swap,pin,nopin

Results go to bench/results/duet.json (and a summary on stdout).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.harness import save
from kernmlops.duet.analysis import Options, analyze
from kernmlops.duet.config import validate_duet_config
from kernmlops.duet.process import process_dirs
from kernmlops.duet.runner import run_suite

BENCH = Path(__file__).resolve().parent

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "minimum detectable slowdown ≤ 1% at an A/A false-positive rate ≤ 5%"

KINDS = ("duet", "sequential")
#: how the two sides get their CPUs (one suite per setup and experiment)
SETUPS = {
    "default": "kernmlops duet's defaults (cpus: auto, nice: auto): as swap-nice as root "
    "on a 2-CPU machine",
    "swap": "pinned to CPUs 0 and 1, trading them every --swap-ms (swap:MS: every MS ms), nice 0",
    "swap-nice": "swap, both sides at nice -10 (root; swap-nice@N: at N): other work takes "
    "less of their CPUs",
    "pin": "pinned to CPUs 0 and 1 for the whole run (AB/BA orders swap them)",
    "nopin": "not pinned: the scheduler places them (nice 0)",
}

LOOP_C = r"""
#include <stdlib.h>
int main(int argc, char **argv) {
	unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000000;
	volatile unsigned long x = 0;
	for (unsigned long i = 0; i < n; i++)
		x += i * i;
	return 0;
}
"""


def build_loop(folder: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        sys.exit("a C compiler (cc, gcc, clang) is needed")
    (folder / "loop.c").write_text(LOOP_C)
    subprocess.run([cc, "-O2", "-o", str(folder / "loop"), str(folder / "loop.c")], check=True)
    return folder / "loop"


def experiment(loop: Path, out: Path, n: int, extra: float, args: argparse.Namespace,
               seed: int, setup: str) -> dict:  # fmt: skip
    b_n = int(n * (1 + extra))
    pin: dict = {"cpus": "none", "nice": 0}
    if setup == "default":
        pin = {}  # whatever `kernmlops duet run` does without cpus or nice
    elif setup != "nopin":
        kind_ms, _, nice = setup.partition("@")
        name, _, ms = kind_ms.partition(":")
        swap_ms = (float(ms) if ms else args.swap_ms) if name.startswith("swap") else 0
        pin = {"cpus": ["0", "1"], "cpu_swap_ms": swap_ms, "nice": 0}
        if name == "swap-nice":
            pin["nice"] = int(nice) if nice else -10
    config = {
        "duetbench": {
            "suite": out.name,
            "seed": seed,
            "duet_repetitions": args.runs,
            "sequential_repetitions": args.runs // 2 if args.sequential else 0,
            "schedule": "randomized_interleaving_trials",
            "harness": {"budget_s": args.run_s},
            "duets": ["loop"],
            **pin,
        },
        "loop": {"A": {"run": f"{loop} {n}"}, **({"B": {"run": f"{loop} {b_n}"}} if extra else {})},
    }
    suite = validate_duet_config(config, out.name)
    t0 = time.monotonic()
    result = run_suite(suite, out.parent, force=True)
    wall = time.monotonic() - t0
    table = process_dirs([result.folder]).results
    analysis = analyze(table, Options(warmup=args.warmup, resamples=args.resamples))
    [bench] = analysis.benchmarks
    row: dict = {"seed": seed, "setup": setup, "extra": extra, "wall_s": round(wall, 1),
                 "load": os.getloadavg()[0],
                 "cpu_swaps": sum(t.cpu_swaps for t in result.trials),
                 "warnings": sorted({w for t in result.trials for w in t.warnings})}  # fmt: skip
    for kind in KINDS if args.sequential else ("duet",):
        c = bench.comparisons[kind]
        row[kind] = {
            "detected": c.detected,
            "gm_ratio": c.gm_ratio,
            "ci": c.ratio_ci.as_list() if c.ratio_ci else None,
            "mds": c.mds,
            "unit": c.unit,
            "runs": c.n_runs,
            "pairs": c.n_pairs,
            "iterations": c.n_a + c.n_b,
            "mean_a_ms": c.mean_a_ns / 1e6,
            "original_detected": c.original.detected if c.original is not None else None,
        }
        if c.runs is not None:
            # per run: id, order, log of its ratio, pairs (to study what the interval
            # over runs assumes: independent runs, symmetric under A/A)
            row[kind]["per_run"] = [
                [r["runid"], r["order"], math.log(r["gm_ratio"]) if r["gm_ratio"] else None,
                 r["n_pairs"]]
                for r in c.runs.iter_rows(named=True)
            ]  # fmt: skip
    if not args.keep:
        shutil.rmtree(result.folder, ignore_errors=True)
    return row


def _mds_text(values: list[float | None]) -> str:
    got = sorted(v if v is not None else float("inf") for v in values)
    if not got:
        return "-"
    q = statistics.quantiles(got, n=4) if len(got) > 1 else [got[0]] * 3

    def pct(x: float) -> str:
        return ">15%" if x == float("inf") else f"{x * 100:.2f}%"

    return f"median {pct(q[1])} (quartiles {pct(q[0])} .. {pct(q[2])})"


def _ci_text(ci: list[float] | None) -> str:
    return "-" if ci is None else f"{ci[0]:.1%}-{ci[1]:.1%}"


def _setup_ok(setup: str) -> bool:
    setup, _, nice = setup.partition("@")
    if nice and not (setup.startswith("swap-nice") and nice.lstrip("-").isdigit()):
        return False
    name, _, ms = setup.partition(":")
    if name not in SETUPS or (ms and not name.startswith("swap")):
        return False
    try:
        return not ms or float(ms) > 0
    except ValueError:
        return False


def _kinds(rows: list[dict], kinds: tuple[str, ...], real_pct: float) -> dict:
    """False positives, MDS (and power with --real) of one setup's experiments."""
    out: dict = {}
    aa = [r for r in rows if r["extra"] == 0]
    real = [r for r in rows if r["extra"] > 0]
    for kind in kinds:
        fp = sum(r[kind]["detected"] != "none" for r in aa)
        fp_original = sum(r[kind]["original_detected"] not in ("none", "unknown") for r in aa)
        mds = [r[kind]["mds"] for r in aa]
        k = {
            "aa_experiments": len(aa),
            "false_positives": fp,
            "false_positive_rate": fp / len(aa) if aa else None,
            "false_positive_rate_ci95": _clopper_pearson(fp, len(aa)),
            "original_method_false_positives": fp_original,
            "mds": mds,
            "mds_summary": _mds_text(mds),
            "iterations_per_experiment": (
                statistics.median(r[kind]["iterations"] for r in aa) if aa else None
            ),
        }
        if real:
            k["real_slowdown"] = real_pct
            k["real_detected"] = sum(r[kind]["detected"] == "slower" for r in real)
            k["real_experiments"] = len(real)
            k["real_ratio_median"] = statistics.median(r[kind]["gm_ratio"] for r in real)
        out[kind] = k
    return out


def _plan(aa: int, extra: float, real: int) -> list[tuple[float, int]]:
    """A/A experiments with the real-slowdown ones spread among them (same hour)."""
    plan: list[tuple[float, int]] = [(0.0, i) for i in range(aa)]
    for j in range(real):
        plan.insert(round((j + 0.5) * (aa + j + 1) / real), (extra, 1000 + j))
    return plan


def _clopper_pearson(k: int, n: int) -> list[float] | None:
    """Exact 95% interval of a rate k/n."""
    if not n:
        return None
    from scipy.stats import beta

    lo = float(beta.ppf(0.025, k, n - k + 1)) if k else 0.0
    hi = float(beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return [lo, hi]


def _summary(args: argparse.Namespace, setups: list[str], kinds: tuple[str, ...],
             rows: list[dict], load: list[float]) -> dict:  # fmt: skip
    summary: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_min_median_max": [min(load), statistics.median(load), max(load)],
        },
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "setups": {},
    }
    for setup in setups:
        summary["setups"][setup] = {"kinds": _kinds([r for r in rows if r["setup"] == setup],
                                                    kinds, args.real)}  # fmt: skip
    summary["experiments"] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__name__, __doc__)
    parser.add_argument("--experiments", type=int, default=20, help="A/A experiments")
    parser.add_argument("--runs", type=int, default=10, help="duet runs per experiment")
    parser.add_argument("--run-s", type=float, default=2.0, help="seconds per run and side")
    parser.add_argument("--n", type=int, default=20_000_000, help="loop size (about 20 ms)")
    parser.add_argument("--real", type=float, default=0.0, help="also test B PCT %% slower")
    parser.add_argument("--real-experiments", type=int, default=10)
    parser.add_argument("--warmup", default="10%")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--setups", default="default",
                        help="comma-separated, run interleaved in each experiment: "
                        + "; ".join(f"{k}: {v}" for k, v in SETUPS.items()))  # fmt: skip
    parser.add_argument("--swap-ms", type=float, default=10.0,
                        help="swap: ms between the sides' CPU trades")  # fmt: skip
    parser.add_argument("--no-pin", dest="setups", action="store_const", const="nopin",
                        help="the same as --setups nopin")  # fmt: skip
    parser.add_argument("--sequential", action=argparse.BooleanOptionalAction, default=True,
                        help="also run A alone and B alone (half the time goes there)")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the suites' folders")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "duet.json")
    args = parser.parse_args(argv)
    if args.runs < 10:
        sys.exit("--runs must be at least 10 (sequential gets runs/2 >= 5 repetitions)")
    setups = [x.strip() for x in args.setups.split(",") if x.strip()]
    if not setups or any(not _setup_ok(x) for x in setups):
        sys.exit(f"--setups: one or more of {', '.join(SETUPS)}")
    kinds = KINDS if args.sequential else ("duet",)
    work = Path(tempfile.mkdtemp(prefix="kmo-bench-duet-"))
    loop = build_loop(work)
    rows = []
    plan = _plan(args.experiments, args.real / 100, args.real_experiments if args.real else 0)
    load = [os.getloadavg()[0]]
    for extra, seed in plan:
        order = list(setups)
        random.Random(seed).shuffle(order)  # interleaved: no setup always runs first
        for setup in order:
            row = experiment(loop, work / f"exp{seed}-{setup}", args.n, extra, args, seed, setup)
            load.append(os.getloadavg()[0])
            rows.append(row)
            # saved as it goes: an hour's run stopped early keeps what it measured
            save(args.out, _summary(args, setups, kinds, rows, load), indent=1)
            parts = [
                f"{k} {row[k]['detected']} ratio {row[k]['gm_ratio']:.4f} MDS {row[k]['mds']} "
                f"(original: {row[k]['original_detected']})"
                for k in kinds
            ]
            print(
                f"extra {extra:.0%} seed {seed} {setup}: "
                + "; ".join(parts)
                + f" ({row['wall_s']} s, load {row['load']:.1f}, {row['cpu_swaps']} swaps)"
                + "".join(f"\n  warning: {w}" for w in row["warnings"]),
                flush=True,
            )
    if args.keep:
        print(f"suites kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    summary = _summary(args, setups, kinds, rows, load)
    save(args.out, summary, indent=1)
    print(f"\nload average during the runs: {summary['machine']['load_avg_min_median_max']}")
    for setup in setups:
        for kind, k in summary["setups"][setup]["kinds"].items():
            line = (
                f"{setup:6s} {kind:10s}: A/A false positives {k['false_positives']}/"
                f"{k['aa_experiments']} ({(k['false_positive_rate'] or 0):.1%}, 95% "
                f"interval {_ci_text(k['false_positive_rate_ci95'])}); "
                f"MDS {k['mds_summary']}"
            )
            if args.real:
                line += (
                    f"; real +{args.real:g}%: detected {k['real_detected']}/"
                    f"{k['real_experiments']} (median ratio {k['real_ratio_median']:.4f})"
                )
            print(line)
    print(f"-> {args.out}")
