"""``recover`` as root compacts a collection its user owns: the folder compaction makes
in it (``.compact-<table>``) is swapped, right after it is made, for one of the user's
holding links at the names the new parts are written under. Root writes through none
of them, and the collection keeps every row."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.collect.test_recover_compaction import SPOOLED, _pids, killed_collection
from tests.nobody import NOBODY, as_nobody, reachable_folder

SECRET = b"root's own: never to be overwritten\n"


@pytest.fixture
def hostile() -> Iterator[tuple[Path, Path]]:
    """(a killed collection, all of it nobody's, in nobody's folder; a folder of root's
    only, holding root's file)."""
    with reachable_folder("kmo-hostile-compaction-") as top:
        victim = top / "root-only"
        victim.mkdir(mode=0o700)
        (victim / "secret").write_bytes(SECRET)
        col = killed_collection(top / "alice" / "col")
        for path in [top / "alice", *(top / "alice").rglob("*")]:
            os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        yield col, victim


def test_a_compaction_folder_swapped_as_it_is_made_is_not_written_through(
    hostile: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernmlops.collect.recovery import recover
    from kernmlops.host.pinned import pin

    col, victim = hostile
    made = os.mkdir
    swapped = []

    def swap_first(path: str | Path, *args: object, **kw: object) -> None:
        made(path, *args, **kw)  # type: ignore[arg-type]
        name = Path(path).name
        if name.startswith(".compact-") and not swapped:
            # between root's mkdir and its open: the user's folder in its place
            swapped.append(name)

            def plant() -> None:
                os.rename(col / name, col / f"{name}.roots")
                os.mkdir(col / name)
                for i in range(4):
                    (col / name / f".part-{i:05d}.parquet.tmp").symlink_to(victim / "secret")

            as_nobody(plant)

    monkeypatch.setattr(os, "mkdir", swap_first)
    pinned = pin(col, what="the collection")
    try:
        done = recover(pinned.io, shown=col)
    finally:
        pinned.close()
    assert swapped
    assert (victim / "secret").read_bytes() == SECRET
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    assert not done.lost
    # not compacted (said why), every row kept once
    assert done.compaction["process_trace"].startswith("skipped: "), done.compaction
    assert _pids(col) == list(range(SPOOLED))
    shutil.rmtree(col / f"{swapped[0]}.roots", ignore_errors=True)


def test_a_fifo_among_the_parts_is_one_error_line_not_a_hang(hostile: tuple[Path, Path]) -> None:
    """A FIFO the user made at a part's name: root's recover would wait for a writer
    forever when it opened it to count its rows; it is named in one line, exit 2, and
    the spool stays."""
    col, _ = hostile
    fifo = col / "process_trace" / "part-00009.parquet"
    as_nobody(lambda: os.mkfifo(fifo))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kernmlops", "recover", str(col)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("recover hung on the FIFO")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "part-00009.parquet" in line and "not a plain file" in line, line
    assert list((col / ".spool").glob("*.ring")), "the spool stays"
