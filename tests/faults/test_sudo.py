"""``sudo kernmlops collect`` as a user runs it: SUDO_UID/SUDO_GID set to nobody's ids
(as root). Every folder and file written is the user's; the benchmark runs as root by
default (as under perf record and bpftrace -c) and as the user with --as-user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.collect.manifest import read_manifest
from tests.faults.conftest import start_collect

pytestmark = pytest.mark.bpf

NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}


def _owners(root: Path) -> dict[Path, tuple[int, int]]:
    """Owner (uid, gid) of ``root`` and of everything under it, links themselves."""
    found = {root: (os.lstat(root).st_uid, os.lstat(root).st_gid)}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            st = os.lstat(Path(top) / name)
            found[Path(top) / name] = (st.st_uid, st.st_gid)
    return found


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder of root's that any user may enter, like a home above a project (pytest's
    own are root's alone); in it ``said/``, which any user may write: there the
    benchmark says which uid, gid and HOME it ran with."""
    folder = Path(tempfile.mkdtemp(prefix="kmo-sudo-"))
    folder.chmod(0o755)
    (folder / "said").mkdir(mode=0o777)
    (folder / "said").chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _collect(said: Path, out: Path, *args: str) -> tuple[int, str]:
    """collect under "sudo" with a command that says which user it ran as."""
    run = start_collect(out, "--hooks", "process_trace", *args, "--", "sh", "-c",
                        f'echo "$(id -u) $(id -g) $HOME" > {said}; echo ran', env=SUDO)  # fmt: skip
    return run.finish(timeout_s=60)


def test_under_sudo_the_collection_is_the_users_and_the_benchmark_runs_as_root(
    home: Path,
) -> None:
    out, said = home / "new" / "data", home / "said" / "uid"  # "new" is made by kernmlops
    code, err = _collect(said, out)
    assert code == 0, err
    assert said.read_text().split()[:2] == ["0", "0"]  # as perf record would run it
    owners = _owners(home / "new")
    assert len(owners) >= 8  # folders, manifest, parts, captured output
    assert {p: o for p, o in owners.items() if o != (NOBODY, NOBODY)} == {}
    assert os.lstat(home).st_uid == 0  # was there before: left alone
    col = next(out.glob("curated/benchmark=*/collection_id=*"))
    assert read_manifest(col).state == "completed"
    # nobody can delete it all, as the user could after sudo
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    rm = subprocess.run([*as_nobody, "rm", "-r", str(out)], capture_output=True, text=True)
    assert rm.returncode == 0, rm.stderr


def test_as_user_runs_the_benchmark_as_the_invoking_user(home: Path) -> None:
    out, said = home / "data", home / "said" / "uid"
    code, err = _collect(said, out, "--as-user")
    assert code == 0, err
    uid, gid, home = said.read_text().split()
    assert (int(uid), int(gid)) == (NOBODY, NOBODY)
    assert home == "/nonexistent"  # nobody's HOME, not root's
    assert list(out.glob("curated/benchmark=*/collection_id=*/manifest.json"))
    assert {p: o for p, o in _owners(out).items() if o != (NOBODY, NOBODY)} == {}


def test_as_user_without_sudo_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    out = subprocess.run(
        [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "--as-user",
         "-o", str(tmp_path / "data"), "--", "touch", str(marker)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "SUDO_UID is not set" in lines[0], out.stderr
    assert not marker.exists() and not (tmp_path / "data").exists()


def test_a_built_in_benchmark_as_the_user_writes_and_root_reads_its_results(home: Path) -> None:
    """stress-ng run as the user writes its metrics into the run's workdir (the user's
    for the run), which root reads back without following links: results and the
    captured output are in the collection, all of it the user's."""
    out = home / "data"
    run = start_collect(out, "--hooks", "process_trace", "-b", "stress-ng", "--as-user",
                        env=SUDO, more_config="benchmark:\n  stress_ng:\n    scenario: cpu\n"
                        "    workers: 1\n    duration_s: 1\n")  # fmt: skip
    code, err = run.finish(timeout_s=60)
    assert code == 0, err
    col = run.collection()
    manifest = read_manifest(col)
    assert manifest.results_error is None, manifest.results_error
    assert list((col / "benchmark_result").glob("part-*.parquet"))
    assert (col / "benchmark_output" / "stderr.txt").stat().st_size
    assert {p: o for p, o in _owners(out).items() if o != (NOBODY, NOBODY)} == {}
