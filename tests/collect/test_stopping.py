"""The stop's last steps on the real kernel: the spool removed once its rows are in
parts, whatever moment a kill cuts that removal at."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kernmlops.collect.session import Session
from kernmlops.config import load_config
from kernmlops.data import read_collection
from kernmlops.ebpf.build import build
from kernmlops.spool.memory import own_memory
from kernmlops.spool.recovery import pending_spools, remove_spool
from tests.faults.conftest import assert_recovered_manifest

pytestmark = pytest.mark.bpf


class _Killed(BaseException):
    """A SIGKILL at this point: nothing after it runs (not an error anyone catches)."""


def _remove_cut(monkeypatch: pytest.MonkeyPatch, spool: Path, after: int | None) -> int:
    """remove_spool(spool), its process killed once ``after`` files or folders are
    deleted (None: never); the deletions made."""
    made = 0

    def counted(real):
        def delete(*args, **kwargs):
            nonlocal made
            if after is not None and made >= after:
                raise _Killed
            real(*args, **kwargs)
            made += 1

        return delete

    with monkeypatch.context() as m:
        m.setattr(os, "unlink", counted(os.unlink))
        m.setattr(os, "rmdir", counted(os.rmdir))
        with contextlib.suppress(_Killed):
            remove_spool(spool)
    return made


def _recover_cli(col: Path) -> tuple[int, str]:
    from click.testing import CliRunner

    from kernmlops.cli import cli

    done = CliRunner().invoke(cli, ["recover", str(col)])
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    return done.exit_code, done.output


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int], Path]:
    """A collection whose every row waited in the spool (memory and disk) until the
    stop made it, with its spool as the stop left it before removing it: (the
    collection, its rows per table, a saved copy of the spool and its memory folder)."""
    build()
    out = tmp_path_factory.mktemp("stopped")
    cfg = load_config(
        {
            "collector": {
                "output_dir": str(out), "progress": False, "hooks": ["quanta_runtime"],
                "flush_interval_s": 0.2, "spool_spare_cpus": float((os.cpu_count() or 1) + 1),
                "spool_row_workers": 1, "spool_memory_mib": 1,
            },
            "benchmark": {"name": "faux", "duration_s": 1.5},
        }
    )  # fmt: skip
    kept: list[Path] = []
    mp = pytest.MonkeyPatch()
    # the stop leaves its spool: each test cuts the removal where it likes
    mp.setattr("kernmlops.collect.stopping.remove_spool", kept.append)
    storm = subprocess.Popen(["stress-ng", "--switch", "1", "-t", "2"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        result = Session(cfg).run()
    finally:
        mp.undo()
        storm.terminate()  # what it was for is over: no waiting out its -t
        storm.wait(timeout=30)
    spool = result.path / ".spool"
    assert len(kept) == 1 and spool.is_dir()  # (kept names it through the held folder)
    saved = tmp_path_factory.mktemp("saved")
    shutil.copytree(spool, saved / "spool", symlinks=True)
    mem = own_memory(spool)
    assert mem is not None and any(mem.glob("*.ring"))  # the first MiB was in memory
    shutil.copytree(mem, saved / "mem")
    assert any(p.stat().st_size for p in spool.glob("*.ring"))  # the rest on disk
    yield result.path, result.rows, saved
    remove_spool(spool)


def _lay_spool(col: Path, saved: Path) -> Path:
    """The spool (and its memory folder) as the stop left it."""
    spool = col / ".spool"
    shutil.rmtree(spool, ignore_errors=True)
    shutil.copytree(saved / "spool", spool, symlinks=True)
    mem = Path(os.readlink(spool / "mem"))
    shutil.rmtree(mem, ignore_errors=True)
    shutil.copytree(saved / "mem", mem)
    return spool


def test_a_kill_anywhere_in_the_spools_removal_loses_nothing_and_names_no_loss(
    stopped: tuple[Path, dict[str, int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every row is in parts when the stop removes the spool: whatever a kill leaves of
    # it (a segment's json without its file, a description gone before its segments,
    # the memory folder gone before the link to it) is no loss to recover or readers.
    col, rows, saved = stopped
    assert rows["quanta_runtime"] > 10_000
    # the collector that wrote it is gone, as after a kill
    monkeypatch.setattr("kernmlops.spool.collection.collector_running", lambda *a: None)
    deletions = _remove_cut(monkeypatch, _lay_spool(col, saved), None)
    assert deletions >= 8  # segments and their jsons, in memory and on disk
    problems = []  # (cut, what went wrong), all of them at once
    for cut in range(deletions):
        spool = _lay_spool(col, saved)
        mem = Path(os.readlink(spool / "mem"))
        assert _remove_cut(monkeypatch, spool, cut) == cut
        pending = pending_spools(col)  # what readers and push take for rows not made
        code, said = _recover_cli(col)
        if pending:
            problems.append((cut, f"pending: {[p.name for p in pending]}"))
        if code != 0 or "lost" in said or "warning" in said:
            problems.append((cut, f"recover exit {code}: {said.strip()}"))
        if spool.exists() or mem.exists():
            problems.append((cut, "the spool's remnant stays after recover"))
        c = read_collection(col)
        assert {t: c[t].height for t in rows} == rows, cut  # nothing lost, nothing twice
    assert not problems, "\n".join(f"cut after {n}: {what}" for n, what in problems)


def test_a_kill_in_the_spools_removal_leaves_a_manifest_recover_brings_to_the_parts(
    stopped: tuple[Path, dict[str, int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stop removes the spool before it writes its last manifest: a kill there
    # leaves the running one (state running, the rows of its last checkpoint). recover
    # has nothing to make, and brings the manifest to the parts: recovered, from running.
    from kernmlops.collect.manifest import MANIFEST_NAME, read_manifest, write_manifest

    col, rows, saved = stopped
    kept = (col / MANIFEST_NAME).read_bytes()
    manifest = read_manifest(col)
    manifest.state = "running"
    for record in manifest.hooks.values():
        record.rows = {}  # a killed collector's hooks count their rows at the stop
    for record in manifest.tables.values():
        record.rows = 0  # older than the last parts
    write_manifest(col, manifest)
    monkeypatch.setattr("kernmlops.spool.collection.collector_running", lambda *a: None)
    try:
        spool = _lay_spool(col, saved)
        assert _remove_cut(monkeypatch, spool, 3) == 3
        code, said = _recover_cli(col)
        assert code == 0 and "nothing to recover" in said and "lost" not in said, said
        on_disk = assert_recovered_manifest(col, "running")
        assert {t: on_disk[t] for t in rows} == rows  # the collection's own count
        assert not spool.exists()
    finally:
        (col / MANIFEST_NAME).write_bytes(kept)


def test_a_segment_deleted_by_anyone_else_is_still_named_lost(
    stopped: tuple[Path, dict[str, int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same spool, but a segment file deleted outside the removal (no mark says its
    # rows are in parts): recover names it, with the size its json noted, and keeps it.
    import json

    col, _, saved = stopped
    monkeypatch.setattr("kernmlops.spool.collection.collector_running", lambda *a: None)
    spool = _lay_spool(col, saved)
    seg = next(p for p in sorted(spool.glob("*.ring")) if p.stat().st_size)
    noted = json.loads(seg.with_suffix(".json").read_text())["bytes"]
    assert noted > 0
    seg.unlink()
    assert seg in pending_spools(col)
    code, said = _recover_cli(col)
    assert code == 2, said
    assert f"{noted:,} bytes not recovered: the file is missing" in said
    assert seg.with_suffix(".json").exists()
    remove_spool(spool)


def test_a_disk_that_fills_during_the_stop_says_so_in_one_line_and_keeps_the_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The benchmark ended with room left; a neighbour takes the disk as the stop begins
    # (the hooks detached, every row still in the spool): the rows made from it cannot
    # be written. One line says the disk filled during the stop (not that the benchmark
    # was stopped), the spool stays whole, and recover makes every row once there is room.
    from kernmlops.collect import attach
    from kernmlops.collect.manifest import read_manifest
    from kernmlops.collect.space import OutOfSpace
    from tests.faults.test_output import tmpfs
    from tests.faults.test_space import fill

    build()
    with tmpfs(tmp_path / "disk", "64m") as disk:
        cfg = load_config(
            {
                "collector": {
                    "output_dir": str(disk), "progress": False, "hooks": ["quanta_runtime"],
                    "flush_interval_s": 0.2, "min_free_mb": 1, "spool_memory_mib": 0,
                    "spool_spare_cpus": float((os.cpu_count() or 1) + 1),
                    "spool_row_workers": 1,
                },
                "benchmark": {"name": "faux", "duration_s": 3},
            }
        )  # fmt: skip
        real = attach.trim_as_usual
        monkeypatch.setattr(attach, "trim_as_usual", lambda: (real(), fill(disk)))
        # rows enough that their parts cannot fit in the room fill() leaves (256 KiB):
        # a storm of 1.5 s on a busy machine made so few that the stop fitted
        storm = subprocess.Popen(["stress-ng", "--switch", "1", "-t", "4"],
                                 stdout=subprocess.DEVNULL)  # fmt: skip
        session = Session(cfg)
        try:
            time.sleep(0.2)
            with pytest.raises(OutOfSpace) as raised:
                session.run()
        finally:
            storm.terminate()  # what it was for is over: no waiting out its -t
            storm.wait(timeout=30)
        said = str(raised.value)
        assert "\n" not in said and "It filled during the stop, the benchmark ended" in said
        assert "The benchmark was stopped" not in said and "kernmlops recover" in said
        col = session.path
        before = read_manifest(col)
        assert before.state == "disk_full" and before.error == said
        assert any(p.stat().st_size for p in pending_spools(col))  # the spool, kept
        (disk / "fill").unlink()  # room again
        # its collector is gone (this process may carry the name in its command line)
        monkeypatch.setattr("kernmlops.spool.collection.collector_running", lambda *a: None)
        code, out = _recover_cli(col)
        assert code == 0 and "lost" not in out, out
        c = read_collection(col)
        runtime, queued = c["quanta_runtime"].height, c["quanta_queued_time"].height
        assert runtime > 10_000 and abs(runtime - queued) <= 100  # a row of each a switch
        assert not (col / ".spool").exists()
        # The manifest tells what is on disk now (before: its hooks counted 0 rows and
        # the records made before the disk filled, its state still said to recover).
        rows = assert_recovered_manifest(col, "disk_full")
        assert rows["quanta_runtime"] == runtime and rows["quanta_queued_time"] == queued
        after = read_manifest(col)
        assert after.recovery is not None and after.recovery.error == said
        hook = after.hooks["quanta_runtime"]
        assert hook.rows == {"quanta_runtime": runtime, "quanta_queued_time": queued}
        # each switch record gives a row to one table or to both: the spool held them all
        assert max(runtime, queued) <= hook.events <= runtime + queued, hook.events
        lost = getattr(after, "lost_rows", None) or {}
        assert "quanta_runtime" not in lost and "quanta_queued_time" not in lost, lost
