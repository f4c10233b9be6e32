"""Paths a folder names stay in the folder; reads stop at a size limit."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernmlops.confined as confined_mod
from kernmlops.confined import UnsafePathError, check_size, confined, human_size, read_confined


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "outside").write_text("secret\n")
    (tmp_path / "f" / "sub").mkdir(parents=True)
    (tmp_path / "f" / "sub" / "a.txt").write_text("inside\n")
    return tmp_path / "f"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("/etc/shadow", "is an absolute path"),
        ("../outside", "climbs out with '..'"),
        ("sub/../../outside", "climbs out with '..'"),
        ("", "is not a file name"),
        (7, "is not a file name"),
        ("a\0b", "is not a file name"),
        ("out", "is a link out of the folder"),
        ("up/outside", "is a link out of the folder"),
    ],
)
def test_names_leaving_the_folder_are_refused(folder: Path, name: object, why: str) -> None:
    (folder / "out").symlink_to(folder.parent / "outside")
    (folder / "up").symlink_to("..")  # a folder link: every component counts
    with pytest.raises(UnsafePathError, match=why):
        confined(folder, name)
    with pytest.raises(UnsafePathError, match=why):
        read_confined(folder, name, 1024)


def test_names_inside_are_resolved(folder: Path) -> None:
    (folder / "link").symlink_to("sub/a.txt")
    assert confined(folder, "sub/a.txt") == (folder / "sub" / "a.txt").resolve()
    assert read_confined(folder, "link", 1024) == b"inside\n"
    assert read_confined(folder, "./sub//a.txt", 1024) == b"inside\n"


def test_a_link_swapped_in_after_the_check_is_refused(folder: Path, monkeypatch) -> None:
    # the race: the name passed the check, then became a link out before the open
    (folder / "swapped").symlink_to(folder.parent / "outside")
    monkeypatch.setattr(confined_mod, "confined", lambda f, n, what: Path(f) / n)
    with pytest.raises(UnsafePathError, match="is a link out of the folder"):
        read_confined(folder, "swapped", 1024)


def test_sizes_over_the_limit_are_refused(folder: Path) -> None:
    path = folder / "big"
    with open(path, "wb") as f:
        f.truncate(3 << 20)  # sparse: no disk used
    with pytest.raises(UnsafePathError, match=r"of 3\.0 MiB, over the 1\.0 MiB limit: not read!"):
        read_confined(folder, "big", 1 << 20, hint="!")
    with pytest.raises(UnsafePathError, match=r"over the 2\.0 KiB limit"):
        check_size(path, 2048)
    assert check_size(path, 3 << 20) == 3 << 20
    assert read_confined(folder, "sub/a.txt", 7) == b"inside\n"  # exactly the limit
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read_confined(folder, "sub", 1024)
    assert [human_size(n) for n in (5, 1536, 1 << 30)] == ["5 B", "1.5 KiB", "1.0 GiB"]
