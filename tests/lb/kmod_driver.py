"""Runs inside the kernel lab, in the lab's one interpreter (tests/lab_guest.py: each
Python start costs 25-60 s under QEMU without KVM): kmo_lb's whole cycle through the
real `kernmlops lb` commands, with the kernel's own load-balancing statistics beside it. Writes
what it saw to OUT/result.json for tests/lb/test_kmod_lab.py to judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import kernmlops
from kernmlops.lb import deploy
from kernmlops.lb.cli import lb_group
from kernmlops.lb.effect import schedstat_balance

OUT = Path(sys.argv[1])
STRESS = ["stress-ng", "--cpu", "4", "--timeout", "3", "--temp-path", "/tmp", "-q"]


def cli(*args: str) -> int:
    try:
        lb_group.main(list(args), prog_name="kernmlops lb", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def balance() -> dict:
    """The kernel's own balancing counts so far (/proc/schedstat)."""
    gained, pushed = schedstat_balance(Path("/proc/schedstat").read_text())
    return {"lb_gained": gained, "alb_pushed": pushed}


def pulled(counts: dict) -> int:
    """Tasks load_balance pulled (active balancing's pushes are counted in lb_gained)."""
    return counts["lb_gained"] - counts["alb_pushed"]


def phase(name: str, res: dict, enough: int, most: int, pull: bool = False) -> None:
    """The load under the module's current mode, run again until the module made
    ``enough`` decisions in this phase (and, with ``pull``, the kernel pulled a task),
    ``most`` runs at most. Decisions, not time: a guest slowed by the host's other
    work made 28, 12 and 1 in one 3-s run, and the balancer need not ask
    can_migrate_task at all where the hogs happen to start one per CPU."""
    res.setdefault("t", {})[name] = time.monotonic()
    before, decided = balance(), deploy.stats().get("decisions", 0)
    runs = 0
    while runs < most:
        subprocess.run(STRESS, check=True)
        runs += 1
        made = deploy.stats().get("decisions", 0) - decided
        moved = {k: v - before[k] for k, v in balance().items()}
        if made >= enough and (not pull or pulled(moved) > 0):
            break
    res[name] = {**deploy.stats(), **moved, "runs": runs}


res: dict = {"uptime_at_start_s": time.monotonic()}
subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)
Path("/proc/sys/kernel/sched_schedstats").write_text("1\n")
res["probes_before"] = deploy.probed_functions()
ko = deploy.module_path(os.uname().release)
res["kernmlops"], res["module"] = kernmlops.__file__, str(ko)
stamp = ko.parent / ".source"
built_at = stamp.stat().st_mtime if stamp.exists() else None
# the kernel refuses a wrong-shaped model by itself (not only the CLI)
raw = subprocess.run(["insmod", str(ko), "w1=1,2,3", "b1=0", "w2=0", "b2=0"],
                     capture_output=True, text=True)  # fmt: skip
res["raw_insmod_rc"], res["loaded_after_raw"] = raw.returncode, deploy.loaded()
res["bad_rc"] = cli("deploy", str(OUT / "bad.q11.json"), "--mode", "replace")
res["loaded_after_bad"] = deploy.loaded()

res["deploy_rc"] = cli("deploy", str(OUT / "rule.q11.json"), "--mode", "shadow")
res["probes_loaded"] = deploy.probed_functions()
# lb deploy rebuilds a module that is not current: it must not have (minutes under TCG)
res["rebuilt"] = not stamp.exists() or stamp.stat().st_mtime != built_at
res["again_rc"] = cli("deploy", str(OUT / "rule.q11.json"), "--mode", "shadow")
phase("shadow", res, enough=20, most=6, pull=True)
res["mode_rc"] = cli("mode", "replace")
phase("replace", res, enough=10, most=4)
rows = json.loads((OUT / "eval_in.json").read_text())
res["eval"] = deploy.evaluate(rows)
res["bench_ns"] = deploy.bench(200_000)
res["clocksource"] = (
    Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
)
# why that clocksource: the kernel's own words on the TSC under emulation
log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
res["clock_log"] = [x for x in log if "tsc" in x.lower() or "clocksource" in x.lower()][-6:]
res["status_rc"] = cli("status")
res["undeploy_rc"] = cli("undeploy")

# a model that never migrates, deciding: load_balance must pull nothing
res["never_rc"] = cli("deploy", str(OUT / "never.q11.json"), "--mode", "replace")
phase("never", res, enough=1, most=3)
res["never_undeploy_rc"] = cli("undeploy")
res["loaded_after"] = deploy.loaded()
res["modules_after"] = Path("/proc/modules").read_text()
res["probes_after"] = deploy.probed_functions()
# stock again: the balancer pulls tasks, given the chance (3 runs at most; no module
# here, so not phase()): hogs that happen to start two per CPU leave it nothing to pull
before = balance()
for _ in range(3):
    subprocess.run(STRESS, check=True)
    res["stock"] = {k: v - before[k] for k, v in balance().items()}
    if pulled(res["stock"]) > 0:
        break
res["uptime_at_end_s"] = time.monotonic()
(OUT / "result.json").write_text(json.dumps(res))
