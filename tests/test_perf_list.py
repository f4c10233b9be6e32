"""list_events against the machine and against linux-perf's own `perf list` and
`perf stat` (the independent sources)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from kernmlops.ebpf.perf_counters import PMU_DIR, SOFTWARE, tracefs_events
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


@pytest.mark.bpf
def test_tracepoints_carry_their_tracefs_id() -> None:
    root = tracefs_events()
    assert root is not None, "tracefs not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
    frame = list_events(tracepoints=True, probe_cpu=None)
    row = frame.filter(pl.col("name") == "tlb:tlb_flush").row(0, named=True)
    assert row["config"] == int((root / "tlb" / "tlb_flush" / "id").read_text())
    assert (row["kind"], row["type"]) == ("tracepoint", 2)
    assert frame.filter(pl.col("kind") == "tracepoint").height == len(list(root.glob("*/*/id")))


@pytest.mark.bpf
def test_tracepoints_are_not_probed_unless_asked() -> None:
    frame = list_events(tracepoints=True)
    tps = frame.filter(pl.col("kind") == "tracepoint")
    assert tps["supported"].is_null().all()
    assert (tps["reason"] == TRACEPOINT_NOT_PROBED).all()


@pytest.mark.bpf
def test_software_events_are_listed_and_supported_as_perf_counts_them() -> None:
    frame = list_events()
    sw = frame.filter(pl.col("kind") == "software")
    assert set(sw["name"]) == set(SOFTWARE)
    assert sw["supported"].all(), sw.filter(~pl.col("supported"))
    # perf lists the same software events, and counts them
    perf_sw = {n for n, kind in _perf_list().items() if kind == "Software event"}
    assert perf_sw == set(SOFTWARE)
    counted = _perf_stat(["context-switches", "cpu-clock", "task-clock", "minor-faults"])
    assert all(v.replace(".", "").isdigit() for v in counted.values()), counted


@pytest.mark.bpf
def test_hardware_support_agrees_with_perf_stat() -> None:
    frame = list_events()
    verdict = _perf_stat(GENERIC_CHECKED)
    print(f"\nperf stat: {verdict}")
    assert set(verdict) == set(GENERIC_CHECKED)
    for name in GENERIC_CHECKED:
        row = frame.filter(pl.col("name") == name).row(0, named=True)
        perf_supports = verdict[name] != "<not supported>"
        assert row["supported"] == perf_supports, (name, row["reason"], verdict[name])
        if not perf_supports:
            assert "not supported" in row["reason"]
    cycles = frame.filter(pl.col("name") == "cycles").row(0, named=True)
    assert cycles["kind"] == "hardware" and cycles["aliases"] == ["cpu-cycles"]
    if not Path("/sys/bus/event_source/devices/cpu").exists():
        # This VM: no core PMU, so perf calls cycles <not supported> and so do we.
        assert verdict["cycles"] == "<not supported>" and cycles["supported"] is False


@pytest.mark.bpf
def test_sysfs_pmu_events_match_perf_list() -> None:
    frame = list_events()
    pmu_rows = frame.filter(pl.col("kind") == "pmu")
    perf_pmu = {n for n, kind in _perf_list().items() if kind == "Kernel PMU event"}
    assert perf_pmu, "perf lists no PMU event on this machine"
    assert perf_pmu <= set(pmu_rows["name"])
    for row in pmu_rows.iter_rows(named=True):
        pmu, event = row["name"].strip("/").split("/")
        assert row["pmu"] == pmu
        assert row["type"] == int((PMU_DIR / pmu / "type").read_text())
        assert row["encoding"] == (PMU_DIR / pmu / "events" / event).read_text().strip()
        assert row["description"] == "sysfs"
    # perf counts what we call supported (e.g. msr/tsc/ here; a scaled count such as
    # power/'s Joules is a decimal)
    supported = pmu_rows.filter(pl.col("supported"))["name"].to_list()
    counted = _perf_stat(supported, system_wide=True)
    for name in supported:
        assert re.fullmatch(r"\d+(\.\d+)?", counted.get(name, "")), (name, counted.get(name))


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
