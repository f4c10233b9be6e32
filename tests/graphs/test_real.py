"""Graphs and the report of a real collection (`kernmlops collect`, 2 s, whole system),
looked at in headless Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.counters import scaled
from kernmlops.data import Collection, read_collection
from kernmlops.graphs import load, render, report
from kernmlops.graphs._report import table_summary
from kernmlops.graphs.perf_counters import per_sample
from kernmlops.tables import UPTIME_TIMESTAMP
from tests.graphs.conftest import assert_png
from tests.graphs.test_render import EXPECTED
from tests.graphs.test_report import (
    assert_one_query_gives_the_two_queries_results,
    assert_self_contained,
    browser_view,
)

pytestmark = pytest.mark.bpf


def expected_graphs(collection: Collection) -> set[str]:
    """Graphs whose tables the collector wrote rows to, by the manifest's counts."""
    rows = {t: v["rows"] for t, v in collection.manifest["tables"].items()}
    return {g for g, tables in EXPECTED.items() if all(rows.get(t, 0) > 0 for t in tables)}


def test_render_a_real_collection(real_collection: Collection, tmp_path: Path) -> None:
    expected = expected_graphs(real_collection)
    # 2 s of the whole system with a forking shell always schedules, polls, calls and faults
    assert {"quanta_timeline", "memory_usage", "syscalls_top", "perf_rate",
            "page_fault_rate", "process_events"} <= expected  # fmt: skip
    written = render(real_collection, tmp_path)
    assert {p.stem for p in written} == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{g}.png" for g in expected)
    for path in written:
        width, height = assert_png(path.read_bytes())
        assert width >= 900 and height >= 380


def test_table_summary_of_a_real_collection_is_one_query_with_the_two_queries_results(
    real_collection: Collection,
) -> None:
    # the whole system, then its busiest process: syscalls' and perf_counters' own
    # summaries and the default one, over the tables a real collector writes
    assert_one_query_gives_the_two_queries_results(load(real_collection))
    busiest = real_collection["quanta_runtime"]["tgid"].mode().sort()[0]
    assert_one_query_gives_the_two_queries_results(load(real_collection, tgid=int(busiest)))


def test_report_of_a_real_collection_renders_in_chromium(
    real_collection: Collection, tmp_path: Path
) -> None:
    page = report([real_collection.path], tmp_path / "report.html")
    pngs = assert_self_contained(page.read_text())
    assert len(pngs) == len(expected_graphs(real_collection))

    shot = tmp_path / "report.png"
    seen = browser_view(page, tmp_path, width=1400, height=9000, screenshot=shot)
    assert seen["images"] == len(pngs) and seen["decoded"] == len(pngs)

    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1400, 9000)
        pixels = np.asarray(image.convert("RGB")).astype(int)
    ink = np.any(pixels < 200, axis=2).mean()
    colour = (pixels.max(axis=2) - pixels.min(axis=2) > 80).mean()
    # Text and tables alone leave the page nearly white and grey; the figures bring
    # colour. The window is tall enough to show every figure: on an idle machine the
    # first (the CPU heat map) is nearly all the colour map's black.
    assert ink > 0.03, f"{ink:.2%} of the screenshot is not white"
    print(f"ink {ink:.2%}, colour {colour:.2%}, {len(pngs)} figures")
    assert colour > 0.01, f"only {colour:.2%} of the screenshot is coloured"


#: One CPU busy until the burner itself has run 4 s on it (past 3.04 s, where count *
#: enabled of a clock counter passes 2**63; on a busy machine that takes longer than 4 s
#: of wall time, and on one CPU, or the count is split between CPUs), then its own CPU
#: time from the kernel's rusage and its wall time.
BURN = textwrap.dedent(
    """
    import json, os, resource, time
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    t0 = time.monotonic()
    def cpu_s():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    while cpu_s() < 4.0 and time.monotonic() - t0 < 60:
        for _ in range(10000):
            pass
    print(json.dumps({"cpu_s": cpu_s(), "wall_s": time.monotonic() - t0}))
    """
)


def test_perf_clocks_of_a_collection_past_3_seconds_stay_exact(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o", str(tmp_path),
           "--hooks", "perf", "--", sys.executable, "-c", BURN]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    burn = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    found = sorted((tmp_path / "curated").glob("benchmark=command/collection_id=*"))
    frame = read_collection(found[0])["perf_counters"].sort("cpu", UPTIME_TIMESTAMP)
    cpus = frame["cpu"].n_unique()

    # The counters reached the range where the old Int64 product wrapped.
    last = frame.group_by("cpu").agg(pl.col("task_clock_ns", "task_clock_enabled_ns").last())
    assert max(int(a) * int(b) for a, b in last.select("task_clock_ns", "task_clock_enabled_ns")
               .iter_rows()) > 2**63  # fmt: skip
    # Software clocks are never multiplexed: the scaled count is the raw count, exactly.
    assert (frame["task_clock_enabled_ns"] == frame["task_clock_running_ns"]).all()
    out = scaled(frame)
    assert (out["task_clock_ns_scaled"] == out["task_clock_ns"].cast(pl.Float64)).all()

    # The total over the run is the sum of each CPU's own difference of the raw table.
    raw = frame.group_by("cpu").agg(
        delta=pl.col("task_clock_ns").last() - pl.col("task_clock_ns").first()
    )
    total = per_sample(frame, cumulative=True)["task_clock_ns_scaled"].to_list()[-1]
    assert total == raw["delta"].sum()
    # It holds the workload's CPU time (the kernel's rusage of it, an independent
    # account) and no more than every CPU's whole span.
    span_s = (frame[UPTIME_TIMESTAMP].max() - frame[UPTIME_TIMESTAMP].min()) / 1e6
    assert burn["cpu_s"] >= 3.5
    assert burn["cpu_s"] <= total / 1e9 <= cpus * span_s * 1.01 + 0.01

    # Each read's rate: between 0 and the CPU count (the old code: 0, then 5.7 on 2 CPUs),
    # per second of each counter's enabled time: a read delayed on a busy machine (2.68
    # on 2 CPUs, when the rows' timestamps were the time base) shifts nothing.
    rates = per_sample(frame, cumulative=False)["task_clock_ns_scaled"] / 1e9
    assert rates.min() >= 0 and rates.max() <= cpus * 1.001, rates.to_list()
    # The report's line: the same total, in CPU-s/s at most the CPU count.
    stats = {t["table"]: dict(t["stats"]) for t in table_summary(load(found[0]))}
    line = stats["perf_counters"]["task_clock_ns"]
    found_line = re.fullmatch(r"([\d,.]+) s \(([\d.]+) CPU-s/s\)", line)
    assert found_line, line
    seconds, per_s = (float(g.replace(",", "")) for g in found_line.groups())
    assert seconds == pytest.approx(total / 1e9, abs=0.0005)
    assert 0 < per_s <= cpus * 1.01
