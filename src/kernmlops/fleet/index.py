"""The dataset's index: one row per published collection, a table any engine reads.

Each push writes its collection's row as ``<URI>/_index/<collection_id>.parquet``, after
the collection's manifest: a row in the index means a whole collection. One file per
collection, so machines that push at the same time never overwrite each other's rows.
The folder is one table::

    duckdb:   select * from read_parquet('s3://bucket/fleet/_index/*.parquet')
    spark:    spark.read.parquet("s3a://bucket/fleet/_index")
    polars:   kernmlops.fleet.index.read_index(open_dataset(uri))

``rows`` is a map table -> rows, counted from the Parquet footers of the parts published
(not copied from the manifest). ``kernmlops fleet reindex URI`` rebuilds the index from
the manifests (a dataset copied by hand, or rows of collections deleted since).

A collection that reindex finds damaged (its manifest or a part unreadable) has no row:
the index lists whole collections only, so every reader of it skips the damaged one.
It is named in ``<URI>/_damaged/<collection_id>.json`` (its folder and why) instead,
outside ``_index/`` (whose readers take every file in it for an index row), for
``fleet ls`` to warn about until a push copies the collection whole again.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, unquote

from kernmlops.collect import pagecheck
from kernmlops.fleet.store import (
    OBJECT_STORES,
    Dataset,
    PublishError,
    Unreadable,
    delete,
    describe_error,
    listing,
    put,
    read_at_most,
)
from kernmlops.tables import BENCHMARK, COLLECTION_ID

if TYPE_CHECKING:
    import pyarrow as pa

    # pydantic's import is a fifth of `fleet ls`'s start: only writers need a manifest
    from kernmlops.collect.manifest import Manifest

__all__ = [
    "DAMAGED_DIR",
    "INDEX_DIR",
    "Damaged",
    "check_dataset",
    "clear_damaged",
    "damaged_advice",
    "damaged_marker",
    "index_row",
    "index_rows",
    "index_schema",
    "is_damaged",
    "read_damaged",
    "read_index",
    "unindexed",
    "write_index_row",
]

INDEX_DIR = "_index"
#: the largest index row read (one row: a few KiB) and _damaged/ marker (under 1 KiB)
INDEX_ROW_MAX_BYTES = 16 << 20
MARKER_MAX_BYTES = 1 << 20
#: the collections reindex found damaged, one ``<collection_id>.json`` each (not rows)
DAMAGED_DIR = "_damaged"


def check_dataset(dataset: Dataset) -> None:
    """Check that the root is a dataset: a folder holding ``_index/`` or ``benchmark=<b>/``
    folders, or an empty one (what a push that published nothing leaves: it creates the
    root first). A missing root, a file, or a folder of other things is taken for a typo
    rather than an empty dataset.

    Raises:
        PublishError: the root is not a dataset (why, one line).
        OSError: the root cannot be read.
    """
    import pyarrow.fs as pafs

    kind = dataset.fs.get_file_info(dataset.root).type
    if kind == pafs.FileType.NotFound:
        raise PublishError(f"{dataset.uri}: no such dataset: {_not_there(dataset)}")
    if kind != pafs.FileType.Directory:
        raise PublishError(f"{dataset.uri} is a file, not a dataset")
    names = [
        i.base_name
        for i in dataset.fs.get_file_info(pafs.FileSelector(dataset.root))
        if not i.base_name.startswith(".")
    ]
    if names and not any(n == INDEX_DIR or n.startswith(f"{BENCHMARK}=") for n in names):
        hint = (
            f" (a folder of local collections: `kernmlops push {dataset.uri} URI` publishes it)"
            if "curated" in names
            else ""
        )
        raise PublishError(
            f"{dataset.uri}: not a dataset: no {INDEX_DIR}/ or {BENCHMARK}=<b>/ folders in it"
            + hint
        )


def _not_there(dataset: Dataset) -> str:
    """Why nothing is at the root, as accurately as the filesystem tells it: an object
    store has no empty folder, so a prefix nothing was pushed to (or a push that published
    nothing) is not there either; its bucket may be missing too."""
    import pyarrow.fs as pafs

    if dataset.kind not in OBJECT_STORES:
        return "nothing there: check the URI"
    bucket = dataset.root.split("/", 1)[0]
    # the root is the bucket: an empty bucket is a folder, so it is missing
    if bucket == dataset.root or dataset.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        return f"the bucket {bucket!r} does not exist: check the URI"
    return (
        "no object under this prefix (nothing was published there, and an object store "
        "keeps no empty folder): check the URI"
    )


class Unindexed(NamedTuple):
    """Collection folders under a dataset's root (``benchmark=<b>/collection_id=<id>/``)."""

    #: those with a manifest: whole collections (copied by hand, a collector's own output)
    #: or a push between its manifest and its index row
    collections: int
    #: those without one: a push under way (parts are copied before the manifest), or
    #: one interrupted, which running it again resumes
    partial: int


def unindexed(dataset: Dataset, *, damaged: Iterable[str] = ()) -> Unindexed:
    """Count the collection folders under the root, with and without a manifest: what an
    empty index may be hiding. Two levels are listed (not the parts within). The folders
    ``damaged`` names (paths under the root: those reindex left out) are not counted.

    Raises:
        OSError: the dataset cannot be read.
    """
    import pyarrow.fs as pafs

    from kernmlops.spool.collection import MANIFEST_NAME

    def folders(path: str, prefix: str) -> list[str]:
        infos = listing(dataset, path)
        return sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.Directory and i.base_name.startswith(f"{prefix}=")
        )

    skip = {dataset.path(p) for p in damaged}
    found = [
        c
        for b in folders(dataset.path(), BENCHMARK)
        for c in folders(b, COLLECTION_ID)
        if c not in skip
    ]
    if not found:
        return Unindexed(0, 0)
    manifests = dataset.fs.get_file_info([f"{c}/{MANIFEST_NAME}" for c in found])
    # anything at the name (a FIFO, a folder: damage) is reindex's to judge and name
    whole = sum(i.type != pafs.FileType.NotFound for i in manifests)
    return Unindexed(whole, len(found) - whole)


def index_schema() -> pa.Schema:
    """The index's columns, typed so that DuckDB and Spark read each naturally (signed
    integers, UTC timestamps, a map of rows per table). Fixed: a dataset holds rows of
    every version that pushes, and a file with a column more or less than the others
    fails ``pl.read_parquet`` and DuckDB's plain ``read_parquet`` over the folder (what
    a collection went through, such as its ``recovery``, is read from its manifest:
    README, "Query a fleet's dataset")."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            (COLLECTION_ID, pa.string()),
            (BENCHMARK, pa.string()),
            # the collection's folder under the dataset's root
            ("path", pa.string()),
            ("host", pa.string()),
            ("kernel", pa.string()),
            ("cpu_model", pa.string()),
            ("logical_cpus", pa.int32()),
            ("started_at", ts),
            ("stopped_at", ts),
            ("duration_s", pa.float64()),
            ("state", pa.string()),
            ("exit_code", pa.int32()),
            ("rows", pa.map_(pa.string(), pa.int64())),
            ("total_rows", pa.int64()),
            ("files", pa.int32()),
            ("bytes", pa.int64()),
            ("kernmlops_version", pa.string()),
            ("published_at", ts),
        ]
    )


def index_row(
    manifest: Manifest, path: str, files: Iterable[tuple[str, int, int | None]]
) -> dict[str, Any]:
    """The index row of a collection published at ``path`` with ``files`` (relative path,
    size, Parquet rows or None; see :func:`kernmlops.fleet.push.collection_files`)."""
    from kernmlops.collect.manifest import manifest_time

    system = manifest.system or {}
    rows: dict[str, int] = {}
    count = size = 0
    for rel, nbytes, nrows in files:
        count += 1
        size += nbytes
        table, _, name = rel.partition("/")
        if nrows is not None and name.startswith("part-") and "/" not in name:
            rows[table] = rows.get(table, 0) + nrows
    cpus = system.get("logical_cpus")
    return {
        COLLECTION_ID: manifest.collection_id or path.rsplit("=", 1)[-1],
        BENCHMARK: path.split("/", 1)[0].split("=", 1)[1],
        "path": path,
        "host": system.get("hostname"),
        "kernel": system.get("kernel_release"),
        "cpu_model": system.get("cpu_model"),
        "logical_cpus": cpus if isinstance(cpus, int) else None,
        "started_at": manifest_time(manifest.started_at),
        "stopped_at": manifest_time(manifest.stopped_at),
        "duration_s": manifest.duration_s,
        "state": manifest.state,
        "exit_code": manifest.exit_code,
        "rows": sorted(rows.items()),
        "total_rows": sum(rows.values()),
        "files": count + 1,  # the manifest
        "bytes": size,
        "kernmlops_version": (manifest.versions or {}).get("kernmlops"),
        "published_at": datetime.now(UTC),
    }


def _row_bytes(row: dict[str, Any]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([row], schema=index_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf, **pagecheck.WRITE)  # a flipped byte: a damaged row, not a wrong one
    return buf.getvalue()


def write_index_row(
    dataset: Dataset, row: dict[str, Any], collection_id: str, *, only_missing: bool = False
) -> bool:
    """Write ``row`` as the collection's index file; with ``only_missing``, only if there is
    none. True if written."""
    import pyarrow.fs as pafs

    rel = f"{INDEX_DIR}/{collection_id}.parquet"
    if only_missing and dataset.fs.get_file_info(dataset.path(rel)).type == pafs.FileType.File:
        return False
    put(dataset, _row_bytes(row), rel)
    return True


#: index files read at once from a remote filesystem, where each read is a round trip
REMOTE_READERS = 16


class _Damaged(Exception):
    """An index file whose bytes were read but are not an index row (the reason)."""


def _read_row_file(dataset: Dataset, path: str, schema: pa.Schema) -> pa.Table:
    """One index file as a table of ``schema``: an older file's missing columns as nulls,
    its other types cast (as ``pq.read_table(schema=...)`` does).

    Raises:
        _Damaged: the file was read but is not an index row.
        OSError: the file cannot be read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    # the whole file (a few KB) first: an error reading it is the filesystem's, one
    # parsing it is the file's (pyarrow raises OSError for both)
    try:
        data = read_at_most(dataset, path, INDEX_ROW_MAX_BYTES)
    except Unreadable as err:
        raise _Damaged(f"{err} of an index row") from None
    try:
        # ParquetFile, not pq.read_table: read_table goes through pyarrow.dataset, whose
        # import brings in pandas (half a second), and costs 3x more a file; one thread a
        # file: a file is a row, threads inside it only contend
        table = pq.ParquetFile(pa.BufferReader(data), **pagecheck.READ).read(use_threads=False)
        for name in (COLLECTION_ID, BENCHMARK):  # what every index row has had
            if name not in table.column_names or table.column(name).null_count:
                raise _Damaged(f"no {name}: not an index row")
        if table.schema.equals(schema):
            return table
        columns = [
            table.column(field.name).cast(field.type)
            if field.name in table.column_names
            else pa.nulls(table.num_rows, field.type)
            for field in schema
        ]
        return pa.Table.from_arrays(columns, schema=schema)
    except _Damaged:
        raise
    except (OSError, ValueError, TypeError, NotImplementedError, pa.ArrowException) as err:
        # its first sentence: pyarrow goes on with what the user already knows
        raise _Damaged(describe_error(err).split(". ", 1)[0].rstrip(".")) from None


def _not_read(dataset: Dataset, base: str, read: set[str]) -> list[tuple[str, str]]:
    """(name, what it is) of each entry of a local index folder named as a row file that
    is not read: a link (never followed as root, see :func:`listing`; a dangling one,
    which pyarrow does not list), a FIFO, a folder. Reindex neither reads nor removes
    them; an object store has none."""
    import os
    import stat

    from kernmlops.yamlfile import not_plain

    if not dataset.local:
        return []
    found = []
    try:
        with os.scandir(base) as entries:
            for e in entries:
                if (
                    not e.name.endswith(".parquet")
                    or e.name.startswith((".", "_"))
                    or e.name in read
                ):
                    continue
                with contextlib.suppress(FileNotFoundError):  # gone meanwhile
                    mode = e.stat(follow_symlinks=False).st_mode
                    if stat.S_ISLNK(mode):
                        found.append((e.name, "a symbolic link"))
                    elif not stat.S_ISREG(mode):  # a plain file: written since listed
                        found.append((e.name, not_plain(mode)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found)


def read_index(
    dataset: Dataset,
    *,
    on_damaged: Callable[[str, str], None] | None = None,
    on_not_read: Callable[[list[tuple[str, str]]], None] | None = None,
) -> pa.Table:
    """Every row of the dataset's index (an empty table when nothing is published),
    ordered by start time.

    Args:
        dataset: the dataset (:func:`kernmlops.fleet.open_dataset`).
        on_damaged: called with (the file's URI, the reason) for each index file that is
            not a readable index row (truncated, overwritten), which is then left out;
            without it, such a file raises PublishError.
        on_not_read: called once, with (name, what it is) of each entry of a local
            ``_index/`` named as a row file that was not read at all (a link as root, a
            dangling link, a FIFO, a folder), when there are any.

    Raises:
        PublishError: the root is not a dataset (:func:`check_dataset`), or an index file
            is damaged and ``on_damaged`` is None.
        OSError: the dataset cannot be read (pyarrow's errors are OSErrors).
    """
    import pyarrow as pa
    import pyarrow.fs as pafs

    base = dataset.path(INDEX_DIR)
    infos = listing(dataset, base)
    paths = sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File
        and i.base_name.endswith(".parquet")
        and not i.base_name.startswith((".", "_"))
    )
    if on_not_read is not None:
        skipped = _not_read(dataset, base, {p.rsplit("/", 1)[-1] for p in paths})
        if skipped:
            on_not_read(skipped)
    schema = index_schema()
    if not paths:
        # checked only here, where it costs no round trip to a dataset with rows: a typo
        # must not read as an empty dataset
        check_dataset(dataset)
        return schema.empty_table()

    def read(path: str) -> pa.Table | str:
        try:
            return _read_row_file(dataset, path, schema)
        except _Damaged as err:
            return str(err)

    if dataset.local or len(paths) == 1:
        # a local read is CPU-bound (~0.5 ms a file): threads on a small machine only
        # slow it down
        read_all = [read(p) for p in paths]
    else:
        from concurrent.futures import ThreadPoolExecutor

        # an object store's read waits on the network: many at once
        with ThreadPoolExecutor(min(REMOTE_READERS, len(paths))) as pool:
            read_all = list(pool.map(read, paths))
    tables = []
    for path, got in zip(paths, read_all, strict=True):
        if isinstance(got, str):
            where = dataset.where(INDEX_DIR, path.rsplit("/", 1)[-1])
            if on_damaged is None:
                raise PublishError(f"{where}: {damaged_advice(dataset, got)}")
            on_damaged(where, got)
        else:
            tables.append(got)
    if not tables:
        return schema.empty_table()
    table = pa.concat_tables(tables)
    return table.sort_by([("started_at", "ascending"), (COLLECTION_ID, "ascending")])


def damaged_advice(dataset: Dataset, reason: str) -> str:
    """What a damaged index file is and what rebuilds it, for its message."""
    import shlex

    return (
        f"not a readable index file ({reason}): `kernmlops fleet reindex "
        f"{shlex.quote(dataset.uri)}` rewrites the index from the manifests"
    )


class Damaged(NamedTuple):
    """A collection that reindex found damaged and left out of the index."""

    collection_id: str
    #: its folder under the root (``benchmark=<b>/collection_id=<id>``)
    path: str
    #: why: the damaged file and what is wrong with it
    reason: str


def _marker(prefix: str) -> str:
    """The damaged marker of the collection folder ``prefix`` (:func:`_marker_id`)."""
    return f"{DAMAGED_DIR}/{_marker_id(prefix)}.json"


def _marker_id(prefix: str) -> str:
    """The id a damaged marker of the collection folder ``prefix`` is named by: the
    folder's ``collection_id`` (its manifest may be what is damaged). A folder's name that
    unquotes to more than one name (``..%2F..%2Fetc``, made by whoever writes in the
    dataset) is kept quoted: the marker is one file in ``_damaged/``, never one the
    ``/`` and ``..`` lead to."""
    value = prefix.rsplit("=", 1)[-1]
    cid = unquote(value)
    if "/" in cid or "\0" in cid:
        cid = quote(cid, safe="")  # no '/'; and not hidden, as readers skip those
        if cid.startswith((".", "_")):
            cid = f"%{ord(cid[0]):02X}{cid[1:]}"
    return cid


def damaged_marker(dataset: Dataset, prefix: str, reason: str) -> None:
    """Name the collection folder ``prefix`` damaged, for ``reason``, in ``_damaged/``."""
    import json

    cid = _marker_id(prefix)
    record = dict(Damaged(cid, prefix, reason)._asdict(), found_at=datetime.now(UTC).isoformat())
    put(dataset, json.dumps(record).encode(), _marker(prefix))


def is_damaged(dataset: Dataset, prefix: str) -> bool:
    """Whether reindex named the collection folder ``prefix`` damaged (and no push has
    copied it since).

    Raises:
        OSError: the dataset cannot be read.
    """
    import pyarrow.fs as pafs

    return dataset.fs.get_file_info(dataset.path(_marker(prefix))).type == pafs.FileType.File


def clear_damaged(dataset: Dataset, prefix: str) -> None:
    """Remove the damaged marker of the collection folder ``prefix`` (a push copied it
    whole again).

    Raises:
        OSError: the dataset cannot be written.
    """
    with contextlib.suppress(FileNotFoundError):
        delete(dataset, _marker(prefix))


def read_damaged(dataset: Dataset) -> list[Damaged]:
    """The collections that the last reindex found damaged and that no push has copied
    again since, by folder. A marker that is not readable JSON still names its collection.

    Raises:
        OSError: the dataset cannot be read.
    """
    import pyarrow.fs as pafs

    from kernmlops.jsonfile import loads

    infos = listing(dataset, dataset.path(DAMAGED_DIR))
    found = []
    for info in sorted(infos, key=lambda i: i.path):
        name = info.base_name
        if info.type != pafs.FileType.File or not name.endswith(".json") or name[0] in "._":
            continue
        cid = name.removesuffix(".json")
        try:
            record = loads(read_at_most(dataset, info.path, MARKER_MAX_BYTES))
            found.append(Damaged(cid, str(record["path"]), str(record["reason"])))
        except (ValueError, TypeError, KeyError):
            found.append(Damaged(cid, "", f"its marker {DAMAGED_DIR}/{name} is not readable"))
    return found


def index_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The index's rows as dicts: timestamps as UTC datetimes, ``rows`` as (table, rows)
    pairs."""
    import pyarrow as pa

    # pyarrow turns a timestamp with a time zone into a datetime through pandas (its
    # import is half a second): convert the naive instants, then say they are UTC
    zoned = [f.name for f in table.schema if pa.types.is_timestamp(f.type) and f.type.tz]
    for name in zoned:
        k = table.column_names.index(name)
        naive = table.column(k).cast(pa.timestamp(table.schema.field(k).type.unit))
        table = table.set_column(k, name, naive)
    rows = table.to_pylist()
    for row in rows:
        for name in zoned:
            if row[name] is not None:
                row[name] = row[name].replace(tzinfo=UTC)
    return rows


class Reindexed(NamedTuple):
    """What :func:`reindex` did."""

    written: int
    #: stale rows removed (collections no longer there); a damaged one's is not counted
    removed: int
    #: (collection folder's URI, why) for each collection left out: a damaged manifest
    #: or part (its row, if any, removed; named in ``_damaged/``)
    skipped: list[tuple[str, str]]


#: a Parquet file's last bytes read at once: its footer, in one request for most files
_TAIL = 64 << 10


def _part_rows(dataset: Dataset, path: str, size: int) -> int:
    """A part's rows, from its footer.

    Raises:
        _Damaged: the footer was read but is not a Parquet footer.
        OSError: the file cannot be read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    # the footer's bytes first, parsed apart (pq.read_metadata raises OSError for a
    # damaged file and for a lost connection alike): a network error stops the
    # reindex, a damaged part skips its collection
    with dataset.fs.open_input_file(path) as f:
        tail = f.read_at(min(size, _TAIL), max(size - _TAIL, 0))
        n = int.from_bytes(tail[-8:-4], "little") if len(tail) >= 12 else -1
        if tail[-4:] == b"PAR1" and len(tail) - 8 < n <= size - 12:
            tail = f.read_at(n + 8, size - n - 8)
    if len(tail) < 12 or tail[-4:] != b"PAR1" or not 0 < n <= size - 12:
        raise _Damaged("not a Parquet file (no footer)")
    try:
        return int(pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-n - 8 :])).num_rows)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise _Damaged(f"not a readable Parquet file ({describe_error(err)})") from None


class _Recorded:
    """A remote file for pyarrow.PythonFile, its own read errors kept: pyarrow raises
    OSError for a page that fails its checksum and for a lost connection alike."""

    def __init__(self, file: pa.NativeFile) -> None:
        self.file = file
        self.error: OSError | None = None
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        try:
            return self.file.read(n)
        except OSError as err:
            self.error = err
            raise

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.file.seek(pos, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self.file.size()


#: a part read whole in one request to check its pages (a request a column chunk
#: took a reindex over S3 past 10 s for three small collections); larger ones are
#: read a row group at a time
_WHOLE_PART = 64 << 20


def _part_pages(dataset: Dataset, path: str, size: int) -> None:
    """Every page of the part at ``path`` (``size`` bytes) read and checked against its
    checksum (kernmlops.collect.pagecheck).

    Raises:
        _Damaged: a page fails its checksum or does not decode.
        OSError: the file cannot be read (a network error stops the reindex).
    """
    import pyarrow as pa

    with dataset.fs.open_input_file(path) as f:
        if size <= _WHOLE_PART:
            # read first: an error now is the connection's, one parsing it the file's
            damage = pagecheck.page_damage(pa.BufferReader(f.read_at(size, 0)))
        else:
            recorded = _Recorded(f)
            damage = pagecheck.page_damage(pa.PythonFile(recorded, mode="r"), pre_buffer=True)
            if recorded.error is not None:
                raise recorded.error
    if damage is not None:
        raise _Damaged(damage)


def _collection_row(
    dataset: Dataset, prefix: str, entries: list[Any], *, pages: bool = True
) -> dict[str, Any]:
    """The index row of the collection at ``prefix`` (its (relative path, FileInfo)s);
    ``pages``: every page of its parts checked too, else their footers only.

    Raises:
        _Damaged: its manifest or a part is damaged ("<relative path>: why").
        OSError: a file cannot be read.
    """
    import pyarrow.fs as pafs

    from kernmlops.collect.manifest import MANIFEST_NAME, parse_manifest
    from kernmlops.errors import CollectionError
    from kernmlops.spool.collection import MANIFEST_MAX_BYTES

    try:
        data = read_at_most(dataset, dataset.path(prefix, MANIFEST_NAME), MANIFEST_MAX_BYTES)
        # as push reads one (read_manifest): a manifest it would refuse is not indexed
        manifest = parse_manifest(data.decode("utf-8"), Path(MANIFEST_NAME))
    except Unreadable as err:  # a FIFO at its name, one made huge
        raise _Damaged(f"{MANIFEST_NAME}: {err}") from None
    except UnicodeDecodeError:
        raise _Damaged(f"{MANIFEST_NAME}: not UTF-8 text") from None
    except CollectionError as err:
        raise _Damaged(str(err)) from None
    files = []
    for rel, info in entries:
        if rel == MANIFEST_NAME or info.type != pafs.FileType.File:
            continue
        size = int(info.size or 0)
        nrows = None
        if rel.endswith(".parquet"):
            try:
                nrows = _part_rows(dataset, info.path, size)
                if pages:
                    _part_pages(dataset, info.path, size)
            except _Damaged as err:
                raise _Damaged(f"{rel}: {err}") from None
        files.append((rel, size, nrows))
    return index_row(manifest, prefix, files)


def reindex(
    dataset: Dataset,
    *,
    progress: Callable[[int, int], None] | None = None,
    pages: bool = False,
) -> Reindexed:
    """Rebuild the index from the collections' manifests and parts at the destination:
    a row for each collection with a manifest, none for others. A collection whose
    manifest or a part is damaged is skipped (named in ``skipped``): its row, if it has
    one, is removed (the index lists whole collections only) and it is named in
    ``_damaged/`` instead; the rest is indexed. The ``_damaged/`` markers of collections
    that are whole again, or gone, are removed.

    ``pages``: every page of every part is read and checked against its checksum (a
    byte damaged inside a page leaves the footer whole): the whole dataset is read.
    False (the default): the parts' footers only, a rebuild that reads a few KiB a
    part (push checked every page before publishing; damage inside a page since is
    not seen).

    ``progress`` is told (collections done, collections in all) as each is read.

    Raises:
        PublishError: the root is not a dataset (:func:`check_dataset`).
        OSError: the dataset cannot be read or written.
    """
    import pyarrow.fs as pafs

    from kernmlops.collect.manifest import MANIFEST_NAME

    check_dataset(dataset)  # before a recursive listing of whatever a typo names
    root = dataset.path()
    infos = listing(dataset, root, recursive=True)  # no link followed (local, as root)
    by_collection: dict[str, list[Any]] = {}
    for info in infos:
        # a FIFO (any other kind) is listed too: at a manifest's name it is damage, not
        # "no manifest" (_collection_row reads only plain files)
        if info.type == pafs.FileType.Directory:
            continue
        rel = info.path[len(root) + 1 :] if root else info.path
        parts = rel.split("/")
        if (
            len(parts) < 3
            or not parts[0].startswith(f"{BENCHMARK}=")
            or not parts[1].startswith(f"{COLLECTION_ID}=")
            or any(p.startswith((".", "_")) for p in parts)
        ):
            continue
        by_collection.setdefault("/".join(parts[:2]), []).append(("/".join(parts[2:]), info))
    written: set[str] = set()
    # the damaged collections' rows go as stale ones do: counted apart
    damaged: set[str] = set()
    markers: set[str] = set()
    skipped: list[tuple[str, str]] = []
    for done, (prefix, entries) in enumerate(sorted(by_collection.items()), 1):
        if progress is not None:
            progress(done - 1, len(by_collection))
        names = {rel for rel, _ in entries}
        if MANIFEST_NAME not in names:
            continue  # a push under way, or a failed one: not published
        try:
            row = _collection_row(dataset, prefix, entries, pages=pages)
        except _Damaged as err:
            skipped.append((dataset.where(prefix), str(err)))
            value = prefix.rsplit("=", 1)[-1]
            damaged.update((value, unquote(value)))
            markers.add(_marker(prefix))
            damaged_marker(dataset, prefix, str(err))
            continue
        write_index_row(dataset, row, row[COLLECTION_ID])
        written.add(row[COLLECTION_ID])
    if progress is not None:
        progress(len(by_collection), len(by_collection))
    removed = 0
    base = dataset.path(INDEX_DIR)
    for info in listing(dataset, base):
        stem = info.base_name.removesuffix(".parquet")
        stale = stem not in written and not stem.startswith((".", "_"))
        if info.type == pafs.FileType.File and info.base_name.endswith(".parquet") and stale:
            delete(dataset, f"{INDEX_DIR}/{info.base_name}")  # no link followed
            removed += stem not in damaged
    # markers of collections whole again (indexed now) or deleted since
    for info in listing(dataset, dataset.path(DAMAGED_DIR)):
        ours = info.base_name.endswith(".json") and not info.base_name.startswith((".", "_"))
        marker = f"{DAMAGED_DIR}/{info.base_name}"
        if info.type == pafs.FileType.File and ours and marker not in markers:
            delete(dataset, marker)
    return Reindexed(len(written), removed, skipped)
