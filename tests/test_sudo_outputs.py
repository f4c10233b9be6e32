"""The commands besides collect that write files, run under sudo (nobody's ids as
SUDO_UID/SUDO_GID, as root): what they write is the invoking user's, and only that
(a root file already in the output folder stays root's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.data import Collection
from kernmlops.graphs.cli import graph_command, report_command
from tests.graphs.conftest import synthetic  # noqa: F401 (the fixture)

NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hands files over: needs root")


def _owners(root: Path) -> dict[Path, int]:
    return {p: p.lstat().st_uid for p in [root, *root.rglob("*")]}


def test_graph_under_sudo_writes_the_users_pngs_and_leaves_roots_files(
    synthetic: Collection,  # noqa: F811
    tmp_path: Path,
) -> None:
    figs = tmp_path / "new" / "figs"
    (tmp_path / "roots").mkdir()
    (tmp_path / "roots" / "keep.txt").write_text("root's\n")
    for out in (figs, tmp_path / "roots"):
        done = CliRunner(env=SUDO).invoke(
            graph_command, [str(synthetic.path), "-o", str(out), "--only", "syscalls_top"]
        )
        assert done.exit_code == 0, done.output
    assert (figs / "syscalls_top.png").exists()
    assert set(_owners(tmp_path / "new").values()) == {NOBODY}  # made by it: all the user's
    assert (tmp_path / "roots" / "syscalls_top.png").lstat().st_uid == NOBODY
    assert (tmp_path / "roots" / "keep.txt").lstat().st_uid == 0  # there before: root's
    assert (tmp_path / "roots").lstat().st_uid == 0


def test_report_under_sudo_is_the_users(synthetic: Collection, tmp_path: Path) -> None:  # noqa: F811
    page = tmp_path / "out" / "report.html"
    argv = [str(synthetic.path), "-o", str(page), "--only", "syscalls_top"]
    done = CliRunner(env=SUDO).invoke(report_command, argv)
    assert done.exit_code == 0, done.output
    assert page.lstat().st_uid == NOBODY and page.parent.lstat().st_uid == NOBODY
