"""Ring records waiting on disk: what keeps the collector light on a saturated machine.

A BPF hook's rings are copied, as they lie (record headers included), into the
collection's ``.spool/`` every poll (kernmlops.ebpf.spool): one ``write`` per piece
of ring, no decoding. Rows are made from the spool (decode, the hook's own columns,
Parquet) while the machine has CPU to spare and the sink keeps up (:class:`Pacer`),
and all of what is left at stop, the way ``perf record`` writes first and ``perf
report`` decodes later. On a machine with idle CPU the spool is read back within a
poll and rows reach Parquet as they always did; under a storm that keeps every CPU
busy the collector takes only the copy's few percent of a core from the workload,
and its memory does not grow with the backlog (the page cache holds it, the disk
keeps it).

Durability is the collection's (README, "A collection survives its collector"):
the spool is fsync'd at every flush, and ``kernmlops recover`` (:func:`recover`)
turns what a killed collector left into parts, skipping the rows already in
finished parts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.manifest import SPOOL_DIR
from kernmlops.ebpf.ringbuf import decode, record_stride
from kernmlops.errors import CollectionError
from kernmlops.host.cpus import SpareCpu
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np

    from kernmlops.ebpf.btf import RecordLayout
else:
    np = lazy_import("numpy")


__all__ = ["SPOOL_DIR", "Pacer", "SpareCpu", "collector_alive", "pending_spools", "recover"]


class Pacer:
    """When a spooling hook may make rows during the run: the machine has CPU to spare
    and the sink is not behind (a write would wait for its writer, and the rings
    would not be copied meanwhile)."""

    def __init__(self, spare: SpareCpu, behind: Callable[[], bool]) -> None:
        self.spare = spare
        self.behind = behind

    def ask(self) -> bool:
        return not self.behind() and self.spare.ask()


def pending_spools(collection: Path) -> list[Path]:
    """The spool segments a collection still holds (after a kill)."""
    folder = collection / SPOOL_DIR
    return sorted(folder.glob("*.ring")) if folder.is_dir() else []


def recover(collection: Path, bpf_dir: Path | None = None) -> dict[str, int]:
    """Turn what a killed collector left in ``collection``'s spool into Parquet parts
    after the finished ones, then delete the spool; the rows added per table. Rows
    already in finished parts are not repeated: each segment says how many rows each
    table had before it, and the finished parts say how many they hold."""
    import pyarrow.parquet as pq

    from kernmlops.collect.manifest import TableRecord, read_manifest, write_manifest
    from kernmlops.collect.sinks import ParquetSink
    from kernmlops.ebpf.btf import unbatch
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks import get_hook

    folder = collection / SPOOL_DIR
    infos = [p for p in sorted(folder.glob("*.json")) if "." not in p.stem]
    if not infos:
        return {}
    manifest = read_manifest(collection)
    sink = ParquetSink(collection, manifest.collection_id)
    finished: dict[str, int] = {}
    for table_dir in collection.iterdir():
        parts = sorted(table_dir.glob("part-*.parquet")) if table_dir.is_dir() else []
        if parts:
            finished[table_dir.name] = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
            sink.resume(table_dir.name, len(parts))
    added: dict[str, int] = {}
    for info_path in infos:
        key = info_path.stem
        info = json.loads(info_path.read_text())
        cls = get_hook(info["hook"])
        hook = cls(cls.Options.model_validate(info["options"]))
        obj = Path(bpf_dir) / Path(info["object"]).name if bpf_dir else Path(info["object"])
        if not obj.exists():
            raise CollectionError(
                f"spool {key} needs {obj} to decode its records (build the BPF objects "
                "of the version that collected, or pass their folder)"
            )
        layout: RecordLayout = object_spec(obj).ring_layouts()[info["ring"]]
        dtype = layout.batch if layout.batch is not None else layout.dtype
        if dtype.itemsize != info["itemsize"]:
            raise CollectionError(f"{obj} does not describe spool {key}: rebuilt since?")
        stride = record_stride(dtype.itemsize)
        for seg in sorted(folder.glob(f"{key}.*.ring")):
            made = dict(json.loads(seg.with_suffix(".json").read_text())["rows_before"])
            raw = np.fromfile(seg, np.uint8)
            whole = len(raw) // stride * stride  # a kill may cut the last record
            records = decode(raw[:whole], 1, 0, whole, dtype).records
            if layout.batch is not None:
                records = unbatch(records)
            for table, rows in hook.rows_from(key, records, layout):
                n = rows.num_rows if hasattr(rows, "num_rows") else rows.height
                first = made.get(table, 0)
                made[table] = first + n
                skip = min(n, max(0, finished.get(table, 0) - first))
                if skip < n:
                    sink.write(table, rows.slice(skip))
                    added[table] = added.get(table, 0) + n - skip
    sink.close()
    # The manifest's tables say what is on disk now (its state stays: the run was cut).
    files = sink.files_written()
    for table, n in added.items():
        record = manifest.tables.get(table) or TableRecord()
        record.rows = finished.get(table, 0) + n
        record.files = sorted({*record.files, *files.get(table, [])})
        manifest.tables[table] = record
    write_manifest(collection, manifest)
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return added


def collector_alive(collection: Path) -> int | None:
    """The pid of the collector still writing ``collection``, if it runs."""
    from kernmlops.collect.manifest import read_manifest

    pid = read_manifest(collection).collector_pid
    if not pid:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"kernmlops" in cmdline else None
