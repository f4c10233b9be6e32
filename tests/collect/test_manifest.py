"""manifest.json: atomic write, round trip, and a clear error for each bad file."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from kernmlops.collect.manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    read_manifest,
    write_manifest,
)
from kernmlops.errors import CollectionError


def test_round_trip(tmp_path: Path) -> None:
    started = dt.datetime(2024, 5, 1, 12, 30, 0, tzinfo=dt.UTC)
    manifest = {
        "collection_id": "abc",
        "state": "completed",
        "benchmark": {"name": "faux", "exit_code": 0},
        "started_at": started,
        "output": {"path": tmp_path / "x"},
        "hooks": {"block_io": {"attached": True, "events": 12, "drops": 0}},
        "tables": {"block_io": {"rows": 12, "files": ["block_io/part-00000.parquet"]}},
        "lb": {"variant": "mllb"},  # a section of another module is kept as it is
    }
    path = write_manifest(tmp_path, manifest)
    assert path == tmp_path / MANIFEST_NAME
    raw = json.loads(path.read_text())
    assert list(raw)[:2] == ["format", "version"]  # format and version come first
    assert raw["version"] == 2 and FORMAT_VERSION == 3  # 3: recovered ones alone
    back = read_manifest(tmp_path)
    assert isinstance(back, Manifest)
    assert back.format == FORMAT and back.state == "completed" and back.complete
    assert back.started_at == "2024-05-01 12:30:00+00:00"
    assert back.output == {"path": str(tmp_path / "x")}
    assert back.hooks["block_io"].events == 12 and back.hooks["block_io"].attached
    assert back.tables["block_io"].files == ["block_io/part-00000.parquet"]
    assert back.benchmark is not None and back.benchmark.name == "faux"
    # the dict-style access of version 1 still works, ended_by included
    assert back["hooks"]["block_io"]["events"] == 12
    assert back["lb"] == {"variant": "mllb"} and back.get("nothing", 5) == 5
    assert back["ended_by"] == "completed" and "lb" in back and "nothing" not in back
    assert "\n  " in path.read_text()  # indented for people
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]  # no temporary file left
    assert manifest.get("format") is None  # the caller's dict is not changed


def test_running_manifest_is_incomplete(tmp_path: Path) -> None:
    write_manifest(tmp_path, Manifest(collection_id="a", state="running"))
    back = read_manifest(tmp_path)
    assert back.state == "running" and not back.complete and back.ended_by is None


def test_reads_version_1(tmp_path: Path) -> None:
    """A collection of an earlier kernmlops: ended_by becomes the state."""
    doc = {"format": FORMAT, "version": 1, "collection_id": "old", "ended_by": "failed",
           "benchmark": {"name": "command", "exit_code": 3},
           "tables": {"t": {"rows": 1, "files": ["t/part-00000.parquet"]}}}  # fmt: skip
    write_raw(tmp_path, json.dumps(doc))
    back = read_manifest(tmp_path)
    assert back.version == 1 and back.state == "failed" and back.complete
    assert back["ended_by"] == "failed" and back.benchmark.exit_code == 3


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("hooks", 5, "hooks"),
        ("system", "x", "system"),
        ("started_at", 3, "started_at"),
        ("state", "exploded", "state"),
        ("hooks", {"h": {"events": "many"}}, "hooks.h.events"),
    ],
)
def test_wrong_types_are_one_clear_error(
    tmp_path: Path, field: str, value: object, where: str
) -> None:
    write_raw(tmp_path, json.dumps({"format": FORMAT, "version": 2, field: value}))
    with pytest.raises(CollectionError, match="the manifest is not valid") as info:
        read_manifest(tmp_path)
    assert where in str(info.value) and str(tmp_path / MANIFEST_NAME) in str(info.value)


def test_rewrite_replaces_and_sets_format(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"collection_id": "a"})
    write_manifest(tmp_path, {"collection_id": "b", "format": "other", "version": 99})
    back = read_manifest(tmp_path)
    assert back.collection_id == "b" and back.format == FORMAT
    assert back.version == 2
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]


def test_creates_the_folder(tmp_path: Path) -> None:
    write_manifest(tmp_path / "a" / "b", {})
    assert read_manifest(tmp_path / "a" / "b").version == 2


def test_a_recovered_manifest_is_version_3_and_says_upgrade_to_a_version_2_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an older kernmlops reads up to 2 and knows no state recovered: it is told to
    # upgrade (the version check comes before the fields'), not that the file is invalid
    from kernmlops.collect import manifest as mod

    write_manifest(tmp_path / "r", {"collection_id": "r", "state": "recovered"})
    write_manifest(tmp_path / "c", {"collection_id": "c", "state": "completed"})
    raw = {n: json.loads((tmp_path / n / MANIFEST_NAME).read_text()) for n in ("r", "c")}
    assert (raw["r"]["version"], raw["c"]["version"]) == (3, 2)
    assert read_manifest(tmp_path / "r").state == "recovered"
    monkeypatch.setattr(mod, "FORMAT_VERSION", 2)
    with pytest.raises(CollectionError, match=r"format version 3, .*up to version 2; upgrade"):
        read_manifest(tmp_path / "r")
    assert read_manifest(tmp_path / "c").state == "completed"


def write_raw(folder: Path, text: str) -> None:
    (folder / MANIFEST_NAME).write_text(text)


def test_missing(tmp_path: Path) -> None:
    with pytest.raises(CollectionError, match="no manifest") as info:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST_NAME) in str(info.value)


def test_a_number_too_long_to_read(tmp_path: Path) -> None:
    """A damaged manifest with a 5000-digit number (past Python's int parsing limit) is
    one clear error, not json's ValueError traceback."""
    write_raw(tmp_path, '{"format": "kernmlops-collection", "version": 2, "flushes": '
              + "9" * 5000 + "}")  # fmt: skip
    with pytest.raises(CollectionError, match="not valid JSON") as info:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST_NAME) in str(info.value)


def test_not_json(tmp_path: Path) -> None:
    write_raw(tmp_path, '{"format": ')
    with pytest.raises(CollectionError, match="not valid JSON") as info:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST_NAME) in str(info.value)


def test_not_an_object(tmp_path: Path) -> None:
    write_raw(tmp_path, "[1, 2]")
    with pytest.raises(CollectionError, match="JSON object, not list"):
        read_manifest(tmp_path)


def test_wrong_format(tmp_path: Path) -> None:
    write_raw(tmp_path, json.dumps({"format": "pyperf", "version": 1}))
    with pytest.raises(
        CollectionError, match="format is 'pyperf', expected 'kernmlops-collection'"
    ):
        read_manifest(tmp_path)


def test_missing_format(tmp_path: Path) -> None:
    write_raw(tmp_path, json.dumps({"version": 1}))
    with pytest.raises(CollectionError, match="format is None"):
        read_manifest(tmp_path)


def test_newer_version(tmp_path: Path) -> None:
    write_raw(tmp_path, json.dumps({"format": FORMAT, "version": FORMAT_VERSION + 1}))
    with pytest.raises(CollectionError, match=r"format version 4.*upgrade") as info:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST_NAME) in str(info.value)


@pytest.mark.parametrize("version", ["1", None, 0, True, 1.0])
def test_bad_version(tmp_path: Path, version: object) -> None:
    write_raw(tmp_path, json.dumps({"format": FORMAT, "version": version}))
    with pytest.raises(CollectionError, match="not a positive integer"):
        read_manifest(tmp_path)
