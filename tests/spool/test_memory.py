"""The spool's memory on a tmpfs: whose folder it is, what a killed or moved
collection left there, what a reboot took, and a link that is not the spool's own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernmlops.spool.recovery import pending_spools
from tests.spool.conftest import make_collection


def test_a_memory_folder_someone_else_made_is_not_used(tmp_path: Path, shm: Path) -> None:
    from kernmlops.spool import memory as spool_mod

    planted = shm / f"{spool_mod.MEMORY_PREFIX}c1"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)  # another user's, open to all (or a link): not ours
    assert spool_mod.spool_memory(tmp_path / "c1" / ".spool", "c1", 8) is None
    assert spool_mod.spool_memory(tmp_path / "c2" / ".spool", "c2", 8) is not None


def test_recover_says_when_the_memory_link_is_not_the_spools_own(tmp_path: Path, shm: Path) -> None:
    # never read, never deleted, but never in silence either: rows of this
    # collection may be in the folder it names
    import subprocess
    import sys

    from kernmlops.spool.memory import MEMORY_LINK, foreign_memory

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "quanta_runtime.00000.ring").write_bytes(b"x" * 64)
    spool_dir = make_collection(tmp_path / "c", "c1")
    spool_dir.mkdir()
    (spool_dir / MEMORY_LINK).symlink_to(elsewhere)
    assert foreign_memory(tmp_path / "c", "c1") == elsewhere
    out = subprocess.run(
        [sys.executable, "-m", "kernmlops", "recover", str(tmp_path / "c")],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"the spool's memory link names {elsewhere}" in out.stderr
    assert "Traceback" not in out.stderr
    assert (elsewhere / "quanta_runtime.00000.ring").read_bytes() == b"x" * 64  # untouched
    assert foreign_memory(tmp_path / "c2", None) is None  # no collection, no link: nothing


def test_recover_frees_the_empty_memory_folder_a_kill_during_set_up_left(
    tmp_path: Path, shm: Path
) -> None:
    """Killed between making its tmpfs folder and linking it from the spool: no spool
    leads back to the folder, which holds no row. ``recover`` removes it (found by
    the collection's id); a folder with segments, or not ours alone, stays."""
    from click.testing import CliRunner

    from kernmlops.cli import cli
    from kernmlops.spool import memory as spool_mod

    make_collection(tmp_path / "c", "c1")
    empty = spool_mod.memory_folder("c1")
    empty.mkdir(mode=0o700)
    done = CliRunner().invoke(cli, ["recover", str(tmp_path / "c")])
    assert done.exit_code == 0, done.output
    assert f"no spool (its empty memory folder {empty} is removed)" in done.output
    assert not empty.exists()
    owner_only = spool_mod.memory_folder("c2")
    owner_only.mkdir(mode=0o700)
    (owner_only / spool_mod.OWNER_FILE).write_text(str(tmp_path / "c2" / ".spool"))
    assert spool_mod.free_empty_memory("c2") == owner_only and not owner_only.exists()
    held = spool_mod.memory_folder("c3")
    held.mkdir(mode=0o700)
    (held / "quanta_runtime.00000.ring").write_bytes(b"x" * 64)
    shared = spool_mod.memory_folder("c4")
    shared.mkdir()
    os.chmod(shared, 0o755)  # others may read it: not the collector's own
    for cid, folder in (("c3", held), ("c4", shared)):
        assert spool_mod.free_empty_memory(cid) is None and folder.exists()
    assert (held / "quanta_runtime.00000.ring").read_bytes() == b"x" * 64
    assert spool_mod.free_empty_memory("c5") is None and spool_mod.free_empty_memory(None) is None


def test_a_moved_collections_memory_is_kept_and_named_at_the_next_start(
    tmp_path: Path, shm: Path
) -> None:
    # Kill a collection, move its folder, start another: the memory spool of the moved
    # one holds the only copy of its rows. It is listed (size, where), never deleted,
    # and recover on the moved folder still finds it through the collection's id.
    from kernmlops.spool.memory import leftover_memory, spool_memory
    from kernmlops.spool.recovery import spool_folders

    spool_dir = make_collection(tmp_path / "a", "ida")
    memory = spool_memory(spool_dir, "ida", 8)
    assert memory is not None
    (memory.folder / "events.00000.ring").write_bytes(b"x" * 3000)
    assert leftover_memory() == []  # a young folder: a collector may be making it
    os.utime(memory.folder, (0, 0))
    (left,) = leftover_memory()
    assert (left.folder, left.bytes, left.collection, left.found) == (
        memory.folder, 3000 + len(str(spool_dir.resolve())), tmp_path / "a", True
    )  # fmt: skip
    assert f"`kernmlops recover {tmp_path / 'a'}`" in left.describe()
    (tmp_path / "a").rename(tmp_path / "moved")
    spool_memory(make_collection(tmp_path / "b", "idb"), "idb", 8)  # the next start
    (left,) = leftover_memory()
    assert left.folder == memory.folder and not left.found
    assert "moved or deleted since" in left.describe()
    assert left.describe().startswith("a collection's unrecovered spool holds")  # no manifest
    assert (memory.folder / "events.00000.ring").exists()
    moved = tmp_path / "moved" / ".spool"
    assert spool_folders(moved) == [moved, moved / "mem"]
    assert [p.name for p in pending_spools(tmp_path / "moved")] == ["events.00000.ring"]


@pytest.mark.parametrize(
    ("state", "whose"),
    [("running", "a killed collection's spool"),  # its collector died: never finalised
     ("interrupted", "an interrupted collection's spool"),  # Ctrl+C again at the stop
     ("disk_full", "the spool of a collection stopped by a full disk"),
     ("completed", "a collection's unrecovered spool")],  # e.g. a hook's bug at the stop
)  # fmt: skip
def test_the_memory_left_is_named_by_how_its_collection_ended(
    tmp_path: Path, shm: Path, state: str, whose: str
) -> None:
    # a spool parked at the stop keeps its memory too: the warning says what the
    # collection's manifest knows, not that it was killed
    from kernmlops.collect.manifest import Manifest, write_manifest
    from kernmlops.spool.memory import leftover_memory, spool_memory

    spool_dir = make_collection(tmp_path / "a", "ida")
    write_manifest(tmp_path / "a", Manifest(collection_id="ida", state=state))
    memory = spool_memory(spool_dir, "ida", 8)
    assert memory is not None
    os.utime(memory.folder, (0, 0))
    (left,) = leftover_memory()
    assert left.describe() == (
        f"{whose} holds 0 MiB of memory in {memory.folder}: "
        f"`kernmlops recover {tmp_path / 'a'}` makes its rows and frees it"
    )


def test_memory_gone_after_a_reboot_is_named(tmp_path: Path) -> None:
    from kernmlops.spool.memory import MEMORY_LINK, memory_lost

    spool_dir = tmp_path / "c" / ".spool"
    spool_dir.mkdir(parents=True)
    assert memory_lost(tmp_path / "c") is None
    (spool_dir / MEMORY_LINK).symlink_to(tmp_path / "shm-gone")
    assert memory_lost(tmp_path / "c") == tmp_path / "shm-gone"
    assert pending_spools(tmp_path / "c") == []  # only what is on disk is left
