"""Sync-duet's shared files against a hostile neighbour: the barrier in the
shared /dev/shm and the FIFOs of the built-in harness. Each attack is the
one a local user can mount: plant a link where root's run will write, and
check the file it points at is untouched and the run says why."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from kernmlops.duet.barrier import (
    BarrierClient,
    barrier_path,
    make_barrier,
    new_name,
    remove_barrier,
)
from kernmlops.duet.config import load_duet_config
from kernmlops.duet.harness import run_harness
from kernmlops.duet.runner import run_suite
from tests.duet.conftest import write_config

NOBODY = 65534
SECRET = b"root:$6$precious:19000:0:99999:7:::\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A root-only file that a planted link points at."""
    path = tmp_path / "shadow"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def _plant(link: Path, target: Path) -> Path:
    """What the attacker does: a link at the name root will open, owned by nobody."""
    link.symlink_to(target)
    if os.geteuid() == 0:
        os.lchown(link, NOBODY, NOBODY)
    return link


def test_a_barrier_name_cannot_be_guessed():
    names = {new_name("syncduet.d.0") for _ in range(100)}
    assert len(names) == 100  # 64 random bits each
    assert all(n.startswith("syncduet.d.0.") and n.endswith(":barrier") for n in names)
    for bad in ("../etc/x", "a/b", "", "a b", "x;rm"):
        with pytest.raises(ValueError, match="letters, digits"):
            barrier_path(bad)


def test_a_planted_link_at_the_barrier_name_is_refused(secret: Path):
    name = new_name("syncduet.attack.0")
    link = _plant(barrier_path(name), secret)
    try:
        with pytest.raises(FileExistsError, match="exists already"):
            make_barrier(name)
        # neither written through nor removed: the file and the link are as they were
        assert secret.read_bytes() == SECRET and link.is_symlink()
        with pytest.raises(OSError):  # a side never opens it through the link either
            BarrierClient(name)
    finally:
        link.unlink()
    assert secret.read_bytes() == SECRET


def test_the_barrier_is_the_runners_alone():
    name = new_name("syncduet.mode.0")
    path = make_barrier(name)
    try:
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.geteuid()
    finally:
        remove_barrier(name)
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
def test_a_side_refuses_a_barrier_of_another_user():
    name = new_name("syncduet.foreign.0")
    path = barrier_path(name)
    path.write_bytes(b"\0" * 64)
    os.chown(path, NOBODY, NOBODY)
    try:
        with pytest.raises(PermissionError, match="belongs to uid 65534"):
            BarrierClient(name)
    finally:
        path.unlink()


SYNC_CONFIG = """
duetbench:
  suite: plant-{pid}
  duet_repetitions: 0
  syncduet_repetitions: 2
  timeout: 60
  syncduet_run_base: {py} -m kernmlops.duet.harness --iterations 2 --barrier $$ --output out.csv --
  results: [out.csv]
  duets: [victim]
victim:
  A: {{run: "true"}}
  B: {{run: "true"}}
"""


def test_links_at_the_old_predictable_names_are_not_followed(tmp_path: Path, secret: Path):
    # The attack as filed: the barrier used to be named after the duet, the run
    # id and the runner's pid; the attacker plants links at those names first.
    pid = os.getpid()
    links = [_plant(barrier_path(f"syncduet.victim.{i}.{pid}:barrier"), secret) for i in range(2)]
    try:
        cfg = write_config(tmp_path / "duet.yml", SYNC_CONFIG.format(pid=pid, py=sys.executable))
        result = run_suite(load_duet_config(cfg), tmp_path / "out")
        # the original's config form still runs, synchronized on barriers of its own
        assert not result.failed, [t.sides for t in result.trials]
        names = [t.sync.removeprefix("barrier ") for t in result.trials]
        assert len(set(names)) == 2 and all(str(pid) not in n for n in names)
        assert not any(barrier_path(n).exists() for n in names)  # removed after each trial
        assert secret.read_bytes() == SECRET
        assert all(link.is_symlink() for link in links)  # not ours: left alone
    finally:
        for link in links:
            link.unlink()


def test_the_sync_fifos_live_in_a_private_folder(tmp_path: Path):
    # a harness side records where its FIFOs are and who may enter there
    probe = tmp_path / "probe.sh"
    probe.write_text(
        'd="$KERNMLOPS_DUET_SYNC"\n'
        'stat -c "%a %u" "$d" "$(dirname "$d")" > perm.txt\necho "$d" >> perm.txt\n'
    )
    cfg = write_config(tmp_path / "duet.yml", f"""
duetbench: {{suite: fifo-{os.getpid()}, duet_repetitions: 0, syncduet_repetitions: 1,
             duets: [d], harness: {{iterations: 1}}}}
d:
  A: {{run: "sh {probe}", results: [perm.txt]}}
  B: {{run: "true"}}
""")  # fmt: skip
    result = run_suite(load_duet_config(cfg), tmp_path / "out")
    assert not result.failed, [t.sides for t in result.trials]
    [perm] = (result.folder / "results").glob("*.A.perm.txt")
    side_dir, parent_dir, where = perm.read_text().splitlines()
    uid = str(os.geteuid())
    assert side_dir == f"700 {uid}" and parent_dir == f"700 {uid}"
    assert not Path(where).exists()  # removed after the trial
    assert not Path(where).is_relative_to(tmp_path)  # not in the (maybe shared) outdir


def test_a_side_never_writes_through_a_planted_fifo_link(tmp_path: Path, secret: Path, capfd):
    # --sync DIR given by hand: ready is a link to a root file, not the runner's FIFO
    sync = tmp_path / "sync"
    sync.mkdir()
    _plant(sync / "ready", secret)
    os.mkfifo(sync / "go")
    code = run_harness(["true"], iterations=1, output=str(tmp_path / "h.csv"), sync=str(sync))
    assert code == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("harness: cannot use sync folder")
    assert secret.read_bytes() == SECRET
    # and a barrier name that is a link is refused by the side in one line too
    name = new_name("syncduet.side.0")
    link = _plant(barrier_path(name), secret)
    try:
        code = run_harness(["true"], iterations=1, output=str(tmp_path / "h.csv"), barrier=name)
    finally:
        link.unlink()
    assert code == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"harness: cannot use barrier '{name}'")
    assert secret.read_bytes() == SECRET
