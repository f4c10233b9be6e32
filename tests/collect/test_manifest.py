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
    read_manifest,
    write_manifest,
)
from kernmlops.errors import CollectionError


def test_round_trip(tmp_path: Path) -> None:
    started = dt.datetime(2024, 5, 1, 12, 30, 0, tzinfo=dt.UTC)
    manifest = {
        "collection_id": "abc",
        "benchmark": "faux",
        "started_at": started,
        "output": tmp_path / "x",
        "hooks": {"block_io": {"attached": True, "events": 12, "drops": 0}},
        "tables": {"block_io": ["block_io/part-00000.parquet"]},
    }
    path = write_manifest(tmp_path, manifest)
    assert path == tmp_path / MANIFEST_NAME
    back = read_manifest(tmp_path)
    # format and version come first; the caller's order follows, keys unsorted.
    assert list(back) == ["format", "version", *manifest]
    assert back["format"] == FORMAT
    assert back["version"] == FORMAT_VERSION == 1
    assert back["started_at"] == "2024-05-01 12:30:00+00:00"
    assert back["output"] == str(tmp_path / "x")
    assert back["hooks"] == manifest["hooks"]
    assert back["tables"] == manifest["tables"]
    assert "\n  " in path.read_text()  # indented for people
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]  # no temporary file left
    assert manifest.get("format") is None  # the caller's dict is not changed


def test_rewrite_replaces_and_sets_format(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"collection_id": "a"})
    write_manifest(tmp_path, {"collection_id": "b", "format": "other", "version": 99})
    back = read_manifest(tmp_path)
    assert back == {"format": FORMAT, "version": FORMAT_VERSION, "collection_id": "b"}
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_NAME]


def test_creates_the_folder(tmp_path: Path) -> None:
    write_manifest(tmp_path / "a" / "b", {})
    assert read_manifest(tmp_path / "a" / "b") == {"format": FORMAT, "version": 1}


def write_raw(folder: Path, text: str) -> None:
    (folder / MANIFEST_NAME).write_text(text)


def test_missing(tmp_path: Path) -> None:
    with pytest.raises(CollectionError, match="no manifest") as info:
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
    with pytest.raises(CollectionError, match=r"format version 2.*upgrade") as info:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST_NAME) in str(info.value)


@pytest.mark.parametrize("version", ["1", None, 0, True, 1.0])
def test_bad_version(tmp_path: Path, version: object) -> None:
    write_raw(tmp_path, json.dumps({"format": FORMAT, "version": version}))
    with pytest.raises(CollectionError, match="not a positive integer"):
        read_manifest(tmp_path)
