"""manifest.json: what a collection is, as a typed, versioned model, written atomically.

The manifest makes a collection self-describing (system info, config, versions, start/stop
times, per-hook status) and says how far the collection got. Its life:

1. written before any probe attaches, ``state: running`` (config, ids, start time);
2. rewritten after attaching (system, versions, what attached) and at every flush
   (rows and parts so far, drops, ``last_flush_at``);
3. finalised at stop: ``state`` becomes how it ended (``completed``, ``failed``,
   ``duration``, ``interrupted``, ``disk_full``, ``error``) with the duration and exit code;
4. after ``kernmlops recover`` has made every row of the spool a collector left (a kill,
   a full disk) into parts: ``state: recovered``, the rows per table and hook counted
   again, and ``recovery`` saying what it was before (state, error) and when, with
   which version, recover ran.

A collection whose collector was killed keeps ``state: running`` until ``recover`` makes
it whole: readers report it as incomplete and read what was flushed (one still being
written, :meth:`Manifest.live_collector`, is reported as such). Every reader goes
through :class:`Manifest`; it carries ``format`` and ``version`` so a file from a newer
kernmlops is refused, not misread.
Version 1 (before the lifecycle) is read too: its ``ended_by`` becomes ``state``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from kernmlops.errors import CollectionError
from kernmlops.fileio import write_atomic
from kernmlops.jsonfile import loads
from kernmlops.spool.collection import (  # below both: the spool reads these too
    MANIFEST_NAME,
    check_collection_id,
    collector_running,
    read_manifest_bytes,
)

__all__ = [
    "FINAL_STATES",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "BenchmarkRecord",
    "HookRecord",
    "Manifest",
    "RecoveryRecord",
    "State",
    "TableRecord",
    "check_collection_id",
    "manifest_time",
    "parse_manifest",
    "read_manifest",
    "write_manifest",
]

FORMAT = "kernmlops-collection"
#: the newest manifest version this kernmlops reads. Each manifest is written with the
#: lowest version that can read it: 3 only for ``state: recovered`` (and its
#: ``recovery`` record), which a kernmlops of version 2 would refuse as invalid; so
#: that one says "upgrade", and reads every other collection as before.
FORMAT_VERSION = 3
#: the version of a manifest in any other state
BASE_VERSION = 2


State = Literal[
    "running", "completed", "failed", "duration", "interrupted", "disk_full", "error", "recovered"
]
#: states of a collection whose rows are all in parts: a finished collector's, or
#: ``recovered`` (recover made the rest); ``running`` after the run means the collector died
FINAL_STATES = (
    "completed", "failed", "duration", "interrupted", "disk_full", "error", "recovered"
)  # fmt: skip


class _Record(BaseModel):
    """A typed record that also answers ``m["key"]`` and ``m.get("key")``, as the plain
    dict of earlier versions did (notebooks index manifests that way)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    def __getitem__(self, key: str) -> Any:
        if key in type(self).model_fields or key in (self.__pydantic_extra__ or {}):
            return getattr(self, key)
        if isinstance(getattr(type(self), key, None), property):
            return getattr(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def keys(self) -> list[str]:
        return list(self.model_dump(exclude_unset=False))


class HookRecord(_Record):
    """One hook: attached or why not, and what it saw."""

    attached: bool = False
    reason: str | None = None
    variant: str | None = None
    programs: list[str] = []
    events: int = 0
    drops: int = 0
    missed: int = 0
    rows: dict[str, int] = {}
    unsupported: dict[str, str] = {}
    counters: dict[str, int] = {}
    #: records lost per CPU (index = CPU), where any were lost
    drops_by_cpu: list[int] = []
    #: what the hook saw against the kernel's own count (block_io: per disk, its
    #: completions by /proc/diskstats, rows, counted losses, completions_not_seen)
    reconciliation: dict[str, Any] = {}
    #: how the rings reached the spool ({"native": bool, "priority": n, "error": ...})
    copier: dict[str, Any] = {}
    #: a BPF hook's rings per table that ran: its ring_groups as this machine's CPUs
    #: split (at most one ring per CPU); config.hooks.<name>.ring_groups is what was asked
    rings: int | None = None
    #: it failed while the collection ran (a bug in it): detached then, ``reason`` says
    #: what failed; the other hooks went on, and the collection's exit code is 1
    failed: bool = False


class TableRecord(_Record):
    """One table: rows in finished parts and the part files (relative to the collection)."""

    rows: int = 0
    files: list[str] = []
    #: at stop: "compacted" (the flushed parts were rewritten as one) or why not
    compaction: str | None = None


class BenchmarkRecord(_Record):
    name: str | None = None
    description: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    #: CLOCK_MONOTONIC µs, the clock of every table's ts_uptime_us
    started_uptime_us: int | None = None
    stopped_uptime_us: int | None = None
    #: the cgroup v2 the benchmark ran in (None: a process group only)
    cgroup: str | None = None
    #: what was set for the run: transparent_hugepages (set, was, restored),
    #: page_cache (dropped, Cached before and after), cpus (list, cpuset or affinity)
    environment: dict[str, Any] | None = None


class ClockPairRecord(_Record):
    """CLOCK_MONOTONIC and CLOCK_REALTIME read back to back (kernmlops.host.clock)."""

    monotonic_ns: int
    realtime_ns: int
    uncertainty_ns: int


class ClockRecord(_Record):
    """The tables' clock tied to the wall clock at the collection's start and stop:
    what converts ``ts_uptime_us`` to wall-clock time (kernmlops.data.wall_clock)."""

    start: ClockPairRecord | None = None
    stop: ClockPairRecord | None = None


class RecoveryRecord(_Record):
    """What ``kernmlops recover`` found and did (the manifest's ``recovery``)."""

    #: the state before the first recover (``running``: its collector was killed)
    recovered_from: str | None = None
    #: the manifest's error before the first recover (what went wrong, as collect said it)
    error: str | None = None
    #: when the last recover finished, and the kernmlops version it ran
    recovered_at: str | None = None
    kernmlops: str | None = None
    #: rows recover added per table (every recover's, summed)
    rows_added: dict[str, int] = {}
    #: pieces of the spool recover could not read, and their bytes (the last one's:
    #: none once it made every row; the spool stays while there are any)
    lost_pieces: int = 0
    lost_bytes: int = 0


class Manifest(_Record):
    """The manifest of one collection. Unknown keys (e.g. ``lb``) are kept as they are."""

    format: Literal["kernmlops-collection"] = FORMAT
    version: int = FORMAT_VERSION
    collection_id: str | None = None
    state: State | None = None
    benchmark: BenchmarkRecord | None = None
    started_at: str | None = None
    #: wall clock of the last rewrite while running (flushes)
    updated_at: str | None = None
    last_flush_at: str | None = None
    flushes: int = 0
    stopped_at: str | None = None
    #: CLOCK_MONOTONIC and CLOCK_REALTIME pairs at start and stop (since 2026-11)
    clock: ClockRecord | None = None
    duration_s: float | None = None
    attach_s: float | None = None
    exit_code: int | None = None
    error: str | None = None
    results_error: str | None = None
    #: where the collection was written and the free space seen at start and stop
    output: dict[str, Any] | None = None
    filter: dict[str, Any] | None = None
    collector_pid: int | None = None
    system: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    versions: dict[str, str] | None = None
    #: euid, the capabilities held that the collector's steps use, and each lesser way
    #: taken for want of one (kernmlops.collect.privileges; since 2026-11)
    privileges: dict[str, Any] | None = None
    hooks: dict[str, HookRecord] = {}
    #: collect --export: url, sets (each one's status), scrapes (pages of metrics sent
    #: whole to a GET), renders (reads of the maps; see RunningExporter.summary)
    exporter: dict[str, Any] | None = None
    tables: dict[str, TableRecord] = {}
    #: set by ``kernmlops recover`` (None: it never ran)
    recovery: RecoveryRecord | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_version_1(cls, data: Any) -> Any:
        # Version 1 had no lifecycle: how it ended was ``ended_by``.
        if isinstance(data, dict) and "ended_by" in data and "state" not in data:
            data = dict(data)
            data["state"] = data.pop("ended_by")
        return data

    @field_validator("collection_id")
    @classmethod
    def _one_name(cls, value: str | None) -> str | None:
        return value if value is None else check_collection_id(value)

    @field_validator("benchmark", mode="before")
    @classmethod
    def _benchmark_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("tables", mode="before")
    @classmethod
    def _table_files(cls, value: Any) -> Any:
        # Hand-made manifests may list a table's files only.
        if isinstance(value, dict):
            return {k: {"files": v} if isinstance(v, list) else v for k, v in value.items()}
        return value

    @property
    def ended_by(self) -> str | None:
        """How the collection ended (version 1's name for ``state``); None while running."""
        return self.state if self.state != "running" else None

    @property
    def complete(self) -> bool:
        """The collector finished (whatever the benchmark did), or ``recover`` made the
        rows it left in its spool into parts: no row waits anywhere."""
        return self.state in FINAL_STATES

    def live_collector(self) -> int | None:
        """The pid of the collector still writing the collection: it is ``running``
        and its ``collector_pid`` is a kernmlops process that runs and began before
        ``started_at`` (None: it finished, or its collector is gone)."""
        if self.state != "running":
            return None
        return collector_running(self.collector_pid, self.started_at)

    def as_json(self) -> dict[str, Any]:
        """The JSON object written to disk: format and version first, extras last."""
        body = self.model_dump(mode="json", exclude={"format", "version"})
        version = FORMAT_VERSION if self.state == "recovered" else BASE_VERSION
        return {"format": FORMAT, "version": version, **body}


def manifest_time(text: str | None) -> datetime | None:
    """A time the manifest holds (``started_at``, ``stopped_at``, ...: ISO 8601 with
    its offset) as an aware datetime; one without an offset (hand-made) is UTC's, and
    one that is not a time is None. The one reading of them: the fleet's index and
    list_collections type them alike."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _coerce(manifest: Manifest | dict[str, Any]) -> Manifest:
    if isinstance(manifest, Manifest):
        return manifest
    data = {k: v for k, v in manifest.items() if k not in ("format", "version")}
    # Values JSON does not know (paths, datetimes) are kept as text.
    data = json.loads(json.dumps(data, default=str))
    return Manifest.model_validate(data)


def manifest_text(manifest: Manifest | dict[str, Any]) -> str:
    """The manifest's file content."""
    body = _coerce(manifest).as_json()
    return json.dumps(body, indent=2, sort_keys=False, default=str, ensure_ascii=False) + "\n"


def write_manifest(collection_dir: Path, manifest: Manifest | dict[str, Any] | str) -> Path:
    """Write ``manifest`` (or its :func:`manifest_text`) as ``<collection_dir>/manifest.json``
    atomically; return its path.

    The file is written to a temporary name, synced and renamed, so readers see the old
    manifest or the new one, never half of one.
    """
    collection_dir = Path(collection_dir)
    collection_dir.mkdir(parents=True, exist_ok=True)
    text = manifest if isinstance(manifest, str) else manifest_text(manifest)
    return write_atomic(collection_dir / MANIFEST_NAME, text, durable=True)


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "(top level)"
    return f"{where}: {e['msg']} (got {e.get('input')!r:.60})"


def read_manifest(collection_dir: Path) -> Manifest:
    """Read and check ``<collection_dir>/manifest.json``.

    Raises:
        CollectionError: the file is missing or unreadable, is not a JSON object, is not a
            kernmlops collection manifest, was written by a newer format version, or a
            field has the wrong type.
    """
    import errno
    import os

    path = Path(collection_dir) / MANIFEST_NAME
    try:
        owner = os.stat(collection_dir).st_uid
        # never through a link, nor more than a manifest's size (read_manifest_bytes)
        text = read_manifest_bytes(Path(collection_dir), owner=owner).decode("utf-8")
    except FileNotFoundError:
        raise CollectionError(
            f"{path}: no manifest (is {collection_dir} a collection folder?)"
        ) from None
    except OSError as e:
        why = "a link" if e.errno == errno.ELOOP else e.strerror or str(e)
        raise CollectionError(f"{path}: cannot read the manifest: {why}") from None
    except UnicodeDecodeError:  # the codec's byte and position say nothing to a user
        raise CollectionError(f"{path}: cannot read the manifest: not UTF-8 text") from None
    return parse_manifest(text, path)


def parse_manifest(text: str, path: Path) -> Manifest:
    """A manifest's text checked as :func:`read_manifest` checks it (``path`` names it)."""
    try:
        raw = loads(text)
    except ValueError as e:  # malformed, nested too deep, or a number past 4300 digits
        raise CollectionError(f"{path}: the manifest is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise CollectionError(f"{path}: the manifest must be a JSON object, not {kind}")
    fmt = raw.get("format")
    if fmt != FORMAT:
        raise CollectionError(f"{path}: format is {fmt!r}, expected {FORMAT!r}")
    version = raw.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CollectionError(f"{path}: version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        raise CollectionError(
            f"{path}: written with format version {version}, this kernmlops reads up to "
            f"version {FORMAT_VERSION}; upgrade kernmlops to read it"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as err:
        raise CollectionError(f"{path}: the manifest is not valid: {_first_error(err)}") from None
