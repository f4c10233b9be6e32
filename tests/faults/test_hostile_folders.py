"""``sudo kernmlops collect`` into a folder its user (or another) can change: the user
plays the attacker (nobody's ids as SUDO_UID/SUDO_GID, the attacks run as nobody
through setpriv). Root never writes through a link the user planted or swapped in,
before the run or during it, and never into another user's folder; a file of root's
the links name is left as it was, and a refusal is one line naming the path."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.collect.manifest import read_manifest
from tests.faults.conftest import start_collect, wait_until

pytestmark = pytest.mark.bpf

NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SECRET = b"root's own: never to be overwritten\n"


def _as_nobody(*argv: str) -> None:
    done = subprocess.run([*AS_NOBODY, *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and owner."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"", p.lstat().st_uid)
        for p in sorted(folder.rglob("*"))
    }


@contextlib.contextmanager
def made_home() -> Iterator[tuple[Path, Path]]:
    """(the user's folder, a folder of root's only holding a manifest.json and a part)
    in a folder of root's any user may enter, like /home."""
    top = Path(tempfile.mkdtemp(prefix="kmo-hostile-"))
    top.chmod(0o755)
    user = top / "alice"
    user.mkdir()
    os.chown(user, NOBODY, NOBODY)
    victim = top / "root-only"
    (victim / "process_trace").mkdir(parents=True)
    victim.chmod(0o700)
    (victim / "manifest.json").write_bytes(SECRET)
    (victim / "process_trace" / "part-00000.parquet").write_bytes(SECRET)
    try:
        yield user, victim
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def home() -> Iterator[tuple[Path, Path]]:
    """made_home(), for the test."""
    with made_home() as folders:
        yield folders


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_collection_swapped_for_a_link_mid_run_is_still_written_where_it_was_made(
    home: tuple[Path, Path],
) -> None:
    """The user owns the folders above the collection (a previous sudo collect handed
    them over): mid-run they move the collection away and put a link to root's folder
    in its place. Root goes on writing the folder it made, wherever it now is."""
    user, victim = home
    before = _snapshot(victim)
    bench = user / "data" / "curated" / "benchmark=command"
    bench.mkdir(parents=True)
    for folder in [user / "data", user / "data" / "curated", bench]:
        os.chown(folder, NOBODY, NOBODY)
    run = start_collect(user / "data", "--hooks", "process_trace", "--", "sleep", "4", env=SUDO)
    assert wait_until(lambda: list(bench.glob("collection_id=*/manifest.json")), 30)
    (col,) = bench.glob("collection_id=*")
    moved = bench / "moved"
    _as_nobody("mv", str(col), str(moved))
    _as_nobody("ln", "-s", str(victim), str(col))
    code, err = run.finish(timeout_s=60)
    assert _snapshot(victim) == before  # nothing written there, nothing changed hands
    assert code == 0, err
    manifest = read_manifest(moved)
    assert manifest.state == "completed" and manifest.tables["process_trace"].rows
    assert list((moved / "process_trace").glob("part-*.parquet"))
    owners = {p: p.lstat().st_uid for p in [moved, *moved.rglob("*")]}
    assert {p: o for p, o in owners.items() if o != NOBODY} == {}  # handed over all the same
    assert col.is_symlink() and os.lstat(col).st_uid == NOBODY  # the user's link, untouched


def test_a_link_in_a_folder_only_root_can_change_is_followed() -> None:
    """/home -> /var/home and the like: a link of root's in a folder of root's is no
    one's plant, and is followed as before."""
    top = Path(tempfile.mkdtemp(prefix="kmo-rootlink-"))
    try:
        top.chmod(0o755)
        (top / "real").mkdir()
        (top / "link").symlink_to("real")
        run = start_collect(top / "link" / "data", "--hooks", "process_trace", "--", "true",
                            env=SUDO)  # fmt: skip
        code, err = run.finish(timeout_s=60)
        assert code == 0, err
        (col,) = (top / "real" / "data").glob("curated/benchmark=*/collection_id=*")
        assert read_manifest(col).state == "completed"
        assert os.lstat(top / "real" / "data").st_uid == NOBODY
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_under_sudo_the_users_own_link_to_their_folder_is_followed(
    home: tuple[Path, Path],
) -> None:
    """``-o ~/data`` where ~/data is the user's own link to their folder elsewhere
    (/scratch/alice/data): followed as they would follow it (fs.protected_symlinks:
    the link is the follower's); the collection lands there and is theirs."""
    user, _ = home
    scratch = user.parent / "scratch"
    scratch.mkdir(mode=0o755)
    data = scratch / "alice"
    data.mkdir()
    os.chown(data, NOBODY, NOBODY)
    _as_nobody("ln", "-s", str(data), str(user / "data"))
    run = start_collect(user / "data", "--hooks", "process_trace", "--", "true", env=SUDO)
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    (col,) = data.glob("curated/benchmark=*/collection_id=*")
    assert read_manifest(col).state == "completed"
    owners = {p: p.lstat().st_uid for p in data.rglob("*")}
    assert {p: o for p, o in owners.items() if o != NOBODY} == {}
    assert (user / "data").is_symlink() and os.lstat(user / "data").st_uid == NOBODY


def test_a_table_folder_cannot_be_planted_mid_run(home: tuple[Path, Path]) -> None:
    """During the run the collection is root's alone: the user can neither plant a
    table folder (a link to root's folder) in it nor move what is there."""
    user, victim = home
    before = _snapshot(victim)
    run = start_collect(user / "data", "--hooks", "process_trace", "--", "sleep", "4", env=SUDO)
    assert wait_until(lambda: list(user.glob("data/curated/*/*/manifest.json")), 30)
    (col,) = user.glob("data/curated/*/*")
    assert read_manifest(col).state == "running"
    for argv in (["ln", "-s", str(victim), str(col / "process_trace")],
                 ["mv", str(col / "manifest.json"), str(col / "x")]):  # fmt: skip
        tried = subprocess.run([*AS_NOBODY, *argv], capture_output=True, text=True)
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, tried
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    assert _snapshot(victim) == before
    assert not (col / "process_trace").is_symlink()
