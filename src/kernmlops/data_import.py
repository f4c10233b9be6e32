"""KernMLOps' data call: ``read_parquet_dir(data_dir, benchmark_name=None)`` -> {table
name: DataFrame}.

Every table of every collection under ``data_dir`` (a curated folder, the data folder
holding ``curated/``, one ``benchmark=<b>`` folder or one collection), each concatenated
over the collections with ``benchmark`` and ``collection_id`` columns, as
:func:`kernmlops.data.read_parquet_dir` reads one table::

    from kernmlops import data_import as di
    r = di.read_parquet_dir("data/curated")
    r = di.read_parquet_dir("data/curated", "linux_build")   # one benchmark's collections
    r.keys()
    r["quanta_runtime"].filter(pl.col("tgid") == 1234)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.data import _collections, _local_folder, _table_files
from kernmlops.data import read_parquet_dir as read_table
from kernmlops.errors import CollectionError

if TYPE_CHECKING:
    import polars as pl

__all__ = ["read_parquet_dir"]


def read_parquet_dir(
    data_dir: str | Path, benchmark_name: str | None = None
) -> dict[str, pl.DataFrame]:
    """Every table under ``data_dir``, by name; ``benchmark_name`` keeps only that
    benchmark's collections (a KernMLOps name such as ``linux_build`` works too).
    Called as KernMLOps' own is: ``read_parquet_dir(data_dir, benchmark_name)``, each
    argument by position or by name.

    Raises:
        CollectionError: ``data_dir`` holds no collections (of ``benchmark_name``).
    """
    root = _local_folder(data_dir)
    found = _collections(root)
    if benchmark_name is not None:
        wanted = benchmark_name.replace("_", "-")
        found = [c for c in found if c[0].replace("_", "-") == wanted]
        if not found:
            raise CollectionError(f"{root}: no collections of benchmark {benchmark_name!r}")
    tables = sorted({t for _, _, folder in found for t in _table_files(folder)[0]})
    out: dict[str, pl.DataFrame] = {}
    for table in tables:
        if benchmark_name is None:
            out[table] = read_table(root, table)  # type: ignore[assignment]
            continue
        frames = [
            read_table(folder, table) for _, _, folder in found if table in _table_files(folder)[0]
        ]
        import polars as pl

        out[table] = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")  # type: ignore[assignment,arg-type]
    return out
