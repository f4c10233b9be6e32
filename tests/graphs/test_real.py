"""Graphs and the report of a real collection (`kernmlops collect`, 2 s, whole system),
looked at in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernmlops.data import Collection
from kernmlops.graphs import load, render, report
from tests.graphs.conftest import assert_png, run_chromium
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

    seen = browser_view(page, tmp_path)
    assert seen["images"] == len(pngs) and seen["decoded"] == len(pngs)

    shot = tmp_path / "report.png"
    run_chromium(
        ["--window-size=1400,9000", "--hide-scrollbars", f"--screenshot={shot}", page.as_uri()],
        tmp_path / "profile",
    )
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
