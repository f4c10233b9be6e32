"""The tests of test_perf_list.py that need root and BPF (the main lane): the tracepoints'
ids, and the software, hardware and PMU events checked against perf list and perf stat;
apart from the others so that those run beside it."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from kernmlops.ebpf.perf_counters import PMU_DIR, SOFTWARE, tracefs_events
from kernmlops.perf_list import TRACEPOINT_NOT_PROBED, list_events
from tests.test_perf_list import GENERIC_CHECKED, _perf_list, _perf_stat


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
