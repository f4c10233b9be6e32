"""MLLB's measurement: throughput under the stock scheduler and under the model.

Boots the kernel lab once (Debian's 6.1 under QEMU without KVM, NUMA
emulation), loads kmo_lb with a model trained by this project (on the lab's
recorded kprobe decisions, tests/lb/data, unless ``--model`` gives a
``*.q11.json``) and runs MLLB's stress-ng scenarios (kernmlops.lb.effect),
each in blocks of one stock run (kmo_lb mode off) and one model run (mode
replace) in random order, all blocks shuffled together, in that one boot.
Per run: stress-ng's bogo-ops/s, the module's counters and the kernel's own
lb_gained. Per scenario: model/stock with the duet statistics' interval
(sequential runs) and the verdict. Writes bench/results/lb_effect.json.

    python -m bench lb-effect --reps 10 --seconds 10   # 160 runs, ~30 min in the lab
    python -m bench lb-effect --analyse bench/build/lb-effect   # again, from the runs

Needs the lab (make lab: qemu, virtme-ng, the lab kernel and its headers).
Inside the guest this module runs again as ``--guest OUT``: it then imports
only the standard library and kernmlops.lb.deploy / .effect (every import
costs 20-28x under TCG).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import harness

#: what this benchmark is held to (python -m bench list shows it)
TARGET = "model/stock throughput per MLLB scenario: parity within ±2% or a shown difference"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
DATA = ROOT / "tests" / "lb" / "data" / "lab_kprobe_decisions.parquet"
#: kmo_lb's counters summed over a scenario's model runs
COUNTED = ("calls", "hard_constraint", "decisions", "agree", "overridden", "ns_sum", "missed")


# --- inside the lab --------------------------------------------------------------------------


def _topology() -> dict[str, str]:
    root = Path("/sys/devices/system/node")
    return {p.name: (p / "cpulist").read_text().strip() for p in sorted(root.glob("node[0-9]*"))}


def guest(out: Path) -> None:
    from kernmlops.lb import deploy
    from kernmlops.lb.effect import schedstat_lb_gained

    plan = json.loads((out / "plan.json").read_text())
    info: dict = {"uptime_at_start_s": time.monotonic(), "topology": _topology()}
    Path("/proc/sys/kernel/sched_schedstats").write_text("1\n")
    gained = lambda: schedstat_lb_gained(Path("/proc/schedstat").read_text())  # noqa: E731
    ko = deploy.deploy(deploy.load_q11(out / "model.q11.json"), "off")
    info["module"] = str(ko)
    # the first run of stress-ng and of the probe's paths is translated by QEMU
    # first: one warm-up run, of both modes, that counts for nothing
    for mode in ("off", "replace"):
        deploy.set_mode(mode)
        subprocess.run(plan["warmup"], stdin=subprocess.DEVNULL, capture_output=True)
    runs = out / "runs.jsonl"
    with runs.open("a") as fh:
        for step in plan["steps"]:
            deploy.set_mode(step["mode"])
            yaml_path = Path("/tmp") / f"lb-effect-{step['index']}.yaml"
            before, g0, t0 = deploy.stats(), gained(), time.monotonic()
            proc = subprocess.run([*step["argv"], "--yaml", str(yaml_path)],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  errors="replace")  # fmt: skip
            t1, g1, after = time.monotonic(), gained(), deploy.stats()
            rec = {
                **step,
                "rc": proc.returncode,
                "wall_s": t1 - t0,
                "uptime_s": t0,
                "lb_gained": g1 - g0,
                "counters": {k: after[k] - before[k] for k in after
                             if isinstance(after[k], int) and k in before and k != "ns_max"},
                "yaml": yaml_path.read_text() if yaml_path.exists() else None,
                "stderr": proc.stderr[-2000:] if proc.returncode else "",
            }  # fmt: skip
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
            yaml_path.unlink(missing_ok=True)
            print(f"[{step['index'] + 1}/{len(plan['steps'])}] {step['scenario']} "
                  f"{step['side']} rc {proc.returncode} {t1 - t0:.1f} s", flush=True)  # fmt: skip
    info["final"] = deploy.stats()
    deploy.evaluate([[0] * len(deploy.EVAL_INPUTS)])
    info["bench_ns"] = deploy.bench(100_000)
    info["clocksource"] = (
        Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    )
    deploy.undeploy()
    info["uptime_at_end_s"] = time.monotonic()
    (out / "guest.json").write_text(json.dumps(info))


# --- on the host ---------------------------------------------------------------------------


def lab_nodes(cpus: int, numa: int) -> dict[int, list[int]]:
    """The lab's topology: ``cpus`` split evenly over ``numa`` nodes (kernmlops vm)."""
    per = cpus // numa
    return {n: list(range(n * per, (n + 1) * per)) for n in range(numa)}


def make_model(out: Path, model: Path | None, data: Path, seed: int) -> dict:
    from kernmlops.lb import deploy

    target = out / "model.q11.json"
    if model is not None:
        deploy.load_q11(model)  # refused here, before the lab boots
        target.write_text(model.read_text())
        return {"model": str(model)}
    import polars as pl

    from kernmlops.lb.fixed import fixed_json
    from kernmlops.lb.pipeline import train_model

    result = train_model(pl.read_parquet(data), seed=seed)
    meta = {k: v for k, v in result.model.meta.items() if k != "report"}
    target.write_text(json.dumps(fixed_json(result.fixed, meta)))
    test = result.report["test"]
    return {
        "trained_on": str(data),
        "seed": seed,
        "test_collections": test["collections"],
        "test_rows": test["rows"],
        "test_accuracy_fixed": test["fixed"]["accuracy"],
    }


def plan_runs(args: argparse.Namespace) -> dict:
    from kernmlops.lb.effect import BY_NAME, LAB_SIZES, command, schedule

    nodes = lab_nodes(args.cpus, args.numa)
    steps = []
    for s in schedule(args.scenarios, args.reps, args.seed):
        argv = command(BY_NAME[s.scenario], nodes, args.seconds, LAB_SIZES)
        steps.append({**s.__dict__, "mode": s.mode, "argv": argv})
    warmup = command(BY_NAME["oversubscribe"], nodes, 2, LAB_SIZES)
    return {"nodes": nodes, "seconds": args.seconds, "reps": args.reps, "seed": args.seed,
            "steps": steps, "warmup": warmup}  # fmt: skip


def run_lab(args: argparse.Namespace, out: Path) -> float:
    from kernmlops.lb import deploy
    from kernmlops.vm.qemu import default_kernel, run_in_vm

    release = default_kernel().name.removeprefix("vmlinuz-")
    build = out / "kmod"
    deploy.build(release, build)
    src = ROOT / "src"
    cmd = ["env", f"KERNMLOPS_KMOD_DIR={build}", f"PYTHONPATH={src}:{ROOT}", sys.executable,
           "-m", "bench.lb_effect", "--guest", str(out)]  # fmt: skip
    n = len(json.loads((out / "plan.json").read_text())["steps"])
    t0 = time.monotonic()
    res = run_in_vm(cmd, cpus=args.cpus, numa=args.numa, memory=args.memory, outdir=out,
                    timeout_s=300 + n * (args.seconds + 20), echo=True)  # fmt: skip
    if res.exit_code != 0:
        sys.exit(f"the lab run failed (exit {res.exit_code}); runs so far in {out}/runs.jsonl")
    return time.monotonic() - t0


def analyse(out: Path, seed: int) -> dict:
    from kernmlops.lb.effect import compare_scenario, throughput

    plan = json.loads((out / "plan.json").read_text())
    recs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines() if line]
    scenarios: dict[str, dict] = {}
    failed = []
    for r in recs:
        sc = scenarios.setdefault(r["scenario"], {"stock": {}, "model": {}, "runs": [],
                                                  "argv": r["argv"]})  # fmt: skip
        ops, per = throughput(r["yaml"]) if r["yaml"] and r["rc"] == 0 else (None, {})
        keep = ("index", "block", "side", "order", "rc", "wall_s", "lb_gained", "counters")
        sc["runs"].append({k: r[k] for k in keep} | {"ops_s": ops, "per_stressor": per})
        if ops is None:
            failed.append(f"{r['scenario']} {r['side']} block {r['block']}: rc {r['rc']} "
                          f"{r.get('stderr', '')[-200:]}")  # fmt: skip
            continue
        sc[r["side"]][r["block"]] = ops
    table = {}
    for name, sc in scenarios.items():
        res = compare_scenario(sc["stock"], sc["model"], seed)
        model_runs = [x for x in sc["runs"] if x["side"] == "model"]
        tot = {k: sum(x["counters"].get(k, 0) for x in model_runs) for k in COUNTED}
        d = tot["decisions"]
        res["module"] = {**tot, "agreement": tot["agree"] / d if d else None,
                         "ns_per_decision": tot["ns_sum"] / d if d else None}  # fmt: skip
        res["lb_gained_mean"] = {
            side: sum(x["lb_gained"] for x in sc["runs"] if x["side"] == side)
            / max(1, sum(1 for x in sc["runs"] if x["side"] == side))
            for side in ("stock", "model")
        }
        res["command"] = " ".join(sc["argv"])
        res["runs"] = sc["runs"]
        table[name] = res
    # every block of every scenario as one sample: the model's effect over all
    # of MLLB's workloads, each block its own scenario's stock/model ratio
    pooled = compare_scenario(
        {(n, b): v for n, sc in scenarios.items() for b, v in sc["stock"].items()},
        {(n, b): v for n, sc in scenarios.items() for b, v in sc["model"].items()},
        seed,
    )
    pooled["module"] = {k: sum(t["module"][k] for t in table.values()) for k in COUNTED}
    m = pooled["module"]
    m["agreement"] = m["agree"] / m["decisions"] if m["decisions"] else None
    m["ns_per_decision"] = m["ns_sum"] / m["decisions"] if m["decisions"] else None
    pooled["stock_ops_s"] = pooled["model_ops_s"] = None  # no common unit across scenarios
    guest = json.loads((out / "guest.json").read_text()) if (out / "guest.json").exists() else {}
    return {"plan": {k: plan[k] for k in ("nodes", "seconds", "reps", "seed")},
            "scenarios": table, "all": pooled, "failed_runs": failed, "guest": guest}  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def print_table(result: dict) -> None:
    print(f"\n{'scenario':<14}{'stock ops/s':>13}{'model ops/s':>13}  {'model/stock [95% CI]':<26}"
          f"{'decisions':>10}{'overridden':>11}{'agree':>8}{'ns/dec':>9}  verdict")  # fmt: skip
    for name, r in [*result["scenarios"].items(), ("all (pooled)", result["all"])]:
        ci = r["ci"]
        rat = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        rat += f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        m = r["module"]
        ns = "-" if m["ns_per_decision"] is None else f"{m['ns_per_decision']:,.0f}"
        so = "-" if r["stock_ops_s"] is None else f"{r['stock_ops_s']:,.1f}"
        mo = "-" if r["model_ops_s"] is None else f"{r['model_ops_s']:,.1f}"
        print(f"{name:<14}{so:>13}{mo:>13}  {rat:<26}{m['decisions']:>10,}{m['overridden']:>11,}"
              f"{_pct(m['agreement']):>8}{ns:>9}  {r['verdict']}")  # fmt: skip
    for f in result["failed_runs"]:
        print("failed:", f)


def run(argv: list[str] | None) -> None:
    from kernmlops.lb.effect import SCENARIOS

    p = harness.parser(__name__, __doc__)
    p.add_argument("--guest", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=HERE / "build" / "lb-effect",
                   help="the lab's folder: plan, model, module, runs.jsonl")  # fmt: skip
    p.add_argument("--model", type=Path, help="a *.q11.json (default: train on tests/lb/data)")
    p.add_argument("--data", type=Path, default=DATA, help="decisions to train on")
    p.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    p.add_argument("--reps", type=int, default=10, help="blocks (stock + model) per scenario")
    p.add_argument("--seconds", type=int, default=10, help="length of one run")
    p.add_argument("--cpus", type=int, default=4)
    p.add_argument("--numa", type=int, default=2)
    p.add_argument("--memory", default="4G")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--analyse", type=Path, help="only analyse a finished run's folder")
    p.add_argument("--results", type=Path, default=RESULTS / "lb_effect.json")
    args = p.parse_args(argv)
    command = sys.argv[1:] if argv is None else argv
    if args.guest:
        guest(args.guest)
        return
    if args.analyse:
        out = args.analyse
        meta = json.loads((out / "meta.json").read_text())
    else:
        args.scenarios = [s for s in args.scenarios.split(",") if s]
        unknown = sorted(set(args.scenarios) - {s.name for s in SCENARIOS})
        if unknown or args.reps < 1 or args.seconds < 1:
            sys.exit(f"scenarios are {', '.join(s.name for s in SCENARIOS)}; --reps and "
                     f"--seconds at least 1 (unknown: {', '.join(unknown) or 'none'})")  # fmt: skip
        out = args.out.resolve()
        if (out / "runs.jsonl").exists():
            sys.exit(f"{out} holds a run already: --analyse it or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        meta = {"command": " ".join(["python -m bench lb-effect", *command]),
                "model": make_model(out, args.model, args.data, args.seed)}  # fmt: skip
        plan = plan_runs(args)
        (out / "plan.json").write_text(json.dumps(plan))
        print(f"{len(plan['steps'])} runs of {args.seconds} s; model {meta['model']}")
        meta["lab"] = {"cpus": args.cpus, "numa": args.numa, "memory": args.memory}
        (out / "meta.json").write_text(json.dumps(meta))
        meta["lab_wall_s"] = run_lab(args, out)
        (out / "meta.json").write_text(json.dumps(meta))
    host = {"kernel": os.uname().release, "cpus": os.cpu_count(), "loadavg": os.getloadavg()}
    result = {"analysed": " ".join(["python -m bench lb-effect", *command]), "host": host, **meta,
              **analyse(out, 0)}  # fmt: skip
    print_table(result)
    harness.save(args.results, result)
    print(f"wrote {args.results}")


def main(argv: list[str] | None = None) -> int:
    from kernmlops.errors import KernmlopsError

    try:
        run(argv)
    except KernmlopsError as err:  # a bad model, no headers, no lab: one line
        sys.exit(f"error: {err}")
    except FileNotFoundError as err:
        sys.exit(f"error: {err.filename} not found (--analyse takes a folder of a finished run)")
    return 0


if __name__ == "__main__":  # the lab runs this module as ``python -m bench.lb_effect --guest``
    sys.exit(main())
