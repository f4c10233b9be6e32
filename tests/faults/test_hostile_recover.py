"""``kernmlops recover`` run as root on a collection its user owns (nobody, as
SUDO_UID): the user plants links and hard links where recover writes, and a manifest
whose collection id leads elsewhere. Root's files the plants name stay as they were,
a refusal is one line naming the path and keeps the spool, and the new parts are the
collection owner's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.collect.manifest import read_manifest
from tests.faults.conftest import EVENT_WAIT_S, kill_collector, start_collect, wait_until

pytestmark = pytest.mark.bpf

NOBODY = 65534
SUDO = {"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}
SECRET = b"root's own: never to be overwritten\n"


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collection killed with its process_trace rows still in its spool, on disk."""
    out = tmp_path_factory.mktemp("killed")
    config = "  spool_spare_cpus: 1000\n  spool_memory_mib: 0\n"
    loop = "for i in $(seq 2000); do /bin/true; done; sleep 60"
    run = start_collect(out, "--hooks", "process_trace", "--", "sh", "-c", loop,
                        more_config=config)  # fmt: skip
    run.wait_for("probes attached")
    col = run.collection()
    time.sleep(2.5)

    def spooled() -> bool:  # the execs' records the tests recover, copied to disk
        return any(p.stat().st_size for p in (col / ".spool").glob("process_trace.*.ring"))

    wait_until(lambda: run.proc.poll() is not None or spooled(), EVENT_WAIT_S, 0.1)
    kill_collector(run)
    assert spooled()
    return col


@pytest.fixture
def hostile(killed: Path) -> Iterator[tuple[Path, Path]]:
    """(a copy of the killed collection, all of it nobody's, in nobody's folder; a
    folder of root's only, holding a part and a file of root's)."""
    top = Path(tempfile.mkdtemp(prefix="kmo-hostile-recover-"))
    top.chmod(0o755)
    victim = top / "root-only"
    victim.mkdir(mode=0o700)
    (victim / "part-00000.parquet").write_bytes(SECRET)
    (victim / "secret").write_bytes(SECRET)
    col = top / "alice" / "curated" / "benchmark=command" / killed.name
    shutil.copytree(killed, col, symlinks=True)
    for path in [top / "alice", *(top / "alice").rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    try:
        yield col, victim
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _recover(col: Path, env: dict[str, str] | None = SUDO) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "recover", str(col)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "400", **(env or {})},
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _victim(victim: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in victim.iterdir()}


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_planted_links_at_the_part_names_are_not_written_through(
    hostile: tuple[Path, Path],
) -> None:
    """The user links every name a new part is first written under to root's file:
    recover writes new files in their place, the file is unchanged, and the new parts
    and manifest are the user's (the collection's owner's)."""
    col, victim = hostile
    table = col / "process_trace"
    table.mkdir(exist_ok=True)
    os.chown(table, NOBODY, NOBODY)
    for k in range(8):  # the next parts' first names (after any finished ones)
        tmp = table / f".part-{k:05}.parquet.tmp"
        if not (table / f"part-{k:05}.parquet").exists():
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(victim / "secret")
            os.chown(tmp, NOBODY, NOBODY, follow_symlinks=False)
    before = _victim(victim)
    done = _recover(col)
    assert _victim(victim) == before
    assert done.returncode == 0, done.stderr
    assert "recovered process_trace" in done.stderr
    parts = sorted(table.glob("part-*.parquet"))
    assert parts and not (col / ".spool").exists()
    owners = {p: p.lstat().st_uid for p in [col, *col.rglob("*")]}
    assert {p: o for p, o in owners.items() if o != NOBODY} == {}
    assert read_manifest(col).tables["process_trace"].rows


def test_a_table_folder_linked_to_roots_folder_is_refused_and_the_spool_kept(
    hostile: tuple[Path, Path],
) -> None:
    col, victim = hostile
    shutil.rmtree(col / "process_trace", ignore_errors=True)
    (col / "process_trace").symlink_to(victim)
    before = _victim(victim)
    done = _recover(col)
    assert _victim(victim) == before
    assert done.returncode == 2, done.stderr
    line = _error_line(done.stderr)
    assert f"{col / 'process_trace'}: it is a link or a file, not a folder" in line, line
    assert list((col / ".spool").glob("*.ring"))  # nothing collected is lost


def test_a_lock_file_hard_linked_to_roots_file_is_refused(hostile: tuple[Path, Path]) -> None:
    """fs.protected_hardlinks off: the user hard-links root's file as the spool's lock
    (recover would truncate it and write its pid in it)."""
    col, victim = hostile
    lock = col / ".spool" / "recover.lock"
    lock.unlink(missing_ok=True)
    os.link(victim / "secret", lock)
    before = _victim(victim)
    done = _recover(col)
    assert _victim(victim) == before
    assert done.returncode == 2, done.stderr
    line = _error_line(done.stderr)
    assert f"cannot lock {lock}: not a plain file of its own" in line, line
    assert list((col / ".spool").glob("*.ring"))


def test_a_collection_id_that_leads_out_of_the_tmpfs_deletes_nothing(
    hostile: tuple[Path, Path],
) -> None:
    """The spool's memory folder is /dev/shm/kernmlops-spool-<collection id>, which
    recover deletes once all is recovered: an id of '../..' (a folder
    kernmlops-spool-.. made by the user in /dev/shm) and a ``mem`` link to match would
    name a folder of root's. The manifest is refused, root's folder stays."""
    col, victim = hostile
    up = Path("/dev/shm/kernmlops-spool-..")
    made = not up.exists()
    if made:
        up.mkdir()
        os.chown(up, NOBODY, NOBODY)
    try:
        cid = "../../../.." + str(victim)  # kernmlops-spool-.. /.. /.. /..: /
        manifest = json.loads((col / "manifest.json").read_text())
        manifest["collection_id"] = cid
        (col / "manifest.json").write_text(json.dumps(manifest))
        mem = col / ".spool" / "mem"
        mem.unlink(missing_ok=True)
        mem.symlink_to(f"/dev/shm/kernmlops-spool-{cid}")
        assert mem.resolve() == victim  # where the crafted id leads
        done = _recover(col)
        assert victim.is_dir() and _victim(victim)["secret"] == SECRET
        assert done.returncode == 2, done.stderr
        assert "collection id is one name" in _error_line(done.stderr)
    finally:
        if made:
            up.rmdir()


def test_a_killed_collection_still_roots_is_the_invokers_once_recovered(
    killed: Path, tmp_path: Path
) -> None:
    """Killed, the collection is still root's (no hand-over): recover under sudo hands
    it, new parts included, to the invoking user, as collect would have."""
    col = tmp_path / "curated" / "benchmark=command" / killed.name
    shutil.copytree(killed, col, symlinks=True)
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    owners = {p: p.lstat().st_uid for p in [col, *col.rglob("*")]}
    assert {p: o for p, o in owners.items() if o != NOBODY} == {}
    assert os.lstat(tmp_path).st_uid == 0  # above the collection: left alone


def _descriptions(col: Path) -> list[Path]:
    """The spool's ring descriptions (<key>.json beside <key>.<n>.ring)."""
    spool = col / ".spool"
    found = [p for p in spool.glob("*.json") if list(spool.glob(f"{p.stem}.*.ring"))]
    assert found, sorted(spool.iterdir())
    return found


def test_the_object_path_in_the_spool_is_not_opened(hostile: tuple[Path, Path]) -> None:
    """The user points the spool's description at an object of their own (crafted to
    trip the ELF/BTF parser root runs, or a FIFO to hang it): recover takes only the
    file name and decodes with the object of the build folder collect uses."""
    col, _ = hostile
    crafted = col.parent / "process_trace.bpf.o"
    crafted.write_bytes(b"\x7fELF" + SECRET * 64)
    os.chown(crafted, NOBODY, NOBODY)
    for desc in _descriptions(col):
        info = json.loads(desc.read_text())
        info["object"] = str(crafted)
        desc.write_text(json.dumps(info))
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert "recovered process_trace" in done.stderr
    assert str(crafted) not in done.stderr
    assert read_manifest(col).tables["process_trace"].rows
    assert not (col / ".spool").exists()


def test_an_object_not_the_hooks_own_is_refused_and_the_spool_kept(
    hostile: tuple[Path, Path],
) -> None:
    col, victim = hostile
    for desc in _descriptions(col):
        info = json.loads(desc.read_text())
        info["object"] = str(victim / "secret")
        desc.write_text(json.dumps(info))
    done = _recover(col)
    assert done.returncode == 2, done.stderr
    assert "names the object 'secret', not 'process_trace.bpf.o'" in done.stderr
    assert list((col / ".spool").glob("*.ring"))  # kept for another try
