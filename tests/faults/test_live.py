"""A collection read while its collector still writes it, and after a kill: what the
readers say of it, and what its manifest says of the parts on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from kernmlops.data import IncompleteCollectionWarning, list_collections, read_collection
from tests.faults.conftest import FLUSH_S, kill_collector, start_collect, wait_until

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


def parts_on_disk(collection: Path) -> dict[str, int] | None:
    """Rows per finished part (its path relative to the collection), from the
    footers; None where a part went while it was listed (the stop's compaction)."""
    import pyarrow.parquet as pq

    found = {}
    try:
        listed = sorted(collection.glob("*/part-*.parquet"))
    except FileNotFoundError:  # a folder (the stop's .spool) went while it was listed
        return None
    for part in listed:
        try:
            found[part.relative_to(collection).as_posix()] = pq.read_metadata(part).num_rows
        except (OSError, ValueError):
            return None
    return found


def manifest_now(collection: Path) -> dict:
    """The manifest as it is on disk now (written whole: read whole)."""
    return json.loads((collection / "manifest.json").read_text())


def counted(manifest: dict) -> dict[str, int]:
    return {t: r["rows"] for t, r in manifest["tables"].items() if r["rows"]}


def in_parts(parts: dict[str, int], files: list[str]) -> int:
    return sum(parts[f] for f in files)


def test_the_manifest_written_at_a_flush_describes_that_flush(tmp_path: Path) -> None:
    """Polled while the collection runs (a flush a second), each manifest lists every
    part already on disk once its flush has rewritten it (well within the flush
    interval: it once lagged a whole flush, listing the flush before), counts exactly
    the rows of the parts it lists, and ``flushes`` and ``last_flush_at`` move with
    each rewrite; the final manifest's ``last_flush_at`` is its last flush's."""
    run = start_collect(tmp_path / "out", "--", "sleep", "6")
    run.wait_for("probes attached")
    col = run.collection()
    seen: list[tuple[int, str]] = []  # (flushes, last_flush_at) of each manifest
    while run.proc.poll() is None:
        parts = parts_on_disk(col)
        if parts is None:
            time.sleep(0.01)
            continue
        deadline = time.monotonic() + FLUSH_S / 2
        while True:
            manifest = manifest_now(col)
            if manifest["state"] != "running":
                break
            listed = [f for r in manifest["tables"].values() for f in r["files"]]
            if set(parts) <= set(listed):
                break
            assert time.monotonic() < deadline, (
                f"parts on disk {sorted(set(parts) - set(listed))} not in the manifest "
                f"{FLUSH_S / 2} s on (flushes {manifest['flushes']})"
            )
            time.sleep(0.01)
        if manifest["state"] != "running":
            break
        now = parts_on_disk(col) or {}
        for table, record in manifest["tables"].items():
            assert record["rows"] == in_parts(now, record["files"]), (table, manifest)
        if parts:
            assert manifest["flushes"] >= 1 and manifest["last_flush_at"] is not None
        if manifest["last_flush_at"] and (not seen or seen[-1][1] != manifest["last_flush_at"]):
            seen.append((manifest["flushes"], manifest["last_flush_at"]))
        time.sleep(0.02)
    code, said = run.finish()
    assert code == 0, said
    assert len(seen) >= 3, seen  # a flush a second for six
    assert [f for f, _ in seen] == sorted({f for f, _ in seen}), seen  # each one more
    assert [t for _, t in seen] == sorted(t for _, t in seen), seen
    final = manifest_now(col)
    assert final["state"] == "completed" and final["flushes"] > seen[-1][0]
    assert seen[-1][1] < final["last_flush_at"] <= final["stopped_at"], (seen, final)
    parts = parts_on_disk(col)
    assert parts is not None
    for table, record in final["tables"].items():
        assert record["rows"] == in_parts(parts, record["files"]), (table, final)


def test_after_kill_9_the_manifest_counts_the_rows_read(tmp_path: Path) -> None:
    """Killed between two flushes: the manifest counts the rows of every part on
    disk, and read_collection names the last flush, not 'never' (the manifest once
    lagged a flush: it counted the parts of the flush before, or none)."""
    run = start_collect(tmp_path / "out", "--", "sleep", "120")
    try:
        run.wait_for("probes attached")
        col = run.collection()
        assert wait_until(lambda: manifest_now(col)["flushes"] >= 1, 30)
        before = manifest_now(col)["flushes"]
        # the rewrite of the next flush, seen as it comes; killed half way to the one
        # after (a kill as it comes may beat the parts of either one)
        assert wait_until(lambda: manifest_now(col)["flushes"] > before, 30, 0.005)
        time.sleep(FLUSH_S / 2)
    finally:
        kill_collector(run)
    manifest = manifest_now(col)
    assert manifest["state"] == "running" and manifest["last_flush_at"] is not None
    parts = parts_on_disk(col)
    assert parts is not None
    on_disk = {p.split("/")[0] for p in parts}
    assert set(counted(manifest)) == on_disk, (manifest["tables"], parts)
    for table, record in manifest["tables"].items():
        assert record["rows"] == in_parts(parts, record["files"]), (table, manifest)
        assert sorted(record["files"]) == sorted(p for p in parts if p.startswith(f"{table}/"))
    said = read_warnings(col)
    assert any(
        f"stopped without finishing (last flush {manifest['last_flush_at']})" in w for w in said
    ), said
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteCollectionWarning)
        tables = read_collection(col)
    assert {t: f.height for t, f in tables.items()} == counted(manifest)
