"""render(), figure() and `kernmlops graph` on hand-built collections (no root needed)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kernmlops.data import Collection, IncompleteCollectionWarning, read_collection
from kernmlops.errors import CollectionError
from kernmlops.graphs import (
    GraphFailure,
    SelectionError,
    figure,
    graph_registry,
    load,
    render,
    report,
)
from kernmlops.graphs._render import GraphError, figures
from kernmlops.graphs._report import table_summary
from kernmlops.graphs.cli import graph_command, report_command
from kernmlops.graphs.quanta_runtime import busy_fraction
from kernmlops.hooks import REGISTRY as HOOKS
from tests.graphs.conftest import (
    BENCH_START,
    BENCH_STOP,
    EXPECTED,
    WORKER,
    assert_png,
    assert_self_contained,
    synthetic_tables,
    write_collection,
)


@pytest.fixture(scope="module")
def rendered(synthetic: Collection, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return render(synthetic, tmp_path_factory.mktemp("png"))


def test_every_graph_is_drawn_as_a_png(rendered: list[Path]) -> None:
    assert {p.stem for p in rendered} == set(EXPECTED)
    for path in rendered:
        assert path.exists() and path.suffix == ".png"
        assert_png(path.read_bytes())


def test_graphs_name_the_tables_they_draw() -> None:
    registry = graph_registry()
    assert {name: set(g.tables) for name, g in registry.items()} == EXPECTED
    hook_tables = {t for hook in HOOKS.values() for t in hook.tables}
    assert set().union(*EXPECTED.values()) <= hook_tables
    # scheduling first, counters last: the report's order
    assert list(registry)[:2] == ["quanta_timeline", "quanta_run_length"]
    assert list(registry)[-1] == "perf_cumulative"


def test_graph_modules_are_named_after_a_hook_or_table() -> None:
    import kernmlops.graphs.base as base

    src = Path(base.__file__).parent
    machinery = {"base", "context", "cli"}
    modules = {p.stem for p in src.glob("[!_]*.py")} - machinery
    tables_of = {hook: set(cls.tables) for hook, cls in HOOKS.items()}
    assert modules <= set(tables_of) | set().union(*tables_of.values())
    for graph in graph_registry().values():
        module = type(graph).__module__.rsplit(".", 1)[1]
        # beside its table: the table's own module, or that of the hook writing it
        assert module in set(graph.tables) or set(graph.tables) <= tables_of[module], graph.name


def test_only_graphs_of_tables_with_rows(tmp_path: Path) -> None:
    tables = synthetic_tables()
    folder = write_collection(
        tmp_path,
        {
            "memory_usage": tables["memory_usage"],
            "quanta_runtime": tables["quanta_runtime"].clear(),  # the table, no rows
            "system_info": tables["system_info"],
        },
    )
    written = render(folder)  # default: <collection>/graphs
    assert [p.relative_to(folder).as_posix() for p in written] == ["graphs/memory_usage.png"]
    assert sorted(p.name for p in (folder / "graphs").iterdir()) == ["memory_usage.png"]
    # the PNGs beside the tables do not make the collection unreadable
    assert "graphs" not in read_collection(folder).tables


def test_a_collection_without_drawable_tables_gives_no_graph(tmp_path: Path) -> None:
    folder = write_collection(tmp_path, {"system_info": synthetic_tables()["system_info"]})
    assert render(folder, tmp_path / "out") == []


def test_benchmark_start_and_stop_are_drawn_on_time_axes(synthetic: Collection) -> None:
    fig = figure(synthetic, "process_events")
    ax = fig.axes[0]
    vertical = {
        line.get_label(): line.get_xdata()[0]
        for line in ax.lines
        if len(set(line.get_xdata())) == 1
    }
    assert vertical["benchmark start"] == 0.0
    assert vertical["benchmark stop"] == pytest.approx((BENCH_STOP - BENCH_START) / 1e6)
    assert ax.get_xlabel() == "time since benchmark start (s)"


def test_selection_by_tgid_and_comm(synthetic: Collection, tmp_path: Path) -> None:
    by_tgid = load(synthetic, tgid=WORKER)
    by_comm = load(synthetic, comm="worker")
    for data in (by_tgid, by_comm):
        frame = data.frame("quanta_runtime")  # scanned: collected only to look at it
        assert set(frame.collect()["tgid"].to_list()) == {WORKER}
        # the worker ran every other 2 ms quantum on both CPUs: half of each CPU
        _, busy = busy_fraction(frame, data.origin_us, data.timeline([frame], target=10))
        assert np.median(busy) == pytest.approx(0.5, abs=0.02)
    written = render(synthetic, tmp_path, comm="worker", graphs=["quanta_timeline", "perf_rate"])
    assert [p.name for p in written] == ["quanta_timeline.png", "perf_rate.png"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tgid": 424242}, "no rows of tgid 424242"),
        ({"comm": "nosuch"}, "no process named 'nosuch'"),
        ({"tgid": WORKER, "comm": "worker"}, "not both"),
    ],
)
def test_selection_errors_say_what_exists(
    synthetic: Collection, kwargs: dict, message: str
) -> None:
    with pytest.raises(SelectionError, match=message) as info:
        load(synthetic, **kwargs)
    if "tgid" in kwargs and "comm" not in kwargs:
        assert "worker" in str(info.value)  # the busiest processes are named


def test_a_failing_graph_is_reported_and_the_others_drawn(
    synthetic: Collection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(data: object, fig: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(graph_registry()["memory_usage"], "draw", broken)
    names = ["memory_usage", "process_events"]
    failures: list[GraphFailure] = []
    written = render(synthetic, tmp_path, graphs=names, errors=failures)
    assert [p.name for p in written] == ["process_events.png"]
    assert failures == [GraphFailure("memory_usage", "ValueError: boom")]
    with pytest.raises(GraphError, match="graph 'memory_usage' failed: ValueError: boom"):
        render(synthetic, tmp_path, graphs=names)


def test_a_table_whose_part_is_another_tables_fails_its_graphs_in_one_line_each(
    synthetic: Collection, tmp_path: Path
) -> None:
    # memory_usage's part copied over quanta_runtime's: polars names the missing column,
    # then every column the frame has and the plan it resolved (dozens of lines)
    col = tmp_path / "col"
    shutil.copytree(synthetic.path, col)
    (part,) = sorted((col / "memory_usage").glob("part-*.parquet"))[:1]
    for old in (col / "quanta_runtime").glob("part-*.parquet"):
        shutil.copyfile(part, old)
    failures: list[GraphFailure] = []
    written = render(read_collection(col), tmp_path / "out", graphs=["quanta_run_length",
                     "memory_usage"], errors=failures)  # fmt: skip
    assert [p.name for p in written] == ["memory_usage.png"]
    (failed,) = failures
    assert failed.graph == "quanta_run_length" and "\n" not in failed.error
    assert failed.error.startswith("ColumnNotFoundError: unable to find column ")
    assert failed.error.endswith("(a part of another table, or damaged?)")
    assert "valid columns" not in failed.error and len(failed.error) < 200


def test_a_damaged_table_is_left_out_and_said_and_the_others_drawn_and_reported(
    synthetic: Collection, tmp_path: Path
) -> None:
    col = tmp_path / "col"
    shutil.copytree(synthetic.path, col)
    for part in (col / "memory_usage").glob("part-*.parquet"):
        os.truncate(part, 300)  # a disk's damage: no footer
    runner = CliRunner()
    out = tmp_path / "figs"
    drawn = runner.invoke(graph_command, [str(col), "-o", str(out), "--dpi", "40",
                                          "--only", "process_events,syscalls_top"])  # fmt: skip
    assert drawn.exit_code == 1, drawn.output  # said, and not a clean run
    said = [ln for ln in drawn.output.splitlines() if ln.startswith("warning:")]
    assert len(said) == 1 and "memory_usage: cannot read table 'memory_usage'" in said[0]
    assert said[0].endswith("the table is left out")
    assert sorted(p.name for p in out.iterdir()) == ["process_events.png", "syscalls_top.png"]
    page = tmp_path / "r.html"
    reported = runner.invoke(report_command, [str(col), "-o", str(page), "--dpi", "40",
                                              "--only", "process_events"])  # fmt: skip
    assert reported.exit_code == 1, reported.output
    assert "the table is left out" in reported.output and page.stat().st_size > 10_000
    # a figure asked for whose table is the damaged one: said so, not "no table"
    refused = runner.invoke(graph_command, [str(col), "-o", str(tmp_path / "m"),
                                            "--only", "memory_usage"])  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert "memory_usage needs memory_usage (damaged: left out)" in refused.output
    reported = runner.invoke(report_command, [str(col), "-o", str(page), "--dpi", "40",
                                              "--only", "memory_usage"])  # fmt: skip
    assert reported.exit_code == 1, reported.output
    said = [ln for ln in reported.output.splitlines() if ln.startswith("warning:")]
    assert len(said) == 2 and "memory_usage (damaged: left out)" in said[1]


def _damage_pages(part: Path) -> None:
    """Every byte between the magic and the footer overwritten: the footer (the schema,
    what a scan checks first) reads, the data does not."""
    data = bytearray(part.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    end = len(data) - 8 - footer
    data[4:end] = b"\xff" * (end - 4)
    part.write_bytes(bytes(data))


def test_a_page_that_fails_its_checksum_leaves_its_table_out_of_graph_and_report(
    synthetic: Collection, tmp_path: Path
) -> None:
    """One byte flipped inside a page (the footer whole: a lazy scan sees nothing):
    graph and report check every page, so the table is left out and said, never
    drawn from what the page now holds."""
    from kernmlops.collect import pagecheck
    from tests.parquet_damage import flip_page_byte

    col = tmp_path / "col"
    shutil.copytree(synthetic.path, col)
    part = sorted((col / "quanta_runtime").glob("part-*.parquet"))[-1]
    # written as the collector writes parts: a checksum on each page (the fixture's
    # frames are written without), then one byte inside a page flipped
    pq.write_table(pq.read_table(part), part, compression="zstd", **pagecheck.WRITE)
    flip_page_byte(part, "quanta_run_length_us")
    runner = CliRunner()
    drawn = runner.invoke(graph_command, [str(col), "-o", str(tmp_path / "figs"), "--dpi",
                                          "40", "--only", "process_events"])  # fmt: skip
    assert drawn.exit_code == 1, drawn.output
    said = [ln for ln in drawn.output.splitlines() if ln.startswith("warning:")]
    assert len(said) == 1, drawn.output
    assert f"{part.name} is damaged: a page fails its checksum" in said[0]
    assert said[0].endswith("the table is left out")
    page = tmp_path / "r.html"
    reported = runner.invoke(report_command, [str(col), "-o", str(page), "--dpi", "40",
                                              "--only", "process_events"])  # fmt: skip
    assert reported.exit_code == 1, reported.output
    assert "a page fails its checksum" in reported.output and page.stat().st_size > 10_000
    # a lazy read checks the pages too (said in a warning), unless told not to
    with pytest.warns(IncompleteCollectionWarning, match="a page fails its checksum"):
        assert "quanta_runtime" not in read_collection(col, lazy=True, damaged="skip")
    assert "quanta_runtime" in read_collection(col, lazy=True, damaged="skip", pages=False)


def test_a_table_damaged_past_its_first_footer_is_left_out_and_the_others_drawn(
    synthetic: Collection, tmp_path: Path
) -> None:
    # A scan checks only a table's first part's footer: a damaged page, or a later part
    # of another table, was found by the first query over the tables, and refused the
    # whole collection (exit 2, nothing drawn) where a table is to be left out.
    col = tmp_path / "col"
    shutil.copytree(synthetic.path, col)
    for part in (col / "quanta_runtime").glob("part-*.parquet"):
        _damage_pages(part)
    (first,) = sorted((col / "syscalls").glob("part-*.parquet"))[:1]
    shutil.copyfile(first, col / "memory_usage" / "part-09999.parquet")
    runner = CliRunner()
    out = tmp_path / "figs"
    drawn = runner.invoke(graph_command, [str(col), "-o", str(out), "--dpi", "40",
                                          "--only", "process_events,syscalls_top"])  # fmt: skip
    assert drawn.exit_code == 1, drawn.output
    said = sorted(ln for ln in drawn.output.splitlines() if ln.startswith("warning:"))
    assert len(said) == 2, drawn.output
    assert "memory_usage: cannot read table 'memory_usage'" in said[0]
    assert "quanta_runtime: cannot read table 'quanta_runtime'" in said[1]
    assert all(ln.endswith("the table is left out") for ln in said)
    assert sorted(p.name for p in out.iterdir()) == ["process_events.png", "syscalls_top.png"]
    page = tmp_path / "r.html"
    reported = runner.invoke(report_command, [str(col), "-o", str(page), "--dpi", "40",
                                              "--only", "process_events"])  # fmt: skip
    assert reported.exit_code == 1, reported.output
    assert reported.output.count("the table is left out") == 2
    assert page.stat().st_size > 10_000
    # a library caller that asked for no skipping (and no page check) still gets the
    # refusal
    with pytest.raises(CollectionError, match="cannot read the collection"):
        load(read_collection(col, lazy=True, pages=False))
    with pytest.warns(IncompleteCollectionWarning, match="its page header does not parse"):
        scanned = read_collection(col, lazy=True, damaged="skip")
    with pytest.warns(IncompleteCollectionWarning):
        data = load(scanned, damaged="skip")
    assert sorted(scanned.damaged) == ["memory_usage", "quanta_runtime"]
    assert "quanta_runtime" not in data.tables and "quanta_runtime" not in scanned
    assert data.count("syscalls") == synthetic["syscalls"].height


def test_a_report_on_a_table_with_one_damaged_column_is_written_and_says_it(
    synthetic: Collection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The damaged column is one that load's queries (timestamps, process names) never
    # read: the table's statistics raised a Python traceback and no page was written.
    # The report checks every page first now, so the table is left out and said; where
    # that check sees nothing (here made so), the statistics say it instead.
    col = tmp_path / "col"
    shutil.copytree(synthetic.path, col)
    for part in (col / "quanta_runtime").glob("part-*.parquet"):
        meta = pq.ParquetFile(part).metadata
        data = bytearray(part.read_bytes())
        for group in range(meta.num_row_groups):
            for i in range(meta.num_columns):
                chunk = meta.row_group(group).column(i)
                if chunk.path_in_schema == "quanta_run_length_us":
                    start = chunk.dictionary_page_offset or chunk.data_page_offset
                    data[start : start + chunk.total_compressed_size] = (
                        b"\xff" * chunk.total_compressed_size
                    )
        part.write_bytes(bytes(data))
    page = tmp_path / "r.html"
    checked = CliRunner().invoke(report_command, [str(col), "-o", str(page), "--dpi", "40",
                                                  "--only", "process_events"])  # fmt: skip
    assert checked.exit_code == 1, checked.output
    said = [ln for ln in checked.output.splitlines() if ln.startswith("warning:")]
    assert len(said) == 1 and "cannot read table 'quanta_runtime'" in said[0], checked.output
    assert "a page does not decode" in said[0] and said[0].endswith("the table is left out")
    assert page.read_text().count("<li><b>") > 3  # the other tables' statistics
    monkeypatch.setattr("kernmlops.data._part_damage", lambda fd: None)
    reported = CliRunner().invoke(report_command, [str(col), "-o", str(page), "--dpi", "40",
                                                   "--only", "process_events"])  # fmt: skip
    assert reported.exit_code == 1, reported.output
    assert reported.exception is None or isinstance(reported.exception, SystemExit)
    said = [ln for ln in reported.output.splitlines() if ln.startswith("not summarised:")]
    assert len(said) == 1 and "cannot read table 'quanta_runtime'" in said[0], reported.output
    text = page.read_text()
    assert "cannot be read: " in text and "process_events.png" in text
    # the other tables' statistics are there
    assert text.count("<li><b>") > 3
    with pytest.raises(CollectionError, match="cannot read table 'quanta_runtime'"):
        report(col, tmp_path / "lib.html", graphs=["process_events"], dpi=40)


def test_only_names_each_graph_once_and_at_least_one(synthetic: Collection, tmp_path: Path) -> None:
    """--only a,a drew and listed a twice ('2 graph(s) written'); --only , drew none
    and said the collection had no table to draw, exit 0 (and --only "" drew all)."""
    runner = CliRunner()
    out = tmp_path / "figs"
    twice = runner.invoke(graph_command, [str(synthetic.path), "-o", str(out), "--dpi", "40",
                                          "--only", "syscalls_top, syscalls_top"])  # fmt: skip
    assert twice.exit_code == 0, twice.output
    assert twice.stdout.splitlines() == [str(out / "syscalls_top.png")]
    assert "1 graph(s) written" in twice.output
    for command in (graph_command, report_command):
        for empty in ("", ",", " , "):
            result = runner.invoke(command, [str(synthetic.path), "-o", str(tmp_path / "x"),
                                             "--only", empty])  # fmt: skip
            assert result.exit_code == 2, result.output
            assert f"--only {empty!r} names no graph" in result.output
    assert not (tmp_path / "x").exists()


def test_graph_command(synthetic: Collection, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "figs"
    result = runner.invoke(
        graph_command, [str(synthetic.path), "-o", str(out), "--only", "syscalls_top,perf_rate"]
    )
    assert result.exit_code == 0, result.output
    listed = [line for line in result.stdout.splitlines() if line.endswith(".png")]
    assert listed == [str(out / "syscalls_top.png"), str(out / "perf_rate.png")]
    assert all(Path(p).exists() for p in listed)

    listing = runner.invoke(graph_command, ["--list"])
    assert listing.exit_code == 0
    assert {line.split()[0] for line in listing.stdout.splitlines()} == set(EXPECTED)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--comm", "nosuch"], 2, "no process named 'nosuch'"),
        (["--only", "nope"], 2, "unknown graph(s) 'nope'"),
        (["--tgid", "1", "--comm", "x"], 2, "--tgid and --comm exclude each other"),
        (["--tgid", "-3"], 2, "-3 is not in the range x>=0"),
    ],
)
def test_graph_command_errors(
    synthetic: Collection, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    result = CliRunner().invoke(graph_command, [str(synthetic.path), "-o", str(tmp_path), *args])
    assert result.exit_code == code
    assert message in " ".join(result.output.split())


def test_graph_command_on_a_folder_that_is_no_collection(tmp_path: Path) -> None:
    result = CliRunner().invoke(graph_command, [str(tmp_path)])
    assert result.exit_code == 2
    assert "no manifest" in result.output


def _collected(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every result polars collects from now on."""
    heights: list[int] = []
    collect, collect_all = pl.LazyFrame.collect, pl.collect_all

    def one(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> pl.DataFrame:
        found = collect(self, *args, **kwargs)
        heights.append(found.height)
        return found

    def every(frames: Any, *args: Any, **kwargs: Any) -> list[pl.DataFrame]:
        found = collect_all(frames, *args, **kwargs)
        heights.extend(f.height for f in found)
        return found

    monkeypatch.setattr(pl.LazyFrame, "collect", one)
    monkeypatch.setattr(pl, "collect_all", every)
    return heights


def test_a_collection_larger_than_the_memory_left_is_drawn_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 1 KiB of memory left, reading the collection is refused, and `graph` and
    `report` still draw every graph: they scan it, and what they collect does not
    grow with its rows: with each event table 200 times over, no query collects
    more rows than on the tables once, fewer than any of those tables has."""
    tables = synthetic_tables()
    small = write_collection(tmp_path / "small", tables)
    events = ("process_trace", "quanta_runtime", "quanta_queued_time", "mm_rss_stat",
              "page_faults", "sched_migrate", "syscalls", "block_io")  # fmt: skip
    many = {t: pl.concat([f] * 200) if t in events else f for t, f in tables.items()}
    large = write_collection(tmp_path / "large", many)
    # replayed a few rows at a time, as a table past a million rows is
    monkeypatch.setattr("kernmlops.graphs.mm_rss_stat.SLICE_ROWS", 2)
    monkeypatch.setattr("kernmlops.host.meminfo.available_bytes", lambda: 1 << 10)
    with pytest.raises(CollectionError, match=r"memory and 1\.0 KiB is available: scan it"):
        read_collection(small)

    # the queries of a report (every figure, every table's summary) on each
    heights = _collected(monkeypatch)
    data = load(small)
    assert len([fig for _, fig in figures(data)]) == len(EXPECTED)
    table_summary(data)
    most_small, heights[:] = max(heights), []
    page = tmp_path / "large.html"
    runner = CliRunner()
    result = runner.invoke(report_command, [str(large), "-o", str(page), "--dpi", "40"])
    assert result.exit_code == 0, result.output
    assert len(assert_self_contained(page.read_text())) == len(EXPECTED)
    # an event table collected whole would be the largest result
    assert max(heights) == most_small < min(many[t].height for t in events)

    # graph reads as report does (every figure was drawn above): two of its event graphs
    figs, two = tmp_path / "figs", "quanta_timeline,syscalls_top"
    result = runner.invoke(
        graph_command, [str(large), "-o", str(figs), "--dpi", "40", "--only", two]
    )
    assert result.exit_code == 0, result.output
    assert {p.stem for p in figs.iterdir()} == set(two.split(","))


def test_empty_selection_of_a_system_table_draws_it_whole(synthetic: Collection) -> None:
    data = load(synthetic, tgid=WORKER)
    assert data.tables["memory_usage"].collect().height == synthetic["memory_usage"].height
    fig = figure(data, "memory_usage")
    assert "system-wide" in fig.get_suptitle()
    assert "tgid" in figure(data, "process_events").get_suptitle()


def test_rows_are_aggregated_not_drawn_one_by_one(tmp_path: Path) -> None:
    n = 400_000
    rng = np.random.default_rng(3)
    ends = np.cumsum(rng.integers(5, 200, n)).astype(np.uint64)
    quanta = pl.DataFrame(
        {
            "ts_uptime_us": ends + 1_000_000,
            "quanta_run_length_us": rng.integers(1, 5, n).astype(np.uint64),
            "cpu": rng.integers(0, 4, n).astype(np.uint32),
            "pid": np.full(n, 9, np.uint32),
            "tgid": np.full(n, 9, np.uint32),
        }
    )
    folder = write_collection(tmp_path, {"quanta_runtime": quanta}, pid=None)
    fig = figure(folder, "quanta_timeline")
    image = fig.axes[0].images[0].get_array()
    assert image.shape[0] == 4 and image.shape[1] <= 200  # CPUs x time bins
    ax = figure(folder, "quanta_run_length").axes[0]
    assert len(ax.patches) + len(ax.lines) + len(ax.collections) < 10


def test_the_commands_load_no_plotting_until_they_draw() -> None:
    import subprocess
    import sys

    import kernmlops.graphs as graphs

    assert sorted(graphs.__all__) == sorted(graphs._EXPORTS)
    code = "import sys, kernmlops.graphs.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("command", ["graph", "report"])
def test_an_incomplete_collection_is_one_warning_line(tmp_path: Path, command: str) -> None:
    import subprocess
    import sys

    tables = {"syscalls": synthetic_tables()["syscalls"]}
    folder = write_collection(tmp_path, tables, extra={"state": "running"})
    out = tmp_path / ("figs" if command == "graph" else "page.html")
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", command, str(folder), "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "incomplete collection" in line]
    # not Python's "<file>:<line>: IncompleteCollectionWarning: ..." and its source line
    assert warned == [
        f"warning: {folder}: incomplete collection: its collector stopped without finishing "
        "(last flush never); reading what was flushed"
    ], done.stderr
    assert "IncompleteCollectionWarning" not in done.stderr
    with pytest.warns(IncompleteCollectionWarning, match="incomplete collection"):
        read_collection(folder)  # the library's callers are still warned


def test_graph_usage_says_the_collection_is_required_unless_list() -> None:
    result = CliRunner().invoke(graph_command, ["--help"])
    assert result.exit_code == 0
    assert result.output.startswith("Usage: graph [OPTIONS] COLLECTION\n")
    assert "COLLECTION is required, except with --list." in result.output
    missing = CliRunner().invoke(graph_command, [])
    assert missing.exit_code == 2 and "Missing argument 'COLLECTION'" in missing.output


def test_graph_only_of_a_table_the_collection_lacks_is_refused_before_a_folder(
    tmp_path: Path,
) -> None:
    tables = synthetic_tables()
    folder = write_collection(tmp_path, {t: tables[t] for t in ("syscalls", "system_info")})
    out = tmp_path / "figs"
    args = [str(folder), "-o", str(out), "--only", "syscalls_top,perf_rate"]
    result = CliRunner().invoke(graph_command, args)
    assert result.exit_code == 2, result.output
    assert (
        "error: the collection has no table for perf_rate (perf_rate needs perf_counters); "
        "its tables: syscalls, system_info"
    ) in " ".join(result.output.split())
    assert not out.exists()  # nothing drawn, no folder made


@pytest.mark.parametrize(
    ("page", "said"),
    [
        (Path("/proc/kmo-report.html"),
         "/proc/kmo-report.html: no file can be made in /proc"),
        (Path("/proc/sys/kmo-report.html"),
         "kmo-report.html into /proc/sys: not writable (choose another path with -o)"),
    ],
)  # fmt: skip
def test_a_page_that_cannot_be_written_is_refused_before_anything_is_read(
    synthetic: Collection, page: Path, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report -o /proc/x.html` read and drew every collection, then said "No such file
    or directory": now one line first, and no collection is read."""
    import kernmlops.data

    def unread(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a collection was read")

    monkeypatch.setattr(kernmlops.data, "read_collection", unread)
    done = CliRunner().invoke(report_command, [str(synthetic.path), "-o", str(page)])
    assert done.exit_code == 2, done.output
    assert done.output == f"error: cannot write the report {said}\n"
