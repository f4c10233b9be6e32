"""Finding a killed collection's spool in both its folders (the disk's and the
memory's), in order, and removing it: never through a link to another folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernmlops.spool.recovery import pending_spools
from tests.spool.conftest import make_collection


def test_a_killed_collections_spool_is_recovered_from_memory_and_disk(
    tmp_path: Path, shm: Path
) -> None:
    # pending_spools and the order of segments across the two folders (the link
    # "mem" is how a collection finds its tmpfs folder)
    from kernmlops.spool.memory import MEMORY_LINK, spool_memory
    from kernmlops.spool.recovery import remove_spool, spool_folders

    spool_dir = make_collection(tmp_path / "c", "c1")
    memory = spool_memory(spool_dir, "c1", 8)
    assert memory is not None and memory.folder == shm / "kernmlops-spool-c1"
    for folder, n in ((memory.folder, 0), (spool_dir, 1), (memory.folder, 2), (spool_dir, 10)):
        (folder / f"events.{n:05d}.ring").write_bytes(b"")
    assert spool_folders(spool_dir) == [spool_dir, spool_dir / MEMORY_LINK]
    assert [p.name for p in pending_spools(tmp_path / "c")] == [
        "events.00000.ring", "events.00001.ring", "events.00002.ring", "events.00010.ring"
    ]  # fmt: skip
    remove_spool(spool_dir)
    assert not spool_dir.exists() and not memory.folder.exists()


def test_a_collection_copied_with_its_memory_folder_keeps_those_segments(
    tmp_path: Path, shm: Path
) -> None:
    # cp -r / shutil.copytree follow the link: the copy's "mem" is a folder of its
    # own inside the spool, and recover must read its segments (under a storm they
    # hold every row that was not made yet).
    import shutil

    from kernmlops.spool.memory import MEMORY_LINK, spool_memory
    from kernmlops.spool.recovery import spool_folders

    spool_dir = make_collection(tmp_path / "c", "c1")
    memory = spool_memory(spool_dir, "c1", 8)
    assert memory is not None
    for folder, n in ((memory.folder, 0), (spool_dir, 1)):
        (folder / f"events.{n:05d}.ring").write_bytes(b"x")
    shutil.copytree(tmp_path / "c", tmp_path / "copy")
    copied = tmp_path / "copy" / spool_dir.relative_to(tmp_path / "c")
    assert not (copied / MEMORY_LINK).is_symlink()
    assert spool_folders(copied) == [copied, copied / MEMORY_LINK]
    assert [p.name for p in pending_spools(tmp_path / "copy")] == [
        "events.00000.ring", "events.00001.ring"
    ]  # fmt: skip


def test_a_memory_link_to_anything_but_its_own_folder_is_never_read_nor_deleted(
    tmp_path: Path, shm: Path
) -> None:
    # A collection folder someone planted (or one damaged): its link names another
    # folder. Neither recover nor the removal of its spool may touch that folder.
    from kernmlops.spool.memory import MEMORY_LINK
    from kernmlops.spool.recovery import remove_spool, spool_folders

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "x.00000.ring").write_bytes(b"keep")
    other = shm / "kernmlops-spool-someone-else"
    other.mkdir(mode=0o700)
    for n, target in enumerate((precious, other)):
        spool_dir = make_collection(tmp_path / f"c{n}", f"c{n}")
        (spool_dir).mkdir()
        (spool_dir / MEMORY_LINK).symlink_to(target)
        assert spool_folders(spool_dir) == [spool_dir]
        assert pending_spools(tmp_path / f"c{n}") == []
        remove_spool(spool_dir)
        assert target.exists() and not spool_dir.exists()
    assert (precious / "x.00000.ring").read_bytes() == b"keep"


def test_recover_on_what_is_not_a_collection_is_an_error_not_nothing_to_do(
    tmp_path: Path,
) -> None:
    # a typo, or a collection whose manifest was damaged: never "nothing to recover"
    import subprocess
    import sys

    empty = tmp_path / "empty"
    empty.mkdir()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "manifest.json").write_text("{bad")
    fifo = tmp_path / "fifo"  # a FIFO at its manifest's name: damage, never a wait
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    for folder, said in [
        (empty, f"{empty} is not a collection: it has no manifest.json"),
        (damaged, f"{damaged} is not a readable collection: the manifest is not valid JSON"),
        (fifo, f"{fifo} is not a readable collection: cannot read the manifest: not a plain"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "kernmlops", "recover", str(folder)],
            capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_spool_whose_removal_a_kill_cut_reads_as_done_and_a_deletion_as_a_loss(
    tmp_path: Path, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # remove_spool marks the spool done (its rows are all in parts) before any file
    # goes: whatever a kill leaves (a json without its segment, a dangling "mem") reads
    # as nothing pending and nothing lost. Without the mark the same json is a loss.
    import json
    import shutil

    from kernmlops.spool.memory import memory_lost, spool_memory
    from kernmlops.spool.recovery import remove_spool

    class Killed(BaseException):
        pass

    def lay() -> Path:
        col = tmp_path / "c"
        shutil.rmtree(col, ignore_errors=True)
        spool = make_collection(col, "c1")
        memory = spool_memory(spool, "c1", 8)
        assert memory is not None
        (spool / "events.json").write_text("{}")
        for folder, n in ((memory.folder, 0), (spool, 1)):
            (folder / f"events.{n:05d}.ring").write_bytes(b"x" * 64)
            meta = {"version": 2, "rows_before": {}, "bytes": 64, "retired": False}
            (folder / f"events.{n:05d}.json").write_text(json.dumps(meta))
        return spool

    deleted: list[str] = []

    def cut_after(n: int | None):
        real = os.unlink

        def unlink(path, *args, **kwargs):
            if n is not None and len(deleted) >= n:
                raise Killed
            real(path, *args, **kwargs)
            deleted.append(os.fspath(path))

        return unlink

    with monkeypatch.context() as m:
        m.setattr(os, "unlink", cut_after(None))
        remove_spool(lay())
    assert not (tmp_path / "c" / ".spool").exists() and not list(shm.iterdir())
    files = len(deleted)
    assert files == 8  # 2 segments and 2 jsons, the owner file, the link, the description, the mark
    for n in range(files):
        deleted.clear()
        spool = lay()
        with monkeypatch.context() as m:
            m.setattr(os, "unlink", cut_after(n))
            with pytest.raises(Killed):
                remove_spool(spool)
        assert pending_spools(tmp_path / "c") == [], n
        assert memory_lost(tmp_path / "c") is None, n
    # deleted by anyone else: no mark, a json noting 64 bytes and no file
    spool = lay()
    (spool / "events.00001.ring").unlink()
    assert pending_spools(tmp_path / "c")[-1] == spool / "events.00001.ring"
    # a spool that is a link is never followed, its target never marked nor emptied
    (tmp_path / "c" / ".spool").rename(tmp_path / "elsewhere")
    (tmp_path / "c" / ".spool").symlink_to(tmp_path / "elsewhere")
    remove_spool(tmp_path / "c" / ".spool")
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == [
        "events.00001.json", "events.json", "mem"
    ]  # fmt: skip


def test_a_planted_or_stray_done_mark_does_not_hide_a_spool(tmp_path: Path, shm: Path) -> None:
    # "done" in a spool the stop never finished (a user's `touch`, a damaged or stale
    # mark): its segments are still pending, and recover reads them (here they are no
    # records: named lost, exit 2, the spool kept), never "nothing to recover" and the
    # segments deleted. Only the mark remove_spool writes, naming each segment left
    # and its size, reads as done.
    import json
    import subprocess
    import sys

    from kernmlops.spool.collection import DONE_MARK, spool_done
    from kernmlops.spool.recovery import remove_spool

    spool = make_collection(tmp_path / "c", "c1")
    spool.mkdir()
    (spool / "events.json").write_text("{}")
    (spool / "events.00000.ring").write_bytes(b"x" * 64)
    meta = {"version": 2, "rows_before": {}, "bytes": 64, "retired": False}
    (spool / "events.00000.json").write_text(json.dumps(meta))
    for mark in [b"", b"{}", b"not json", json.dumps({"segments": {"events.00000.ring": 63}})]:
        (spool / DONE_MARK).write_bytes(mark if isinstance(mark, bytes) else mark.encode())
        assert not spool_done(spool), mark
        assert pending_spools(tmp_path / "c") == [spool / "events.00000.ring"], mark
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "recover", str(tmp_path / "c")],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert done.returncode == 2 and "nothing to recover" not in done.stderr, done.stderr
    assert (spool / "events.00000.ring").read_bytes() == b"x" * 64
    # the stop's own mark, cut right after it was written: done, nothing pending
    real = os.unlink

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    os.unlink = killed  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            remove_spool(spool)
    finally:
        os.unlink = real
    assert spool_done(spool) and pending_spools(tmp_path / "c") == []


def test_a_segment_that_shrinks_while_read_is_named_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read a frame at a time, a segment file its user cuts meanwhile (or an I/O
    error) costs what was not read yet: named in one line, the spool kept."""
    from kernmlops.collect.recovery import recover
    from kernmlops.spool.frames import SegmentFile
    from tests.collect.test_recover_compaction import killed_collection

    col = killed_collection(tmp_path / "col")
    (seg,) = (col / ".spool").glob("*.ring")
    size = seg.stat().st_size
    reads: list[int] = []
    read = SegmentFile.read

    def cut_after_a_header(self: SegmentFile, at: int, n: int) -> bytes:
        reads.append(at)
        if len(reads) == 2:  # the first frame's records, after its header
            os.truncate(seg, 10)
        return read(self, at, n)

    monkeypatch.setattr(SegmentFile, "read", cut_after_a_header)
    done = recover(col)
    assert [(lost.file, lost.reason) for lost in done.lost] == [
        (seg, "cannot be read to its end (the file shrank while it was read)")
    ]
    assert done.added == {} and reads[:2] == [0, 8] and size > 10
    assert seg.exists()  # the spool stays
