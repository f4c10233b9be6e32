"""``kernmlops recover``: what a killed collector left in its spool, made into parts.

Each ring's segments are read back in order (raw ring records, or zstd frames with
their checksums), decoded with the BPF object that collected them, turned into the
hook's rows and written after the collection's finished parts, skipping the rows those
already hold. Damage never stops it: what cannot be read is listed (:class:`Lost`), and
the spool then stays. Then, as the collector's stop does (collector.compact), each
table's parts are compacted into few files (kernmlops.collect.compaction: an atomic
swap, before the spool goes: a kill at any step leaves every row once). Finding the
spool, reading its segments and removing it are kernmlops.spool.recovery; the spool
itself is kernmlops.spool.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.rowmaking import STAGING_PREFIX
from kernmlops.ebpf.ringbuf import decode, record_stride
from kernmlops.errors import CollectionError
from kernmlops.host.pinned import UnsafePath, open_plain_file, read_plain, subfolder
from kernmlops.lazy import lazy_import
from kernmlops.spool.collection import JSON_MAX_BYTES, SPOOL_DIR, spool_done
from kernmlops.spool.frames import FRAME, SegmentFile, SegmentFormat, format_of
from kernmlops.spool.recovery import (
    deleted_bytes,
    good_records,
    guess_format,
    pending_spools,
    remove_spool,
    segment_pieces,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from kernmlops.collect.manifest import Manifest
    from kernmlops.collect.parquet import ParquetSink
    from kernmlops.ebpf.btf import RecordLayout
else:
    np = lazy_import("numpy")

__all__ = ["LOCK_FILE", "Lost", "Recovery", "recover"]


@dataclass
class Lost:
    """What ``recover`` could not read from one spool file, and why."""

    file: Path
    reason: str
    bytes: int = 0
    #: records (ring records: a batch counts as one) in those bytes, where known
    records: int | None = None

    def describe(self) -> str:
        what = f"{self.bytes:,} bytes"
        if self.records is not None:
            what += f" ({self.records:,} records)"
        return f"{self.file}: {what} not recovered: {self.reason}"


@dataclass
class Recovery:
    """What ``recover`` did: rows added per table, and what it could not read."""

    added: dict[str, int] = field(default_factory=dict)
    lost: list[Lost] = field(default_factory=list)
    #: per hook, the records its spooled rings ever held (rows made before the spool's
    #: first segment left, as its json counts them, and every record read here):
    #: its events; a hook with a ring whose count is unknown (a spool of before, a
    #: loss) is not in it
    events: dict[str, int] = field(default_factory=dict)
    #: per table compacted or considered: "compacted" or why not (the manifest's)
    compaction: dict[str, str] = field(default_factory=dict)


#: in the spool: held by the ``recover`` that works on it (its pid inside)
LOCK_FILE = "recover.lock"


def _lock(folder: Path, shown: Path) -> int:
    """Hold the spool for one ``recover``; a second one is told who has it. The lock
    file is in a folder its user may own: opened without following a link, and never
    a file with a second link (a hard link to a file of root's would be truncated)."""
    import fcntl

    try:
        spool = subfolder(folder, "", create=False)  # the spool, not a link to elsewhere
    except UnsafePath:
        raise UnsafePath(f"{shown / SPOOL_DIR} is a link, not a folder: not read") from None
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(LOCK_FILE, flags, 0o600, dir_fd=spool)
    except OSError as err:
        raise UnsafePath(
            f"cannot lock {shown / SPOOL_DIR / LOCK_FILE}: "
            f"{'a link' if err.errno == errno.ELOOP else err.strerror or err}"
        ) from None
    finally:
        os.close(spool)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise UnsafePath(
            f"cannot lock {shown / SPOOL_DIR / LOCK_FILE}: not a plain file of its own "
            "(a hard link to another file?): remove it and recover again"
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise CollectionError(
            f"another `kernmlops recover` (pid {other}) is recovering {shown}: "
            "wait for it to finish"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _meta(path: Path, what: str) -> dict:
    """A spool json, or CollectionError naming it (missing, unreadable, not an object)."""
    try:
        data = json.loads(read_plain(path, limit=JSON_MAX_BYTES).decode())
    except FileNotFoundError:
        raise CollectionError(f"its {what} {path.name} is missing") from None
    except OSError as err:
        why = err.strerror or err
        raise CollectionError(f"its {what} {path.name} is damaged ({why})") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CollectionError(f"its {what} {path.name} is damaged ({err})") from None
    if not isinstance(data, dict):
        raise CollectionError(f"its {what} {path.name} is damaged (not an object)")
    return data


def recover(
    collection: Path,
    bpf_dir: Path | None = None,
    *,
    shown: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Recovery:
    """Turn what a killed collector left in ``collection``'s spool into Parquet parts
    after the finished ones. Rows already in finished parts are not repeated: each
    segment says how many rows each table had before it, and the finished parts say
    how many they hold.

    Damage never stops it: every intact frame and record is recovered, and what could
    not be read (a description missing or damaged, a frame cut or failing its
    checksum, records of the wrong size, rows a later segment expected) is listed in
    the result. The spool is deleted only when nothing was lost; otherwise it stays,
    for another try or an autopsy. One ``recover`` at a time (a lock in the spool).

    Run as root the collection may be a user's: ``collection`` is then its folder
    held open (kernmlops.host.pinned; ``shown`` names it for messages), and nothing in
    it is read or written through a link its user planted. ``progress`` is told
    (bytes of the spool read, its bytes in all) as the frames are made into rows."""
    import pyarrow.parquet as pq

    from kernmlops.collect.manifest import TableRecord, read_manifest, write_manifest
    from kernmlops.ebpf.build import check_build_dir, default_build_dir, object_path
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks import get_hook

    folder = collection / SPOOL_DIR
    result = Recovery()
    for staged in collection.glob(f"{STAGING_PREFIX}*"):
        # a stop killed while workers made rows: the spool still has all of them
        if staged.is_dir() and not staged.is_symlink():
            shutil.rmtree(staged, ignore_errors=True)
    if spool_done(folder):
        # every row in parts: a kill cut its removal, which ends here; the stop never
        # wrote its last manifest (the removal comes before it), so the manifest is
        # brought to the parts as after any recover
        manifest = read_manifest(collection)
        if manifest.state == "running":
            on_disk = _finished_parts(pq, collection)
            if manifest.collection_id:  # its parts' collection_id column (none: as they are)
                sink = _sink(collection, manifest, shown or collection)
                sink.close()
                _compact(collection, manifest, sink, on_disk, set(), result)
            for table, parts in on_disk.items():
                record = manifest.tables.get(table) or TableRecord()
                record.rows, record.files = sum(parts.values()), list(parts)
                record.compaction = result.compaction.get(table, record.compaction)
                manifest.tables[table] = record
            _settle(manifest, result, {})
            write_manifest(collection, manifest)
        remove_spool(folder)
        return result
    segments = pending_spools(collection)
    if not segments:
        return result
    # root parses the objects (and caches their specs) there: a folder another user
    # can change is refused in one line before anything is read or written
    check_build_dir(bpf_dir or default_build_dir())
    shown = shown or collection
    lock = _lock(folder, shown)
    read = _Read(sum(map(_size, segments)), progress)
    try:
        manifest = read_manifest(collection)
        sink = _sink(collection, manifest, shown)
        parts = _finished_parts(pq, collection)
        finished = {table: sum(rows.values()) for table, rows in parts.items()}
        for table, files in parts.items():
            sink.resume(table, len(files))
        by_key: dict[str, list[Path]] = {}
        #: per hook, each of its rings' records (None: not known), and its tables
        hook_keys: dict[str, list[int | None]] = {}
        hook_tables: dict[str, set[str]] = {}
        for seg in segments:
            by_key.setdefault(seg.stem.rpartition(".")[0], []).append(seg)
        for key, segs in by_key.items():
            info: object = None
            try:
                info = _meta(folder / f"{key}.json", "description")
                cls = get_hook(info["hook"])
                hook = cls(cls.Options.model_validate(info["options"]))
                # the json is the collection owner's to edit: of its object only the
                # file name is taken, and must be the hook's own; the object is looked
                # up where collect finds it (or in --bpf-dir), never at a path it gives
                own = getattr(cls, "object_name", None)
                if not isinstance(own, str):
                    raise CollectionError(f"its description {key}.json names hook {cls.name}, "
                                          "which spools no ring")  # fmt: skip
                obj = object_path(own, bpf_dir)
                if Path(str(info["object"])).name != obj.name:
                    raise CollectionError(
                        f"its description {key}.json names the object "
                        f"{Path(str(info['object'])).name!r}, not {obj.name!r} of hook {cls.name}"
                    )
                if not obj.exists():
                    raise CollectionError(
                        f"its records need {obj} to be decoded (build the BPF objects of "
                        "the version that collected, and pass their folder with --bpf-dir)"
                    )
                spec = object_spec(obj)
                layout: RecordLayout = spec.ring_layouts()[info["ring"]]
                dtype = layout.batch if layout.batch is not None else layout.dtype
                # spools of before 2026-11-30 have no fingerprint: their size is checked
                known = info.get("layout")
                if dtype.itemsize != info["itemsize"] or (
                    known is not None and known != spec.btf.ring_fingerprint(info["ring"])
                ):
                    raise CollectionError(
                        f"{obj} lays out its records otherwise than the objects that "
                        "collected them (rebuilt since?): build the BPF objects of the "
                        "version that collected, and pass their folder with --bpf-dir"
                    )
            except (CollectionError, KeyError, TypeError, ValueError) as err:
                if isinstance(info, dict) and isinstance(info.get("hook"), str):
                    hook_keys.setdefault(info["hook"], []).append(None)
                reason = str(err) if isinstance(err, CollectionError) else f"its description "\
                    f"{key}.json is damaged ({type(err).__name__}: {err})"  # fmt: skip
                for seg in segs:
                    result.lost.append(Lost(seg, reason, _size(seg) or deleted_bytes(seg)))
                    read.segment_done(seg)
                continue
            lost_before = len(result.lost)
            records = _recover_key(key, segs, hook, layout, dtype, finished, sink, result, read)
            hook_keys.setdefault(cls.name, []).append(
                records if len(result.lost) == lost_before else None
            )
            hook_tables.setdefault(cls.name, set()).update(hook.written_tables())
        sink.close()
        for name, counts in hook_keys.items():
            if None not in counts:
                result.events[name] = sum(c for c in counts if c is not None)
        # the parts recover wrote are compactly encoded: compaction may keep them
        made = {f for files in sink.files_written().values() for f in files}
        on_disk = _finished_parts(pq, collection)
        _compact(collection, manifest, sink, on_disk, made, result)
        # The manifest's tables say what is on disk now: also where nothing was added,
        # since parts may have been finished after the manifest's last checkpoint (a
        # stop killed while it took row workers' parts in).
        for table in {*finished, *result.added}:
            record = manifest.tables.get(table) or TableRecord()
            record.rows = finished.get(table, 0) + result.added.get(table, 0)
            record.files = list(on_disk.get(table, {}))
            record.compaction = result.compaction.get(table, record.compaction)
            manifest.tables[table] = record
        _settle(manifest, result, hook_tables)
        write_manifest(collection, manifest)
    finally:
        os.close(lock)
        for lost in result.lost:  # named as the user named the collection
            if lost.file.is_relative_to(collection):
                lost.file = shown / lost.file.relative_to(collection)
    if not result.lost:
        remove_spool(folder)
    return result


def _settle(manifest: Manifest, result: Recovery, hook_tables: dict[str, set[str]]) -> None:
    """The manifest brought to what recover leaves: each hook's rows (and events, where
    the spool counts them) as its tables now hold them, the rows its spool kept no
    longer counted lost, and, once no row is left in the spool, ``state: recovered``
    with what the state and error were before (kept in ``recovery``, as are when and
    with which version recover ran)."""
    from kernmlops import __version__
    from kernmlops.collect.manifest import RecoveryRecord

    tables = _hook_tables(manifest, hook_tables)
    for name, record in manifest.hooks.items():
        rows = dict(record.rows)
        for table in tables.get(name, ()):
            rows[table] = manifest.tables[table].rows if table in manifest.tables else 0
        record.rows = rows
        if name in result.events:
            record.events = result.events[name]
    lost_rows = getattr(manifest, "lost_rows", None)
    if isinstance(lost_rows, dict):
        # rows a failed sink dropped: those of a spooled hook are made again from the
        # spool; another's (a poller's) are lost for good and stay counted
        remade = {t for name in hook_tables for t in tables.get(name, ())}
        left = {t: n for t, n in lost_rows.items() if t not in remade}
        if left:
            manifest.lost_rows = left  # type: ignore[attr-defined]
        else:
            del manifest.lost_rows  # type: ignore[attr-defined]
    before = manifest.recovery
    if before is None:  # the first recover: what went wrong is kept as it was said
        before = RecoveryRecord(recovered_from=manifest.state, error=manifest.error)
    added = dict(before.rows_added)
    for table, n in result.added.items():
        added[table] = added.get(table, 0) + n
    manifest.recovery = RecoveryRecord(
        recovered_from=before.recovered_from,
        error=before.error,
        recovered_at=datetime.now(UTC).isoformat(),
        kernmlops=__version__,
        rows_added=added,
        lost_pieces=len(result.lost),
        lost_bytes=sum(lost.bytes for lost in result.lost),
    )
    if not result.lost:
        # every row is in parts: no reader is to warn, nor the error to say "recover"
        manifest.state = "recovered"
        manifest.error = None


def _hook_tables(manifest: Manifest, recovered: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per hook of the manifest, the tables it writes: those its rows name, those
    recover made for it, and those its options (the manifest's config) give it; a
    killed collector's hooks name none yet (their rows are counted at the stop)."""
    from kernmlops.hooks import REGISTRY

    config = (manifest.config or {}).get("hooks")
    out: dict[str, set[str]] = {}
    for name, record in manifest.hooks.items():
        tables = {*record.rows, *recovered.get(name, ())}
        cls = REGISTRY.get(name)
        options = config.get(name.replace("-", "_"), {}) if isinstance(config, dict) else {}
        if cls is not None and isinstance(options, dict):
            # the collection owner's file: options this version no longer takes leave
            # the hook's tables as its rows and the spool name them
            with contextlib.suppress(ValueError, TypeError):  # pydantic's errors are ValueErrors
                tables.update(cls(cls.Options.model_validate(options)).written_tables())
        out[name] = tables
    return out


def _sink(collection: Path, manifest: Manifest, shown: Path) -> ParquetSink:
    """The sink recover writes with: row groups as the collection's config had them."""
    from kernmlops.collect.parquet import ParquetSink

    cfg = (manifest.config or {}).get("collector")
    rows = cfg.get("row_group_rows") if isinstance(cfg, dict) else None
    # the collection owner's file: a value collect would not take is not taken
    if not isinstance(rows, int) or isinstance(rows, bool) or not 1024 <= rows <= 16 << 20:
        rows = 65536
    if not manifest.collection_id:
        # every row written carries it: refused before any is, the spool kept
        raise CollectionError(
            f"{shown}: its manifest names no collection_id, which every recovered row "
            "carries: put it back in manifest.json (the folder's name says it, "
            "collection_id=<id>) and recover again; the spool is kept"
        )
    return ParquetSink(collection, manifest.collection_id, row_group_rows=rows, shown=shown)


def _compact(
    collection: Path,
    manifest: Manifest,
    sink: ParquetSink,
    parts: dict[str, dict[str, int]],
    made: set[str],
    result: Recovery,
) -> None:
    """Compact each table as the collector's stop does where its config asks for it
    (collector.compact, on by default): ``parts`` (per table, its parts and their rows,
    in order) are brought to what compaction leaves. Parts compacted already (``made``
    by this recover, or listed under a table the manifest says was compacted: an
    earlier recover's) are kept where big enough. A table that cannot be compacted
    keeps its parts, and the manifest says why."""
    import pyarrow as pa

    from kernmlops.collect.compaction import compact_table, table_on_disk
    from kernmlops.collect.parts import PartFormat

    cfg = (manifest.config or {}).get("collector")
    if isinstance(cfg, dict) and cfg.get("compact", True) is not True:
        return
    fmt = PartFormat(sink.collection_id, sink.compression, sink.row_group_rows)
    for table, rows in parts.items():
        record = manifest.tables.get(table)
        compacted = set(record.files) if record and record.compaction == "compacted" else set()
        try:
            state = table_on_disk(collection, table, rows)
            state.whole_parts = {f: n for f, n in rows.items() if f in made | compacted}
            outcome = compact_table(state, collection, fmt, sink.rows_per_file)
        except (OSError, ValueError, TypeError, pa.ArrowException, UnsafePath) as err:
            # a part that cannot be read, or rows of two versions: the parts stay
            outcome = f"skipped: {getattr(err, 'strerror', None) or err}"
        else:
            if outcome == "compacted":
                parts[table] = dict(state.whole_parts)
        result.compaction[table] = outcome


def _finished_parts(pq, collection: Path) -> dict[str, dict[str, int]]:
    """Per table folder of ``collection`` (links not followed; hidden folders, such as
    what a kill left of a compaction, are no table): its finished parts
    (``table/part-….parquet``, in order) and their rows."""
    from kernmlops.collect.parts import check_table_name

    found: dict[str, dict[str, int]] = {}
    for table_dir in collection.iterdir():
        try:
            check_table_name(table_dir.name)
        except ValueError:
            continue
        plain = table_dir.is_dir() and not table_dir.is_symlink()
        parts = sorted(table_dir.glob("part-*.parquet")) if plain else []
        if parts:
            found[table_dir.name] = {f"{table_dir.name}/{p.name}": _part_rows(pq, p) for p in parts}
    return found


def _part_rows(pq, part: Path) -> int:  # pq: pyarrow.parquet, imported late
    """A finished part's rows, read without following a link, from a plain file only
    (a FIFO its user made there would block the open, and the read, for ever).

    Raises:
        OSError: EINVAL for what is not a plain file (the error names it).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with open(os.open(part, flags), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, f"{part.parent.name}/{part.name} is not a plain file")
        return pq.ParquetFile(f).metadata.num_rows


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size  # a link's own: never the size of what it names
    except OSError:
        return 0


class _Read:
    """How many of the spool's bytes were read, for a progress callback."""

    def __init__(self, total: int, progress: Callable[[int, int], None] | None) -> None:
        self.total, self.progress = total, progress
        self.before = 0  # the bytes of the segments read to their end

    def at(self, offset: int, seg: Path) -> None:
        if self.progress is not None:
            self.progress(self.before + min(offset, _size(seg)), self.total)

    def segment_done(self, seg: Path) -> None:
        self.before += _size(seg)
        if self.progress is not None:
            self.progress(min(self.before, self.total), self.total)


def _recover_key(key: str, segs: list[Path], hook, layout, dtype, finished: dict[str, int],
                 sink, result: Recovery, read: _Read) -> int | None:  # fmt: skip
    """Recover one ring's segments, in order, into ``sink``; losses into ``result``.
    The records the ring ever held (None: its first segment's json does not count
    those before it: a spool of before)."""
    from kernmlops.ebpf.btf import unbatch

    stride = record_stride(dtype.itemsize)
    made: dict[str, int] = {}
    held: int | None = None  # records before the first segment, then every one read
    gone = False  # the segment before this one is named lost: its file is missing
    for i, seg in enumerate(segs):
        # the ring's last bytes (a kill may cut them): an empty standby after is no data
        last = not any(_size(later) for later in segs[i + 1 :])
        try:
            meta = _meta(seg.with_suffix(".json"), "description")
            before = meta.get("rows_before")
            fmt: SegmentFormat | None = format_of(meta)
        except (CollectionError, ValueError, TypeError) as err:
            # its rows come after the previous segment's, as for rows_before: null
            result.lost.append(Lost(seg, f"{err}; read as its first bytes look", 0))
            meta, before, fmt = {}, None, None
        if i == 0:
            counted = meta.get("records_before")
            held = counted if isinstance(counted, int) and not isinstance(counted, bool) else None
        if isinstance(before, dict):
            # rows a damaged segment before this one did not give: lost
            short = {t: n - made.get(t, 0) for t, n in before.items()
                     if isinstance(n, int) and n > made.get(t, 0)}  # fmt: skip
            if made and short and not gone:
                rows = ", ".join(f"{t} {n:,}" for t, n in sorted(short.items()))
                result.lost.append(
                    Lost(segs[i - 1], f"rows the next segment counts on are missing: {rows}")
                )
            made = {t: n for t, n in before.items() if isinstance(n, int)}
        if not os.path.lexists(seg):  # pending_spools gave it for its json
            result.lost.append(Lost(
                seg, "the file is missing, deleted after the collection wrote it (its size "
                "at the collector's last flush, as its json noted it)", deleted_bytes(seg),
            ))  # fmt: skip
            gone = True  # one line for it: the next segment's rows_before is not checked
            continue
        gone = False
        try:
            # read a frame at a time: a segment may be huge, or sparse (its user's)
            fd = open_plain_file(seg)
        except OSError as err:
            result.lost.append(Lost(seg, f"cannot be read ({err.strerror or err})", _size(seg)))
            read.segment_done(seg)
            continue
        bad: list[tuple[str, int, int | None]] = []
        damaged: list[Lost] = []  # records with a damaged header, named after the frames
        try:
            data = SegmentFile(fd)
            if fmt is None:
                fmt = guess_format(data.read(0, FRAME.size + 4))
            flushed = meta.get("bytes")
            if isinstance(flushed, int) and len(data) < flushed:
                missing = flushed - len(data)
                result.lost.append(Lost(
                    seg, f"cut short: {missing:,} bytes fewer than it held at the collector's "
                    "last flush", missing, None if fmt.framed else missing // stride,
                ))  # fmt: skip
            pieces, bad = segment_pieces(data, fmt, stride, last)
            for at, piece in pieces:
                read.at(at, seg)
                raw, n_bad = good_records(np.frombuffer(piece, np.uint8), stride, dtype.itemsize)
                if n_bad:
                    damaged.append(Lost(seg, f"records with a damaged header in the piece at "
                                        f"byte {at:,}", n_bad * stride, n_bad))  # fmt: skip
                records = decode(raw, 1, 0, len(raw), dtype).records
                if layout.batch is not None:
                    records = unbatch(records, layout)
                if held is not None:
                    held += len(records)
                for table, rows in hook.rows_from(key, records, layout):
                    n = rows.num_rows if hasattr(rows, "num_rows") else rows.height
                    first = made.get(table, 0)
                    made[table] = first + n
                    skip = min(n, max(0, finished.get(table, 0) - first))
                    if skip < n:
                        sink.write(table, rows.slice(skip))
                        result.added[table] = result.added.get(table, 0) + n - skip
        except OSError as err:  # an I/O error, or a file that shrank while read
            bad.append((f"cannot be read to its end ({err.strerror or err})", 0, None))
        finally:
            os.close(fd)
            read.segment_done(seg)
        result.lost.extend(Lost(seg, reason, size, records) for reason, size, records in bad)
        result.lost.extend(damaged)
    return held
