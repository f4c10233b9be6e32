"""A lab data set worth the name: exact decisions from every
one of MLLB's scenarios, a model tested on whole runs it never saw.

``--collect OUT`` boots the kernel lab once (Debian's 6.1 under QEMU without
KVM, NUMA emulation) and runs rounds of MLLB's eight evaluation scenarios,
exactly as ``kernmlops.lb.effect`` defines them (through the stress-ng
benchmark's scenarios of the same names; MLLB's ``mixed`` is ``mllb-mixed``),
each round in a random order, each run one ``lb collect --variant both``
collection: every ``can_migrate_task`` call (kprobe/fexit, exact) and the
host's tracepoint approximation rebuilt from the same run's scheduler tables.
One ``lb collect`` per round, so a crash loses at most that round; no round
starts after ``--budget-min``. ``--migration-cost-ns`` sets the guest
kernel's sched migration cost (debugfs) before the first run; the features
use the same value (recorded in every manifest).

``--analyse DIR...`` counts the decisions (raw, after MLLB's filter, per
scenario and class), holds out whole runs (per scenario, a seeded half of its
runs), trains on the rest with ``lb``'s pipeline and reports, on the held-out
runs, balanced accuracy and recall per class of the model (float and Q20.11)
beside the hand rule and the majority-class baseline, per scenario too; and
the tracepoint approximation against the exact labels of the same runs.
Writes bench/results/lb-dataset.json.

    python -m bench lb-dataset --collect bench/build/lb-dataset/a --seconds 45 \\
        --budget-min 40 --migration-cost-ns 10000000 --seed 0    # (and /b --seed 1 beside it)
    python -m bench lb-dataset --analyse bench/build/lb-dataset/a bench/build/lb-dataset/b

The training setting is chosen by cross-validation over whole training runs
(``CANDIDATES``); the held-out runs are scored once.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "≥ 20,000 exact decisions, ≥ 1,000 held-out 'stay', ≥ 99% balanced accuracy"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
#: our stress-ng scenario name for each of MLLB's eight (kernmlops.lb.effect)
SCENARIOS = (
    "numa", "cpu-half", "cache", "oversubscribe", "hdd-seek", "matrixprod", "fft", "mllb-mixed",
)  # fmt: skip


# --- collecting ------------------------------------------------------------------------


def plan_rounds(rounds: int, seed: int) -> list[list[str]]:
    """Every scenario once per round, each round in its own random order."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        order = list(SCENARIOS)
        rng.shuffle(order)
        out.append(order)
    return out


def guest_script(out: Path, rounds: list[list[str]], budget_s: float, cost_ns: int | None) -> str:
    """The shell script the lab runs: the kernel's migration cost, then one ``lb
    collect`` per round (its log beside the data) until the rounds or the time run out."""
    py = shlex.quote(sys.executable)
    lines = [
        "#!/bin/sh",
        "mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug",
        f"end=$(( $(date +%s) + {int(budget_s)} ))",
    ]
    if cost_ns is not None:
        lines.append(f"echo {int(cost_ns)} > /sys/kernel/debug/sched/migration_cost_ns || exit 3")
    lines.append("echo migration_cost_ns $(cat /sys/kernel/debug/sched/migration_cost_ns)")
    for i, order in enumerate(rounds):
        cfgs = " ".join(f"-c {shlex.quote(str(out / 'configs' / f'{s}.yaml'))}" for s in order)
        log = shlex.quote(str(out / f"round-{i:02d}.log"))
        lines += [
            f'if [ "$(date +%s)" -ge "$end" ]; then echo "budget spent before round {i}"; '
            "exit 0; fi",
            f"echo round {i}: {' '.join(order)}",
            f"{py} -m kernmlops.lb collect --variant both --no-progress -o {shlex.quote(str(out))} "
            f"{cfgs} > {log} 2>&1",
            f'echo "round {i} exit $?"',
        ]
    return "\n".join(lines) + "\n"


def collect(args: argparse.Namespace) -> int:
    import yaml

    from kernmlops.vm.qemu import LabError, run_in_vm

    out = args.collect.resolve()
    (out / "configs").mkdir(parents=True, exist_ok=True)
    for s in SCENARIOS:
        cfg = {"benchmark": {"name": "stress-ng",
                             "stress_ng": {"scenario": s, "duration_s": args.seconds}}}  # fmt: skip
        (out / "configs" / f"{s}.yaml").write_text(yaml.safe_dump(cfg))
    rounds = plan_rounds(args.rounds, args.seed)
    script = out / "guest.sh"
    script.write_text(guest_script(out, rounds, args.budget_min * 60, args.migration_cost_ns))
    script.chmod(0o755)
    (out / "plan.json").write_text(json.dumps({
        "rounds": rounds, "seconds": args.seconds, "budget_min": args.budget_min,
        "migration_cost_ns": args.migration_cost_ns, "cpus": args.cpus, "numa": args.numa,
        "memory": args.memory, "seed": args.seed,
    }, indent=1))  # fmt: skip
    src = ROOT / "src"
    cmd = ["env", f"PYTHONPATH={src}", "sh", str(script)]
    t0 = time.monotonic()
    try:
        res = run_in_vm(cmd, cpus=args.cpus, numa=args.numa, memory=args.memory, outdir=out,
                        timeout_s=args.budget_min * 60 + 900, echo=True)  # fmt: skip
    except LabError as err:  # e.g. the time limit: the completed runs are kept
        print(f"lab: {err} (after {time.monotonic() - t0:.0f} s); completed runs in {out}")
        return 1
    print(f"lab: exit {res.exit_code} after {time.monotonic() - t0:.0f} s -> {out}")
    return res.exit_code


# --- analysing ---------------------------------------------------------------------------


def _runs(roots: list[Path]) -> list[dict[str, Any]]:
    """Every collection under ``roots`` with its scenario, lb section and tables."""
    from kernmlops.collect.manifest import MANIFEST_NAME

    runs = []
    for root in roots:
        for m in sorted(root.glob(f"**/collection_id=*/{MANIFEST_NAME}")):
            doc = json.loads(m.read_text())
            bench = (doc.get("config") or {}).get("benchmark") or {}
            runs.append({
                "path": m.parent,
                "collection_id": doc["collection_id"],
                "scenario": (bench.get("stress_ng") or {}).get("scenario"),
                "state": doc.get("state"),
                "exit_code": doc.get("exit_code"),
                "lb": doc.get("lb") or {},
                "tables": doc.get("tables") or {},
            })  # fmt: skip
    return runs


def held_out_ids(runs: list[dict[str, Any]], fraction: float, seed: int) -> list[str]:
    """Per scenario, a seeded ``fraction`` of its runs (at least one, one left to
    train on): whole runs, chosen before any label is looked at."""
    rng = random.Random(seed)
    out = []
    for s in sorted({r["scenario"] for r in runs}):
        ids = sorted(r["collection_id"] for r in runs if r["scenario"] == s)
        if len(ids) < 2:
            continue
        rng.shuffle(ids)
        out += ids[: min(len(ids) - 1, max(1, math.ceil(fraction * len(ids))))]
    return sorted(out)


#: training settings compared by cross-validation on the training runs alone
CANDIDATES = {
    "default": {},
    "balanced": {"balanced": True},
    "long": {"epochs": 200, "patience": 30},
    "balanced-long": {"balanced": True, "epochs": 200, "patience": 30},
}


def select_config(train_frame: Any, cost: int, seed: int, folds: int = 3) -> dict[str, Any]:
    """The training setting with the best mean balanced accuracy over ``folds``
    folds of whole training runs (each scenario's runs dealt over the folds):
    chosen without the held-out runs."""
    import numpy as np

    from kernmlops.lb.features import LABEL, float_features
    from kernmlops.lb.model import TrainConfig, metrics, train

    rng = random.Random(seed)
    fold_of: dict[str, int] = {}
    for s in sorted(set(train_frame["scenario"].to_list())):
        ids = sorted(set(train_frame.filter(train_frame["scenario"] == s)["collection_id"]))
        rng.shuffle(ids)
        start = rng.randrange(folds)
        for i, c in enumerate(ids):
            fold_of[c] = (start + i) % folds
    fold = np.array([fold_of[c] for c in train_frame["collection_id"].to_list()])
    x, y = float_features(train_frame, cost), train_frame[LABEL].to_numpy()
    scores: dict[str, list[float]] = {}
    for name, opts in CANDIDATES.items():
        for f in range(folds):
            fit, val = fold != f, fold == f
            if not val.any() or len(set(y[fit].tolist())) < 2:
                continue
            m = train(x[fit], y[fit], TrainConfig(seed=seed, **opts))
            scores.setdefault(name, []).append(
                metrics(y[val], m.predict(x[val]))["balanced_accuracy"]
            )
    means = {k: float(np.mean(v)) for k, v in scores.items()}
    return {"folds": folds, "cv_balanced_accuracy": means, "chosen": max(means, key=means.get)}


def _scores(metrics_of: Any, y: Any, preds: dict[str, Any]) -> dict[str, Any]:
    return {name: metrics_of(y, p) for name, p in preds.items()}


def analyse(roots: list[Path], fraction: float, seed: int) -> dict[str, Any]:
    import numpy as np
    import polars as pl

    from kernmlops.lb.dataset import load_decisions
    from kernmlops.lb.features import LABEL, fixed_features, float_features, rule_decision
    from kernmlops.lb.model import metrics
    from kernmlops.lb.pipeline import prepare, train_model
    from kernmlops.lb.tracepoint import compare_with_kprobe

    # a run cut short (state not completed) is counted as failed, not used
    runs = [
        r for r in _runs(roots)
        if r["scenario"] in SCENARIOS and "lb_decisions" in r["tables"]
        and r["state"] == "completed"
    ]  # fmt: skip
    if not runs:
        sys.exit(f"no lb collections of MLLB's scenarios under {', '.join(map(str, roots))}")
    costs = {r["lb"].get("migration_cost_ns") for r in runs}
    kernel_costs = {r["lb"].get("kernel_migration_cost_ns") for r in runs}
    if len(costs) != 1:
        sys.exit(f"the runs used different migration costs ({sorted(map(str, costs))}): "
                 "analyse each set apart")  # fmt: skip
    (cost,) = costs
    scenario_of = {r["collection_id"]: r["scenario"] for r in runs}
    frames = []
    for r in runs:
        frames.append(load_decisions([r["path"]]).with_columns(
            pl.lit(r["collection_id"]).alias("collection_id")))  # fmt: skip
    decisions = pl.concat(frames, how="diagonal_relaxed").filter(pl.col("variant") == "kprobe")
    decisions = decisions.with_columns(
        pl.col("collection_id").replace_strict(scenario_of).alias("scenario")
    )
    kept = prepare(decisions)
    test_ids = held_out_ids(runs, fraction, seed)
    is_test = pl.col("collection_id").is_in(test_ids)

    def counts(frame: pl.DataFrame, filtered: pl.DataFrame) -> dict[str, Any]:
        return {
            "runs": frame["collection_id"].n_unique(),
            "raw": frame.height,
            "filtered": filtered.height,
            "stay": int((filtered[LABEL] == 0).sum()),
            "migrate": int((filtered[LABEL] == 1).sum()),
        }

    per_scenario = {}
    for s in SCENARIOS:
        d, k = decisions.filter(pl.col("scenario") == s), kept.filter(pl.col("scenario") == s)
        per_scenario[s] = {
            "all": counts(d, k),
            "held_out": counts(d.filter(is_test), k.filter(is_test)),
        }
    out: dict[str, Any] = {
        "migration_cost_ns": cost,
        "kernel_migration_cost_ns": sorted(c for c in kernel_costs if c is not None),
        "runs_failed": [
            {
                "collection_id": r["collection_id"],
                "scenario": r["scenario"],
                "state": r["state"],
                "exit_code": r["exit_code"],
            }
            for r in _runs(roots)
            if r["state"] != "completed" or r["exit_code"]
        ],
        "total": counts(decisions, kept),
        "held_out_total": counts(decisions.filter(is_test), kept.filter(is_test)),
        "train_total": counts(decisions.filter(~is_test), kept.filter(~is_test)),
        "per_scenario": per_scenario,
        "held_out_collections": test_ids,
        "held_out_fraction_per_scenario": fraction,
        "seed": seed,
    }
    # the kernel's own logic on the recorded columns: a check of the data, not a baseline
    from kernmlops.lb.features import kernel_decision

    out["kernel_logic_agrees"] = float(
        (kernel_decision(kept, cost) == kept[LABEL].to_numpy()).mean()
    )

    from kernmlops.lb.model import TrainConfig

    t0 = time.monotonic()
    out["selection"] = select_config(kept.filter(~is_test), cost, seed)
    chosen = out["selection"]["chosen"]
    out["selection_s"] = round(time.monotonic() - t0, 1)
    print(f"training setting by 3-fold CV on the training runs: {out['selection']}")
    t0 = time.monotonic()
    res = train_model(decisions, test_collections=test_ids, seed=seed, migration_cost_ns=cost,
                      config=TrainConfig(seed=seed, **CANDIDATES[chosen]))  # fmt: skip
    out["train_s"] = round(time.monotonic() - t0, 1)
    # the pipeline's default setting too, as lb train runs it without options
    default = train_model(decisions, test_collections=test_ids, seed=seed, migration_cost_ns=cost)
    rep = res.report
    test = kept.filter(is_test)
    x, xq, y = float_features(test, cost), fixed_features(test, cost), test[LABEL].to_numpy()
    commoner = int(kept.filter(~is_test)[LABEL].mean() >= 0.5)  # from the training runs
    preds = {
        "model_float": res.model.predict(x),
        "model_fixed": res.fixed.predict(xq),
        "model_default_setting": default.model.predict(x),
        "hand_rule": rule_decision(x),
        "majority": np.full(len(y), commoner),
    }
    out["held_out"] = _scores(metrics, y, preds)
    out["float_vs_fixed"] = rep["test"]["float_vs_fixed"]
    out["held_out_per_scenario"] = {}
    scen = test["scenario"].to_numpy()
    for s in SCENARIOS:
        m = scen == s
        if m.any():
            out["held_out_per_scenario"][s] = _scores(
                metrics, y[m], {k: v[m] for k, v in preds.items()}
            )
    wrong = test.filter(pl.Series(preds["model_float"] != y))
    out["model_errors"] = wrong.select(
        "scenario", "collection_id", "src_cpu", "dst_cpu", "same_node", "prefer_src",
        "prefer_dst", "delta_ns", "nr_balance_failed", "cache_nice_tries", "buddy_hot",
        "cpu_idle", "cpu_newly_idle", "src_len", LABEL,
    ).to_dicts()[:50]  # fmt: skip
    out["train_metrics_model_float"] = rep["train"]["float"]

    # the tracepoint approximation against the exact labels of the same runs
    tp_sum: dict[str, float] = {}
    tp_runs = 0
    tp_frames = []
    for r in runs:
        if "lb_decisions_tracepoint" not in r["tables"]:
            continue
        from kernmlops.data import read_parquet_dir

        tp = read_parquet_dir(r["path"], "lb_decisions_tracepoint")
        kp = decisions.filter(pl.col("collection_id") == r["collection_id"])
        if tp.height == 0:
            continue
        c = compare_with_kprobe(tp, kp)
        tp_frames.append(tp.with_columns(pl.lit(r["collection_id"]).alias("collection_id")))
        tp_runs += 1
        for k, v in c.items():
            if isinstance(v, int):
                tp_sum[k] = tp_sum.get(k, 0) + v
    if tp_runs:
        examined = tp_sum["positives"] + tp_sum["negatives_examined"]
        agree = tp_sum["positives_agree"] + tp_sum["negatives_agree"]
        out["tracepoint"] = {
            "runs": tp_runs,
            **tp_sum,
            "label_agreement_examined": agree / examined if examined else None,
            "positives_agreement": tp_sum["positives_agree"] / tp_sum["positives"]
            if tp_sum["positives"] else None,
            "negatives_examined_share": tp_sum["negatives_examined"] / tp_sum["negatives"]
            if tp_sum["negatives"] else None,
            "negatives_agreement_examined": tp_sum["negatives_agree"] / tp_sum["negatives_examined"]
            if tp_sum["negatives_examined"] else None,
            # of the exact decisions answered 1 (after the filter), how many the
            # approximation saw as a pull at all
            "exact_migrate_seen": tp_sum["positives_agree"] / max(1, tp_sum["kprobe_migrations"]),
        }  # fmt: skip
        # what a model learned from the approximation (its training runs' rows) does
        # on the exact held-out decisions
        from kernmlops.lb.model import TrainConfig, train

        tp_train = prepare(pl.concat(tp_frames, how="diagonal_relaxed").filter(~is_test))
        if tp_train.height and tp_train[LABEL].n_unique() == 2:
            tm = train(float_features(tp_train, cost), tp_train[LABEL].to_numpy(),
                       TrainConfig(seed=seed))  # fmt: skip
            out["tracepoint"]["model_trained_on_it"] = {
                "train_rows": tp_train.height,
                "on_exact_held_out": metrics(y, tm.predict(x)),
            }
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def print_summary(r: dict[str, Any]) -> None:
    t, h = r["total"], r["held_out_total"]
    print(f"migration cost {r['migration_cost_ns']:,} ns (kernel: {r['kernel_migration_cost_ns']})")
    print(f"all: {t['runs']} runs, {t['raw']:,} kprobe decisions, {t['filtered']:,} after MLLB's "
          f"filter ({t['stay']:,} stay, {t['migrate']:,} migrate); failed runs: "
          f"{len(r['runs_failed'])}")  # fmt: skip
    print(f"held out: {h['runs']} runs, {h['raw']:,} decisions, {h['filtered']:,} filtered "
          f"({h['stay']:,} stay, {h['migrate']:,} migrate)")  # fmt: skip
    print(f"{'scenario':<14}{'runs':>5}{'raw':>8}{'filtered':>9}{'stay':>7}{'migrate':>8}"
          f"   held out: {'runs':>4}{'filtered':>9}{'stay':>6}")  # fmt: skip
    for s, c in r["per_scenario"].items():
        a, ho = c["all"], c["held_out"]
        print(f"{s:<14}{a['runs']:>5}{a['raw']:>8,}{a['filtered']:>9,}{a['stay']:>7,}"
              f"{a['migrate']:>8,}   {'':>10}{ho['runs']:>4}{ho['filtered']:>9,}"
              f"{ho['stay']:>6,}")  # fmt: skip
    print(
        f"kernel's logic on the columns agrees with its answers: {_pct(r['kernel_logic_agrees'])}"
    )
    print("held out:")
    for name, m in r["held_out"].items():
        rc = m["recall_per_class"]
        print(f"  {name:<13} balanced {_pct(m['balanced_accuracy']):>8}  recall stay "
              f"{_pct(rc['stay']):>8} migrate {_pct(rc['migrate']):>8}  accuracy "
              f"{_pct(m['accuracy']):>8}  {m['confusion']}")  # fmt: skip
    for s, per in r["held_out_per_scenario"].items():
        print(f"  {s:<13} " + "  ".join(
            f"{n} {_pct(m['balanced_accuracy'])}" for n, m in per.items()))  # fmt: skip
    tp = r.get("tracepoint")
    if tp:
        print(f"tracepoint approximation ({tp['runs']} runs): {tp['positives']:,} positives, "
              f"{_pct(tp['positives_agreement'])} an exact 'migrate' for the same task and CPUs; "
              f"{tp['negatives']:,} negatives, {_pct(tp['negatives_examined_share'])} examined by "
              f"the balancer, {_pct(tp['negatives_agreement_examined'])} of those answered 'stay'; "
              f"agreement on the rows the kernel examined "
              f"{_pct(tp['label_agreement_examined'])}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__name__, __doc__)
    ap.add_argument("--collect", type=Path, help="boot the lab and collect into this folder")
    ap.add_argument("--rounds", type=int, default=40, help="rounds of the 8 scenarios at most")
    ap.add_argument("--seconds", type=int, default=30, help="stress-ng time of a run")
    ap.add_argument("--budget-min", type=float, default=50, help="no round starts after this")
    ap.add_argument("--migration-cost-ns", type=int, help="set the lab kernel's migration cost")
    ap.add_argument("--cpus", type=int, default=4)
    ap.add_argument("--numa", type=int, default=2)
    ap.add_argument("--memory", default="4G")
    ap.add_argument("--analyse", type=Path, nargs="*", help="collection roots to analyse")
    ap.add_argument("--held-out", type=float, default=0.5, help="share of each scenario's runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", type=Path, default=RESULTS / "lb-dataset.json")
    args = ap.parse_args(argv)
    if args.collect:
        return collect(args)
    if not args.analyse:
        ap.error("give --collect OUT or --analyse DIR...")
    r = analyse(args.analyse, args.held_out, args.seed)
    r["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print_summary(r)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    harness.save(args.output, r, indent=1)
    print(f"-> {args.output}")
    return 0
