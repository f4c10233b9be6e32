"""lb's readers and a FIFO at a file's name, there from the start or swapped in
right after the reader looked at it (another user's move between root's check and
root's read): each file is opened once, a plain file only, and read through that
descriptor; a FIFO is never waited on."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kernmlops.collect.manifest import write_manifest
from kernmlops.errors import CollectionError, KernmlopsWarning
from kernmlops.lb.collect import _read_table
from kernmlops.lb.dataset import TABLE, load_decisions, recorded_cost
from kernmlops.lb.mllb_import import read_mllb_csv
from tests.swap import swap_after_look, within

RAW = Path(__file__).parent / "mllb_raw.csv"


def test_an_mllb_dump_swapped_after_its_check_is_read_as_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "raw_1.csv"
    shutil.copy(RAW, dump)
    expected = read_mllb_csv(dump)
    # its lines were counted from one descriptor, then polars read it by name
    swap = swap_after_look(monkeypatch, dump, stats=None)
    got = within(lambda: read_mllb_csv(dump), dump)
    assert swap.swapped
    assert_frame_equal(got, expected)


def test_a_manifest_swapped_after_its_check_is_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    collection = tmp_path / "benchmark=b" / "collection_id=c1"
    collection.mkdir(parents=True)
    manifest = collection / "manifest.json"
    manifest.write_text(json.dumps({"lb": {"migration_cost_ns": 250_000}}))
    assert recorded_cost([tmp_path]) == 250_000
    # looked at twice (found by the glob, then is_file()) before it was read
    swap = swap_after_look(monkeypatch, manifest, stats=2)
    # what is there now, a FIFO, is no manifest: no cost recorded, and no wait
    with pytest.warns(KernmlopsWarning, match=f"^{manifest}: not read "):
        assert within(lambda: recorded_cost([tmp_path]), manifest) is None
    assert swap.swapped


def _part(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder.parent / "manifest.json").exists():
        write_manifest(folder.parent, {})
    return folder / f"part-{n:05d}.parquet"


def test_a_fifo_part_is_named_not_waited_on_by_lb_collect(tmp_path: Path) -> None:
    pl.DataFrame({"a": [1, 2]}).write_parquet(_part(tmp_path / TABLE, 0))
    fifo = _part(tmp_path / TABLE, 1)
    os.mkfifo(fifo)
    with pytest.raises(CollectionError, match=f"^{fifo}: not a plain file: not read$"):
        within(lambda: _read_table(tmp_path, TABLE), fifo)


def test_a_fifo_part_is_named_not_waited_on_by_lb_train_without_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without root as with it, a collection folder's parts are read as
    read_collection reads them: each opened once, a plain file only."""
    pl.DataFrame({"a": [1, 2]}).write_parquet(_part(tmp_path / TABLE, 0))
    fifo = _part(tmp_path / TABLE, 1)
    os.mkfifo(fifo)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(CollectionError, match=f"^{fifo}: not a plain file: not read$"):
        within(lambda: load_decisions([tmp_path]), fifo)
