"""kernmlops.host.pinned.pin failing partway, as root under sudo (nobody's ids as
SUDO_UID/SUDO_GID): the folders it made in the user's folder are not left root's."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.errors import OutputError
from kernmlops.host import pinned
from kernmlops.host.pinned import UnsafePath, pin

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tmp_path.chmod(0o755)
    home = tmp_path / "alice"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    for key, value in {"SUDO_UID": NOBODY, "SUDO_GID": NOBODY, "SUDO_USER": "nobody"}.items():
        monkeypatch.setenv(key, str(value))
    return home


def test_the_empty_folders_made_before_a_failure_are_removed(user: Path) -> None:
    with pytest.raises(OutputError, match="File name too long"):
        pin(user / "a" / "b" / ("x" * 300), create=True, invoker_uid=NOBODY)
    assert list(user.iterdir()) == []


def test_a_folder_made_that_is_not_empty_is_handed_over(
    user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after something was written in a folder pin made: it cannot be
    removed, and is the invoker's rather than root's."""
    real = pinned._open_dir

    def swapped(name: str, parent: int, here: Path, path: Path, action: str) -> int:
        if name == "b":
            os.close(os.open("kept", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=parent))
            raise UnsafePath(f"cannot {action} {path}: {here} was replaced as it was made")
        return real(name, parent, here, path, action)

    monkeypatch.setattr(pinned, "_open_dir", swapped)
    with pytest.raises(UnsafePath):
        pin(user / "a" / "b", create=True, invoker_uid=NOBODY)
    assert (user / "a").lstat().st_uid == NOBODY
    assert (user / "a" / "kept").exists()


def test_a_pin_that_succeeds_keeps_what_it_made(user: Path) -> None:
    held = pin(user / "a" / "b", create=True, invoker_uid=NOBODY)
    try:
        assert len(held.created) == 2  # a and b, to be handed over by the caller
        assert (user / "a" / "b").lstat().st_uid == 0
    finally:
        held.close()


@pytest.fixture
def shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder of root's any user may enter, like /home, holding nobody's home
    ``alice`` (tmp_path's parents are root's alone: nobody could go nowhere below)."""
    top = Path(tempfile.mkdtemp(prefix="kmo-pinned-"))
    top.chmod(0o755)
    _folder(top / "alice")
    for key, value in {"SUDO_UID": NOBODY, "SUDO_GID": NOBODY, "SUDO_USER": "nobody"}.items():
        monkeypatch.setenv(key, str(value))
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _link(link: Path, target: Path, owner: int = NOBODY) -> None:
    link.symlink_to(target)
    os.chown(link, owner, owner, follow_symlinks=False)


def _folder(path: Path, owner: int = NOBODY, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, mode=mode)
    path.chmod(mode)
    os.chown(path, owner, owner)
    return path


def test_under_sudo_the_invokers_own_link_is_followed(shared: Path) -> None:
    """``~/data -> /scratch/alice/data``, link and target the invoker's: written in
    as if named (protected_symlinks: the follower owns the link)."""
    user = shared / "alice"
    data = _folder(_folder(shared / "scratch", owner=0) / "alice") / "data"
    _folder(data)
    _link(user / "data", data)
    held = pin(user / "data" / "c" / "d", create=True, invoker_uid=NOBODY)  # c, d made
    try:
        assert os.path.samestat(os.fstat(held.fd), os.stat(data / "c" / "d"))
    finally:
        held.close()


def test_under_sudo_a_link_of_another_user_is_refused(shared: Path) -> None:
    user = shared / "alice"
    data = _folder(shared / "data")
    _link(user / "data", data, owner=4242)  # in the invoker's folder, but uid 4242's link
    with pytest.raises(UnsafePath, match=f"{user / 'data'} is a link in a folder nobody can"):
        pin(user / "data" / "c", create=True, invoker_uid=NOBODY)
    assert not (data / "c").exists()


@pytest.mark.parametrize(
    ("owner", "mode", "why"),
    [
        (0, 0o700, "which nobody could not enter"),  # root's alone: /root
        (0, 0o755, "which nobody could not write in"),  # /etc
        (0, 0o777, "which nobody could not keep from other users"),  # open, not sticky
        (4242, 0o777, "belongs to uid 4242, neither to you"),  # a third user's
    ],
)
def test_the_invokers_link_leads_only_where_they_could_go(
    shared: Path, owner: int, mode: int, why: str
) -> None:
    """Followed with the invoker's rights: past their link every folder must be
    root's or theirs, open to no one else, one they may enter and, last, write in."""
    user = shared / "alice"
    victim = _folder(shared / "victim", owner=owner, mode=mode)
    _link(user / "data", victim)
    with pytest.raises(UnsafePath, match=why):
        pin(user / "data" / "c", create=True, invoker_uid=NOBODY)
    assert list(victim.iterdir()) == []


def test_under_sudo_the_invokers_link_in_a_folder_others_can_change_is_refused(
    shared: Path,
) -> None:
    """Their own link, but in a folder open to everyone (not sticky): anyone could
    have put it there in place of another."""
    user = shared / "alice"
    data = _folder(user / "data")
    _folder(shared / "open", owner=0, mode=0o777)
    _link(shared / "open" / "data", data)
    with pytest.raises(UnsafePath, match=f"{shared / 'open' / 'data'} is a link in a folder"):
        pin(shared / "open" / "data", invoker_uid=NOBODY)


def test_a_held_folder_is_followed_by_its_descriptor_not_its_name(user: Path) -> None:
    """pin(fd_path(fd) / ...) reaches the held folder itself: the name /proc shows for
    it (here '<name> (deleted)', a folder the user made under that name) is not
    walked again."""
    gone = user / "gone"
    gone.mkdir()
    fd = os.open(gone, os.O_RDONLY | os.O_DIRECTORY)
    try:
        gone.rmdir()
        decoy = _folder(user / "gone (deleted)")
        assert os.readlink(pinned.fd_path(fd)) == str(decoy)
        with pytest.raises(OutputError):
            pin(pinned.fd_path(fd) / "c", create=True, invoker_uid=NOBODY)
        assert list(decoy.iterdir()) == []
    finally:
        os.close(fd)


def test_a_fresh_subfolder_is_made_now_and_is_the_one_made(tmp_path: Path) -> None:
    # made and opened: the folder made; one there already is refused and left as it is
    # (one swapped in as it is made: tests/collect/test_hostile_compaction.py)
    held = pin(tmp_path, what="the collection")
    try:
        fd = pinned.subfolder(held.io, "new", fresh=True)
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "new"))
        os.close(fd)
        (tmp_path / "new" / "kept").write_bytes(b"x")
        with pytest.raises(FileExistsError):
            pinned.subfolder(held.io, "new", fresh=True)
        assert (tmp_path / "new" / "kept").read_bytes() == b"x"
    finally:
        held.close()


@pytest.mark.parametrize("theirs", ["a user's empty folder", "a folder with a link in it"])
def test_a_fresh_folder_swapped_as_it_is_made_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs: str
) -> None:
    # a user who may write in the parent renames the folder pin made and puts theirs
    # at its name between the mkdir and the open: nothing is written in theirs
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's")
    real = os.mkdir

    def mkdir_then_swap(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real(name, mode, dir_fd=dir_fd)
        if name == "out":
            os.rename("out", "made", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            real("out", 0o777, dir_fd=dir_fd)
            fd = os.open("out", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
            try:
                if theirs == "a user's empty folder":
                    os.fchown(fd, NOBODY, NOBODY)
                else:
                    os.symlink(victim, "manifest.json", dir_fd=fd)
            finally:
                os.close(fd)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(UnsafePath, match="was replaced as it was made"):
        pin(tmp_path / "out", create=True, fresh=True)
    monkeypatch.undo()
    assert victim.read_bytes() == b"root's"
    assert (tmp_path / "made").is_dir()  # pin's own folder, left where the user put it
