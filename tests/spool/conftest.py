"""A stand-in for /dev/shm, and collections for the spool's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm."""
    from kernmlops.spool import memory as spool_mod

    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(spool_mod, "SHM", folder)
    monkeypatch.setattr(spool_mod, "_is_tmpfs", lambda path: True)
    return folder


def make_collection(root: Path, collection_id: str) -> Path:
    """A collection folder with its manifest (running); its spool folder, not made."""
    from kernmlops.collect.manifest import Manifest, write_manifest

    root.mkdir(parents=True)
    write_manifest(root, Manifest(collection_id=collection_id, state="running"))
    return root / ".spool"
