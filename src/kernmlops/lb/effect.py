"""Does the model run the machine as well as the kernel? MLLB's measurement.

MLLB's evaluation ran stress-ng scenarios under the stock scheduler and under
the model and compared their throughput. The scenarios (``SCENARIOS``, MLLB's
commands made exact and scaled to a smaller machine) are defined in
:mod:`kernmlops.workloads.mllb`, below both this module and the stress-ng
benchmark that runs them; their names are re-exported here.

Stock and model cannot run at the same time in one kernel, so each scenario
runs in blocks of one stock and one model run, in random order, the blocks
of all scenarios shuffled together (``schedule``). The throughput of a run is
stress-ng's own bogo-ops/s (real time; the geometric mean over the run's
stressors when there are several). Each block is one sequential run of the
duet statistics (``kernmlops.duet.analysis.compare``): the geometric-mean
ratio model/stock over blocks with its interval over runs (the default's:
sign-flip randomization; the blocks' random order makes stock and model
exchangeable).

Everything here is pure (no kernel, no lab); ``bench/lb_effect.py`` runs it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

# the scenarios, by the names this module has always offered them under
from kernmlops.workloads.mllb import (
    BY_NAME,
    LAB_SIZES,
    MLLB_CPUS,
    SCENARIOS,
    Nodes,
    Scenario,
    Sizes,
    command,
    cpu_list,
    scaled,
)

#: Parity: the ratio's whole interval within ±2 %.
PARITY = 0.02
SIDES = ("stock", "model")
#: kmo_lb's mode for each side.
MODE = {"stock": "off", "model": "replace"}


# --- the order of the runs -------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    index: int
    block: int
    scenario: str
    side: str  # stock | model
    order: str  # the block's order: "stock-model" or "model-stock"

    @property
    def mode(self) -> str:
        return MODE[self.side]


def schedule(scenarios: list[str], reps: int, seed: int = 0) -> list[Step]:
    """``reps`` blocks of each scenario, each block one stock and one model run.
    Per scenario, half the blocks run stock first and half model first (which
    half at random); the blocks of all scenarios run in one random order, so a
    drift of the machine falls on both sides and on every scenario alike."""
    if reps < 1:
        raise ValueError("reps must be at least 1")
    rng = random.Random(seed)
    blocks = []
    for name in scenarios:
        both = [SIDES, SIDES[::-1]]
        orders = both * (reps // 2) + [rng.choice(both)] * (reps % 2)
        rng.shuffle(orders)
        blocks += [(name, b, o) for b, o in enumerate(orders)]
    rng.shuffle(blocks)
    steps: list[Step] = []
    for name, b, order in blocks:
        for side in order:
            steps.append(Step(len(steps), b, name, side, "-".join(order)))
    return steps


# --- one run's throughput ----------------------------------------------------------------


def throughput(yaml_text: str) -> tuple[float | None, dict[str, float]]:
    """A run's bogo-ops/s (real time) from stress-ng's ``--yaml`` file: per
    stressor, and their geometric mean (None when a stressor reported none)."""
    from kernmlops.benchmarks.stress_ng import parse_metrics_yaml

    per = {s: v for s, m, v, _u in parse_metrics_yaml(yaml_text) if m == "bogo_ops_per_s_real"}
    if not per or min(per.values()) <= 0:
        return None, per
    return math.exp(sum(math.log(v) for v in per.values()) / len(per)), per


# --- the verdict -----------------------------------------------------------------------------


def verdict(ratio: float | None, ci: tuple[float, float] | None, tol: float = PARITY) -> str:
    """Parity when the interval of model/stock lies within 1 ± tol; a difference
    when it excludes 1; otherwise inconclusive (the interval is too wide)."""
    if ratio is None or ci is None:
        return "inconclusive (too few runs for an interval)"
    lo, hi = ci
    pct = f"{(ratio - 1) * 100:+.1f}% [{(lo - 1) * 100:+.1f}%, {(hi - 1) * 100:+.1f}%]"
    if 1 - tol <= lo and hi <= 1 + tol:
        return f"parity within ±{tol * 100:.0f}% ({pct})"
    if lo > 1:
        return f"model faster: {pct}"
    if hi < 1:
        return f"model slower: {pct}"
    return f"inconclusive: {pct}"


def compare_scenario(
    stock: dict[Hashable, float], model: dict[Hashable, float], seed: int = 0
) -> dict[str, Any]:
    """Model against stock for one scenario (or several pooled, blocks keyed
    by (scenario, block)): ``{block: ops/s}`` of each side.
    Blocks with both sides are the duet statistics' sequential runs (A = stock,
    B = model, the "time" being seconds per bogo-op, so B/A < 1 is faster);
    the result is turned back into throughput: model/stock and its interval."""
    import numpy as np

    from kernmlops.duet.analysis import Options, Run, compare

    blocks = sorted(set(stock) & set(model), key=str)
    runs = []
    for i, b in enumerate(blocks):
        a_t, b_t = np.array([1 / stock[b]]), np.array([1 / model[b]])
        zero = np.zeros(1)
        runs.append(Run(("lb", "effect", "sequential", i, ""), zero, zero, a_t, zero, zero, b_t))
    gmean = lambda side: float(np.exp(np.mean(np.log([side[b] for b in blocks]))))  # noqa: E731
    out: dict[str, Any] = {
        "blocks": len(blocks),
        "stock_ops_s": gmean(stock) if blocks else None,
        "model_ops_s": gmean(model) if blocks else None,
        "ratio": None,
        "ci": None,
        "unit": None,
    }
    if len(blocks) >= 2:
        cmp = compare(runs, "sequential", False, Options(mds=False, seed=seed))
        out["unit"] = cmp.unit
        if cmp.gm_ratio is not None:
            out["ratio"] = 1 / cmp.gm_ratio
        if cmp.ratio_ci is not None:
            out["ci"] = [1 / cmp.ratio_ci.high, 1 / cmp.ratio_ci.low]
    ci = tuple(out["ci"]) if out["ci"] else None
    out["verdict"] = verdict(out["ratio"], ci)  # type: ignore[arg-type]
    return out


def schedstat_balance(text: str) -> tuple[int, int]:
    """(lb_gained, alb_pushed) summed over every domain (and idle type) of
    /proc/schedstat version 15: per domain, 8 fields per idle type with
    lb_gained the 5th, then alb_count, alb_failed, alb_pushed. lb_gained
    counts active balancing's pushes too (detach_one_task), so the tasks
    load_balance() itself pulled are lb_gained - alb_pushed."""
    gained = pushed = 0
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == "version" and f[1:] not in (["15"], ["16"]):
            # later versions lay the domain line out differently
            raise ValueError(f"/proc/schedstat version {' '.join(f[1:])}: 15 or 16 is read")
        if f and f[0].startswith("domain"):
            if len(f) < 2 + 8 * 3 + 3:
                raise ValueError(f"/proc/schedstat: a domain line of {len(f)} fields")
            gained += sum(int(f[2 + 8 * i + 4]) for i in range(3))
            pushed += int(f[2 + 8 * 3 + 2])
    return gained, pushed


def schedstat_lb_gained(text: str) -> int:
    """Tasks the balancer moved (load_balance's pulls and active balancing's
    pushes), from /proc/schedstat: the kernel's own count of its visible work."""
    return schedstat_balance(text)[0]


__all__ = [
    "BY_NAME", "LAB_SIZES", "MLLB_CPUS", "MODE", "PARITY", "SCENARIOS", "SIDES", "Nodes",
    "Scenario", "Sizes", "Step", "command", "compare_scenario", "cpu_list", "scaled",
    "schedstat_balance", "schedstat_lb_gained", "schedule", "throughput", "verdict",
]  # fmt: skip
