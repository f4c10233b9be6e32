"""`kernmlops recover` says on a terminal how much of the spool it has read, in bytes,
up to the spool's size; elsewhere it says what it said before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.collect.manifest import Manifest, write_manifest
from kernmlops.hooks.process_trace import ProcessTraceHook
from kernmlops.spool.copy import RingSpool
from tests.collect.test_recover_compaction import OBJECT, _records
from tests.conftest import skip_here
from tests.progress import force_terminal, last_count

# what a quick run says, however long a starved one takes (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("unhurried")

FRAMES, FRAME_ROWS = 6, 700


@pytest.fixture(autouse=True)
def _small_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernmlops.spool import copy

    if not OBJECT.exists():
        skip_here("the BPF objects are not built (make bpf)")
    # frames of FRAME_ROWS records or fewer: the spool is read in several steps
    monkeypatch.setattr(copy, "FRAME_RAW", FRAME_ROWS * _records(0, 1).itemsize)


def spooled(folder: Path) -> Path:
    """A killed collection whose spool holds FRAMES frames or more, and no part."""
    if not OBJECT.exists():
        skip_here("the BPF objects are not built (make bpf)")
    folder.mkdir()
    write_manifest(folder, Manifest(collection_id="c0", state="running", config={}))
    info = {"hook": "process_trace", "options": ProcessTraceHook.Options().model_dump(),
            "ring": "process_trace_rb", "object": str(OBJECT)}  # fmt: skip
    spool = RingSpool(folder / ".spool", "process_trace", _records(0, 1).itemsize, info)
    for i in range(FRAMES):
        spool.append(_records(i * FRAME_ROWS, (i + 1) * FRAME_ROWS))
    spool.drained()
    spool.close()
    return folder


def _spool_bytes(folder: Path) -> int:
    return sum(os.lstat(p).st_size for p in (folder / ".spool").rglob("*.ring"))


def test_recover_tells_the_bytes_read_up_to_the_spools_size(tmp_path: Path) -> None:
    from kernmlops.collect.recovery import recover

    col = spooled(tmp_path / "c")
    size = _spool_bytes(col)
    told: list[tuple[int, int]] = []
    done = recover(col, progress=lambda n, total: told.append((n, total)))
    assert done.added == {"process_trace": FRAMES * FRAME_ROWS}
    assert {total for _, total in told} == {size}
    read = [n for n, _ in told]
    assert read == sorted(read) and read[-1] == size
    assert len(set(read)) > FRAMES // 2  # frame by frame, not only at the end


def test_recover_command_shows_the_spools_bytes_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernmlops.cli import cli

    said = f"recovered process_trace {FRAMES * FRAME_ROWS:,} into"
    plain = CliRunner().invoke(cli, ["recover", str(spooled(tmp_path / "a"))])
    assert plain.exit_code == 0, plain.output
    assert plain.stderr == f"{said} {tmp_path / 'a'}\n"
    force_terminal(monkeypatch)
    col = spooled(tmp_path / "b")
    size = _spool_bytes(col)
    shown = CliRunner().invoke(cli, ["recover", str(col)])
    assert shown.exit_code == 0, shown.output
    done, total = last_count(shown.stderr, "recovering the spool", "kB")
    assert done == total == f"{size / 1000:.1f}"
    assert shown.stderr.endswith(f"{said} {col}\n")
    off = CliRunner().invoke(cli, ["recover", "--no-progress", str(spooled(tmp_path / "c"))])
    assert (off.exit_code, off.stderr) == (0, f"{said} {tmp_path / 'c'}\n")
