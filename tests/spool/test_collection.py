"""What the spool reads of its collection's manifest: the collection's id (which names
its memory folder) and its collector's pid, as plain JSON from the layer below
kernmlops.collect.manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.collect.manifest import MANIFEST_NAME, Manifest, write_manifest
from kernmlops.spool.collection import check_collection_id, collection_id_of, collector_alive


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


@pytest.mark.parametrize("cid", ["../../etc", "a/b", "..", ".", "", "a\0b", "/"])
def test_one_rule_refuses_an_id_for_the_manifest_and_the_spool_alike(
    tmp_path: Path, cid: str
) -> None:
    # the rule itself, the manifest's model (what writers and readers go through) and
    # the spool's plain-JSON read (what names its tmpfs folder): the same answer
    with pytest.raises(ValueError, match="collection id is one name"):
        check_collection_id(cid)
    with pytest.raises(ValidationError, match="collection id is one name"):
        Manifest(collection_id=cid)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({"collection_id": cid}))
    assert collection_id_of(tmp_path) is None


@pytest.mark.parametrize("cid", ["c1", "0b5e-uuid", "..a", "a..b", "x=y", ".hidden"])
def test_one_rule_accepts_an_id_for_the_manifest_and_the_spool_alike(
    tmp_path: Path, cid: str
) -> None:
    assert check_collection_id(cid) == cid
    write_manifest(tmp_path, Manifest(collection_id=cid))
    assert collection_id_of(tmp_path) == cid
