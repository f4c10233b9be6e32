"""A collection read while its collector still writes it, and after a kill: what the
readers say of it, and what its manifest says of the parts on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from kernmlops.data import IncompleteCollectionWarning, list_collections, read_collection
from tests.faults.conftest import kill_collector, start_collect, wait_until

pytestmark = pytest.mark.bpf


def kernmlops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernmlops", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip


def read_warnings(collection: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        read_collection(collection)
    assert all(issubclass(w.category, IncompleteCollectionWarning) for w in said)
    return [str(w.message) for w in said]


def test_a_collection_still_being_collected_is_said_so_by_every_reader(tmp_path: Path) -> None:
    """While the collector runs, read_collection, graph and report say the collection
    is still being collected (as push does), tell no one to run `recover`, and
    recover refuses in the same words; list_collections names the collector. Once it
    is killed, they say it stopped without finishing."""
    run = start_collect(tmp_path / "out", "--", "sleep", "120")
    try:
        run.wait_for("probes attached")
        col = run.collection()
        assert wait_until(lambda: any(col.glob("*/part-*.parquet")), 30)
        live = f"{col}: still being collected (collector pid {run.proc.pid})"
        said = read_warnings(col)
        assert len(said) == 1 and said[0].startswith(live), said
        assert "recover" not in said[0] and "stopped" not in said[0]
        for command in ("graph", "report"):
            out = kernmlops(command, str(col), "-o", str(tmp_path / command))
            assert out.returncode == 0, out.stderr
            assert f"warning: {live}" in out.stderr and "recover" not in out.stderr, out.stderr
        out = kernmlops("recover", str(col))
        assert out.returncode != 0 and f"error: {live}" in out.stderr, out.stderr
        listed = list_collections(tmp_path / "out")
        assert listed.select("state", "collector_pid").rows() == [("running", run.proc.pid)]
    finally:
        kill_collector(run)
    said = read_warnings(col)
    assert any("its collector stopped without finishing" in w for w in said), said
    assert not any("still being collected" in w for w in said), said
    listed = list_collections(tmp_path / "out")
    assert listed.select("state", "collector_pid").rows() == [("running", None)]
