"""`kernmlops graph` and `report` show how many graphs (and the report's tables) are
done on a terminal, and nothing more than before anywhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.data import Collection
from kernmlops.graphs.cli import graph_command, report_command
from tests.progress import force_terminal, frames, last_count

# what a quick run says, however long a starved one takes (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("unhurried")

TWO = "syscalls_top,perf_rate"


def test_graph_shows_each_graph_done_on_a_terminal(
    synthetic: Collection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    force_terminal(monkeypatch)
    out = tmp_path / "figs"
    result = CliRunner().invoke(graph_command, [str(synthetic.path), "-o", str(out), "--only", TWO])
    assert result.exit_code == 0, result.output
    assert last_count(result.stderr, "drawing", "graphs") == ("2", "2")
    # the PNGs listed on stdout as ever: the bar is on stderr only
    assert result.stdout.splitlines() == [str(out / "syscalls_top.png"), str(out / "perf_rate.png")]


def test_graph_without_a_terminal_or_with_no_progress_says_what_it_said(
    synthetic: Collection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [str(synthetic.path), "-o", str(tmp_path / "figs"), "--only", TWO]
    plain = CliRunner().invoke(graph_command, args)
    assert plain.exit_code == 0, plain.output
    assert plain.stderr == "2 graph(s) written\n"
    force_terminal(monkeypatch)
    off = CliRunner().invoke(graph_command, [*args, "--no-progress"])
    assert off.exit_code == 0, off.output
    assert frames(off.stderr) == ["2 graph(s) written"]


def test_report_shows_its_graphs_and_tables_done_on_a_terminal(
    synthetic: Collection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    force_terminal(monkeypatch)
    page = tmp_path / "r.html"
    args = [str(synthetic.path), "-o", str(page), "--only", TWO, "--dpi", "40"]
    result = CliRunner().invoke(report_command, args)
    assert result.exit_code == 0, result.output
    # a step per graph asked for and per table summarised in the page
    steps = str(2 + len(synthetic.tables))
    assert last_count(result.stderr, "reporting", "graphs and tables") == (steps, steps)
    assert result.stdout == f"{page}\n"
    plain = CliRunner().invoke(report_command, [*args[:-2], "--no-progress"])
    assert (plain.exit_code, plain.stderr) == (0, "")
