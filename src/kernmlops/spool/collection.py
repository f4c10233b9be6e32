"""The collection folder as the spool sees it: where the spool lies in it, and what
the spool reads of its manifest (the collection's id, its collector's pid).

The manifest's model is kernmlops.collect.manifest, a layer above the spool: the
spool reads these two fields as plain JSON, and the collection layer takes the
folder's names and the rule for a collection id (:func:`check_collection_id`)
from here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: a collection's folder of ring records not yet made into rows (kernmlops.spool)
SPOOL_DIR = ".spool"
#: a collection's manifest (kernmlops.collect.manifest)
MANIFEST_NAME = "manifest.json"


def _manifest(collection: Path) -> dict[str, Any]:
    """The collection's manifest as JSON; empty when it is missing or unreadable (a
    reader that needs all of it goes through kernmlops.collect.manifest)."""
    try:
        data = json.loads((collection / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
    return collector_running(_manifest(collection).get("collector_pid"))


def collector_running(pid: object) -> int | None:
    """``pid`` (a manifest's ``collector_pid``) if it is a kernmlops process that still
    runs: the one rule for a live collector (:func:`collector_alive` reads the pid from
    the folder; a reader that parsed the manifest already passes it)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if b"kernmlops" in cmdline else None
