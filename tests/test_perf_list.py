"""list_events against the machine and against linux-perf's own `perf list` and
`perf stat` (the independent sources)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import polars as pl

from kernmlops.perf_list import PARANOID, SCHEMA, TRACEPOINT_NOT_PROBED, list_events, none_opened
from tests.conftest import skip_here

GENERIC_CHECKED = [
    "cycles",
    "instructions",
    "cache-misses",
    "branch-misses",
    "dTLB-load-misses",
    "iTLB-load-misses",
    "context-switches",
    "cpu-clock",
    "task-clock",
    "minor-faults",
]


def _perf() -> str:
    perf = shutil.which("perf")
    assert perf, "linux-perf is the independent source here (apt-get install linux-perf)"
    return perf


def _perf_stat(events: list[str], *, system_wide: bool = False) -> dict[str, str]:
    """event -> perf stat's count field (a number, or <not supported>); ``system_wide``:
    every CPU (-a), as list_events opens a counter (on a CPU, not a task): a PMU that
    counts a package (RAPL's power/, the uncore) opens no other way."""
    out = subprocess.run(
        [_perf(), "stat", "-x,", *(["-a"] * system_wide), "-e", ",".join(events), "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    verdict = {}
    for line in out.stderr.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[2] in events:
            verdict[parts[2]] = parts[0]
    return verdict


def _perf_list() -> dict[str, str]:
    """name -> perf's kind ([Software event], [Kernel PMU event], ...)."""
    out = subprocess.run(
        [_perf(), "list", "sw", "pmu"], capture_output=True, text=True, timeout=60
    ).stdout
    listed = {}
    for line in out.splitlines():
        m = re.match(r"^\s+(\S+)(?: OR \S+)*\s+\[(.+)\]\s*$", line)
        if m:
            listed[m.group(1)] = m.group(2)
    return listed


def test_schema_and_no_probe_without_privilege() -> None:
    frame = list_events(probe_cpu=None)
    assert dict(frame.schema) == {k: (v() if isinstance(v, type) else v) for k, v in SCHEMA.items()}
    assert frame["supported"].is_null().all()
    assert frame["name"].is_unique().all()
    assert set(frame["kind"]) >= {"hardware", "cache", "software"}
    row = frame.filter(pl.col("name") == "context-switches").row(0, named=True)
    assert (row["type"], row["config"], row["aliases"]) == (1, 3, ["cs"])
    assert frame.filter(pl.col("name") == "dTLB-load-misses")["config"].item() == 0x10003


def _probed(*rows: tuple[bool | None, str | None]) -> pl.DataFrame:
    return pl.DataFrame(
        [{"name": f"e{i}", "supported": ok, "reason": why} for i, (ok, why) in enumerate(rows)],
        schema={"name": pl.String, "supported": pl.Boolean, "reason": pl.String},
    )


def test_none_opened_says_why_only_when_no_event_could_be_opened() -> None:
    denied = "not permitted (EACCES: Permission denied; see /proc/sys/kernel/perf_event_paranoid)"
    level = PARANOID.read_text().strip()
    assert none_opened(_probed((False, denied), (False, denied), (None, "not probed"))) == (
        f"no perf event could be opened on CPU 0: not permitted (kernel.perf_event_paranoid is "
        f"{level}; above 0 counting a CPU needs root or CAP_PERFMON): run it as root, or lower "
        "it with sysctl kernel.perf_event_paranoid=0"
    )
    assert none_opened(_probed((False, denied), (True, None))) is None
    assert none_opened(_probed((None, TRACEPOINT_NOT_PROBED))) is None  # nothing probed
    assert none_opened(_probed((False, "ENOSYS: Function not implemented"))) == (
        "no perf event could be opened on CPU 0: ENOSYS: Function not implemented"
    )


def test_perf_list_without_privileges_says_why_and_fails() -> None:
    # root without capabilities: perf_event_open sees an unprivileged process, and the
    # interpreter (perhaps under /root) stays readable
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        skip_here("needs root and setpriv (util-linux) to drop every capability")
    # a machine that lets anyone count a CPU refuses nothing: made to refuse, the while
    level = PARANOID.read_text().strip()
    if level in ("-1", "0"):
        PARANOID.write_text("2\n")
    try:
        done = subprocess.run(
            [setpriv, "--bounding-set=-all", "--inh-caps=-all",
             sys.executable, "-m", "kernmlops", "perf-list"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        if PARANOID.read_text().strip() != level:
            PARANOID.write_text(f"{level}\n")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""  # no empty "0 perf events" table
    assert done.stderr.startswith("error: no perf event could be opened on CPU 0: not permitted")
    assert "perf_event_paranoid is" in done.stderr
