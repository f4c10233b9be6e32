"""A file of a duet folder swapped for a FIFO right after duet looked at it (a local
user's move between root's check and root's read): each reader reads what it
checked, through one open descriptor, never the name again (kernmlops.host.pinned.
open_regular), so the swap can neither hang it nor be read."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kernmlops.confined import UnsafePathError
from kernmlops.duet.parsers import parse_file
from kernmlops.duet.process import process_dirs, read_results, read_table, write_processed
from tests.conftest import skip_here
from tests.duet.test_process import GOOD, _harness_csv, _suite
from tests.swap import swap_after_look, within


@pytest.fixture
def processed(tmp_path: Path) -> Path:
    folder = _suite(tmp_path / "run", [GOOD], {})
    found = process_dirs([folder])
    assert found.results.height > 0
    write_processed(found, folder, json=True)
    return folder


@pytest.mark.parametrize("suffix", ["parquet", "csv", "json"])
def test_a_results_table_swapped_after_its_check_is_read_as_checked(
    processed: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = processed / f"duet-results.{suffix}"
    expected = read_table(table)
    swap = swap_after_look(monkeypatch, table)
    got = within(lambda: read_table(table), table)
    assert swap.swapped
    assert_frame_equal(got, expected)


def test_a_kernel_table_swapped_after_its_check_is_read_as_checked(
    processed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = processed / "duet-kernel.parquet"
    written = pl.DataFrame({"suite": ["s"], "cpu": [3], "runtime_ns": [12_345]})
    written.write_parquet(kernel)
    swap = swap_after_look(monkeypatch, kernel, stats=2)  # exists, then the check
    _, got = within(lambda: read_results(processed), kernel)
    assert swap.swapped
    assert_frame_equal(got, written)


def test_a_result_file_swapped_after_it_was_opened_is_parsed_from_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = tmp_path / "s.d.0.duet.AB.A.out.csv"
    result.write_text(_harness_csv(5))
    # parse_file looked at it (size, first bytes) before its parser read it by name
    swap = swap_after_look(monkeypatch, result, stats=None)
    name, rows = within(lambda: parse_file(result), result)
    assert swap.swapped
    assert name == "harness" and rows["iteration"].to_list() == [0, 1, 2, 3, 4]


def test_a_spec_log_swapped_after_the_folder_check_is_named_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "result"
    folder.mkdir()
    log = folder / "CPU2017.001.log"
    log.write_text("  Rate Start: x (1654092292.5)\n  Rate End: x (1654092757.25)\n")
    # the folder's check looks at the log twice (a plain file? its size), listing it once
    swap = swap_after_look(monkeypatch, log, stats=3)
    with pytest.raises(UnsafePathError, match=f"^{log}: log is not a plain file: not read$"):
        within(lambda: parse_file(folder), log)
    assert swap.swapped


def test_a_side_result_swapped_after_its_check_is_copied_as_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """duet run copies a side's result files out of its working folder: the copy
    looked at the file by name (there? a folder? the same file? a FIFO?), then opened
    that name again."""
    from types import SimpleNamespace

    from kernmlops.duet.runner import SideRecord, _Running

    work, dest = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    dest.mkdir()
    (work / "out.csv").write_text(_harness_csv(2))
    side = object.__new__(_Running)  # its copy alone: no process started
    side.rec = SideRecord("A", "true", None, status="ok")
    side.side = SimpleNamespace(pair="A", results=("out.csv",))
    side.container = None
    side.work = work
    # looked at four times by name before shutil.copy2 opened it (exists, is_dir, and
    # copy2's own samefile and special-file checks); now twice, then opened once
    swap = swap_after_look(monkeypatch, work / "out.csv", stats=4)
    within(lambda: side.collect(dest, "s.d.0.duet.AB", "results/"), work / "out.csv")
    assert swap.swapped
    assert side.rec.results == ["results/s.d.0.duet.AB.A.out.csv"], side.rec.missing
    assert (dest / "s.d.0.duet.AB.A.out.csv").read_text() == _harness_csv(2)


def test_a_plot_swapped_for_a_link_is_not_embedded_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sudo kernmlops duet analyze -o ~/report`` with ~/report/plots the user's: a
    plot, once written, swapped for a link to a file of root's before the page
    embedded it (read back by name, following the link)."""
    if os.geteuid() != 0:
        skip_here("the user plays the attacker: needs root")
    import base64

    from click.testing import CliRunner

    import kernmlops.duet.report as report
    from kernmlops.duet.cli import duet_group
    from tests.duet.conftest import write_config
    from tests.duet.test_cli import CFG, NOBODY, SECRET, SUDO, _home, _plant

    user, victim = _home(tmp_path)
    cfg = write_config(tmp_path / "duet.yml", CFG.format(pid=os.getpid()))
    runs = tmp_path / "runs"
    assert CliRunner().invoke(duet_group, ["run", str(cfg), "-o", str(runs)]).exit_code == 0
    assert CliRunner().invoke(duet_group, ["process", str(runs)]).exit_code == 0
    out = user / "report"
    (out / "plots").mkdir(parents=True)
    for folder in (out, out / "plots"):
        os.chown(folder, NOBODY, NOBODY)
    html = report._html

    def swapped_first(md_text: str, title: str, plots: Path) -> str:
        (out / "plots" / "ci.png").unlink()
        _plant(out / "plots" / "ci.png", victim / "secret")
        return html(md_text, title, plots)

    monkeypatch.setattr(report, "_html", swapped_first)
    args = ["analyze", str(runs), "--out", str(out), "--warmup", "1", "--min-runs", "3"]
    res = CliRunner(env=SUDO).invoke(duet_group, args)
    page = (out / "report.html").read_text() if (out / "report.html").exists() else ""
    assert base64.b64encode(SECRET.encode()).decode() not in page
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines()[-1] == (
        "error: ci.png in the report's plots/ changed as it was written (a link): not "
        "embedded; report.html not written"
    )
