"""Collections for the spool's tests (the stand-in for /dev/shm: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path


def make_collection(root: Path, collection_id: str) -> Path:
    """A collection folder with its manifest (running); its spool folder, not made."""
    from kernmlops.collect.manifest import Manifest, write_manifest

    root.mkdir(parents=True)
    write_manifest(root, Manifest(collection_id=collection_id, state="running"))
    return root / ".spool"
