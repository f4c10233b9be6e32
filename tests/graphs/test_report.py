"""report() and `kernmlops report`: one self-contained page, checked as HTML and in
headless Chromium (no root needed)."""

from __future__ import annotations

import html
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from kernmlops.data import Collection, read_collection
from kernmlops.graphs import report
from kernmlops.graphs._report import table_facts, table_summary
from kernmlops.graphs.base import US_PER_S, GraphData, TableView, collect, format_bytes
from kernmlops.graphs.cli import report_command
from kernmlops.graphs.context import _views, load, table_view
from kernmlops.hooks.task_perf import split_events
from tests.graphs.conftest import (
    WORKER,
    assert_png,
    assert_self_contained,
    browser_view,
    synthetic_tables,
    write_collection,
)
from tests.rows import TASK_PERF_RECORD


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    """A smaller collection: memory and quanta only, another benchmark."""
    tables = synthetic_tables(seed=2)
    keep = ("memory_usage", "quanta_runtime", "system_info")
    folder = write_collection(
        tmp_path_factory.mktemp("second"),
        {k: tables[k] for k in keep},
        cid="synthetic-2",
        benchmark="other",
        pid=None,
    )
    return read_collection(folder)


#: The first collection's tables: enough for every section, 8 figures (fewer to draw).
FIRST = ("process_trace", "quanta_runtime", "syscalls", "memory_usage", "perf_counters",
         "system_info", "benchmark_result")  # fmt: skip


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    tables = synthetic_tables()
    folder = write_collection(tmp_path_factory.mktemp("first"), {k: tables[k] for k in FIRST})
    return read_collection(folder)


@pytest.fixture(scope="module")
def side_by_side(
    first: Collection, second: Collection, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return report([first.path, second.path], tmp_path_factory.mktemp("r") / "both.html")


def test_report_is_one_self_contained_file(side_by_side: Path) -> None:
    text = side_by_side.read_text()
    pngs = assert_self_contained(text)
    # quanta timeline and run length, process events, syscalls top and latency, memory,
    # perf rate and cumulative; the second: quanta timeline and run length, memory
    assert len(pngs) == 8 + 3
    for png in pngs:
        assert_png(png)
    assert sorted(p.name for p in side_by_side.parent.iterdir()) == ["both.html"]


def test_report_shows_system_hooks_and_tables(side_by_side: Path, first: Collection) -> None:
    inline = re.sub(r"</?(?:b|span|code)\b[^>]*>", "", side_by_side.read_text())
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())
    for expected in (
        "synthetic-1",
        "synthetic-2",
        "6.1.0-test",  # kernel
        "Test CPU",
        "not attached needs perf_event with stacks",  # a hook that did not attach
        "not counted: cycles",
        "3 dropped, 0 missed",  # the syscalls hook's drops
        "runtime 1.9 s",  # benchmark_result
        "0 s = benchmark start; start/stop from process_trace",
        "resolved configuration",
    ):
        assert expected in text, expected
    # per-table rows and statistics as the data has them
    quanta = first["quanta_runtime"]
    assert f"quanta_runtime {quanta.height:,} 2.00 s 3" in text  # rows, span, processes
    assert "quanta_run_length_us: mean 2 ms · p50 2 ms · p99 2 ms · max 2 ms" in text
    assert "calls: 44 of 3 syscalls · 2 failed" in text
    # a graph the second collection lacks the table for says so
    assert "not collected: no syscalls table" in text


def test_table_summary_matches_the_frames(synthetic: Collection) -> None:
    summary = {t["table"]: t for t in table_summary(load(synthetic))}
    assert summary["block_io"]["rows"] == 60
    assert summary["block_io"]["span_s"] == pytest.approx(1.8)
    assert summary["memory_usage"]["processes"] is None  # system-wide
    stats = dict(summary["block_io"]["stats"])
    assert set(stats) == {"issue_to_complete_us", "queue_to_issue_us", "bytes", "other requests"}
    assert stats["bytes"].startswith("mean 1 MiB")
    assert stats["other requests"] == "FLUSH 2 (2 MiB)"  # the synthetic flushes carry 1 MiB


def test_block_io_bytes_are_those_read_and_written(tmp_path: Path) -> None:
    # A DISCARD of a whole 4 GiB device (mkfs, fstrim) moves no data: the bytes
    # figure is the reads' and writes' alone, discards and flushes said apart.
    rw = np.array([4096, 8192, 4096, 65536, 512 << 10, 4096, 131072, 4096], np.uint32)
    ops = ["READ", "WRITE"] * 4 + ["DISCARD", "DISCARD", "FLUSH"]
    sizes = np.concatenate([rw, np.array([2**32 - 1, 1 << 30, 0], np.uint32)])
    n = sizes.size
    block = pl.DataFrame(
        {
            "ts_uptime_us": np.arange(n, dtype=np.uint64) * 1000 + 5_000_000_000,
            "bytes": sizes,
            "op": ops,
            "queue_to_issue_us": np.full(n, 3, np.uint64),
            "issue_to_complete_us": np.full(n, 100, np.uint64),
            "tgid": np.full(n, WORKER, np.uint32),
        }
    )
    folder = write_collection(tmp_path, {"block_io": block})
    (entry,) = [t for t in table_summary(load(folder)) if t["table"] == "block_io"]
    stats = dict(entry["stats"])
    # by hand, from the reads' and writes' sizes alone
    q = {p: np.quantile(rw, p, method="inverted_cdf") for p in (0.5, 0.99)}
    assert stats["bytes"] == (
        f"mean {format_bytes(rw.mean())} · p50 {format_bytes(q[0.5])} · "
        f"p99 {format_bytes(q[0.99])} · max {format_bytes(rw.max())}"
    )
    discarded = format_bytes(2**32 - 1 + (1 << 30))
    assert stats["other requests"] == f"DISCARD 2 ({discarded}) · FLUSH 1"


def test_task_perf_tables_are_summarised_by_their_counts(tmp_path: Path) -> None:
    # task_perf's tables as its hook makes them from switch records: minor faults per
    # quantum 10 (6 times), 20 (4 times) and 1000; dTLB misses 7 each. The counters'
    # enabled and running times (seconds, in µs) are no statistic of the workload.
    counts = [10] * 6 + [20] * 4 + [1000]
    n = len(counts)
    dt = TASK_PERF_RECORD
    recs = np.zeros(n, dt)
    recs["ts_uptime_us"] = 5_000_000_000 + np.arange(n) * 1000
    recs["count"][:, 0], recs["count"][:, 1] = counts, 7
    recs["cumulative"][:, 0], recs["cumulative"][:, 1] = np.cumsum(counts), 7 * np.arange(1, n + 1)
    recs["enabled_ns"][:, :2] = recs["running_ns"][:, :2] = 4_000_000_000 + np.arange(n)[:, None]
    recs["pid"] = recs["tgid"] = WORKER
    recs["charge_task"] = 1
    tables = {
        name: pl.from_arrow(table)
        for name, table in split_events(recs, ["minor-faults", "dTLB-load-misses"]).items()
    }
    folder = write_collection(tmp_path, tables)  # type: ignore[arg-type]
    stats = {t["table"]: dict(t["stats"]) for t in table_summary(load(folder))}
    # by hand: mean 1140 / 11 = 103.6; p50 the 6th of 11 (10); p99 the 11th (1000)
    assert stats["minor_faults"] == {"count": "mean 104 · p50 10 · p99 1,000 · max 1,000"}
    assert stats["dtlb_misses"] == {"count": "mean 7 · p50 7 · p99 7 · max 7"}


def two_query_table_summary(data: GraphData) -> list[dict[str, Any]]:
    """table_summary as it was made before its queries were one: a table's facts (span,
    processes) by one query, then the view's figures by another (view.summary)."""
    out = []
    for name, frame in data.tables.items():
        rows = data.count(name)
        entry: dict[str, Any] = {"table": name, "rows": rows, "span_s": None, "processes": None}
        view = table_view(name).for_data(data)
        facts = table_facts(frame, view)
        if rows and facts:
            found = collect(frame.select(**facts)).row(0, named=True)
            if "span_us" in found:
                entry["span_s"] = found["span_us"] / US_PER_S
            entry["processes"] = found.get("processes")
        entry["stats"] = view.summary(frame) if rows else []
        out.append(entry)
    return out


def assert_one_query_gives_the_two_queries_results(data: GraphData) -> None:
    one = table_summary(data)
    assert one == two_query_table_summary(data)
    # every kind of entry was compared: facts, the default view's figures, its own
    assert any(t["span_s"] is not None and t["processes"] is not None for t in one)
    assert any(t["stats"] and t["rows"] for t in one)


@pytest.mark.parametrize("select", [{}, {"tgid": WORKER}])
def test_table_summary_is_one_query_with_the_two_queries_results(
    synthetic: Collection, select: dict
) -> None:
    assert_one_query_gives_the_two_queries_results(load(synthetic, **select))


def test_every_view_is_summarised_by_its_queries_and_words() -> None:
    # the report runs summary_queries and words them with summarise: a view that
    # overrode summary() alone would be summarised as the default view in the report
    views = _views()
    assert {"syscalls", "perf_counters", "quanta_runtime"} <= set(views)
    assert all(type(view).summary is TableView.summary for view in views.values())


def test_report_of_collections_of_one_benchmark_names_it_once(
    first: Collection, second: Collection, tmp_path: Path
) -> None:
    # another run of the first's benchmark ("synthetic"): memory only, quick to draw
    tables = synthetic_tables(seed=3)
    again = write_collection(
        tmp_path / "again",
        {k: tables[k] for k in ("memory_usage", "system_info")},
        cid="synthetic-3",
    )
    titles = {}
    for name, paths in {
        "one": [first.path],
        "twice": [first.path, again],
        "mixed": [first.path, second.path, again],
    }.items():
        page = report(paths, tmp_path / f"{name}.html", graphs=["memory_usage"]).read_text()
        titles[name] = re.findall(r"<title>(.*?)</title>", page)
    assert titles == {
        "one": ["kernmlops report: synthetic"],
        "twice": ["kernmlops report: synthetic (2 collections)"],
        "mixed": ["kernmlops report: synthetic (2 collections), other"],
    }


def test_report_renders_in_chromium_side_by_side(side_by_side: Path, tmp_path: Path) -> None:
    seen = browser_view(side_by_side, tmp_path)
    assert seen["images"] == 11 and seen["decoded"] == 11
    assert min(seen["widths"]) >= 800  # decoded at full resolution
    (_, right_a), (left_b, right_b) = seen["cells"]
    assert right_a <= left_b and right_b - left_b > 400  # two columns, next to each other
    assert seen["title"] == "kernmlops report: synthetic, other"


def test_report_command(second: Collection, tmp_path: Path) -> None:
    out = tmp_path / "one.html"
    result = CliRunner().invoke(
        report_command, [str(second.path), "-o", str(out), "--tgid", str(WORKER)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(str(out))
    text = out.read_text()
    assert f"selection: tgid {WORKER}" in text
    assert len(assert_self_contained(text)) == 3  # quanta timeline and run length, memory


def test_report_command_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(report_command, [])
    assert missing.exit_code == 2 and "Missing argument" in missing.output
    not_a_collection = runner.invoke(
        report_command, [str(tmp_path), "-o", str(tmp_path / "r.html")]
    )
    assert not_a_collection.exit_code == 2 and "no manifest" in not_a_collection.output
    assert not (tmp_path / "r.html").exists()


def test_report_onto_a_device_or_a_fifo_is_refused_and_leaves_it(
    first: Collection, tmp_path: Path
) -> None:
    """The page is renamed over its path: `-o /dev/null` as root put an HTML file in the
    place of /dev/null (exit 0). A FIFO, and a link to a device (as /dev/stdout is),
    stand in for it here: refused in one line before anything is drawn, left as they
    were."""
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    link = tmp_path / "null.html"
    link.symlink_to(os.devnull)
    for out, kind in ((fifo, "not a file"), (link, "a device")):
        result = CliRunner().invoke(report_command, [str(first.path), "-o", str(out),
                                                     "--only", "syscalls_top"])  # fmt: skip
        assert result.exit_code == 2, result.output
        (line,) = result.output.strip().splitlines()
        assert line == f"error: cannot write the report {out}: it is {kind}: name a file of its own"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert link.is_symlink() and os.readlink(link) == os.devnull
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.html", "null.html"]


def test_report_command_only(first: Collection, tmp_path: Path) -> None:
    out = tmp_path / "only.html"
    names = ["syscalls_top", "quanta_timeline"]
    result = CliRunner().invoke(
        report_command, [str(first.path), "-o", str(out), "--only", ",".join(names)]
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert len(assert_self_contained(text)) == 2
    # in report order (scheduling first), each under its own heading
    assert re.findall(r'<h3 id="([^"]+)"', text) == ["quanta_timeline", "syscalls_top"]
    shown = html.unescape(re.sub(r"<[^>]+>", "", text))
    assert "calls: 44 of 3 syscalls" in shown  # the tables are summarised still


def test_report_command_only_says_a_figure_a_collection_cannot_have(
    first: Collection, second: Collection, tmp_path: Path
) -> None:
    """--only naming a figure whose table a collection lacks: one warning line per such
    collection, naming it and the table (as `graph --only` names it), exit 1; the page
    is written still, with the figure of the collection that has the table."""
    out = tmp_path / "both.html"
    args = [str(first.path), str(second.path), "-o", str(out), "--dpi", "40"]
    result = CliRunner().invoke(report_command, [*args, "--only", "syscalls_top,memory_usage"])
    assert result.exit_code == 1, result.output
    said = [ln for ln in result.output.splitlines() if ln.startswith("warning:")]
    assert said == [
        f"warning: {second.path}: the collection has no table for syscalls_top (syscalls_top "
        "needs syscalls); its tables: memory_usage, quanta_runtime, system_info"
    ]
    assert "Traceback" not in result.output
    assert result.stdout.strip().endswith(str(out))
    # syscalls_top for the first, memory for both
    assert len(assert_self_contained(out.read_text())) == 3

    alone = tmp_path / "alone.html"
    result = CliRunner().invoke(
        report_command, [str(second.path), "-o", str(alone), "--only", "syscalls_top"]
    )
    assert result.exit_code == 1, result.output
    assert "no table for syscalls_top (syscalls_top needs syscalls)" in result.output
    assert alone.exists() and not assert_self_contained(alone.read_text())


def test_report_command_only_refuses_an_unknown_graph(first: Collection, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        report_command, [str(first.path), "-o", str(out), "--only", "syscalls_top,nope"]
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown graph(s) 'nope'; known: ")
    assert "Traceback" not in result.output
    assert not out.exists()
    assert "--only NAMES" in CliRunner().invoke(report_command, ["--help"]).output


def test_report_counts_what_a_hook_never_saw_as_lost(tmp_path: Path) -> None:
    """block_io's completions that /proc/diskstats counted and it never saw are lost
    events on the report's overview, beside drops and missed runs."""
    hook = {"attached": True, "events": 5, "drops": 0, "missed": 0,
            "counters": {"missed_completions": 2, "completions_not_seen": 1_234}}  # fmt: skip
    folder = write_collection(
        tmp_path, {"system_info": synthetic_tables()["system_info"]},
        extra={"hooks": {"block_io": hook}},
    )  # fmt: skip
    page = report([folder], tmp_path / "r.html").read_text()
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    assert "events lost 0 dropped, 0 missed, 1,234 never seen" in text
