"""The benchmark's folder: held while its collector lives, removed by a later one
once a SIGKILL left it behind, never another user's or a live collector's."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kernmlops.collect.benchmark import STALE_AFTER_S, WORK_PREFIX, RunningBenchmark, sweep_stale

#: a collector's benchmark folder made in TMPDIR, its path printed, then waiting
HOLDER = """
import sys, time
from pathlib import Path
from kernmlops.collect.benchmark import RunningBenchmark
bench = RunningBenchmark(None, "faux", Path("."), keep_output=False)
print(bench.top, flush=True)
time.sleep(600)  # killed by the test; alive however long a starved one takes
"""


def later() -> float:
    """A time as a collector sweeping much later would see it (taken at the call: a
    time taken as the module is imported is no longer later once the tests before
    this one ran for a minute)."""
    return time.time() + STALE_AFTER_S + 60


def holder(tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_the_folder_is_roots_passable_and_the_work_folder_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bench = RunningBenchmark(None, "faux", tmp_path, keep_output=False)  # type: ignore[arg-type]
    try:
        top = bench.top.stat()
        assert bench.top.name.startswith(WORK_PREFIX) and bench.workdir.parent == bench.top
        assert top.st_uid == os.geteuid() and stat.S_IMODE(top.st_mode) == 0o711
        assert stat.S_IMODE(bench.workdir.stat().st_mode) == 0o700
        # held: even long unchanged, a sweep leaves it
        assert bench.top.parent == tmp_path
        assert sweep_stale(tmp_path, now=later()) == [] and bench.top.is_dir()
    finally:
        bench.remove_folder()
    assert not bench.top.exists()


def test_a_killed_collectors_folder_goes_and_a_live_ones_stays(tmp_path: Path) -> None:
    killed, killed_top = holder(tmp_path)
    live, live_top = holder(tmp_path)
    try:
        (killed_top / "work" / "dump.rdb").write_bytes(b"x" * 4096)  # what it left
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
        # not yet: a folder changed within STALE_AFTER_S may be one being made
        assert sweep_stale(tmp_path) == []
        assert sweep_stale(tmp_path, now=later()) == [killed_top]
        assert not killed_top.exists() and live_top.is_dir()
    finally:
        live.kill()
        live.wait(timeout=60)


def test_links_files_and_older_versions_folders_stay(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("mine")
    (tmp_path / f"{WORK_PREFIX}link").symlink_to(target)
    (tmp_path / f"{WORK_PREFIX}file").write_text("a file")
    # an older version's folder (no work/, 0700): it holds no lock, so it may be live
    older = tmp_path / f"{WORK_PREFIX}older"
    (older / "redis").mkdir(parents=True)
    assert sweep_stale(tmp_path, now=later()) == []
    assert (older / "redis").is_dir()
    assert (target / "keep").read_text() == "mine"
    assert (tmp_path / f"{WORK_PREFIX}file").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")
def test_another_users_folder_stays(tmp_path: Path) -> None:
    theirs = tmp_path / f"{WORK_PREFIX}theirs"
    (theirs / "work").mkdir(parents=True)
    theirs.chmod(0o711)
    os.chown(theirs, 65534, 65534)  # nobody
    assert sweep_stale(tmp_path, now=later()) == []
    assert theirs.is_dir()


def test_tail_lines_keeps_the_last_lines_cut_and_without_escapes(tmp_path: Path) -> None:
    from kernmlops.collect.benchmark import tail_lines

    out = tmp_path / "stderr.txt"
    body = [f"line {i}" for i in range(3000)]  # past the 8 KiB read
    out.write_text("\n".join(body) + "\n\n  \n\x1b[2J\x1b]0;owned\x07red\n" + "x" * 500 + "\n")
    kept = tail_lines(out, lines=4, width=40)
    # the escapes' printable rest stays (harmless), their control bytes go
    assert kept == ["line 2998", "line 2999", "[2J]0;ownedred", "x" * 39 + "…"]
    assert all(c.isprintable() for line in kept for c in line)
    link = tmp_path / "link"
    link.symlink_to(out)
    assert tail_lines(link) == []  # a link is not followed
    assert tail_lines(tmp_path / "absent") == [] and tail_lines(None) == []
