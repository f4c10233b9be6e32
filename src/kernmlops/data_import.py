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

Our ``block_io`` rows (one per completed request) are given in KernMLOps' shape
(:func:`block_io_tables`): its ``block_io`` table, our columns beside it, and the two
tables its schema declared it from, ``block_io_queue_length`` and ``block_io_latency``.
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

__all__ = ["block_io_tables", "kernmlops_flags_string", "read_parquet_dir"]

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
    if "block_io" in out:
        out.update(block_io_tables(out["block_io"]))
    return out


#: KernMLOps' op names (its reader's table, from bcc's biolatency) by the kernel's
_KML_OPS = {
    "READ": "Read", "WRITE": "Write", "FLUSH": "Flush", "DISCARD": "Discard",
    "SECURE_ERASE": "SecureErase", "ZONE_RESET": "ZoneReset", "WRITE_SAME": "WriteSame",
    "WRITE_ZEROES": "WriteZeros",
}  # fmt: skip
#: the flags it names, in the order it prefixes them (the last one ends up first)
_KML_FLAGS = (
    ("SYNC", "Sync"), ("META", "Metadata"), ("FUA", "ForcedUnitAccess"),
    ("PRIO", "Priority"), ("NOMERGE", "NoMerge"), ("IDLE", "Idle"),
    ("RAHEAD", "ReadAhead"), ("BACKGROUND", "Background"), ("NOWAIT", "NoWait"),
)  # fmt: skip
#: the numbers its reader decoded with, for rows whose collector had no BTF to name
#: them (op_flags then holds cmd_flags in hex)
_KML_OP_NUMBERS = {0: "READ", 1: "WRITE", 2: "FLUSH", 3: "DISCARD", 5: "SECURE_ERASE",
                   6: "ZONE_RESET", 7: "WRITE_SAME", 9: "WRITE_ZEROES"}  # fmt: skip
_KML_FLAG_BITS = {"SYNC": 11, "META": 12, "PRIO": 13, "NOMERGE": 14, "IDLE": 15, "FUA": 17,
                  "RAHEAD": 19, "BACKGROUND": 20, "NOWAIT": 21}  # fmt: skip


def kernmlops_flags_string(op_flags: str) -> str:
    """Our ``op_flags`` ("WRITE|SYNC|IDLE", the collector kernel's names) as KernMLOps'
    ``block_io_flags_string`` ("Idle-Sync-Write"): its nine flags, its op names, else
    "Unknown"."""
    if op_flags.startswith("0x"):
        raw = int(op_flags, 16)
        names = [_KML_OP_NUMBERS.get(raw & 0xFF, "")]
        names += [name for name, bit in _KML_FLAG_BITS.items() if raw >> bit & 1]
    else:
        names = op_flags.split("|")
    desc, present = _KML_OPS.get(names[0], "Unknown"), set(names[1:])
    for name, word in _KML_FLAGS:
        if name in present:
            desc = f"{word}-{desc}"
    return desc


#: KernMLOps' block_io columns, in its order (all Int64 but the flags string)
KERNMLOPS_BLOCK_IO = (
    "cpu", "device", "sector", "segments", "block_io_bytes", "ts_uptime_us",
    "finish_ts_uptime_us", "block_latency_us", "block_io_latency_us", "measured_latency_us",
    "block_io_flags", "block_io_flags_string", "queue_length_segment_ios",
    "queue_length_4k_ios",
)  # fmt: skip
#: our columns the view reads, with their types: null where a table lacks one (a
#: collection from before alloc_to_complete_us, the queue's size and the CPUs; a frame
#: made by hand)
_READS = {
    "ts_uptime_us": "Int64", "major": "UInt32", "minor": "UInt32", "sector": "Int64",
    "bytes": "UInt32", "segments": "UInt16", "cmd_flags": "UInt32", "op_flags": "String",
    "issue_to_complete_us": "Int64", "alloc_to_complete_us": "Int64",
    "inflight_segments": "UInt32", "inflight_4k_ios": "UInt32", "cpu": "UInt32",
    "issue_cpu": "UInt32",
}  # fmt: skip


def block_io_tables(block_io: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Our ``block_io`` rows as KernMLOps' tables, by name.

    ``block_io``: a request issued and completed, as KernMLOps' merged table: ``cpu``
    the CPU that issued it, ``device`` the kernel's dev_t (major << 20 | minor),
    ``ts_uptime_us`` the issue (the completion less the service time, so within 1 µs of
    the issue's own clock reading) and ``finish_ts_uptime_us`` the completion,
    ``block_latency_us`` from the request's allocation (``start_time_ns``, what
    /proc/diskstats counts; null where the kernel took no stamp),
    ``block_io_latency_us`` and ``measured_latency_us`` from its issue, queue lengths
    the device's requests in flight at the issue, this one included, in segments and
    in 4 KiB units; sorted by issue. Our other columns follow. Rows are joined in
    the kernel by the request itself, not by device and sector as KernMLOps' reader
    joined them, so none is paired with another request's completion.
    ``block_io_queue_length``: the same requests at their issue (its columns only).
    ``block_io_latency``: every completion (``cpu`` and ``ts_uptime_us`` the
    completion's), with ``block_io_latency_us`` null where it was never issued.
    """
    import polars as pl

    df = block_io.with_columns(
        pl.lit(None, getattr(pl, t)).alias(c)
        for c, t in _READS.items()
        if c not in block_io.columns
    )
    i64 = pl.Int64
    common = (
        ((pl.col("major").cast(i64) * (1 << 20)) + pl.col("minor").cast(i64)).alias("device"),
        pl.col("sector").cast(i64),
        pl.col("segments").cast(i64),
        pl.col("bytes").cast(i64).alias("block_io_bytes"),
    )
    flags = pl.col("cmd_flags").cast(i64).alias("block_io_flags")
    issued = df.filter(pl.col("issue_to_complete_us").is_not_null())
    issue_ts = (pl.col("ts_uptime_us") - pl.col("issue_to_complete_us")).cast(i64)
    ours = [c for c in df.columns if c in (BENCHMARK, COLLECTION_ID)]
    distinct = df["op_flags"].unique().to_list()
    strings = {v: kernmlops_flags_string(v) for v in distinct if v is not None}
    merged = issued.select(
        pl.col("issue_cpu").cast(i64).alias("cpu"),
        *common,
        issue_ts.alias("ts_uptime_us"),
        pl.col("ts_uptime_us").cast(i64).alias("finish_ts_uptime_us"),
        pl.col("alloc_to_complete_us").cast(i64).alias("block_latency_us"),
        pl.col("issue_to_complete_us").cast(i64).alias("block_io_latency_us"),
        pl.col("issue_to_complete_us").cast(i64).alias("measured_latency_us"),
        flags,
        pl.col("op_flags").replace_strict(strings, return_dtype=pl.String)
        .alias("block_io_flags_string"),
        pl.col("inflight_segments").cast(i64).alias("queue_length_segment_ios"),
        pl.col("inflight_4k_ios").cast(i64).alias("queue_length_4k_ios"),
        *ours,
        # ours beside: every column KernMLOps' do not replace
        pl.exclude("ts_uptime_us", "device", "sector", "segments", "cpu", *ours),
    ).sort("ts_uptime_us", maintain_order=True)  # fmt: skip
    queue = merged.select(
        "cpu", "device", "sector", "segments", "block_io_bytes", "ts_uptime_us",
        "block_io_flags", "queue_length_segment_ios", "queue_length_4k_ios", *ours,
    )  # fmt: skip
    latency = df.select(
        pl.col("cpu").cast(i64),
        *common,
        pl.col("ts_uptime_us").cast(i64),
        pl.col("alloc_to_complete_us").cast(i64).alias("block_latency_us"),
        pl.col("issue_to_complete_us").cast(i64).alias("block_io_latency_us"),
        flags,
        *ours,
    )
    return {"block_io": merged, "block_io_queue_length": queue, "block_io_latency": latency}


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
