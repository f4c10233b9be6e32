"""The collection folder as the spool sees it: where the spool lies in it, and what
the spool reads of its manifest (the collection's id, its collector's pid).

The manifest's model is kernmlops.collect.manifest, a layer above the spool: the
spool reads these two fields as plain JSON, and the collection layer takes the
folder's names and the rule for a collection id (:func:`check_collection_id`)
from here.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

#: a collection's folder of ring records not yet made into rows (kernmlops.spool)
SPOOL_DIR = ".spool"
#: a collection's manifest (kernmlops.collect.manifest)
MANIFEST_NAME = "manifest.json"
#: the largest manifest read (a few KiB to a few hundred: one made huge, even sparse,
#: would be read whole into memory by every reader)
MANIFEST_MAX_BYTES = 16 << 20
#: in a spool: every row of it is in finished parts, and it is being removed
#: (kernmlops.spool.recovery.remove_spool); written first, deleted last
DONE_MARK = "done"


#: the largest mark read (it names a spool's segments: a few KiB)
_DONE_MAX_BYTES = 1 << 20
#: the largest json of a spool read (a ring's description, a segment's: under 1 KiB)
JSON_MAX_BYTES = 1 << 20


def spool_done(spool_dir: Path) -> bool:
    """Whether the spool's rows are all in finished parts (its removal began): what a
    kill left of it is no loss, and nothing to recover. The mark must be the one the
    removal writes: every segment still there (in the spool and its ``mem`` folder)
    is named in it with its size then; an empty, damaged or planted mark, or one a
    segment is not in, is no mark (the spool is pending, and recover reads it)."""
    from kernmlops.host.pinned import read_plain

    try:
        mark = json.loads(read_plain(spool_dir / DONE_MARK, limit=_DONE_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return False
    named = mark.get("segments") if isinstance(mark, dict) else None
    if not isinstance(named, dict):
        return False
    return all(named.get(key) == size for key, size in done_segments(spool_dir).items())


def done_segments(spool_dir: Path) -> dict[str, int]:
    """The segment files in a spool (``mem/`` ones too) and their sizes: what the done
    mark names."""
    found = {}
    # "mem": kernmlops.spool.memory.MEMORY_LINK (which imports this module)
    for folder, prefix in ((spool_dir, ""), (spool_dir / "mem", "mem/")):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith(".ring"):
                with contextlib.suppress(OSError):
                    found[prefix + entry.name] = entry.stat(follow_symlinks=False).st_size
    return found


def read_manifest_bytes(collection: Path, *, owner: int = -1) -> bytes:
    """The bytes of the collection's manifest, read as root reads a file in a folder a
    user may own (kernmlops.host.pinned.read_plain: no link, a plain file, not a hard
    link to another's file unless ``owner``'s), at most :data:`MANIFEST_MAX_BYTES`.

    Raises:
        OSError: FileNotFoundError, or why it is not read (ELOOP: a link; EFBIG: too
            large, its strerror says so).
    """
    from kernmlops.host.pinned import read_plain

    return read_plain(collection / MANIFEST_NAME, owner=owner, limit=MANIFEST_MAX_BYTES)


def _manifest(collection: Path) -> dict[str, Any]:
    """The collection's manifest as JSON; empty when it is missing or unreadable (a
    reader that needs all of it goes through kernmlops.collect.manifest)."""
    try:
        data = json.loads(read_manifest_bytes(collection, owner=_owner(collection)))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _owner(folder: Path) -> int:
    """The uid of ``folder``'s owner (-1 when it cannot be known)."""
    try:
        return os.stat(folder).st_uid
    except OSError:
        return -1


def check_collection_id(value: str) -> str:
    """``value`` when it is one folder name; ValueError otherwise. The one rule for a
    collection id: the manifest's model checks it, the spool reads no other id, and
    writers check it before the folder named after it is made."""
    # it names the spool's memory folder (/dev/shm/kernmlops-spool-<id>), which
    # recover deletes as root: a '/' or '..' in it would name another folder
    if not value:
        raise ValueError("a collection id is one name: not empty")
    if "/" in value or "\0" in value or value in (".", ".."):
        raise ValueError("a collection id is one name: no '/', not '.' or '..'")
    return value


def collection_id_of(collection: Path) -> str | None:
    """The collection's id, as its manifest says; None without one. An id that
    :func:`check_collection_id` refuses is no id (it names the spool's folder on the
    tmpfs)."""
    found = _manifest(collection).get("collection_id")
    if not isinstance(found, str):
        return None
    try:
        return check_collection_id(found)
    except ValueError:
        return None


def collector_alive(collection: Path) -> int | None:
    """The pid of the collector still writing ``collection``, if it runs (None also
    when the manifest names none or cannot be read)."""
    return collector_and_state(collection)[0]


def collector_and_state(collection: Path) -> tuple[int | None, str | None]:
    """:func:`collector_alive` and the collection's ``state`` (None without one), from
    one read of its manifest."""
    manifest = _manifest(collection)
    pid = collector_running(manifest.get("collector_pid"), manifest.get("started_at"))
    state = manifest.get("state")
    return pid, state if isinstance(state, str) else None


#: seconds a collector's process start may seem to follow its manifest's started_at:
#: the boot time /proc/stat gives is whole seconds, and the wall clock may be stepped
#: (NTP) during a run; a process that took a dead collector's pid began minutes or
#: more after it (a reboot, pids wrapping)
_START_SLACK_S = 60.0


def collector_running(pid: object, started_at: object = None) -> int | None:
    """``pid`` (a manifest's ``collector_pid``) if it is a kernmlops process that still
    runs and, given the manifest's ``started_at`` (ISO 8601), began before it: the one
    rule for a live collector (:func:`collector_alive` reads both from the folder; a
    reader that parsed the manifest already passes them). A process that began after
    the collection did is another one that got the pid (a reboot, pids wrapping)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if b"kernmlops" not in cmdline:
        return None
    began, since = process_start(pid), _unix_time(started_at)
    if began is not None and since is not None and began > since + _START_SLACK_S:
        return None
    return pid


def process_start(pid: int) -> float | None:
    """When ``pid`` began, in Unix seconds (its /proc stat start time after the boot
    time); None where /proc does not say."""
    import os

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _unix_time(text: object) -> float | None:
    """An ISO 8601 time (a manifest's; without an offset: UTC) in Unix seconds."""
    from datetime import UTC, datetime

    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
