"""What the spool reads of its collection's manifest: the collection's id (which names
its memory folder) and its collector's pid, as plain JSON from the layer below
kernmlops.collect.manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kernmlops.collect.manifest import MANIFEST_NAME, Manifest, write_manifest
from kernmlops.spool.collection import collection_id_of, collector_alive


def test_the_id_and_pid_are_read_as_the_manifest_writes_them(tmp_path: Path) -> None:
    write_manifest(tmp_path, Manifest(collection_id="c1", collector_pid=os.getpid()))
    assert collection_id_of(tmp_path) == "c1"
    # a pid that runs something other than kernmlops is no collector
    pid = collector_alive(tmp_path)
    assert pid is None or pid == os.getpid()


def test_a_missing_damaged_or_hostile_manifest_names_nothing(tmp_path: Path) -> None:
    assert collection_id_of(tmp_path) is None and collector_alive(tmp_path) is None
    path = tmp_path / MANIFEST_NAME
    for text in ("{", "[]", json.dumps({"collection_id": 7, "collector_pid": "1"})):
        path.write_text(text)
        assert collection_id_of(tmp_path) is None and collector_alive(tmp_path) is None
    # an id that is not one folder name would name a folder outside /dev/shm's
    for hostile in ("../../etc", "a/b", "..", ""):
        path.write_text(json.dumps({"collection_id": hostile}))
        assert collection_id_of(tmp_path) is None
