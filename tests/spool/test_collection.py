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


def test_a_kernmlops_process_that_began_after_the_collection_is_not_its_collector(
    tmp_path: Path,
) -> None:
    # a dead collector's pid taken by another kernmlops process (after a reboot, or
    # pids wrapping) read as "still being collected": push and recover refused
    import subprocess
    import sys
    import time
    from datetime import UTC, datetime, timedelta

    from kernmlops.spool.collection import process_start

    before = time.time()
    # its command line is set once Popen returns (after the exec); it lives till killed
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "kernmlops"])
    try:
        began = process_start(other.pid)
        # against the wall clock, between the times around its start (however long a
        # starved test took): the boot time is whole seconds, the start 10-ms ticks
        assert began is not None and before - 1.1 <= began <= time.time() + 0.1, began
        now = datetime.now(UTC)
        for started, alive in (
            (now - timedelta(hours=1), False),
            (now + timedelta(seconds=30), True),
        ):
            at = started.isoformat()
            m = Manifest(
                collection_id="c1", state="running", collector_pid=other.pid, started_at=at
            )
            write_manifest(tmp_path, m)
            assert collector_alive(tmp_path) == (other.pid if alive else None), started
            assert m.live_collector() == (other.pid if alive else None)
        # without started_at (older manifests): the command line alone, as before
        write_manifest(tmp_path, Manifest(collection_id="c1", collector_pid=other.pid))
        assert collector_alive(tmp_path) == other.pid
    finally:
        other.kill()
        other.wait()


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
