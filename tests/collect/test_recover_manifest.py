"""`kernmlops recover` on a killed collection whose manifest lost its collection_id
(a hand's edit, a damaged copy): every recovered row carries that id, so recover
refuses in one line, exit 2, and the spool is kept for the try after it is put back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.errors import CollectionError
from tests.collect.test_recover_progress import FRAME_ROWS, FRAMES, spooled


def _without_id(col: Path) -> Path:
    manifest = json.loads((col / "manifest.json").read_text())
    del manifest["collection_id"]
    (col / "manifest.json").write_text(json.dumps(manifest))
    return col


def _rings(col: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (col / ".spool").glob("*.ring")}


def test_recover_without_a_collection_id_is_one_line_and_keeps_the_spool(
    tmp_path: Path,
) -> None:
    from kernmlops.cli import cli

    col = _without_id(spooled(tmp_path / "c"))
    rings = _rings(col)
    assert rings
    done = CliRunner().invoke(cli, ["recover", "--no-progress", str(col)])
    assert done.exit_code == 2, done.output
    assert "Traceback" not in done.output
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert "names no collection_id" in done.stderr
    assert _rings(col) == rings
    assert not (col / "process_trace").exists()  # no part written without the id
    # the id put back, as the message says: every row is recovered
    manifest = json.loads((col / "manifest.json").read_text())
    manifest["collection_id"] = "c0"
    (col / "manifest.json").write_text(json.dumps(manifest))
    again = CliRunner().invoke(cli, ["recover", "--no-progress", str(col)])
    assert again.exit_code == 0, again.output
    assert f"process_trace {FRAMES * FRAME_ROWS:,}" in again.stderr


def test_the_library_recover_refuses_it_as_a_collection_error(tmp_path: Path) -> None:
    from kernmlops.collect.recovery import recover

    col = _without_id(spooled(tmp_path / "c"))
    with pytest.raises(CollectionError, match="names no collection_id"):
        recover(col)
    assert _rings(col)
