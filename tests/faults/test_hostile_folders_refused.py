"""The tests of test_hostile_folders.py whose output folder is refused before anything
runs (a planted link, another user's link or folder): no BPF is loaded, so these run
beside the main lane (tests/lanes.py); the runs that collect are that module's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.conftest import start_collect
from tests.faults.test_hostile_folders import (
    NOBODY,
    SUDO,
    _as_nobody,
    _one_error_line,
    _snapshot,
    made_home,
)


@pytest.fixture
def home() -> Iterator[tuple[Path, Path]]:
    """test_hostile_folders.py's made_home(), for the test."""
    with made_home() as folders:
        yield folders


def test_the_output_folder_a_planted_link_is_refused_in_one_line(
    home: tuple[Path, Path],
) -> None:
    """``-o ~/data/x`` where the user made x a link to root's folder: refused before
    anything runs, the line names the link; root's folder is as it was."""
    user, victim = home
    before = _snapshot(victim)
    (user / "data").mkdir()
    os.chown(user / "data", NOBODY, NOBODY)
    _as_nobody("ln", "-s", str(victim), str(user / "data" / "x"))
    marker = user / "ran"
    run = start_collect(user / "data" / "x", "--", "touch", str(marker), env=SUDO)
    code, err = run.finish(timeout_s=60)
    assert code == 2, err
    line = _one_error_line(err)
    assert f"{user / 'data' / 'x'} is a link in a folder nobody can change" in line, line
    assert _snapshot(victim) == before
    assert not marker.exists()


def test_under_sudo_a_link_of_another_user_is_refused_in_one_line(
    home: tuple[Path, Path],
) -> None:
    """The same link in the user's folder, but uid 4242's: refused, nothing written."""
    user, _ = home
    data = user.parent / "elsewhere"
    data.mkdir()
    os.chown(data, NOBODY, NOBODY)
    (user / "data").symlink_to(data)
    os.chown(user / "data", 4242, 4242, follow_symlinks=False)
    marker = user / "ran"
    run = start_collect(user / "data", "--", "touch", str(marker), env=SUDO)
    code, err = run.finish(timeout_s=60)
    assert code == 2, err
    line = _one_error_line(err)
    assert f"{user / 'data'} is a link in a folder nobody can change" in line, line
    assert list(data.iterdir()) == [] and not marker.exists()


def test_a_folder_of_another_user_is_refused_in_one_line(home: tuple[Path, Path]) -> None:
    """Under sudo as nobody, an output below a folder of uid 4242 (who could swap its
    entries, and whose folder the files would land in): refused, the folder named."""
    user, _ = home
    other = user.parent / "bob"
    other.mkdir()
    os.chown(other, 4242, 4242)
    run = start_collect(other / "data", "--", "true", env=SUDO)
    code, err = run.finish(timeout_s=60)
    assert code == 2, err
    line = _one_error_line(err)
    assert f"{other} belongs to uid 4242, neither to you (nobody) nor to root" in line, line
    assert not (other / "data").exists()
