"""KernMLOps' data call: ``read_parquet_dir(data_dir, benchmark_name=None)`` -> {table
name: DataFrame}.

Every table of every collection under ``data_dir`` (a curated folder, the data folder
holding ``curated/``, one ``benchmark=<b>`` folder or one collection), each concatenated
over the collections with ``benchmark`` and ``collection_id`` columns, as
:func:`kernmlops.data.read_parquet_dir` reads one table. A folder in KernMLOps' own
layout, ``<table>/<collection_id>.<benchmark>.parquet`` (what its ``collect`` wrote
under ``data/curated``), is read too, with the same two columns taken from the file
names::

    from kernmlops import data_import as di
    r = di.read_parquet_dir("data/curated")
    r = di.read_parquet_dir("data/curated", "linux_build")   # one benchmark's collections
    r.keys()
    r["quanta_runtime"].filter(pl.col("tgid") == 1234)
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.data import (
    Damaged,
    IncompleteCollectionWarning,
    _closing_fds,
    _collections,
    _held_collection,
    _held_tables,
    _local_folder,
    _part_damage,
    _table_files,
    reading,
)
from kernmlops.data import read_parquet_dir as read_table
from kernmlops.errors import CollectionError
from kernmlops.tables import BENCHMARK, COLLECTION_ID

if TYPE_CHECKING:
    import polars as pl

__all__ = ["read_parquet_dir"]

#: a file of KernMLOps' own layout: <table>/[<...>.]<collection_id>.<benchmark>.parquet
_ORIGINAL_FILE = re.compile(r"^[^.]+(?:\.[^.]+)*\.[^.]+\.parquet$")


def read_parquet_dir(
    data_dir: str | Path, benchmark_name: str | None = None, *, damaged: Damaged = "raise"
) -> dict[str, pl.DataFrame]:
    """Every table under ``data_dir``, by name; ``benchmark_name`` keeps only that
    benchmark's collections (a KernMLOps name such as ``linux_build`` works too).
    Called as KernMLOps' own is: ``read_parquet_dir(data_dir, benchmark_name)``, each
    argument by position or by name. Every page of every part is checked against its
    checksum as it is read (kernmlops.data.read_parquet_dir).

    ``damaged``: ``"raise"`` (KernMLOps' own behaviour: one unreadable file fails the
    read), or ``"skip"``: a collection whose table cannot be read (a file of
    KernMLOps' layout) is left out of that table, named in an
    IncompleteCollectionWarning, and the rest is read.

    Raises:
        CollectionError: ``data_dir`` holds no collections (of ``benchmark_name``), or
            (``damaged="raise"``) a part cannot be read, or is damaged.
    """
    root = _local_folder(data_dir)
    found = _collections(root, required=False)
    if not found:
        original = _original_layout(root, benchmark_name, damaged)
        if original is not None:
            return original
        _collections(root)  # no collections: its error
    if benchmark_name is not None:
        wanted = benchmark_name.replace("_", "-")
        found = [c for c in found if c[0].replace("_", "-") == wanted]
        if not found:
            raise CollectionError(f"{root}: no collections of benchmark {benchmark_name!r}")
    tables = sorted({t for _, _, folder in found for t in _table_files(folder)[0]})
    out: dict[str, pl.DataFrame] = {}
    for table in tables:
        if benchmark_name is None:
            try:
                out[table] = read_table(root, table, damaged=damaged)  # type: ignore[assignment]
            except CollectionError:
                if damaged == "raise":
                    raise
                # every collection with the table damaged: each named in its warning
            continue
        frames = []
        for _, _, folder in found:
            if table not in _table_files(folder)[0]:
                continue
            try:
                frames.append(read_table(folder, table, damaged=damaged))
            except CollectionError:
                if damaged == "raise":
                    raise
                # its one collection damaged: named in its warning
        if not frames:
            continue
        import polars as pl

        out[table] = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")  # type: ignore[assignment,arg-type]
    return out


def _same_benchmark(a: str, b: str) -> bool:
    # KernMLOps spells them linux_build, kernmlops linux-build
    return a.replace("_", "-") == b.replace("_", "-")


def _original_layout(
    root: Path, benchmark_name: str | None, damaged: Damaged = "raise"
) -> dict[str, pl.DataFrame] | None:
    """The tables of ``root`` (or ``root/curated``) in KernMLOps' own layout, each file
    opened through the held folder as read_collection opens a part (as root, no link a
    user planted is followed) and its pages checked; None where it holds no such file.
    ``damaged="skip"``: a file that cannot be read is left out, named in a warning.

    Raises:
        CollectionError: a file cannot be read (``damaged="raise"``), or none is of
            ``benchmark_name``.
    """
    import polars as pl

    if (root / "curated").is_dir():  # KernMLOps' collect writes data/curated/<table>/
        root = root / "curated"
    with _held_collection(root) as (held, uid), _closing_fds() as fds:
        files, opened, _ = _held_tables(held, root, uid, fds, names=_ORIGINAL_FILE)
        if not files:
            return None
        out: dict[str, pl.DataFrame] = {}
        for table, paths in files.items():
            frames = []
            for path, fd in zip(paths, opened[table], strict=True):
                collection_id, benchmark = path.name.removesuffix(".parquet").split(".")[-2:]
                if benchmark_name is not None and not _same_benchmark(benchmark, benchmark_name):
                    continue
                try:
                    why = _part_damage(fd)
                    if why is not None:
                        raise CollectionError(
                            f"{path.parent}: cannot read table {table!r}: {path.name} is "
                            f"damaged: {why}"
                        )
                    with os.fdopen(fd, "rb", closefd=False) as f, reading(path.parent, table):
                        frame = pl.read_parquet(f)
                except CollectionError as err:
                    if damaged == "raise":
                        raise
                    warnings.warn(
                        f"{path}: damaged, skipped (not read): {err}",
                        IncompleteCollectionWarning,
                        stacklevel=3,
                    )
                    continue
                if COLLECTION_ID not in frame.columns:  # KernMLOps' tables carry it
                    frame = frame.with_columns(pl.lit(collection_id).alias(COLLECTION_ID))
                frames.append(frame.with_columns(pl.lit(benchmark).alias(BENCHMARK)))
            if frames:
                frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
                out[table] = frame.select(
                    BENCHMARK, COLLECTION_ID, pl.exclude(BENCHMARK, COLLECTION_ID)
                )
    if not out:
        raise CollectionError(f"{root}: no collections of benchmark {benchmark_name!r}")
    return out
