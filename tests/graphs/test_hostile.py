"""``sudo kernmlops graph`` / ``report`` on a user's collection, into a user's folder:
the user (nobody, as SUDO_UID) plays the attacker. Root neither writes through a link
they planted (a file of root's stays as it was) nor reads one (a root-only Parquet
file linked in as a part is never drawn into their PNGs); a refusal is one line
naming the path, and what is written is the user's."""

from __future__ import annotations

import os
import re
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


def _kmo(*args: str, sudo: bool = True) -> tuple[int, str]:
    """The command as root, under sudo as nobody (or without sudo: a root shell)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", *args], capture_output=True, text=True,
        timeout=300, env={**env, "COLUMNS": "400", **(SUDO if sudo else {})}, cwd="/",
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stderr


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.lstat().st_uid) for p in sorted(folder.iterdir())}


def _plant(link: Path, target: Path, owner: int = NOBODY) -> None:
    link.symlink_to(target)
    os.chown(link, owner, owner, follow_symlinks=False)


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
    refused as the collection is read (their link, followed with their rights, leads
    where they could not go); without sudo, as nobody's link."""
    _, col, victim = home
    before = _snapshot(victim)
    _plant(col / "graphs", victim)
    code, err = _kmo("graph", str(col), "--only", "syscalls_top")
    assert code == 2, err
    line = _error_line(err)
    assert f"{col / 'graphs'} is a link in a folder nobody can change, to {victim}" in line
    assert _snapshot(victim) == before
    code, err = _kmo("graph", str(col), "--only", "syscalls_top", sudo=False)
    assert code == 2, err
    assert f"{col / 'graphs'}: a link: as root, kernmlops reads no link" in _error_line(err)
    assert _snapshot(victim) == before


def test_a_graphs_link_of_the_invokers_own_is_followed(home: tuple[Path, Path, Path]) -> None:
    """COLLECTION/graphs the user's link to their own folder elsewhere: under sudo the
    PNGs go there, and are theirs; a third user's link there is refused."""
    user, col, _ = home
    figs = user / "figs"
    figs.mkdir()
    os.chown(figs, NOBODY, NOBODY)
    _plant(col / "graphs", figs)
    code, err = _kmo("graph", str(col), "--only", "syscalls_top")
    assert code == 0, err
    png = figs / "syscalls_top.png"
    assert png.exists() and png.lstat().st_uid == NOBODY
    png.unlink()
    os.chown(col / "graphs", 4242, 4242, follow_symlinks=False)
    code, err = _kmo("graph", str(col), "--only", "syscalls_top")
    assert code == 2, err
    assert f"{col / 'graphs'}: a link: as root, kernmlops reads no link" in _error_line(err)
    assert list(figs.iterdir()) == []


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
    code, err = _kmo("report", str(col), "-o", str(user / "r.html"), "--only", "syscalls_top")
    assert code == 0, err
    assert _snapshot(victim) == before
    page = user / "r.html"
    assert not page.is_symlink() and page.lstat().st_uid == NOBODY
    assert b"kernmlops report" in page.read_bytes()


@pytest.mark.parametrize("sudo", [True, False])
@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_part_linked_to_roots_parquet_is_not_read(
    home: tuple[Path, Path, Path], how: str, sudo: bool
) -> None:
    """The user links their syscalls part to root's Parquet file (a hard link where
    fs.protected_hardlinks is off): refused in one line, nothing drawn, under sudo
    and as root without it (a root shell or cron job reading a user's folder)."""
    _, col, victim = home
    part = col / "syscalls" / "part-00000.parquet"
    part.unlink()
    if how == "symlink":
        _plant(part, victim / "part-00000.parquet")
    else:
        os.link(victim / "part-00000.parquet", part)
    for args in (["graph", str(col)], ["report", str(col), "-o", str(col / "r.html")]):
        code, err = _kmo(*args, sudo=sudo)
        assert code == 2, err
        line = _error_line(err)
        if how == "hardlink":
            assert f"{part}: a hard link to a file of another owner: as root" in line
        elif sudo:  # their own link, followed with their rights: root's folder is closed
            assert f"{part} is a link in a folder nobody can change, to {victim}" in line
        else:
            assert f"{part}: a link: as root, kernmlops reads no link" in line
        assert not (col / "graphs").exists() and not (col / "r.html").exists()


@pytest.mark.parametrize("sudo", [True, False])
def test_a_table_folder_or_manifest_linked_to_roots_is_not_read(
    home: tuple[Path, Path, Path], sudo: bool
) -> None:
    _, col, victim = home
    shutil.rmtree(col / "syscalls")
    _plant(col / "syscalls", victim)
    code, err = _kmo("graph", str(col), sudo=sudo)
    assert code == 2, err
    if sudo:
        assert f"{col / 'syscalls'} is a link in a folder nobody can" in _error_line(err)
    else:
        assert f"{col / 'syscalls'}: a link: as root" in _error_line(err)
    (col / "syscalls").unlink()
    (col / "manifest.json").unlink()
    _plant(col / "manifest.json", victim / "secret")
    code, err = _kmo("report", str(col), "-o", str(col / "r.html"), sudo=sudo)
    assert code == 2, err
    line = _error_line(err)
    assert f"{col / 'manifest.json'}: cannot read the manifest: a link" in line, line
    assert "root's own" not in err  # nothing of the file is shown


def test_a_collection_reached_through_a_link_is_read_only_if_the_invokers(
    home: tuple[Path, Path, Path],
) -> None:
    """``~/c -> the collection``: under sudo the user's own link is followed (as if
    they named what it leads to); a third user's is refused, and any user's link as
    root without sudo."""
    user, col, _ = home
    _plant(user / "c", col)
    code, err = _kmo("graph", str(user / "c"), "-o", str(user / "figs"), "--only", "syscalls_top")
    assert code == 0, err
    assert (user / "figs").lstat().st_uid == NOBODY
    shutil.rmtree(user / "figs")
    code, err = _kmo("graph", str(user / "c"), "-o", str(user / "figs"), sudo=False)
    assert code == 2, err
    assert f"cannot read {user / 'c'}: {user / 'c'} is a link" in _error_line(err)
    (user / "c").unlink()
    _plant(user / "c", col, owner=4242)
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


def test_render_and_report_from_a_notebook_write_through_no_planted_link(
    home: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """kernmlops.graphs.render() and report() as root (a notebook, no sudo) hold their
    folder as the commands do: nobody's link on the way is not written through."""
    from kernmlops.graphs import render, report
    from kernmlops.graphs._render import GraphOutputError

    user, col, victim = home
    for key in SUDO:
        monkeypatch.delenv(key, raising=False)
    before = _snapshot(victim)
    _plant(user / "figs", victim)
    refused = re.escape(f"{user / 'figs'} is a link in a folder nobody can change")
    with pytest.raises(GraphOutputError, match=refused):
        render(col, user / "figs" / "new", graphs=["syscalls_top"])
    with pytest.raises(GraphOutputError, match=refused):
        report(col, user / "figs" / "r.html")
    assert _snapshot(victim) == before


def test_render_and_report_under_sudo_make_the_users_folders(
    home: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library under sudo: the folders it makes, and what it writes in them, are
    the invoking user's, as with the commands."""
    from kernmlops.graphs import render, report

    user, col, _ = home
    for key, value in SUDO.items():
        monkeypatch.setenv(key, value)
    written = render(col, user / "a" / "figs", graphs=["syscalls_top"])
    assert written == [user / "a" / "figs" / "syscalls_top.png"]
    assert report(col, user / "b" / "r.html", graphs=["syscalls_top"]) == user / "b" / "r.html"
    made = [*written, user / "a", user / "a" / "figs", user / "b", user / "b" / "r.html"]
    assert {p: p.lstat().st_uid for p in made} == dict.fromkeys(made, NOBODY)
