"""A file of a duet folder swapped for a FIFO right after duet looked at it (a local
user's move between root's check and root's read): each reader reads what it
checked, through one open descriptor, never the name again (kernmlops.host.pinned.
open_regular), so the swap can neither hang it nor be read."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kernmlops.duet.process import process_dirs, read_results, read_table, write_processed
from tests.duet.test_process import GOOD, _suite
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
