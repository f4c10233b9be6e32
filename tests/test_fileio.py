"""write_atomic: the old content or the new one, never half; nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernmlops import fileio
from kernmlops.fileio import write_atomic


def test_text_and_bytes_replace_the_file_and_leave_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "index.json"
    assert write_atomic(target, "é\n") == target
    assert target.read_bytes() == "é\n".encode()
    write_atomic(target, b"\x00\x01", durable=True)
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["index.json"]


def test_a_failed_rename_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old")

    def refuse(src: str | Path, dst: str | Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, "new", durable=True)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_a_missing_folder_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fileio.write_atomic(tmp_path / "absent" / "x.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_or_a_link_to_a_device_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """As root, ``kernmlops defaults /dev/null`` would have renamed a file over the
    device; a FIFO and a link to /dev/null stand in for it (nothing in /dev touched)."""
    fifo, link = tmp_path / "fifo", tmp_path / "null"
    os.mkfifo(fifo)
    link.symlink_to(os.devnull)
    with pytest.raises(OSError, match="not a file"):
        write_atomic(fifo, "x")
    with pytest.raises(OSError, match="a device"):
        write_atomic(link, "x")
    assert fifo.is_fifo() and os.readlink(link) == os.devnull
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "null"]
    # a link to a file is replaced by the new file, its target untouched (as before)
    (tmp_path / "real").write_text("old")
    (tmp_path / "to-real").symlink_to(tmp_path / "real")
    write_atomic(tmp_path / "to-real", "new")
    assert (tmp_path / "real").read_text() == "old"
    assert (tmp_path / "to-real").read_text() == "new" and not (tmp_path / "to-real").is_symlink()


def test_the_temporary_is_hidden_beside_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renamed: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def spy(src: str | Path, dst: str | Path) -> None:
        renamed.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    target = tmp_path / "model.json"
    write_atomic(str(target), "{}")  # a str path works too
    [(src, dst)] = renamed
    assert dst == target
    assert src.parent == tmp_path  # same folder: the rename cannot cross file systems
    assert src.name == f".model.json.{os.getpid()}.tmp"  # hidden from globs and readers
    assert target.read_text() == "{}"


def test_durable_syncs_the_file_and_the_folder_and_plain_syncs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    write_atomic(tmp_path / "a", "x")
    assert synced == []
    write_atomic(tmp_path / "a", "y", durable=True)
    assert len(synced) == 2  # the file before the rename, the folder after it
    assert (tmp_path / "a").read_text() == "y"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "duet-run.json"
    target.write_bytes(b"old")

    def disk_error(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", disk_error)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomic(target, b"new", durable=True)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["duet-run.json"]


def test_exchange_swaps_two_folders_in_one_step(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "old").write_text("1")
    (b / "new").write_text("2")
    fileio.exchange(a, b)
    assert [p.name for p in a.iterdir()] == ["new"]
    assert [p.name for p in b.iterdir()] == ["old"]


def test_exchange_with_a_missing_path_is_an_os_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(FileNotFoundError, match="absent"):
        fileio.exchange(tmp_path / "a", tmp_path / "absent")
    assert (tmp_path / "a").is_dir()
