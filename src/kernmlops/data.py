"""Read collections back as polars DataFrames.

A collection is a folder with a ``manifest.json`` and one sub-folder of Parquet parts per
table. Curated data lays collections out Hive-style, so whole fleets read at once::

    <root>/benchmark=<b>/collection_id=<id>/manifest.json
    <root>/benchmark=<b>/collection_id=<id>/<table>/part-00000.parquet

Examples (in a notebook)::

    from kernmlops.data import count_rows, len64, read_collection, read_parquet_dir

    c = read_collection("data/curated/benchmark=faux/collection_id=4f0c")
    c["block_io"].describe()

    io = read_parquet_dir("data/curated", "block_io")          # every collection
    io.group_by("benchmark", "collection_id").len()
    lazy = read_parquet_dir("data/curated", "block_io", lazy=True)

    big = read_collection("data/curated/benchmark=storm/collection_id=9a1e", lazy=True)
    big["quanta_runtime"].group_by("pid").agg(len64()).collect(engine="streaming")
    count_rows(big["quanta_runtime"])    # past 2^32 rows too, where pl.len() fails

    c["block_io"].with_columns(at=c.wall_clock())   # ts_uptime_us as UTC datetimes

Only finished parts (``part-*.parquet``) are read; an interrupted writer's temporary files
(``.part-*.parquet.tmp``) are never opened. Each part is opened once, without waiting (a
FIFO put at a part's name, even right after it was listed, is refused, never waited on),
a plain file only, and read through that descriptor: a table is what was opened.

A collection whose collector died (its manifest still says ``state: running``), or one
still being collected, is read as far as it was flushed, with a warning; its
``Collection.complete`` is False.

``read_collection`` and ``read_parquet_dir``, into memory or lazy, check every page of
every part against its checksum before polars reads it (kernmlops.collect.pagecheck;
polars checks none): a byte damaged inside a page, the footer whole, is a part refused
by name, never wrong values. The check reads each part's column chunks and decodes
nothing (a tenth of a decode's cost); ``pages=False`` leaves it out (a lazy read's
footers only: ``LazyCollection.read`` too, its parts held by the scan, not reopened).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, TypeVar, overload
from urllib.parse import unquote, urlsplit

import polars as pl

from kernmlops.collect.manifest import (
    FINAL_STATES,
    MANIFEST_NAME,
    Manifest,
    manifest_time,
    read_manifest,
)
from kernmlops.errors import CollectionError, EmptyCollectionError, KernmlopsWarning
from kernmlops.host.fdlimit import raise_fd_limit
from kernmlops.tables import BENCHMARK, COLLECTION_ID

if TYPE_CHECKING:
    from kernmlops.host.pinned import Pinned

__all__ = [
    "Collection",
    "IncompleteCollectionWarning",
    "LazyCollection",
    "count_rows",
    "len64",
    "list_collections",
    "read_collection",
    "read_parquet_dir",
    "wall_clock",
]


class IncompleteCollectionWarning(KernmlopsWarning):
    """Not all of the collection is read: its collector did not finish (killed,
    crashed: read as far as flushed) or is still collecting, rows are still in its spool,
    or a table its manifest counts rows in has no part left."""


_PART = re.compile(r"^part-(\d+)\.parquet$")
_TEMP_GLOB = ".part-*.parquet.tmp"
_BENCHMARK_PREFIX = f"{BENCHMARK}="
_COLLECTION_PREFIX = f"{COLLECTION_ID}="


F = TypeVar("F", pl.DataFrame, pl.LazyFrame)
#: what read_collection does with a table it cannot read: refuse the collection, or
#: leave the table out (named)
Damaged = Literal["raise", "skip"]


@dataclass(frozen=True, eq=False, repr=False)
class _Tables(Mapping[str, F]):
    """What a collection read and a collection scanned share: the folder, the manifest,
    the tables by name, their part files."""

    path: Path
    manifest: Manifest
    tables: dict[str, F]
    files: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    incomplete: tuple[str, ...] = ()
    #: tables left out because a part of theirs could not be read (``damaged="skip"``),
    #: with the reason
    damaged: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A hand-built Collection (tests, notebooks) may pass the manifest as a dict.
        if not isinstance(self.manifest, Manifest):
            object.__setattr__(self, "manifest", Manifest.model_validate(self.manifest))

    def __getitem__(self, name: str) -> F:
        try:
            return self.tables[name]
        except KeyError:
            available = ", ".join(sorted(self.tables)) or "none"
            raise KeyError(
                f"no table {name!r} in collection {self.path} (tables: {available})"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.tables

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    # Mapping's __eq__ would compare DataFrames cell by cell: a collection is itself.
    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    @property
    def collection_id(self) -> str:
        """The manifest's ``collection_id``, else the folder's (``collection_id=<id>``)."""
        if self.manifest.collection_id:
            return self.manifest.collection_id
        name = self.path.name
        return unquote(name.removeprefix(_COLLECTION_PREFIX))

    @property
    def complete(self) -> bool:
        """The collector finished and finalised the manifest (False after a crash)."""
        return self.manifest.complete

    @property
    def benchmark(self) -> str | None:
        """The manifest's benchmark name, else the parent folder's (``benchmark=<b>``)."""
        if self.manifest.benchmark is not None and self.manifest.benchmark.name:
            return self.manifest.benchmark.name
        parent = self.path.parent.name
        if parent.startswith(_BENCHMARK_PREFIX):
            return unquote(parent.removeprefix(_BENCHMARK_PREFIX))
        return None

    def wall_clock(self, column: str = "ts_uptime_us") -> pl.Expr:
        """``column`` (CLOCK_MONOTONIC µs) as wall-clock time: see :func:`wall_clock`."""
        return wall_clock(self.manifest, column)


#: clock readings a manifest may hold: nanoseconds that fit polars' Int64 with a
#: table's own times (about 146 years of uptime) added
_CLOCK_NS_MAX = 2**62


def wall_clock(manifest: Manifest, column: str = "ts_uptime_us") -> pl.Expr:
    """An expression turning ``column`` (CLOCK_MONOTONIC µs, as every table's
    ``ts_uptime_us``) into wall-clock time (``Datetime("us", "UTC")``).

    From the manifest's ``clock`` pairs: CLOCK_MONOTONIC and CLOCK_REALTIME read back to
    back at the collection's start and stop (within ``uncertainty_ns``, a few µs). Between
    them the two offsets are interpolated (they differ only where the wall clock was
    stepped, or the machine suspended, during the collection); before the start and
    after the stop the nearer one holds. A manifest written before the pairs were
    recorded has only ``system.boot_time_unix``, whole seconds: its conversion is
    that coarse (off by up to a second, more after a clock step since boot).

    Raises:
        CollectionError: the manifest has neither, or a damaged one (a time no clock reads).
    """
    ts = pl.col(column).cast(pl.Int64) * 1000  # ns
    clock = manifest.clock
    pairs = [p for p in (clock.start, clock.stop) if p is not None] if clock else []
    for name in ("start", "stop"):
        pair = getattr(clock, name) if clock else None
        if pair is not None and not all(
            0 <= v < _CLOCK_NS_MAX for v in (pair.monotonic_ns, pair.realtime_ns)
        ):
            # damaged or hand-edited: polars would give nulls, or wrap past 2262
            raise CollectionError(
                f"the manifest's clock.{name} holds a time no clock reads (monotonic_ns "
                f"and realtime_ns must be 0 to 2**62): its timestamps cannot be turned "
                "into wall-clock time"
            )
    if pairs:
        first, last = pairs[0], pairs[-1]
        off0 = first.realtime_ns - first.monotonic_ns
        off1 = last.realtime_ns - last.monotonic_ns
        span = last.monotonic_ns - first.monotonic_ns
        if span > 0 and off1 != off0:
            share = ((ts - first.monotonic_ns) / span).clip(0, 1)
            offset = pl.lit(off0) + (share * (off1 - off0)).round().cast(pl.Int64)
        else:
            offset = pl.lit(off0)
        wall_ns = ts + offset
    else:
        boot = (manifest.system or {}).get("boot_time_unix")
        if boot is None:
            raise CollectionError(
                "the manifest records no clock pair and no system.boot_time_unix: "
                "its timestamps cannot be turned into wall-clock time"
            )
        if (
            isinstance(boot, bool)
            or not isinstance(boot, int | float)
            or not 0 <= boot < _CLOCK_NS_MAX // 1_000_000_000  # NaN fails this too
        ):
            raise CollectionError(
                f"the manifest's system.boot_time_unix is {str(boot)[:40]!r}, not a time in "
                "seconds since 1970: its timestamps cannot be turned into wall-clock time"
            )
        wall_ns = ts + int(boot) * 1_000_000_000
    return pl.from_epoch(wall_ns // 1000, time_unit="us").dt.replace_time_zone("UTC").alias(column)


class Collection(_Tables[pl.DataFrame]):
    """One collection read into memory; a mapping of table name -> DataFrame
    (``keys()``, ``items()``, ``in``, ``get()``).

    Attributes:
        path: the collection folder.
        manifest: the parsed ``manifest.json`` (typed; ``manifest["key"]`` works too).
        tables: every table, all its parts concatenated in part order.
        files: the part files each table was read from.
        incomplete: tables with unfinished temporary parts (an interrupted writer); their
            finished parts, if any, are in ``tables``.
    """

    def scan(self, name: str) -> pl.LazyFrame:
        """Table ``name`` as a LazyFrame (the table read: no part is opened by its
        name again)."""
        return self[name].lazy()

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}: {frame.height} rows" for name, frame in self.tables.items())
        return f"Collection({str(self.path)!r}, {{{shapes}}})"


class LazyCollection(_Tables[pl.LazyFrame]):
    """One collection scanned, not read: a mapping of table name -> LazyFrame over its
    part files, read only when collected (``engine="streaming"`` for tables larger
    than memory). Each LazyFrame holds the part files it was opened on: a file
    swapped or linked since is not read. Attributes as :class:`Collection`'s."""

    def scan(self, name: str) -> pl.LazyFrame:
        """Table ``name`` (``c.scan(name)`` is ``c[name]``, as for a Collection)."""
        return self[name]

    def read(self, name: str) -> pl.DataFrame:
        """Table ``name`` read into memory, and no other (CollectionError where a part
        cannot be read, or the table does not fit in the memory left)."""
        folder = self.path / name
        _fits(folder, {name: self[name]}, lazy_call=f"read_collection(path, lazy=True)[{name!r}]")
        with reading(folder, name):
            return self[name].collect()

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}: {len(self.files[name])} parts" for name in self.tables)
        return f"LazyCollection({str(self.path)!r}, {{{parts}}})"


@overload
def read_collection(
    path: str | Path,
    *,
    lazy: Literal[False] = False,
    damaged: Damaged = "raise",
    pages: bool | None = None,
) -> Collection: ...
@overload
def read_collection(
    path: str | Path, *, lazy: Literal[True], damaged: Damaged = "raise", pages: bool | None = None
) -> LazyCollection: ...
def read_collection(
    path: str | Path, *, lazy: bool = False, damaged: Damaged = "raise", pages: bool | None = None
) -> Collection | LazyCollection:
    """Read the collection in folder ``path`` (or the folder of a ``manifest.json``).

    ``lazy``: scan it instead (a :class:`LazyCollection`: each table a LazyFrame that
    reads its parts only when collected), for collections larger than memory, e.g.
    ``read_collection(p, lazy=True)["quanta_runtime"].group_by("pid").agg(...)
    .collect(engine="streaming")``. Every page of every part is checked against its
    checksum first, lazy or not (a byte damaged inside a page leaves the footer whole,
    and polars checks no checksum): a part that fails is refused, named. The check reads
    the parts' column chunks and decodes no value.

    ``damaged="skip"``: a table with a part that cannot be read (lazy: the first) is
    left out, named in an IncompleteCollectionWarning and in ``damaged``, and the rest
    is read (what `graph` and `report` do: one damaged table hides no other).

    ``pages``: check every page of every part against its checksum (None, the default,
    or True: always; lazy, on the parts the scans hold: `graph` and `report` draw no
    figure from wrong values). ``pages=False``: no page checked; a lazy read then reads
    each table's first part's footer (its schema) only, a later part's damage found
    when the scan is collected, and a page's checksum never.

    Raises:
        CollectionError: the folder does not exist, has no valid manifest, has no finished
            Parquet part, or a part cannot be read or has a page that fails its checksum or
            does not decode (``pages=False``, lazy: the first part's footer; unless
            skipped).
            EmptyCollectionError (a CollectionError) where it has no part because it
            recorded no row: its collector finished and its manifest counts none.
    """
    return _read_held(_local_folder(path), lazy, damaged, pages is not False)


def _local_folder(path: str | Path) -> Path:
    """``path`` as the local folder it names (``~`` expanded). A URI (``scheme://...``,
    as push takes a dataset's) is refused in one line that shows it as given: these
    readers read local folders only (a Path would make ``s3://b/p`` the folder
    ``s3:/b/p``)."""
    text = os.fspath(path)
    if isinstance(text, str) and "://" in text:
        scheme = text.partition("://")[0]
        if scheme.lower() == "file":
            local = unquote(urlsplit(text).path) or "/"
            raise CollectionError(f"{text}: a URI: name its folder instead ({local})")
        raise CollectionError(
            f"{text}: a URI: collections are read from local folders only (copy the "
            "dataset here first, or query it where it is with DuckDB or Spark)"
        )
    return Path(text).expanduser()


def _spooled(path: Path, folder: Path) -> str:
    """What a message adds about rows still in the spool of the collection in
    ``folder`` (``path`` names it), or ""."""
    from kernmlops.spool.recovery import pending_spools

    if not pending_spools(folder):
        return ""
    return f"; rows still in its spool are not read: `kernmlops recover {path}` adds them"


def _no_tables(
    path: Path,
    manifest: Manifest,
    files: Mapping[str, list[Path]],
    incomplete: list[str],
    spooled: str,
) -> None:
    """CollectionError where the collection has no finished part:
    EmptyCollectionError where it has none because it recorded none (its collector
    finished, its manifest counts no row, nothing is left unfinished or spooled)."""
    if files:
        return
    pid = manifest.live_collector()
    if pid is not None:
        raise CollectionError(
            f"{path}: no Parquet tables yet: still being collected (collector pid {pid}), "
            "its first flush is still to come"
        )
    if not incomplete and not spooled and _recorded_nothing(manifest):
        raise EmptyCollectionError(
            f"{path}: the collection recorded no rows ({_how_it_went(manifest)})"
        )
    why = (
        f"; only unfinished temporary parts in {', '.join(incomplete)} (the writer was interrupted)"
        if incomplete
        else ""
    )
    raise CollectionError(f"{path}: no Parquet tables (no <table>/part-*.parquet){why}{spooled}")


def _recorded_nothing(manifest: Manifest) -> bool:
    """Whether ``manifest`` is a finished collector's that counts no row in any table
    (a collector that died keeps ``running``: what it recorded is unknown)."""
    return (
        manifest.state in FINAL_STATES
        and not any(t.rows for t in manifest.tables.values())
        and not any(n for h in manifest.hooks.values() for n in h.rows.values())
    )


def _how_it_went(manifest: Manifest) -> str:
    """``completed after 0.18 s; block_io: 0 events, cpu_profile: not attached (why)``."""
    ended = str(manifest.state)
    if manifest.duration_s is not None:
        ended += f" after {manifest.duration_s:.1f} s"  # as collect said it
    hooks = [
        f"{name}: {h.events:,} event{'' if h.events == 1 else 's'}"
        if h.attached
        else f"{name}: not attached" + (f" ({h.reason})" if h.reason else "")
        for name, h in manifest.hooks.items()
    ]
    return f"{ended}; {', '.join(hooks) if hooks else 'no hook'}"


def _collection(
    path: Path,
    manifest: Manifest,
    tables: Mapping[str, pl.DataFrame] | Mapping[str, pl.LazyFrame],
    files: Mapping[str, list[Path]],
    incomplete: list[str],
    spooled: str,
    *,
    lazy: bool,
    stacklevel: int,
    damaged: Mapping[str, str] | None = None,
) -> Collection | LazyCollection:
    """The Collection read (``lazy``: the LazyCollection scanned), warning where its
    collector did not finish, rows are still in its spool, a table is gone or was left
    out as ``damaged`` (``stacklevel``: read_collection's caller's, from here)."""
    damaged = dict(damaged or {})
    for why in damaged.values():
        warnings.warn(f"{why}: the table is left out", IncompleteCollectionWarning,
                      stacklevel=stacklevel)  # fmt: skip
    pid = manifest.live_collector()
    if pid is not None:
        warnings.warn(
            f"{path}: still being collected (collector pid {pid}): reading what was flushed "
            f"so far (last flush {manifest.last_flush_at or 'none yet'})",
            IncompleteCollectionWarning,
            stacklevel=stacklevel,
        )
    elif manifest.state == "running":
        warnings.warn(
            f"{path}: incomplete collection: its collector stopped without finishing "
            f"(last flush {manifest.last_flush_at or 'never'}); reading what was flushed{spooled}",
            IncompleteCollectionWarning,
            stacklevel=stacklevel,
        )
    elif spooled:
        warnings.warn(f"{path}: {spooled[2:]}", IncompleteCollectionWarning, stacklevel=stacklevel)
    # a table the manifest counts rows in, with no part left (a folder deleted or moved)
    gone = {t: r.rows for t, r in manifest.tables.items()
            if r.rows and t not in files and t not in damaged}  # fmt: skip
    if gone:
        named = ", ".join(f"{t} ({n:,} rows)" for t, n in sorted(gone.items()))
        warnings.warn(
            f"{path}: tables its manifest counts rows in have no part here: {named}",
            IncompleteCollectionWarning,
            stacklevel=stacklevel,
        )
    kind = LazyCollection if lazy else Collection
    return kind(
        path=path,
        manifest=manifest,
        tables=dict(tables),
        files={name: tuple(parts) for name, parts in files.items() if name not in damaged},
        incomplete=tuple(incomplete),
        damaged=damaged,
    )


def _read_held(
    path: Path, lazy: bool, damaged: Damaged, pages: bool
) -> Collection | LazyCollection:
    """read_collection, for every user: the folder is held open and each part opened
    once, without waiting, a plain file only (a FIFO another user put at a part's
    name, even right after it was listed, is refused in one line: scanned by name, it
    hung the reader), and each table scanned on the files opened (polars holds its
    own descriptor of each): ``lazy`` or not, no part is opened by name again.

    As root (sudo or not), the collection (or a folder above it) may be a user's: a
    user could link a part, a table folder or the manifest to a root-only file and
    have root draw it into their PNGs. The folder is held as kernmlops.host.pinned
    holds one (a link in a folder a user can change refuses it) and every file in it
    opened without following a link another user made (root's own in a folder only
    root changes, or under sudo the invoker's, followed with their rights:
    kernmlops.host.pinned.may_follow); a link refused, or a hard link to a file of
    another owner, is refused in one line naming it. Without root links are followed
    as usual."""
    from kernmlops.errors import OutputError
    from kernmlops.host.invoker import invoker
    from kernmlops.host.pinned import pin

    raise_fd_limit()  # a lazy table holds a descriptor per part until collected
    as_root = os.geteuid() == 0
    with contextlib.suppress(OSError):
        # as root a linked manifest.json is no collection's (pin refuses the link)
        st = os.stat(path, follow_symlinks=not as_root)
        if path.name == MANIFEST_NAME and stat.S_ISREG(st.st_mode):
            path = path.parent
    who = invoker()
    uid = who.uid if who else None
    try:
        held = pin(path, invoker_uid=uid, what="the collection", action="read")
    except OutputError as err:  # worded as read_collection words them without sudo
        reason = getattr(err, "reason", "")
        named = not as_root or not path.is_symlink()  # as root, a link's refusal says why
        if reason == "no such folder" and named:
            raise CollectionError(f"{path}: no such collection folder") from None
        if reason.startswith("a file is in the way") and named:
            raise CollectionError(f"{path}: not a folder (a collection is a folder)") from None
        raise CollectionError(str(err)) from None
    try:
        with _closing_fds() as fds:
            manifest = _held_manifest(held, path)
            files, opened, incomplete = _held_tables(held, path, uid, fds)
            spooled = _spooled(path, held.io)
            _no_tables(path, manifest, files, incomplete, spooled)
            scans = {name: _held_scan(fds_) for name, fds_ in opened.items()}
            bad: dict[str, str] = {}
            if not lazy:  # what cannot fit is refused before a page is read
                _fits(path, scans)
            if pages:  # every page checked (polars checks no page checksum)
                bad = _damaged_pages(path, files, opened, damaged)
                scans = {name: scan for name, scan in scans.items() if name not in bad}
            tables, unread = _tables(path, scans, lazy, damaged, fitted=True)
            bad |= unread
    finally:
        held.close()
    return _collection(path, manifest, tables, files, incomplete, spooled, lazy=lazy,
                       stacklevel=4, damaged=bad)  # fmt: skip


def _damaged_pages(
    path: Path,
    files: Mapping[str, list[Path]],
    opened: Mapping[str, list[int]],
    damaged: Damaged = "raise",
) -> dict[str, str]:
    """The tables of the collection in ``path`` with a part whose pages fail their
    checksums or do not decode (kernmlops.collect.pagecheck), each with the first such
    part named; ``files`` and ``opened``: each table's parts and their descriptors
    (_held_tables). ``damaged="raise"``: the first one's CollectionError instead.
    """
    bad: dict[str, str] = {}
    # one part after another: the check is page headers parsed in Python (the GIL), so
    # threads made it slower (a 2,160-part collection: 2.6-2.9 s on 2 threads, 2.3-2.5
    # s on one), and a table's first damaged part ends its check
    for name, parts in files.items():
        for part, fd in zip(parts, opened[name], strict=True):
            why = _part_damage(fd)
            if why is not None:
                err = f"{path / name}: cannot read table {name!r}: {part.name} is damaged: {why}"
                if damaged == "raise":
                    raise CollectionError(err)
                bad[name] = err
                break
    return bad


def _part_damage(fd: int) -> str | None:
    """pagecheck.page_damage of the part open on ``fd``, read through a descriptor of
    its own (the file opened, not its name: nothing swapped in since is read; and no
    offset shared with the scans made on ``fd``)."""
    import pyarrow as pa

    from kernmlops.collect.pagecheck import page_damage

    try:
        source = pa.OSFile(f"/proc/self/fd/{fd}")
    except OSError as err:
        return f"not read ({_why(err)})"
    with source:
        return page_damage(source)


def _held_manifest(held: Pinned, path: Path) -> Manifest:
    """The manifest of the held collection folder ``held`` (``path`` names it), read
    through it and checked as read_manifest reads and checks one.

    Raises:
        CollectionError: worded as read_manifest words it, naming ``path``.
    """
    from kernmlops.collect.manifest import parse_manifest
    from kernmlops.spool.collection import read_manifest_bytes

    manifest_path = path / MANIFEST_NAME
    try:
        text = read_manifest_bytes(held.io, owner=held.owner).decode("utf-8")
    except FileNotFoundError:
        raise CollectionError(
            f"{manifest_path}: no manifest ({_where_collections_are(path)})"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise CollectionError(f"{manifest_path}: cannot read the manifest: {_why(err)}") from None
    return parse_manifest(text, manifest_path)


def _where_collections_are(path: Path) -> str:
    """What a message says of ``path``, a folder without a manifest: the collection it
    is a table folder of, or the collections it holds (a curated root, a data folder,
    a ``benchmark=<b>`` folder), to name one of; else the question whether it is one."""
    with contextlib.suppress(OSError):
        if (path.parent / MANIFEST_NAME).is_file():
            return f"{path} is a table of the collection {path.parent}: name the collection"
    try:
        found = _collections(path, required=False)
    except (CollectionError, OSError):
        found = []
    if found:
        many = f"{len(found)} collections" if len(found) > 1 else "a collection"
        return f"{path} holds {many}: name one, e.g. {found[0][2]}"
    return f"is {path} a collection folder?"


def _held_tables(
    held: Pinned,
    path: Path,
    uid: int | None,
    fds: list[int],
    only: str | None = None,
    names: re.Pattern[str] = _PART,
) -> tuple[dict[str, list[Path]], dict[str, list[int]], list[str]]:
    """The tables of the held collection folder ``held`` (``path`` names it), each
    table folder and part opened as _read_held says (their descriptors appended to
    ``fds``, for the caller to close once scanned): per table the parts as named and
    their descriptors, and the tables with unfinished parts. ``only``: that
    table alone. ``names``: what a part is called (a pattern without a part number
    orders them by name: KernMLOps' own layout, kernmlops.data_import)."""
    from kernmlops.errors import OutputError
    from kernmlops.host.pinned import may_follow, pin_in

    files: dict[str, list[Path]] = {}
    opened: dict[str, list[Path]] = {}
    incomplete: list[str] = []
    for entry in sorted(os.scandir(held.io), key=lambda e: e.name):
        if entry.name.startswith((".", "_")) or not entry.is_dir(follow_symlinks=True):
            continue
        if only is not None and entry.name != only:
            continue
        if entry.is_symlink():
            st = os.stat(entry.name, dir_fd=held.fd, follow_symlinks=False)
            if not may_follow(st, os.fstat(held.fd), uid):
                raise CollectionError(_refused(path / entry.name, "a link"))
            try:  # followed as pin follows one: its target walked, held
                linked = pin_in(held.fd, entry.name, path / entry.name, invoker_uid=uid)
            except OutputError as err:
                raise CollectionError(str(err)) from None
            table = os.dup(linked.fd)
            linked.close()
        else:
            try:
                table = os.open(entry.name, _HELD_DIR, dir_fd=held.fd)
            except OSError as err:  # swapped for a link since it was listed
                raise CollectionError(_refused(path / entry.name, _why(err))) from None
        fds.append(table)
        parts = []
        owner = os.fstat(table).st_uid
        for part in os.scandir(f"/proc/self/fd/{table}"):
            match = names.match(part.name)
            if match:
                shown = path / entry.name / part.name
                fd = _open_part(part.name, table, owner, shown, uid)
                if fd is not None:
                    fds.append(fd)
                    number = int(match.group(1)) if names.groups else 0
                    parts.append((number, part.name, fd))
            elif fnmatch(part.name, _TEMP_GLOB) and entry.name not in incomplete:
                incomplete.append(entry.name)
        if parts:
            parts.sort()
            files[entry.name] = [path / entry.name / name for _, name, _ in parts]
            opened[entry.name] = [fd for _, _, fd in parts]
    return files, opened, incomplete


@contextlib.contextmanager
def _held_collection(path: Path) -> Iterator[tuple[Pinned, int | None]]:
    """``path`` held open for reading (kernmlops.host.pinned.pin, the
    invoker's uid under sudo); its refusals as CollectionError."""
    from kernmlops.errors import OutputError
    from kernmlops.host.invoker import invoker
    from kernmlops.host.pinned import pin

    who = invoker()
    uid = who.uid if who else None
    try:
        held = pin(path, invoker_uid=uid, what="the collection", action="read")
    except OutputError as err:
        raise CollectionError(str(err)) from None
    try:
        yield held, uid
    finally:
        held.close()


#: a collection's table parts kept open for their page check (_scan_table_held):
#: its folder, the parts' paths and descriptors by table
_Kept = tuple[Path, dict[str, list[Path]], dict[str, list[int]]]


def _scan_table_held(
    folder: Path, table: str, *, keep: list[_Kept] | None = None
) -> tuple[pl.LazyFrame | None, str | None]:
    """``table`` of the collection in ``folder`` scanned on its parts opened through
    held folders (None where it has no finished part): no part is opened by name
    again, and as root no link a user planted is followed, now or when the scan is
    collected; and why the collection is not whole (:func:`_not_whole`) where it
    has the table. ``keep``: a descriptor of each part, the one the scan was made on,
    is appended to it for a page check later (:func:`_damaged_pages`; the caller
    closes them), so the pages checked are those read."""
    with _held_collection(folder) as (held, uid), _closing_fds() as fds:
        files, opened, _ = _held_tables(held, folder, uid, fds, only=table)
        if table not in opened:
            return None, None
        scan = _held_scan(opened[table])
        with reading(folder / table, table):
            scan.collect_schema()
        if keep is not None:  # a table whose footer reads
            kept = [os.dup(fd) for fd in opened[table]]
            keep.append((folder, {table: files[table]}, {table: kept}))
        return scan, _not_whole(_manifest_or_why(folder, held), held.io)


def _unread(err: Exception, folder: Path) -> str:
    """Why the manifest of the collection in ``folder`` did not read: none there (a
    copy or push under way, as it lands last), or the reader's reason."""
    if isinstance(err, FileNotFoundError):
        return "no readable manifest: a copy or push under way?"
    why = str(err)
    for prefix in (f"{folder / MANIFEST_NAME}: ", f"{folder}: "):
        why = why.removeprefix(prefix)
    return f"manifest not read: {why}"


def _manifest_or_why(folder: Path, held: Pinned) -> Manifest | str:
    """The manifest of the collection in ``folder`` (read through ``held``, its folder
    held open), or why it cannot be read."""
    try:
        return _held_manifest(held, folder)
    except CollectionError as err:
        if not (held.io / MANIFEST_NAME).exists():
            return _unread(FileNotFoundError(), folder)
        return _unread(err, folder)


def _not_whole(manifest: Manifest | str, folder: Path) -> str | None:
    """Why the collection in ``folder`` (its ``manifest``, or why it has none that
    reads) is not whole, as read_collection warns of it; None where it is."""
    from kernmlops.spool.recovery import pending_spools

    if isinstance(manifest, str):
        return manifest
    pid = manifest.live_collector()
    if pid is not None:
        return f"still being collected, collector pid {pid}"
    why = ["its collector stopped without finishing"] if manifest.state == "running" else []
    if pending_spools(folder):
        why.append("rows still in its spool: `kernmlops recover` adds them")
    return "; ".join(why) or None


def _manifest_and_tables_held(folder: Path) -> tuple[Manifest | None, list[str]]:
    """As root, the manifest of the collection in ``folder`` (None where it cannot be
    read or parsed) and its tables with finished parts, read through held folders (a
    table with a part refused is not one of them)."""
    with _held_collection(folder) as (held, uid):
        try:
            manifest: Manifest | None = _held_manifest(held, folder)
        except CollectionError:
            manifest = None
        tables: list[str] = []
        names = sorted(e.name for e in os.scandir(held.io) if not e.name.startswith((".", "_")))
        for name in names:
            # one table at a time: a part refused (a link, a FIFO) leaves out its table,
            # not the manifest and every other table (state and tables were null and [])
            with _closing_fds() as fds, contextlib.suppress(CollectionError):
                tables += _held_tables(held, folder, uid, fds, only=name)[0]
        return manifest, sorted(tables)


@contextlib.contextmanager
def _closing_fds() -> Iterator[list[int]]:
    """A list for the descriptors a block opens, each closed when the block ends
    (a scan made on them holds its own)."""
    fds: list[int] = []
    try:
        yield fds
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


_HELD_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_part(name: str, table: int, owner: int, shown: Path, uid: int | None) -> int | None:
    """A part opened once, without waiting (kernmlops.host.pinned.open_plain), a plain
    file only (a FIFO would wait for a writer for ever); as root without following a
    link another user made (``uid``: the invoker under sudo), and not a second name of
    a file of another owner than the table folder's (``owner``: a hard link the user
    made to root's file). Else CollectionError."""
    from kernmlops.errors import OutputError
    from kernmlops.host.pinned import open_plain

    try:
        fd = open_plain(table, name, shown, invoker_uid=uid)
    except FileNotFoundError:
        return None  # compacted meanwhile
    except OutputError as err:  # the folders a link leads through, refused
        raise CollectionError(str(err)) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CollectionError(_refused(shown, "a link")) from None
        # not a link: the file's own reason (EMFILE once said "as root ... no link")
        hint = " (raise the open-file limit: ulimit -n)" if err.errno == errno.EMFILE else ""
        raise CollectionError(f"{shown}: {_why(err)}: not read{hint}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CollectionError(f"{shown}: not a plain file: not read")
    if st.st_nlink != 1 and st.st_uid != owner and os.geteuid() == 0:
        os.close(fd)
        raise CollectionError(_refused(shown, "a hard link to a file of another owner"))
    return fd


def _refused(shown: Path, kind: str) -> str:
    if os.geteuid() != 0:  # no link refused: the file's own reason
        return f"{shown}: {kind}: not read"
    return (
        f"{shown}: {kind}: as root, kernmlops reads no link in a collection a user can "
        "change (name the file itself, or read it as its owner, not as root)"
    )


def _why(err: OSError | UnicodeDecodeError) -> str:
    if isinstance(err, OSError):
        return "a link" if err.errno == errno.ELOOP else (err.strerror or str(err))
    return "not UTF-8 text"  # the codec's byte and position say nothing to a user


def read_parquet_dir(
    path: str | Path,
    table: str,
    *,
    lazy: bool = False,
    damaged: Damaged = "raise",
    pages: bool | None = None,
) -> pl.DataFrame | pl.LazyFrame:
    """Read ``table`` from every collection under a curated folder.

    ``path`` is the root (holding ``benchmark=<b>/collection_id=<id>/`` folders), the
    data folder holding it as ``curated/`` (as push takes it), one ``benchmark=<b>``
    folder, or one ``collection_id=<id>`` folder inside one. The result
    starts with ``benchmark`` and ``collection_id`` columns, taken from the folder names (as
    Hive readers such as DuckDB and Spark do), followed by the table's columns. Collections
    whose schemas differ (an older kernmlops) are combined diagonally: missing columns are
    null and numeric types widen. Collections read that are not whole (still collected,
    their collector dead, rows left in their spool, no readable manifest: a copy or a
    push under way) are read as far as they are and named in one
    :class:`IncompleteCollectionWarning`.

    Every page of every part is checked against its checksum first, lazy or not (a
    byte damaged inside a page, which the footer cannot show; polars checks none),
    unless ``pages=False``: then a lazy read checks each collection's first footer only.

    Args:
        path: the folder to read.
        table: the table name (its sub-folder in each collection).
        lazy: return a ``LazyFrame`` that reads nothing until collected.
        damaged: ``"raise"``: a collection whose table cannot be read (a part damaged)
            fails the read, naming the part. ``"skip"``: it is left out, named in an
            :class:`IncompleteCollectionWarning` of its own, and the others are read.
        pages: check every page against its checksum (None, the default, or True);
            ``False``: no page checked.

    Raises:
        CollectionError: ``path`` holds no collections, or none has ``table`` (or,
            ``damaged="skip"``, every one that has it is damaged); ``damaged="raise"``:
            a part of it cannot be read.
    """
    root = _local_folder(path)
    collections = _collections(root)
    raise_fd_limit()  # each collection's scan holds a descriptor per part until collected
    kept: list[_Kept] = []  # each part opened once: its pages are checked as opened
    check = pages is not False
    try:
        scans, partial, skipped = _scan_collections(
            collections, table, damaged, keep=kept if check else None
        )
        if not lazy and scans:
            # what cannot fit is refused before a page is read (every footer was)
            whole = {table: _combined([scan for _, scan in scans])}
            _fits(root, whole, lazy_call=f"read_parquet_dir(path, {table!r}, lazy=True)")
            del whole
        if check and scans:  # every page checked (polars checks no page checksum)
            bad: set[Path] = set()
            for folder, files, opened in kept:
                try:
                    _damaged_pages(folder, files, opened)
                except CollectionError as err:
                    if damaged == "raise":
                        raise
                    skipped.append(_skip(folder, str(err)))
                    bad.add(folder)
            scans = [(folder, scan) for folder, scan in scans if folder not in bad]
    finally:
        for _, _, opened in kept:
            for fds in opened.values():
                for fd in fds:
                    os.close(fd)
    for line in skipped:  # each named as it is left out
        warnings.warn(line, IncompleteCollectionWarning, stacklevel=2)
    if not scans:
        damaged_too = f" ({len(skipped)} damaged, skipped)" if skipped else ""
        raise CollectionError(
            f"{root}: no table {table!r} in any of its {len(collections)} collection(s)"
            f"{damaged_too}"
        )
    if partial:
        warnings.warn(
            f"{root}: {len(partial)} of the {len(scans)} collections read are not whole "
            f"(read as far as they are): {', '.join(partial)}",
            IncompleteCollectionWarning,
            stacklevel=2,
        )
    frame = _combined([scan for _, scan in scans])
    if lazy:
        return frame
    if damaged == "raise":
        with reading(root, table):
            return frame.collect()
    # each collection collected alone: one whose damage only decoding finds (a part
    # written without checksums) is left out, not the read
    read = []
    for folder, scan in scans:
        try:
            with reading(folder / table, table):
                read.append(scan.collect())
        except CollectionError as err:
            skipped.append(_skip(folder, str(err)))
            warnings.warn(skipped[-1], IncompleteCollectionWarning, stacklevel=2)
    if not read:
        raise CollectionError(
            f"{root}: no table {table!r} read: each of the {len(skipped)} collection(s) "
            "that have it is damaged (skipped)"
        )
    return _combined(read)


def _combined(frames: Sequence[F]) -> F:
    """``frames`` (one table's, a frame per collection) as one, ``benchmark`` and
    ``collection_id`` first."""
    frame = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    return frame.select(BENCHMARK, COLLECTION_ID, pl.exclude(BENCHMARK, COLLECTION_ID))


def _scan_collections(
    collections: list[tuple[str, str, Path]],
    table: str,
    damaged: Damaged,
    *,
    keep: list[_Kept] | None = None,
) -> tuple[list[tuple[Path, pl.LazyFrame]], list[str], list[str]]:
    """``table`` of each of ``collections`` scanned (_scan_table_held; ``keep``: its
    parts' descriptors kept for a page check), with its ``benchmark`` and
    ``collection_id`` columns; the collections read that are not whole, and why; and
    (``damaged="skip"``) the warnings naming the damaged ones left out.

    Raises:
        CollectionError: ``damaged="raise"``, and a collection's table cannot be read.
    """
    scans: list[tuple[Path, pl.LazyFrame]] = []
    partial: list[str] = []
    skipped: list[str] = []
    for benchmark, collection_id, folder in collections:
        # their parts opened now, through held folders: a scan by name would follow
        # any link planted since (as root), or wait on a FIFO put at a part's name
        try:
            scan, why = _scan_table_held(folder, table, keep=keep)
        except CollectionError as err:
            if damaged == "raise":
                raise
            skipped.append(_skip(folder, str(err)))
            continue
        if why:
            partial.append(f"{folder} ({why})")
        if scan is not None:
            columns = (
                pl.lit(benchmark, pl.String).alias(BENCHMARK),
                pl.lit(collection_id, pl.String).alias(COLLECTION_ID),
            )
            scans.append((folder, scan.with_columns(*columns)))
    return scans, partial, skipped


def _skip(folder: Path, why: str) -> str:
    """The warning that the collection in ``folder`` was left out as damaged (``why``:
    its CollectionError, the folder named once)."""
    return f"{folder}: damaged, skipped (not read): {why.removeprefix(f'{folder}/')}"


def list_collections(path: str | Path) -> pl.DataFrame:
    """One row per collection under a curated folder (or the data folder holding
    ``curated/``, a ``benchmark=<b>`` folder, a collection folder: as read_parquet_dir).

    Columns: ``benchmark``, ``collection_id`` (from the folder names), ``path``,
    ``started_at`` (the manifest's, a UTC timestamp as the fleet index has it; null
    without a readable manifest or time), ``state`` (the manifest's, as written; null
    without a readable manifest; ``running`` both while it is collected and after its
    collector died, as the fleet index has it), ``tables`` (the tables with finished parts) and
    ``collector_pid`` (the pid of the collector still writing it; null when none runs:
    ``state == "running"`` with a null ``collector_pid`` is a collection whose collector
    died).
    """
    root = _local_folder(path)
    rows: dict[str, list[Any]] = {
        BENCHMARK: [],
        COLLECTION_ID: [],
        "path": [],
        "started_at": [],
        "state": [],
        "tables": [],
        "collector_pid": [],
    }
    for benchmark, collection_id, folder in _collections(root, required=False):
        manifest: Manifest | None = None
        if os.geteuid() == 0:  # the collections may be users': no link of theirs followed
            try:
                manifest, tables = _manifest_and_tables_held(folder)
            except CollectionError:  # a link refused: listed, nothing of it read
                tables = []
        else:
            with contextlib.suppress(CollectionError):
                manifest = read_manifest(folder)
            tables = sorted(_table_files(folder)[0])
        rows[BENCHMARK].append(benchmark)
        rows[COLLECTION_ID].append(collection_id)
        rows["path"].append(str(folder))
        rows["started_at"].append(manifest_time(manifest.started_at) if manifest else None)
        rows["state"].append(manifest.state if manifest else None)
        rows["tables"].append(tables)
        rows["collector_pid"].append(manifest.live_collector() if manifest else None)
    return pl.DataFrame(
        rows,
        schema={
            BENCHMARK: pl.String,
            COLLECTION_ID: pl.String,
            "path": pl.String,
            "started_at": pl.Datetime("us", "UTC"),
            "state": pl.String,
            "tables": pl.List(pl.String),
            "collector_pid": pl.Int64,
        },
    )


# -- internals ---------------------------------------------------------------------------


def _parts(folder: Path) -> list[Path]:
    """Finished part files of one table folder, in part order (temporary files excluded)."""
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        match = _PART.match(child.name)
        if match and child.is_file():
            found.append((int(match.group(1)), child))
    # Numeric order: part-100000 comes after part-99999.
    return [p for _, p in sorted(found)]


def _table_files(collection_dir: Path) -> tuple[dict[str, list[Path]], list[str]]:
    """Tables with finished parts, and tables with unfinished temporary parts."""
    files: dict[str, list[Path]] = {}
    incomplete: list[str] = []
    for child in sorted(collection_dir.iterdir()):
        if not child.is_dir() or child.name.startswith((".", "_")):
            continue
        parts = _parts(child)
        if parts:
            files[child.name] = parts
        if any(child.glob(_TEMP_GLOB)):
            incomplete.append(child.name)
    return files, incomplete


def _scan(parts: Sequence[BinaryIO]) -> pl.LazyFrame:
    # Explicit files: no globbing (paths may hold '[' or '*') and no Hive inference from
    # the folder names; read_parquet_dir adds the partition columns itself.
    return pl.scan_parquet(list(parts), hive_partitioning=False, glob=False)


def _held_scan(fds: list[int]) -> pl.LazyFrame:
    """A scan of the parts open on ``fds``. polars takes its own descriptor of each
    file it is handed, so the scan outlives ours and never opens a name again."""
    files = [os.fdopen(fd, "rb", closefd=False) for fd in fds]
    try:
        return _scan(files)
    finally:
        for f in files:
            f.close()


def _tables(
    path: Path,
    scans: dict[str, pl.LazyFrame],
    lazy: bool,
    damaged: Damaged = "raise",
    *,
    fitted: bool = False,
) -> tuple[dict[str, pl.LazyFrame] | dict[str, pl.DataFrame], dict[str, str]]:
    """The collection's tables: ``scans`` (``lazy``; each one's schema read, so a part
    that is not Parquet is refused here, not by polars later), or read into memory
    where they fit (``fitted``: the caller found they do); and those left out
    (``damaged="skip"``), with the reason."""
    tables: dict = {}
    bad: dict[str, str] = {}
    if not lazy and not fitted:
        _fits(path, scans)
    for name, scan in scans.items():
        try:
            with reading(path / name, name):
                if lazy:
                    scan.collect_schema()
                    tables[name] = scan
                else:
                    tables[name] = scan.collect()
        except CollectionError as err:
            if damaged == "raise":
                raise
            bad[name] = str(err)
    return tables, bad


def len64() -> pl.Expr:
    """The rows of a query, or of each group in ``group_by(...).agg()``, counted in 64
    bits (named ``len``, as ``pl.len()``): polars' own count fails past 2^32 - 1 rows in
    its default build, fewer than one quanta table of a ten-minute 16-core storm holds
    (each of its parts holds far fewer, which polars reads). Every count of a scanned
    collection table's rows uses it (:func:`count_rows` for a whole query)."""
    first = pl.first()  # any column: null or not, each row counts once
    return (first.is_null() | first.is_not_null()).cast(pl.UInt64).sum().alias("len")


def count_rows(scan: pl.LazyFrame) -> int:
    """``scan``'s rows, counted in 64 bits (:func:`len64`), by a streaming query."""
    return int(scan.select(len64()).collect(engine="streaming").item())


def needed_bytes(scan: pl.LazyFrame) -> int:
    """Memory a table takes at least once read: its rows (from the parts' footers) times
    the bytes a row of its schema takes at least (a string's 16-byte view without its
    text, a list's offset without its items). An estimate that never exceeds the
    frame's ``estimated_size()``."""
    schema = scan.collect_schema()
    rows = count_rows(scan)
    sample = 1024
    per_row = pl.DataFrame(schema=schema).clear(sample).estimated_size() / sample
    return int(rows * per_row)


def _fits(path: Path, scans: Mapping[str, pl.LazyFrame], *, lazy_call: str = "") -> None:
    """CollectionError where the tables cannot fit in the memory left (the process
    would be killed for it, or take the machine's memory from everyone else), naming
    the lazy read that does fit."""
    from kernmlops.host.meminfo import available_bytes

    available = available_bytes()
    if available is None:
        return
    try:
        needed = sum(needed_bytes(scan) for scan in scans.values())
    except (pl.exceptions.PolarsError, OSError):
        return  # the read itself says what is wrong with a part
    if needed > available:
        from kernmlops.confined import human_size

        call = lazy_call or "read_collection(path, lazy=True)"
        raise CollectionError(
            f"{path}: reading it needs at least {human_size(needed)} of memory and "
            f"{human_size(available)} is available: scan it instead ({call}, then "
            'collect(engine="streaming") what you need from it)'
        )


@contextlib.contextmanager
def reading(folder: Path, table: str | None = None) -> Iterator[None]:
    """What polars or the files refuse while reading ``table`` (in ``folder``, as the
    user named it), or while a scan of the collection in ``folder`` is collected (a
    part damaged past its footer): one CollectionError naming the table or the
    collection, with the first line of the reason."""
    try:
        yield
    except (pl.exceptions.PolarsError, OSError) as e:
        what = f"table {table!r}" if table is not None else "the collection"
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        # a missing column: not the dozens the frame has
        why = why.split("; valid columns:")[0]
        raise CollectionError(f"{folder}: cannot read {what}: {why}") from e


def _hive_value(folder: Path, prefix: str) -> str:
    return unquote(folder.name.removeprefix(prefix))


def _collections(root: Path, *, required: bool = True) -> list[tuple[str, str, Path]]:
    """(benchmark, collection_id, folder) for each collection under ``root``: a
    collection folder, a ``benchmark=<b>`` folder, a curated root, or the data folder
    holding ``curated/`` (the roots ``kernmlops push`` and ``lb train`` take)."""
    if not root.is_dir():
        why = "not a folder" if root.exists() else "no such folder"  # a file was 'no such'
        raise CollectionError(f"{root}: {why}")

    def in_benchmark(folder: Path) -> list[tuple[str, str, Path]]:
        benchmark = _hive_value(folder, _BENCHMARK_PREFIX)
        return [
            (benchmark, _hive_value(child, _COLLECTION_PREFIX), child)
            for child in sorted(folder.iterdir())
            if child.is_dir() and child.name.startswith(_COLLECTION_PREFIX)
        ]

    if root.name.startswith(_COLLECTION_PREFIX) and root.parent.name.startswith(_BENCHMARK_PREFIX):
        found = [
            (
                _hive_value(root.parent, _BENCHMARK_PREFIX),
                _hive_value(root, _COLLECTION_PREFIX),
                root,
            )
        ]
    elif root.name.startswith(_BENCHMARK_PREFIX):
        found = in_benchmark(root)
    else:
        if (root / "curated").is_dir():  # `collect -o data` writes data/curated/...
            root = root / "curated"
        found = [
            entry
            for child in sorted(root.iterdir())
            if child.is_dir() and child.name.startswith(_BENCHMARK_PREFIX)
            for entry in in_benchmark(child)
        ]
    if required and not found:
        raise CollectionError(
            f"{root}: no collections (expected {_BENCHMARK_PREFIX}<b>/"
            f"{_COLLECTION_PREFIX}<id>/ folders, or curated/ holding them)"
        )
    return found
