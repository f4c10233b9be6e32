"""SIGKILL while the parts of a table are compacted into one file, at each step: every
row is read exactly once afterwards, by read_collection, polars and DuckDB."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import duckdb
import polars as pl
import pytest

from kernmlops.data import IncompleteCollectionWarning, read_collection

PARTS, ROWS = 6, 5000

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, polars as pl
    from kernmlops.collect import compaction, parts
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.collect.manifest import write_manifest

    folder, point = sys.argv[1], sys.argv[2]
    sink = ParquetSink(folder, "c0ffee", row_group_rows=4096)
    for i in range({parts}):
        ts = np.arange(i * {rows}, (i + 1) * {rows}, dtype=np.int64)
        sink.write("events", pl.DataFrame({{"ts_uptime_us": ts}}))
        sink.flush(durable=True)
    sink.close()
    write_manifest(folder, {{"state": "running"}})

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    real_exchange = compaction.exchange
    if point == "rewriting":
        class Dying(parts.pq.ParquetWriter):
            def write_table(self, *a, **k):
                super().write_table(*a, **k)
                die()
        parts.pq.ParquetWriter = Dying
    elif point == "before-swap":
        compaction.exchange = die
    elif point == "after-swap":
        def swap_then_die(a, b):
            real_exchange(a, b)
            die()
        compaction.exchange = swap_then_die
    elif point == "removing-old-parts":
        real_rmtree = compaction.shutil.rmtree
        def rm_some_then_die(path, ignore_errors=False):
            files = sorted(os.scandir(path), key=lambda e: e.name)
            for f in files[:2]:
                os.unlink(f.path)
            die()
        compaction.exchange = real_exchange
        compaction.shutil.rmtree = rm_some_then_die
    sink.compact()
    """
).format(parts=PARTS, rows=ROWS)


@pytest.mark.parametrize(
    "point", ["rewriting", "before-swap", "after-swap", "removing-old-parts", "never"]
)
def test_a_kill_at_any_step_of_compaction_loses_and_repeats_nothing(
    tmp_path: Path, point: str
) -> None:
    folder = tmp_path / "collection_id=c0ffee"
    child = subprocess.run([sys.executable, "-c", CHILD, str(folder), point], timeout=60)
    assert child.returncode == (0 if point == "never" else -signal.SIGKILL)
    expected = list(range(PARTS * ROWS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteCollectionWarning)
        got = read_collection(folder)["events"]
    assert sorted(got["ts_uptime_us"].to_list()) == expected
    parts = sorted(p.name for p in (folder / "events").iterdir())
    # Before the swap the old parts are in place; from the swap on, the one new file.
    swapped = point in ("after-swap", "removing-old-parts", "never")
    assert parts == (
        ["part-00000.parquet"] if swapped else [f"part-{i:05d}.parquet" for i in range(PARTS)]
    )
    # Readers given the table's folder see each row once.
    table_glob = str(folder / "events" / "*.parquet")
    assert pl.scan_parquet(table_glob).select(pl.len()).collect().item() == len(expected)
    [(n, distinct)] = duckdb.sql(
        f"select count(*), count(distinct ts_uptime_us) from read_parquet('{table_glob}')"
    ).fetchall()
    assert n == distinct == len(expected)
    # What a kill leaves beside the tables is hidden (Spark and read_collection skip it).
    assert all(
        p.name.startswith(".")
        for p in folder.iterdir()
        if p.name not in ("events", "manifest.json")
    )
