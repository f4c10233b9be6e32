"""manifest.json: what a collection is, written atomically, read with clear errors.

The manifest makes a collection self-describing (system info, config, versions, start/stop
times, per-hook status). It carries ``format`` and ``version`` so a reader can refuse a file
from a newer kernmlops instead of misreading it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kernmlops.errors import CollectionError

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_NAME", "read_manifest", "write_manifest"]

MANIFEST_NAME = "manifest.json"
FORMAT = "kernmlops-collection"
FORMAT_VERSION = 1


def write_manifest(collection_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest`` as ``<collection_dir>/manifest.json`` atomically; return its path.

    ``format`` and ``version`` are set (first in the file); values JSON does not know
    (paths, datetimes) are written with ``str``. The file is written to a temporary name,
    synced and renamed, so readers see the old manifest or the new one, never half of one.
    """
    collection_dir = Path(collection_dir)
    collection_dir.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "version": FORMAT_VERSION}
    body.update((k, v) for k, v in manifest.items() if k not in body)
    text = json.dumps(body, indent=2, sort_keys=False, default=str, ensure_ascii=False) + "\n"

    path = collection_dir / MANIFEST_NAME
    temp = collection_dir / f".{MANIFEST_NAME}.tmp"
    try:
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fd = os.open(collection_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename durable
    finally:
        os.close(fd)
    return path


def read_manifest(collection_dir: Path) -> dict[str, Any]:
    """Read and check ``<collection_dir>/manifest.json``.

    Raises:
        CollectionError: the file is missing or unreadable, is not a JSON object, is not a
            kernmlops collection manifest, or was written by a newer format version.
    """
    path = Path(collection_dir) / MANIFEST_NAME
    if not path.is_file():
        raise CollectionError(f"{path}: no manifest (is {collection_dir} a collection folder?)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CollectionError(f"{path}: cannot read the manifest: {e}") from e
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise CollectionError(f"{path}: the manifest is not valid JSON: {e}") from e
    if not isinstance(manifest, dict):
        raise CollectionError(
            f"{path}: the manifest must be a JSON object, not {type(manifest).__name__}"
        )
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise CollectionError(f"{path}: format is {fmt!r}, expected {FORMAT!r}")
    version = manifest.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CollectionError(f"{path}: version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        raise CollectionError(
            f"{path}: written with format version {version}, this kernmlops reads up to "
            f"version {FORMAT_VERSION}; upgrade kernmlops to read it"
        )
    return manifest
