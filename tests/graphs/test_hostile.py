"""``sudo kernmlops graph`` / ``report`` on a user's collection, into a user's folder:
the user (nobody, as SUDO_UID) plays the attacker. Root neither writes through a link
they planted (a file of root's stays as it was) nor reads one (a root-only Parquet
file linked in as a part is never drawn into their PNGs); a refusal is one line
naming the path, and what is written is the user's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.data import Collection
from tests.graphs.conftest import synthetic  # noqa: F401 (the fixture)

NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}
SECRET = b"root's own: never to be overwritten\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")


@pytest.fixture
def home(synthetic: Collection) -> Iterator[tuple[Path, Path, Path]]:  # noqa: F811
    """(nobody's folder, a copy of the collection in it, all nobody's; a folder of
    root's only, holding a file and a Parquet part of root's) in a folder of root's
    any user may enter, like /home."""
    top = Path(tempfile.mkdtemp(prefix="kmo-hostile-graph-"))
    top.chmod(0o755)
    user = top / "alice"
    col = user / "curated" / "benchmark=faux" / synthetic.path.name
    shutil.copytree(synthetic.path, col)
    victim = top / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "secret").write_bytes(SECRET)
    shutil.copy(synthetic.path / "syscalls" / "part-00000.parquet", victim / "part-00000.parquet")
    for path in [user, *user.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    try:
        yield user, col, victim
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _kmo(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", *args], capture_output=True, text=True,
        timeout=300, env={**os.environ, "COLUMNS": "400", **SUDO}, cwd="/",
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stderr


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.lstat().st_uid) for p in sorted(folder.iterdir())}


def _plant(link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)


def test_graph_into_a_planted_link_writes_nothing_there(home: tuple[Path, Path, Path]) -> None:
    user, col, victim = home
    before = _snapshot(victim)
    _plant(user / "figs", victim)
    code, err = _kmo("graph", str(col), "-o", str(user / "figs"), "--only", "syscalls_top")
    assert code == 2, err
    assert f"{user / 'figs'} is a link in a folder nobody can change" in _error_line(err)
    assert _snapshot(victim) == before


def test_graph_into_the_collection_with_graphs_a_planted_link(
    home: tuple[Path, Path, Path],
) -> None:
    """The default output, COLLECTION/graphs, a link of the user's to root's folder:
    refused as the collection is read (no link in it is followed)."""
    _, col, victim = home
    before = _snapshot(victim)
    _plant(col / "graphs", victim)
    code, err = _kmo("graph", str(col), "--only", "syscalls_top")
    assert code == 2, err
    assert f"{col / 'graphs'}: a link: as root, kernmlops reads no link" in _error_line(err)
    assert _snapshot(victim) == before


def test_graph_under_sudo_into_a_users_folder_is_theirs(home: tuple[Path, Path, Path]) -> None:
    user, col, _ = home
    code, err = _kmo("graph", str(col), "-o", str(user / "a" / "figs"), "--only", "syscalls_top")
    assert code == 0, err
    made = [user / "a", user / "a" / "figs", user / "a" / "figs" / "syscalls_top.png"]
    assert {p: p.lstat().st_uid for p in made} == dict.fromkeys(made, NOBODY)


def test_report_into_a_planted_link_writes_nothing_there(home: tuple[Path, Path, Path]) -> None:
    user, col, victim = home
    before = _snapshot(victim)
    _plant(user / "out", victim)
    code, err = _kmo("report", str(col), "-o", str(user / "out" / "secret"))
    assert code == 2, err
    assert f"{user / 'out'} is a link in a folder nobody can change" in _error_line(err)
    assert _snapshot(victim) == before


def test_report_over_a_planted_link_replaces_the_link_only(home: tuple[Path, Path, Path]) -> None:
    """The page's name itself a link to root's file: the link goes, the file stays."""
    user, col, victim = home
    before = _snapshot(victim)
    _plant(user / "r.html", victim / "secret")
    code, err = _kmo("report", str(col), "-o", str(user / "r.html"))
    assert code == 0, err
    assert _snapshot(victim) == before
    page = user / "r.html"
    assert not page.is_symlink() and page.lstat().st_uid == NOBODY
    assert b"kernmlops report" in page.read_bytes()


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_part_linked_to_roots_parquet_is_not_read(
    home: tuple[Path, Path, Path], how: str
) -> None:
    """The user links their syscalls part to root's Parquet file (a hard link where
    fs.protected_hardlinks is off): refused in one line, nothing drawn."""
    _, col, victim = home
    part = col / "syscalls" / "part-00000.parquet"
    part.unlink()
    if how == "symlink":
        _plant(part, victim / "part-00000.parquet")
    else:
        os.link(victim / "part-00000.parquet", part)
    for args in (["graph", str(col)], ["report", str(col), "-o", str(col / "r.html")]):
        code, err = _kmo(*args)
        assert code == 2, err
        kind = "a link" if how == "symlink" else "a hard link to a file of another owner"
        assert f"{part}: {kind}: as root, kernmlops reads no link" in _error_line(err)
        assert not (col / "graphs").exists() and not (col / "r.html").exists()


def test_a_table_folder_or_manifest_linked_to_roots_is_not_read(
    home: tuple[Path, Path, Path],
) -> None:
    _, col, victim = home
    shutil.rmtree(col / "syscalls")
    _plant(col / "syscalls", victim)
    code, err = _kmo("graph", str(col))
    assert code == 2, err
    assert f"{col / 'syscalls'}: a link: as root" in _error_line(err)
    (col / "syscalls").unlink()
    (col / "manifest.json").unlink()
    _plant(col / "manifest.json", victim / "secret")
    code, err = _kmo("report", str(col), "-o", str(col / "r.html"))
    assert code == 2, err
    line = _error_line(err)
    assert f"{col / 'manifest.json'}: cannot read the manifest: a link" in line, line
    assert "root's own" not in err  # nothing of the file is shown


def test_a_collection_reached_through_a_users_link_is_refused(
    home: tuple[Path, Path, Path],
) -> None:
    user, col, _ = home
    _plant(user / "c", col)
    code, err = _kmo("graph", str(user / "c"), "-o", str(user / "figs"))
    assert code == 2, err
    assert f"cannot read {user / 'c'}: {user / 'c'} is a link" in _error_line(err)
    assert not (user / "figs").exists()


def test_an_output_folder_that_cannot_be_made_leaves_no_folder_of_roots(
    home: tuple[Path, Path, Path],
) -> None:
    """``-o ~/new/<a name too long>``: ~/new is made, then the next one fails; ~/new
    is removed again (no empty folder of root's left in the user's)."""
    user, col, _ = home
    code, err = _kmo("graph", str(col), "-o", str(user / "new" / ("x" * 300)))
    assert code == 2, err
    assert "File name too long" in _error_line(err)
    assert not (user / "new").exists()
