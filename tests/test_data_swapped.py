"""read_collection and read_parquet_dir, run by a user (not root) on a collection
another user can change: a part swapped for a FIFO right after the reader looked at
it, or a FIFO there from the start. Each part is opened once, a plain file only, and
read through that descriptor: the table is the one opened, never a wait for a writer,
and a FIFO there from the start is named, not left out in silence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nobody import NOBODY, reachable_folder
from tests.test_data import events, make_collection

ROOT = Path(__file__).resolve().parents[1]
N = 2500  # rows of "events": 3 parts of at most 1000

#: run as nobody: ``how`` reads the collection while ``part`` is swapped for a FIFO
#: (``swap``: right after the reader's first look at it; ``after``: once read, before
#: the table is scanned again; ``fifo``: one is there from the start); prints what it
#: read, or the error
READER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import pytest
from kernmlops.data import read_collection, read_parquet_dir
from kernmlops.errors import CollectionError
from tests.swap import Swap, swap_after_look, within

how, when, folder, part = sys.argv[2], sys.argv[3], Path(sys.argv[4]), Path(sys.argv[5])
swap = Swap(part)
if when == "swap":
    swap = swap_after_look(pytest.MonkeyPatch(), part)

def scan_again():
    c = read_collection(folder)
    swap.now()
    return c.scan("events").collect()

calls = {
    "read": lambda: read_collection(folder)["events"],
    "lazy": lambda: read_collection(folder, lazy=True)["events"].collect(),
    "scan": scan_again,
    "dir": lambda: read_parquet_dir(folder, "events"),
}
try:
    frame = within(calls[how], part)
except CollectionError as err:
    print(json.dumps({"error": str(err)}))
else:
    print(json.dumps({"rows": frame.height, "sum": int(frame["latency_ns"].sum()),
                      "swapped": swap.swapped}))
"""


def _as_nobody(how: str, when: str, folder: Path, part: Path) -> dict:
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to read as nobody"
    argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            sys.executable, "-c", READER, str(ROOT), how, when, str(folder), str(part)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture
def theirs() -> Iterator[Path]:
    """A collection of nobody's (so that nobody can swap its parts) where nobody reads."""
    with reachable_folder("kmo-swapped-") as top:
        folder = top / "curated" / "benchmark=faux" / "collection_id=s1"
        make_collection(folder, "faux", "s1", N)
        for path in [top / "curated", *(top / "curated").rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        yield folder


@pytest.mark.parametrize("how", ["read", "lazy", "dir"])
def test_a_part_swapped_for_a_fifo_after_a_look_is_read_as_opened(theirs: Path, how: str) -> None:
    part = theirs / "events" / "part-00001.parquet"
    said = _as_nobody(how, "swap", theirs, part)
    expected = events(N, offset=0)
    assert said == {"rows": N, "sum": int(expected["latency_ns"].sum()), "swapped": True}
    assert part.is_fifo()  # it was swapped


def test_a_read_table_is_scanned_as_read_not_by_its_parts_names(theirs: Path) -> None:
    """Collection.scan of a table read: what was read, whatever is at a part's name now."""
    part = theirs / "events" / "part-00000.parquet"
    said = _as_nobody("scan", "after", theirs, part)
    assert said == {"rows": N, "sum": int(events(N, offset=0)["latency_ns"].sum()),
                    "swapped": True}  # fmt: skip


@pytest.mark.parametrize("how", ["read", "lazy", "dir"])
def test_a_fifo_part_is_named_not_left_out(theirs: Path, how: str) -> None:
    part = theirs / "events" / "part-00001.parquet"
    part.unlink()
    os.mkfifo(part)
    said = _as_nobody(how, "fifo", theirs, part)
    assert said == {"error": f"{part}: not a plain file: not read"}
