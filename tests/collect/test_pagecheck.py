"""Page checksums: every part the sink writes carries a CRC32 per page, and
pagecheck.page_damage finds a byte damaged inside a page, which the footer cannot
show; a page written without one (an older kernmlops's part) passes."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernmlops.collect.pagecheck import page_damage
from kernmlops.collect.parquet import ParquetSink
from tests.parquet_damage import flip_page_byte


def _parts(folder: Path, n: int = 3000) -> list[Path]:
    rows = pl.DataFrame(
        {"ts_uptime_us": np.arange(n), "latency_ns": np.arange(n) * 3, "cpu": np.arange(n) % 2}
    )
    with ParquetSink(folder, "c", row_group_rows=256, rows_per_file=1000) as sink:
        sink.write("events", rows)
    return sorted((folder / "events").glob("part-*.parquet"))


@pytest.mark.parametrize(
    ("column", "dictionary"),
    [("latency_ns", False), ("ts_uptime_us", False), ("cpu", True), ("collection_id", True)],
)
def test_a_byte_damaged_inside_a_part_page_fails_its_checksum(
    tmp_path: Path, column: str, dictionary: bool
) -> None:
    part = _parts(tmp_path)[1]
    assert page_damage(str(part)) is None
    flip_page_byte(part, column, row_group=2, dictionary=dictionary)
    assert page_damage(str(part)) == f"a page fails its checksum (row group 2, column {column!r})"
    assert page_damage(pa.OSFile(str(part))) is not None  # an open file as well


def test_a_page_without_a_checksum_passes(tmp_path: Path) -> None:
    """A part written without checksums (by an older kernmlops) is checked as far as it
    can be: it passes, and damage its pages still decode is not seen."""
    table = pa.table({"v": np.arange(1000, dtype=np.int64)})
    old = tmp_path / "old.parquet"
    pq.write_table(table, old, compression="none", use_dictionary=False)
    assert page_damage(str(old)) is None
    damaged = tmp_path / "damaged.parquet"
    shutil.copy(old, damaged)
    flip_page_byte(damaged, "v")
    assert page_damage(str(damaged)) is None
    # what a checksum is for: the last value read back wrong, without a word
    assert pq.read_table(damaged)["v"][-1].as_py() != 999


def test_what_is_not_parquet_is_named(tmp_path: Path) -> None:
    part = _parts(tmp_path)[0]
    part.write_bytes(part.read_bytes()[:300])  # its footer gone
    assert page_damage(str(part)).startswith("not a readable Parquet file (")


def test_compaction_refuses_a_damaged_part_and_leaves_the_parts(tmp_path: Path) -> None:
    """Compaction reads the parts it rewrites with their checksums checked: a damaged
    one is never rewritten into a part with fresh checksums over wrong values."""
    from kernmlops.collect.compaction import compact_table, table_on_disk
    from kernmlops.collect.parts import PartFormat

    parts = _parts(tmp_path)
    flip_page_byte(parts[1], "latency_ns")
    before = {p.name: p.read_bytes() for p in parts}
    rows = {f"events/{p.name}": pq.ParquetFile(p).metadata.num_rows for p in parts}
    state = table_on_disk(tmp_path, "events", rows)
    done = compact_table(state, tmp_path, PartFormat("c", "zstd", 256), rows_per_file=10_000)
    assert done.startswith("skipped: ") and "CRC checksum verification failed" in done, done
    assert {p.name: p.read_bytes() for p in (tmp_path / "events").iterdir()} == before
    # undamaged, the same parts compact
    flip_page_byte(parts[1], "latency_ns")
    state = table_on_disk(tmp_path, "events", rows)
    assert compact_table(state, tmp_path, PartFormat("c", "zstd", 256), 10_000) == "compacted"
