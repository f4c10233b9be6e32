"""The tests of test_push.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleet.test_push import duckdb, duckdb_rows


@pytest.mark.bpf
def test_collect_publish(tmp_path: Path) -> None:
    """A real collection, published when it ends; a bad URI is refused before it starts."""
    from kernmlops.data import read_collection

    dest = tmp_path / "dest"
    base = [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o"]
    bad = subprocess.run(
        [*base, str(tmp_path / "bad"), "--publish", "nope://x", "--", "true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "nope://" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad").exists()
    proc = subprocess.run(
        [*base, str(tmp_path / "out"), "--hooks", "quanta_runtime,process_trace", "--publish",
         dest.as_uri(), "--", "sh", "-c", "ls / > /dev/null; sleep 0.3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "published " in proc.stderr
    [local] = (tmp_path / "out" / "curated").glob("benchmark=command/collection_id=*")
    collection = read_collection(local)
    got = duckdb_rows(dest)
    assert got == {(collection.collection_id, t): f.height for t, f in collection.items()}
    index = f"read_parquet('{dest}/_index/*.parquet')"
    [row] = duckdb.sql(f"select state, host from {index}").fetchall()
    assert row == ("completed", collection.manifest.system["hostname"])
    assert (
        json.loads((dest / local.parent.name / local.name / "manifest.json").read_text())["state"]
        == "completed"
    )
