"""The output folder: read-only, a file, full before the start, full in the middle."""

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


def test_read_only_output(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with tmpfs(tmp_path / "ro", "1m", "ro") as ro:
        run = start_collect(ro / "out", "--", "touch", str(marker))
        assert_refused(run, marker, "read-only")


def test_output_is_a_file(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "afile").write_text("not a folder")
    run = start_collect(tmp_path / "afile" / "out", "--", "touch", str(marker))
    assert_refused(run, marker, "is a file, not a folder")


@pytest.mark.parametrize("out", ["/proc/kmo-test", "/sys/kmo-test", "/sys/kernel/kmo-test/a"])
def test_a_pseudo_filesystem_is_refused_for_what_it_is(tmp_path: Path, out: str) -> None:
    """/proc and /sys hold the kernel's files, not ours: said so, not "only 0 B free"."""
    marker = tmp_path / "ran"
    run = start_collect(Path(out), "--", "touch", str(marker))
    kind = "proc" if out.startswith("/proc") else "sysfs"
    code, err = run.finish()
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: cannot create the output folder {out}: "), err
    assert f"({kind}) is a pseudo filesystem" in lines[0] and "free" not in lines[0], err
    assert not marker.exists() and not Path(out).exists()


def test_no_permission(tmp_path: Path) -> None:
    """A user who may not write the folder gets the reason in one line."""
    import os
    import sys

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)  # root's; others may not write
    os.chmod(tmp_path, 0o755)
    code = (
        "from pathlib import Path\n"
        "from kernmlops.collect.output import prepare_output\n"
        "from kernmlops.errors import OutputError\n"
        "try:\n"
        f"    prepare_output(Path({str(locked / 'c')!r}), min_free_mb=0, warn_free_mb=0)\n"
        "except OutputError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert "permission denied" in out.stdout, out
    assert not (locked / "c").exists()


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
