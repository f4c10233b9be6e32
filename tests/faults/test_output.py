"""The output folder: full before the start, full in the middle (read-only, a file, a
pseudo filesystem, no permission: test_output_refused.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernmlops.collect.manifest import read_manifest
from tests.faults.conftest import (
    assert_no_benchmark_left,
    read_everything,
    recover,
    start_collect,
)

pytestmark = pytest.mark.bpf


@contextlib.contextmanager
def tmpfs(where: Path, size: str, *options: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "kmo-fault", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def assert_refused(run, marker_file: Path, text: str) -> None:
    code, err = run.finish()
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and text in err, err
    assert not marker_file.exists()  # the benchmark never started


def test_too_little_space_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with tmpfs(tmp_path / "small", "4m") as small:
        run = start_collect(small / "out", "--", "touch", str(marker))
        # start_collect's config asks for 1 MiB: fill all but ~0.5 MiB
        subprocess.run(["fallocate", "-l", "3584k", str(small / "fill")], check=True)
        assert_refused(run, marker, "free on")


def test_disk_full_mid_run(tmp_path: Path, bpf_baseline) -> None:
    """The benchmark fills the disk under a context-switch storm: the collection stops
    the benchmark, keeps every finished part and writes its manifest (its room was
    reserved), and exits 2 with one line naming the folder and the free space."""
    with tmpfs(tmp_path / "full", "24m") as full:
        run = start_collect(
            full / "out", "--", "sh", "-c",
            "stress-ng --switch 1 --switch-freq 50000 -t 60 --quiet & sleep 3; "
            f"dd if=/dev/zero of={full}/fill bs=64k 2>/dev/null; sleep 60",
        )  # fmt: skip
        code, err = run.finish(timeout_s=120)
        assert code == 2, err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, err
        # below collector.min_free_mb, or full: the filesystem named, with its free space
        assert f"free on {full} (tmpfs)" in lines[0] and str(full / "out") in lines[0]
        col = run.collection()
        manifest = read_manifest(col)
        assert manifest.state == "disk_full" and manifest.exit_code == 2
        assert f"free on {full} (tmpfs)" in (manifest.error or "")
        read_everything(col)
        assert not list(col.glob("*/.*.tmp"))  # unfinished parts were removed
        assert_no_benchmark_left(run.marker)
        # Rows that were still in the spool (it may be what filled the disk) are
        # there once the collection has room again: here, moved to a bigger disk.
        room = tmp_path / "room"
        shutil.copytree(full / "out", room / "out")
        moved = room / "out" / col.relative_to(full / "out")
    recover(moved)
    rows = read_everything(moved)
    assert rows["quanta_runtime"] > 1000  # three seconds of storm were kept


def test_a_full_tmpfs_under_the_spool_is_named_not_the_collections_disk(tmp_path: Path) -> None:
    """The copier's write into the spool's first MiB fails on a full tmpfs: the error
    names that tmpfs and its free space, not the collection's disk (which had room)."""
    import errno

    from kernmlops.collect.session import Session
    from kernmlops.config import load_config
    from kernmlops.ebpf import copier as native
    from kernmlops.errors import OutputError
    from kernmlops.spool.copy import RingSpool
    from kernmlops.spool.frames import FRAME_RAW
    from kernmlops.spool.memory import SpoolMemory
    from tests.ebpf.test_ringbuf import EVENT, MappedRing, events

    assert native.available()
    ring = MappedRing(1 << 16)
    with tmpfs(tmp_path / "shm", "64k") as shm:
        memory = SpoolMemory(shm, limit=1 << 20)  # more than the tmpfs holds
        spool = RingSpool(tmp_path / "spool", "events", EVENT.itemsize, {}, memory=memory)
        copier = native.Copier(interval_ms=10, budget=memory.budget, frame_raw=FRAME_RAW,
                               sync_bytes=8 << 20)  # fmt: skip
        spool.attach(copier, copier.add("events", ring.fd, ring.size, wakes=False))
        try:
            ring.write_records(events(2700))  # 64.8 KB
            ring.sync()
            copier.copy_now()
            config = load_config({"collector": {"output_dir": str(tmp_path / "out")}})
            session = Session(config)
            with pytest.raises(OutputError) as caught:
                session.space.spool_call(lambda: spool.take(None))  # type: ignore[arg-type]
            assert session.space.disk_full
            message = str(caught.value)
            assert f"cannot write the spool in {shm}: the disk is full" in message, message
            assert f"free on {shm} (tmpfs)" in message
            assert ring.consumer() < ring.prod  # what did not fit is still in the ring
            assert copier.rings[0].error == errno.ENOSPC
        finally:
            copier.stop()
            spool.detach()  # as a hook's stop does: the error is not raised twice
            copier.close()
            spool.close()
            os.close(ring.fd)
