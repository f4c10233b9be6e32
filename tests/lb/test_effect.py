"""MLLB's measurement, the parts that need no lab: the scenarios (checked by
stress-ng's own option parser), the interleaved schedule, a run's throughput
from stress-ng's YAML, the duet statistics per scenario and the verdict."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest

from kernmlops.lb import effect
from kernmlops.lb.effect import (
    compare_scenario,
    schedstat_balance,
    schedstat_lb_gained,
    schedule,
    throughput,
    verdict,
)
from kernmlops.workloads.mllb import BY_NAME, LAB_SIZES, SCENARIOS, Sizes, command

MLLB_NODES = {0: list(range(28)), 1: list(range(28, 56))}
LAB_NODES = {0: [0, 1], 1: [2, 3]}


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_on_mllbs_machine_the_worker_counts_are_the_notes():
    # at 56 CPUs the scaling is the identity: each worker count is the one in
    # MLLB's own command (numa's single worker, matrixprod's 32 as --matrix)
    for s in SCENARIOS:
        argv = s.argv(MLLB_NODES)
        given = dict(re.findall(r"--(cpu|cache|hdd|vm|numa) (\d+)", s.mllb))
        ours = {f[2:]: argv[i + 1] for i, f in enumerate(argv)
                if f in ("--cpu", "--cache", "--hdd", "--vm", "--matrix")}  # fmt: skip
        if s.name == "matrixprod":
            assert ours == {"matrix": given["cpu"]} == {"matrix": "32"}
        elif s.name == "numa":
            assert ours == {"vm": given["numa"]} == {"vm": "1"}
        else:
            assert ours == given, s.name


def test_lab_scaling_and_exact_options():
    a = {s.name: s.argv(LAB_NODES, LAB_SIZES) for s in SCENARIOS}
    # numa: first node's CPUs, memory on the last node
    assert _flag(a["numa"], "--taskset") == "0,1" and _flag(a["numa"], "--mbind") == "1"
    assert _flag(a["numa"], "--vm-method") == "rand-set"
    assert a["cpu-half"] == ["--cpu", "2", "--cpu-method", "matrixprod", "--taskset", "0,1"]
    assert a["cache"] == ["--cache", "4", "--cache-level", "3"]
    assert a["oversubscribe"] == ["--cpu", "8"]
    assert _flag(a["hdd-seek"], "--hdd-opts") == "wr-rnd,rd-rnd"
    assert _flag(a["matrixprod"], "--matrix") == "2"  # 32 of 56 -> 2.3 of 4
    assert _flag(a["matrixprod"], "--matrix-size") == "128"
    assert _flag(BY_NAME["matrixprod"].argv(LAB_NODES), "--matrix-size") == "512"
    assert a["fft"] == ["--cpu", "3", "--cpu-method", "fft"]  # 48 of 56 -> 3.4 of 4
    assert [_flag(a["mixed"], f) for f in ("--cpu", "--vm", "--hdd")] == ["1", "1", "1"]
    with pytest.raises(ValueError, match="two NUMA nodes"):
        BY_NAME["numa"].argv({0: [0, 1, 2, 3]})
    argv = command(BY_NAME["fft"], LAB_NODES, 8, LAB_SIZES)
    assert argv[0] == "stress-ng" and _flag(argv, "--timeout") == "8s"
    assert "--metrics-brief" in argv and "-q" not in argv  # -q drops the YAML's metrics


@pytest.mark.skipif(not shutil.which("stress-ng"), reason="stress-ng not installed")
def test_lb_effect_still_offers_the_scenarios():
    # defined below both users (kernmlops.workloads.mllb); the old names keep working
    assert effect.SCENARIOS is SCENARIOS and effect.BY_NAME is BY_NAME
    assert effect.Sizes is Sizes and effect.LAB_SIZES is LAB_SIZES and effect.command is command


def test_stress_ng_accepts_every_scenario():
    # stress-ng's own parser (--dry-run) on every command, on this machine's CPU 0;
    # --mbind must name a node that exists here, so numa binds to node 0
    one = {0: [0], 1: [0]}
    for s in SCENARIOS:
        argv = command(s, one, 1, Sizes(vm_bytes="1M", hdd_bytes="1M", matrix_size=16))
        if s.name == "numa":
            argv[argv.index("--mbind") + 1] = "0"
        proc = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (s.name, proc.stdout + proc.stderr)


def test_schedule_interleaves_balanced_blocks():
    names = [s.name for s in SCENARIOS]
    steps = schedule(names, 6, seed=3)
    assert len(steps) == len(names) * 6 * 2 and [s.index for s in steps] == list(range(96))
    for name in names:
        mine = [s for s in steps if s.scenario == name]
        assert Counter(s.side for s in mine) == {"stock": 6, "model": 6}
        orders = Counter(s.order for s in mine if s.side == "stock")
        assert orders == {"stock-model": 3, "model-stock": 3}  # each order half the time
    # a block is two adjacent runs, one of each side, in the block's order
    for first, second in zip(steps[::2], steps[1::2], strict=True):
        assert (first.scenario, first.block) == (second.scenario, second.block)
        assert f"{first.side}-{second.side}" == first.order
        assert {first.mode, second.mode} == {"off", "replace"}
    # the scenarios are mixed, not run one after the other
    runs_of_one = sum(1 for a, b in pairwise(steps[::2]) if a.scenario == b.scenario)
    assert runs_of_one < len(steps) // 2 - 1
    assert schedule(names, 6, seed=3) == steps and schedule(names, 6, seed=4) != steps
    odd = schedule(["fft"], 5)
    assert Counter(s.side for s in odd) == {"stock": 5, "model": 5}
    with pytest.raises(ValueError):
        schedule(names, 0)


YAML = """---
system-info:
      stress-ng-version: 0.15.06
      cpus: 2
metrics:
    - stressor: cpu
      bogo-ops: 665
      bogo-ops-per-second-usr-sys-time: 1272.600622
      bogo-ops-per-second-real-time: 661.758973
      wall-clock-time: 1.004898
    - stressor: vm
      bogo-ops: 28291
      bogo-ops-per-second-usr-sys-time: 54372.831842
      bogo-ops-per-second-real-time: 28143.682460
      wall-clock-time: 1.005234
...
"""


def test_throughput_from_stress_ngs_yaml():
    ops, per = throughput(YAML)
    assert per == {"cpu": 661.758973, "vm": 28143.682460}
    assert ops == pytest.approx(math.sqrt(661.758973 * 28143.682460))
    assert throughput(YAML.split("metrics:")[0]) == (None, {})  # no metrics (e.g. -q)
    assert throughput(YAML.replace("661.758973", "0.0"))[0] is None


@pytest.mark.skipif(not shutil.which("stress-ng"), reason="stress-ng not installed")
def test_throughput_of_a_real_run(tmp_path):
    y = tmp_path / "m.yaml"
    subprocess.run(["stress-ng", "--cpu", "1", "--cpu-ops", "50", "--metrics-brief",
                    "--temp-path", str(tmp_path), "--yaml", str(y)],
                   capture_output=True, check=True, timeout=60)  # fmt: skip
    ops, per = throughput(y.read_text())
    # stress-ng's own figures: ops / wall time
    text = y.read_text()
    bogo = float(re.search(r"bogo-ops: (\d+)", text).group(1))
    wall = float(re.search(r"wall-clock-time: ([\d.]+)", text).group(1))
    assert list(per) == ["cpu"] and bogo >= 50
    assert ops == pytest.approx(bogo / wall, rel=0.02)


def test_verdict_rule():
    assert verdict(1.004, (0.99, 1.015)).startswith("parity within ±2%")
    assert verdict(0.95, (0.93, 0.97)) == "model slower: -5.0% [-7.0%, -3.0%]"
    assert verdict(1.05, (1.03, 1.07)).startswith("model faster: +5.0%")
    assert verdict(1.0, (0.97, 1.03)).startswith("inconclusive: +0.0% [-3.0%, +3.0%]")
    assert verdict(1.0, (0.979, 1.01)).startswith("inconclusive")
    assert verdict(None, None).startswith("inconclusive")


def test_compare_scenario_finds_a_known_slowdown():
    rng = np.random.default_rng(1)
    stock = {b: 1000 * rng.lognormal(0, 0.01) for b in range(8)}
    model = {b: v * 0.95 * rng.lognormal(0, 0.005) for b, v in stock.items()}
    r = compare_scenario(stock, model)
    by_hand = math.exp(np.mean([math.log(model[b] / stock[b]) for b in stock]))
    assert r["blocks"] == 8 and r["unit"] == "run"
    assert r["ratio"] == pytest.approx(by_hand)
    assert r["ci"][0] < by_hand < r["ci"][1] < 1
    assert r["verdict"].startswith("model slower: -5.")
    same = compare_scenario(stock, {b: v * rng.lognormal(0, 0.002) for b, v in stock.items()})
    assert same["verdict"].startswith("parity")
    # pooled over scenarios: blocks keyed (scenario, block), the same statistic
    pooled = compare_scenario({("x", b): v for b, v in stock.items()},
                              {("x", b): v for b, v in model.items()})  # fmt: skip
    assert pooled["ratio"] == pytest.approx(by_hand) and pooled["ci"] == r["ci"]
    # a block with one side missing is left out; one block gives no interval
    assert compare_scenario(stock, {0: 990.0})["verdict"].startswith("inconclusive (too few")


SCHEDSTAT = """version 15
timestamp 4295
cpu0 0 0 0 0 0 0 1 2 3
domain0 03 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 0 0 0 0 0 0 0 0 0 0 0
cpu1 0 0 0 0 0 0 1 2 3
domain0 03 0 0 0 0 2 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
"""


def test_lb_gained_from_schedstat():
    # lb_gained is the 5th of 8 fields per idle type: 5 + 13 + 21, then 2 + 1
    assert schedstat_lb_gained(SCHEDSTAT) == 5 + 13 + 21 + 2 + 1
    with pytest.raises(ValueError):
        schedstat_lb_gained("domain0 03 1 2 3\n")
    # alb_pushed is the 3rd field after the 24: 0 on both lines, then 7
    assert schedstat_balance(SCHEDSTAT) == (5 + 13 + 21 + 2 + 1, 0)
    pushed = SCHEDSTAT.replace("24 0 0 0", "24 0 0 7")
    assert schedstat_balance(pushed) == (5 + 13 + 21 + 2 + 1, 7)
    with pytest.raises(ValueError, match="version 17"):
        schedstat_balance(SCHEDSTAT.replace("version 15", "version 17"))
