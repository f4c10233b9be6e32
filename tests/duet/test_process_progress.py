"""`duet process` tells the result files read, up to all of them, and shows them on a
terminal only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.duet.cli import duet_group
from kernmlops.duet.process import process_dirs
from kernmlops.duet.runner import INDEX
from tests.duet.test_process import _harness_csv
from tests.progress import force_terminal, last_count

# what a quick run says, however long a starved one takes (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("unhurried")

RUNS = 4


def _original(folder: Path) -> Path:
    """An original-named results folder: RUNS duets of two sides, and a stray file."""
    folder.mkdir()
    for run in range(RUNS):
        for pair in "AB":
            (folder / f"s.d.{run}.duet.AB.{pair}.out.csv").write_text(_harness_csv())
    (folder / "notes.txt").write_text("not a result\n")
    return folder


def _run_folder(folder: Path) -> Path:
    """A `duet run` folder: RUNS trials whose two sides list a result each."""
    (folder / "results").mkdir(parents=True)
    trials = []
    for run in range(RUNS):
        sides = {}
        for pair in "AB":
            rel = f"results/s.d.{run}.duet.AB.{pair}.out.csv"
            (folder / rel).write_text(_harness_csv())
            sides[pair] = {"status": "ok", "results": [rel], "release_ns": 5_000_000_000}
        trials.append({"label": f"s.d.{run}.duet.AB", "suite": "s", "benchmark": "d",
                       "runid": run, "kind": "duet", "order": "AB", "sides": sides})  # fmt: skip
    index = {"format": "kernmlops-duet-run/1", "suite": "s", "trials": trials}
    (folder / INDEX).write_text(json.dumps(index))
    return folder


def test_process_tells_each_result_file_read(tmp_path: Path) -> None:
    folders = [_original(tmp_path / "orig"), _run_folder(tmp_path / "run")]
    told: list[tuple[int, int]] = []
    processed = process_dirs(folders, progress=lambda n, total: told.append((n, total)))
    files = 2 * 2 * RUNS
    assert processed.files == files and processed.results.height == 3 * files
    assert told == [(n, files) for n in range(files + 1)]


def test_process_command_shows_the_files_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _original(tmp_path / "orig")
    said = f"{3 * 2 * RUNS} iterations from {2 * RUNS} file(s), 1 benchmark(s) -> "
    plain = CliRunner().invoke(duet_group, ["process", str(folder)])
    assert plain.exit_code == 0, plain.output
    assert plain.stderr.startswith(said) and plain.stderr.count("\n") == 1
    force_terminal(monkeypatch)
    shown = CliRunner().invoke(duet_group, ["process", str(folder)])
    assert shown.exit_code == 0, shown.output
    assert last_count(shown.stderr, "processing", "result files") == (str(2 * RUNS),) * 2
    off = CliRunner().invoke(duet_group, ["process", "--no-progress", str(folder)])
    assert off.stderr.startswith(said) and "processing" not in off.stderr
