"""The plan of trials: counts, orders, and a seeded randomized schedule."""

from __future__ import annotations

import itertools
from collections import Counter

import yaml

from kernmlops.duet.config import validate_duet_config
from kernmlops.duet.runner import Trial, plan_trials

CFG = """
duetbench:
  suite: s
  duet_repetitions: 4
  sequential_repetitions: 2
  syncduet_repetitions: 2
  harness: {iterations: 3}
  schedule: %s
  duets: [x, y]
x: {A: {run: a}, B: {run: b}}
y: {A: {run: a}}
"""


def _suite(schedule: str):
    return validate_duet_config(yaml.safe_load(CFG % schedule))


def test_sequential_schedule_order_and_counts():
    plan = plan_trials(_suite("sequential"), seed=None)
    x = [t for t in plan if t.duet == "x"]
    assert plan[: len(x)] == x  # duet by duet, in the config's order
    assert [t.order for t in x if t.kind == "duet"] == ["AB", "BA", "AB", "BA"]
    assert [t.order for t in x if t.kind == "syncduet"] == ["AB", "BA"]
    seq = [(t.runid, t.pair) for t in x if t.kind == "sequential"]
    assert seq == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]  # alternating which goes first
    assert Counter(t.kind for t in plan) == {"duet": 8, "syncduet": 4, "sequential": 8}
    assert Trial("x", "duet", 1, "BA").pairs == ("B", "A")


def test_randomized_schedule_is_seeded():
    suite = _suite("randomized_interleaving_trials")
    first = plan_trials(suite, seed=7)
    assert plan_trials(suite, seed=7) == first
    assert sorted(first, key=repr) == sorted(plan_trials(_suite("sequential"), None), key=repr)
    others = {tuple(plan_trials(suite, seed=s)) for s in range(8)}
    assert len(others) == 8  # 20 trials: 8 seeds give 8 different orders
    # interleaved: the two duets' trials are mixed, not in blocks
    names = [t.duet for t in first]
    assert sum(a != b for a, b in itertools.pairwise(names)) > 2
