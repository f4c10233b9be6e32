"""Publish finished collections to a dataset (``kernmlops push``, ``collect --publish``).

A push copies one collection folder to ``<URI>/benchmark=<b>/collection_id=<id>/``:

1. the collection is checked first: a manifest that says it finished (a collection still
   being collected, or one whose collector died with rows in its spool, is refused with
   the reason), every file the manifest lists present, every part a readable Parquet file
   whose every page matches its checksum (kernmlops.collect.pagecheck: a damaged part is
   never published as good);
2. its files are copied, parts first; a file already there with the same size is not
   copied again, so a push that was interrupted resumes where it stopped and a push
   repeated after it finished copies nothing (a collection that ``fleet reindex`` found
   damaged is copied whole, and its ``_damaged/`` marker removed);
3. the manifest is copied last, then the collection's row of the dataset's index.

Each file appears whole: on an object store (S3, GCS, Azure) an upload appears when it
completes; elsewhere it is written under a hidden temporary name (``.<name>.push-tmp``,
which readers skip) and renamed. A reader that goes by manifests or the index never sees
half a collection. The source is only read: a failed push loses nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from kernmlops.collect.manifest import MANIFEST_NAME, Manifest, read_manifest
from kernmlops.errors import CollectionError, KernmlopsError
from kernmlops.fleet.store import (
    Dataset,
    PublishError,
    Unreadable,
    describe_error,
    listing,
    put,
    read_at_most,
)
from kernmlops.tables import BENCHMARK, COLLECTION_ID

__all__ = [
    "PushResult",
    "Refused",
    "check_publishable",
    "collection_files",
    "expand",
    "push",
    "push_collection",
]

#: the temporary name of a file being written where uploads do not appear whole


@dataclass
class PushResult:
    """What one collection's push did."""

    collection_id: str
    benchmark: str
    #: where the collection now is (URI, no credentials)
    where: str
    copied: list[str] = field(default_factory=list)
    copied_bytes: int = 0
    #: files already at the destination with the same size
    present: list[str] = field(default_factory=list)
    #: the manifest was already there, byte for byte: nothing was copied
    already: bool = False

    def line(self) -> str:
        """One line for the user."""
        if self.already:
            return f"{self.collection_id}: already published at {self.where}"
        from kernmlops.confined import human_size

        resumed = f" ({len(self.present)} already there)" if self.present else ""
        return (
            f"{self.collection_id}: {len(self.copied)} files, {human_size(self.copied_bytes)} "
            f"-> {self.where}{resumed}"
        )


def _hive(prefix: str, folder_name: str, value: str | None) -> str:
    """The Hive folder name: the local folder's own where it has the form, else built
    from the manifest (percent-escaped as Hive escapes partition values)."""
    if folder_name.startswith(f"{prefix}=") and folder_name != f"{prefix}=":
        return folder_name
    if not value:
        raise CollectionError(f"no {prefix} in the manifest and none in the folder's name")
    return f"{prefix}={quote(value, safe='')}"


def check_publishable(folder: Path, *, incomplete: bool = False) -> Manifest:
    """The manifest of ``folder`` if the collection may be published.

    Raises:
        CollectionError: the reason it may not (no manifest, still being collected, rows
            left in its spool, its collector died and ``incomplete`` is False, a file the
            manifest lists is missing, a part is not readable Parquet).
    """
    from kernmlops.spool.recovery import pending_spools

    manifest = read_manifest(folder)
    pid = manifest.live_collector()
    if pid is not None:
        raise CollectionError(
            f"{folder}: still being collected (collector pid {pid}): push it when it has "
            "finished, or collect with --publish"
        )
    if pending_spools(folder):
        raise CollectionError(
            f"{folder}: rows are still in its spool (its collector was killed): run "
            f"`kernmlops recover {folder}` first"
        )
    if manifest.state == "running" and not incomplete:
        flushed = manifest.last_flush_at or "never"
        raise CollectionError(
            f"{folder}: its collector stopped without finishing (state running, last flush "
            f"{flushed}); push --incomplete publishes what was flushed, marked running"
        )
    for table, record in manifest.tables.items():
        for name in record.files:
            if not (folder / name).is_file():
                raise CollectionError(
                    f"{folder}: the manifest lists {name} (table {table}) but it is missing"
                )
    return manifest


def collection_bytes(folder: str | Path) -> int:
    """The bytes a push of ``folder`` copies at most, the files that
    :func:`collection_files` names, by their sizes alone (nothing opened, nothing
    checked: a progress's total)."""
    folder = Path(folder)
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "_"))]
        for name in filenames:
            if name.startswith((".", "_")) or (dirpath == str(folder) and name == MANIFEST_NAME):
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def collection_files(folder: Path) -> list[tuple[str, int, int | None]]:
    """(relative path, size, rows) of each file to publish, the manifest excluded (rows:
    a Parquet file's, from its footer; None for other files): every file
    but hidden ones (names starting with '.' or '_': the spool, temporary parts, a
    compaction's leftovers), in path order.

    Raises:
        CollectionError: a part is not readable Parquet or is damaged (a page fails its
            checksum or does not decode), or a link or special file is in the folder
            (a collection holds none; its target is not published blindly).
    """
    import pyarrow.parquet as pq

    from kernmlops.collect.pagecheck import page_damage

    found: list[tuple[str, int, int | None]] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        here = Path(dirpath)
        for name in sorted(filenames):
            if name.startswith((".", "_")) or (here == folder and name == MANIFEST_NAME):
                continue
            path = here / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink() or not path.is_file():
                raise CollectionError(f"{folder}: {rel} is a link or a special file")
            rows = None
            if name.endswith(".parquet"):
                try:
                    rows = pq.read_metadata(path).num_rows
                except (OSError, ValueError) as err:  # pyarrow: ArrowInvalid is a ValueError
                    raise CollectionError(
                        f"{path}: not a readable Parquet file ({describe_error(err)})"
                    ) from None
                # every page against its checksum: a byte damaged inside a page leaves
                # the footer whole, and would be published as good
                damage = page_damage(str(path))
                if damage is not None:
                    raise CollectionError(f"{path}: damaged, not published: {damage}")
            found.append((rel, path.stat().st_size, rows))
        for d in list(dirnames):
            if (here / d).is_symlink():
                raise CollectionError(f"{folder}: {(here / d).relative_to(folder)} is a link")
    return found


def _existing(dataset: Dataset, prefix: str) -> dict[str, int]:
    """Files under ``prefix`` at the destination: relative path -> size."""
    import pyarrow.fs as pafs

    base = dataset.path(prefix)
    infos = listing(dataset, base, recursive=True)
    return {
        info.path[len(base) + 1 :]: int(info.size or 0)
        for info in infos
        if info.type == pafs.FileType.File
    }


def _read_remote(dataset: Dataset, rel: str, limit: int) -> bytes | None:
    """``rel`` at the destination, at most ``limit`` bytes (read_at_most); None where it
    is not there, or holds more (or is no plain file)."""
    try:
        return read_at_most(dataset, dataset.path(rel), limit)
    except (FileNotFoundError, Unreadable):
        return None


def push_collection(
    folder: str | Path,
    dataset: Dataset,
    *,
    incomplete: bool = False,
    on_file: Callable[[str, int], None] | None = None,
) -> PushResult:
    """Publish the collection in ``folder`` to ``dataset``; see the module's notes.

    Args:
        folder: the collection folder (``.../benchmark=<b>/collection_id=<id>``).
        dataset: the destination (:func:`kernmlops.fleet.open_dataset`).
        incomplete: publish a collection whose collector died (state ``running``).
        on_file: called with (relative path, size) after each file copied.

    Raises:
        CollectionError: the collection may not be published (the reason).
        PublishError: the destination cannot be read or written (the reason).
    """
    from kernmlops.fleet.index import clear_damaged, index_row, is_damaged, write_index_row

    folder = Path(folder).expanduser().absolute()
    if not folder.is_dir():
        raise CollectionError(f"{folder}: no such collection folder")
    manifest = check_publishable(folder, incomplete=incomplete)
    files = collection_files(folder)
    manifest_bytes = (folder / MANIFEST_NAME).read_bytes()
    cid = manifest.collection_id or folder.name.removeprefix(f"{COLLECTION_ID}=")
    bench_name = manifest.benchmark.name if manifest.benchmark else None
    prefix = "/".join(
        (
            _hive(BENCHMARK, folder.parent.name, bench_name),
            _hive(COLLECTION_ID, folder.name, cid),
        )
    )
    bench_dir = prefix.split("/", 1)[0]
    result = PushResult(
        collection_id=cid,
        benchmark=bench_dir.split("=", 1)[1],
        where=dataset.where(prefix),
    )
    try:
        there = _existing(dataset, prefix)
        # one that reindex found damaged is copied whole: a damaged file may have the
        # size of the source's
        damaged = is_damaged(dataset, prefix)
        if damaged:
            there = {}
        whole = there.get(MANIFEST_NAME) == len(manifest_bytes) and all(
            there.get(rel) == size for rel, size, _ in files
        )
        there_manifest = f"{prefix}/{MANIFEST_NAME}"
        if whole and _read_remote(dataset, there_manifest, len(manifest_bytes)) == manifest_bytes:
            result.already = True
            # the index row may be what an interrupted push did not write
            row = index_row(manifest, prefix, files)
            write_index_row(dataset, row, cid, only_missing=True)
            return result
        for rel, size, _ in files:
            if there.get(rel) == size:
                result.present.append(rel)
                continue
            put(dataset, folder / rel, f"{prefix}/{rel}")
            result.copied.append(rel)
            result.copied_bytes += size
            if on_file is not None:
                on_file(rel, size)
        put(dataset, manifest_bytes, f"{prefix}/{MANIFEST_NAME}")
        result.copied.append(MANIFEST_NAME)
        result.copied_bytes += len(manifest_bytes)
        if damaged:
            clear_damaged(dataset, prefix)
        write_index_row(dataset, index_row(manifest, prefix, files), cid)
    except KernmlopsError:
        raise
    except OSError as err:  # pyarrow's errors are OSErrors too
        raise PublishError(
            f"cannot publish {cid} to {result.where}: {describe_error(err)} (nothing of the "
            "source is lost; run the push again to resume)"
        ) from None
    return result


@dataclass
class Refused:
    """A collection that was not published, and why."""

    folder: Path
    reason: str


def push(
    folders: Iterable[str | Path],
    dataset: Dataset,
    *,
    incomplete: bool = False,
    on_result: Callable[[PushResult | Refused], None] | None = None,
    on_file: Callable[[str, int], None] | None = None,
) -> tuple[list[PushResult], list[Refused]]:
    """Publish each collection in turn (:func:`push_collection`); a collection that may
    not be published is refused with its reason and the others are published.

    ``on_result`` is called with each collection's outcome, ``on_file`` with each file
    copied (:func:`push_collection`).

    Raises:
        PublishError: the destination cannot be read or written: the push stops there
            (run it again to resume).
    """
    results: list[PushResult] = []
    refused: list[Refused] = []
    for folder in folders:
        outcome: PushResult | Refused
        try:
            outcome = push_collection(folder, dataset, incomplete=incomplete, on_file=on_file)
        except PublishError:
            raise
        except CollectionError as err:
            outcome = Refused(Path(folder), str(err))
            refused.append(outcome)
        else:
            results.append(outcome)
        if on_result is not None:
            on_result(outcome)
    return results, refused


def expand(paths: Iterable[str | Path]) -> list[Path]:
    """Collection folders named by ``paths``: a collection folder (it has a manifest), or
    its manifest, or a folder holding ``benchmark=*/collection_id=*`` (a root such as
    ``data/curated``, or ``data``), or one ``benchmark=*`` folder.

    Raises:
        CollectionError: a path does not exist or holds no collection.
    """
    found: list[Path] = []
    for p in map(lambda x: Path(x).expanduser(), paths):
        if p.name == MANIFEST_NAME and p.is_file():
            p = p.parent  # its collection, as read_collection and graph take it
        if not p.is_dir():
            # a file was 'no such folder'
            why = "not a folder (a collection is a folder)" if p.exists() else "no such folder"
            raise CollectionError(f"{p}: {why}")
        if (p / MANIFEST_NAME).is_file():
            found.append(p)
            continue
        root = p / "curated" if (p / "curated").is_dir() else p
        if root.name.startswith(f"{BENCHMARK}="):
            inside = sorted(root.glob(f"{COLLECTION_ID}=*/{MANIFEST_NAME}"))
        else:
            inside = sorted(root.glob(f"{BENCHMARK}=*/{COLLECTION_ID}=*/{MANIFEST_NAME}"))
        if not inside:
            raise CollectionError(
                f"{p}: not a collection (no {MANIFEST_NAME}) and no "
                f"{BENCHMARK}=<b>/{COLLECTION_ID}=<id>/ collections in it"
            )
        found.extend(m.parent for m in inside)
    return found
