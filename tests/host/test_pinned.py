"""kernmlops.host.pinned.pin failing partway, as root under sudo (nobody's ids as
SUDO_UID/SUDO_GID): the folders it made in the user's folder are not left root's."""

from __future__ import annotations

import os
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
