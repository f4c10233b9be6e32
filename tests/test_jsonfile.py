"""JSON nested deeper than Python's parser recurses (a few hundred kilobytes of
``[[[[``) is malformed JSON like any other: the commands that read a manifest or a
result file name the file in one line, never a RecursionError's traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kernmlops.jsonfile import loads

#: deeper than the interpreter's recursion limit, as a hostile file would be
DEEP = "[" * 200_000 + "]" * 200_000


def test_nesting_too_deep_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        loads(DEEP)
    assert loads(b'{"a": [1, [2]]}') == {"a": [1, [2]]}


def _kernmlops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernmlops", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["graph", "col"], "error: col/manifest.json: the manifest is not valid JSON: "
                           "nested too deeply"),
        (["recover", "col"], "error: col is not a readable collection: the manifest is not "
                             "valid JSON: nested too deeply"),
    ],
)  # fmt: skip
def test_a_manifest_nested_too_deep_is_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    (tmp_path / "col").mkdir()
    (tmp_path / "col" / "manifest.json").write_text(f'{{"format": {DEEP}}}')
    done = _kernmlops(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == said + "\n"


def test_a_manifest_not_utf8_is_said_so_not_by_the_codec(tmp_path: Path) -> None:
    (tmp_path / "col").mkdir()
    (tmp_path / "col" / "manifest.json").write_bytes(b"\xd1\xff{}")
    done = _kernmlops("graph", "col", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    # before: 'utf-8' codec can't decode byte 0xd1 in position 0: invalid continuation byte
    assert done.stderr == "error: col/manifest.json: cannot read the manifest: not UTF-8 text\n"


def test_a_duet_result_file_nested_too_deep_is_named(tmp_path: Path) -> None:
    results = tmp_path / "res"
    results.mkdir()
    for side in "AB":
        name = f"s.b.0.duet.AB.{side}.hyperfine.json"
        (results / name).write_text(f'{{"results": [], "times": {DEEP}}}')
    done = _kernmlops("duet", "process", "res", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "hyperfine: malformed" in done.stderr and "nested too deeply" in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "error: no iterations in 2 result file(s) (see the warnings above)"
    )
