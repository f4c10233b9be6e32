"""The runway (native/runway.c): the spool's disk segments are allocated ahead of the
copier's writes by a thread of its own, so the copier never waits for the filesystem
to allocate; what a segment did not use goes back once the copier leaves it. The
figures are the filesystem's own (st_blocks), not the copier's."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import copier as native
from kernmlops.ebpf.copier import RUNWAY_MIN, Copier
from kernmlops.spool.copy import RingSpool
from kernmlops.spool.frames import FRAME_RAW
from tests.conftest import needs_tools
from tests.ebpf.test_copier import spool_on
from tests.ebpf.test_ringbuf import EVENT, MappedRing, events


@pytest.fixture(autouse=True)
def _built(bpf_build_dir: Path) -> None:
    assert native.available(), f"no {native.LIBRARY} in {bpf_build_dir}"


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def _running(
    folder: Path, ring: MappedRing, keep_free: int = 0, sync_bytes: int = 8 << 20
) -> contextlib.AbstractContextManager[tuple[RingSpool, Copier]]:
    """A spool whose memory budget holds 100 records (the rest goes to disk), filled by
    a running copier thread with a 60-s runway."""
    return spool_on(ring, folder, budget_records=100, runway_s=60, keep_free=keep_free,
                    sync_bytes=sync_bytes, start=True)  # fmt: skip


def _feed(ring: MappedRing, records: np.ndarray, batch: int = 500) -> None:
    """Write ``records`` into the ring in batches, each copied before the next."""
    for i in range(0, len(records), batch):
        ring.cons = ring.consumer()
        ring.write_records(records[i : i + batch])
        # as the kernel commits: the records first, then the producer position (the
        # copier thread reads while this writes; MappedRing.sync writes it first)
        os.pwrite(ring.fd, ring.data.tobytes(), 2 * ring.page)
        os.pwrite(ring.fd, np.uint64(ring.prod).tobytes(), ring.page)
        _wait(lambda: ring.consumer() == ring.prod, "the copier")


def _read_all(spool: RingSpool) -> np.ndarray:
    return np.concatenate(list(spool.records(EVENT)))


def test_disk_segments_are_allocated_ahead_and_give_back_what_they_did_not_use(
    tmp_path: Path,
) -> None:
    ring = MappedRing(1 << 16)
    want = events(6000)
    with _running(tmp_path, ring) as (spool, copier):
        standby = spool._standby
        assert standby is not None
        # before any record: the standby on disk has its first MiB, and no size
        _wait(lambda: copier.runway["allocations"] >= 1, "the standby's runway")
        assert standby.path.stat().st_size == 0
        assert _allocated(standby.path) >= RUNWAY_MIN
        _feed(ring, want)  # past the memory budget: on in the standby
        spool.take(None)  # type: ignore[arg-type]  # looks at what the copier did
        assert standby.native.state == native.ACTIVE
        size = standby.path.stat().st_size
        assert 0 < size < RUNWAY_MIN // 2
        assert _allocated(standby.path) >= RUNWAY_MIN  # what it wrote went into the runway
        # ... and so did every byte the copier wrote to disk
        assert copier.runway["outside_bytes"] == 0
        # the next standby has its runway too
        nxt = spool._standby
        assert nxt is not None and nxt is not standby
        _wait(lambda: _allocated(nxt.path) >= RUNWAY_MIN, "the next standby's runway")
        copier.stop()
        spool.detach()
        # the copier has stopped: the blocks past each segment's end went back (the
        # standby was deleted); what is left is the file's own, in 4-KiB blocks
        assert standby.path.stat().st_size == size
        assert _allocated(standby.path) <= size + 4096
        assert not nxt.path.exists()
        assert np.array_equal(_read_all(spool), want)


def test_a_long_runway_is_allocated_in_pieces_the_copier_can_write_between(
    tmp_path: Path,
) -> None:
    # each fallocate holds the inode's lock, which the copier's writes to the segment
    # take: 192 MiB ahead is three calls of 64 MiB, not one, and the file has all of it
    ring = MappedRing(1 << 16)
    with spool_on(ring, tmp_path, budget_records=100, runway_s=60) as (spool, copier):
        copier._c.runway_min = 192 << 20  # as a fast storm's 60 s would ask
        copier.start()
        standby = spool._standby
        assert standby is not None
        _wait(lambda: copier.runway["allocated_bytes"] >= 192 << 20, "the standby's runway")
        assert copier.runway["allocations"] == 3
        assert copier.runway["allocated_bytes"] == 192 << 20
        assert _allocated(standby.path) >= 192 << 20  # the filesystem's own count
        assert standby.path.stat().st_size == 0


def test_the_runway_thread_starts_the_writeback_behind_the_copier(tmp_path: Path) -> None:
    # Writeback's submission takes page locks and journal handles: the runway thread
    # starts it (every sync_bytes), up to a MiB boundary a MiB or more behind the end
    # the copier appends at; the copier no longer does it itself.
    ring = MappedRing(1 << 21)
    rng = np.random.default_rng(7)
    want = events(200_000)
    want["ts"] = rng.integers(0, 2**63, len(want))  # zstd cannot shrink them much
    want["pid"] = rng.integers(0, 2**32, len(want))
    with _running(tmp_path, ring, sync_bytes=256 << 10) as (spool, copier):
        _feed(ring, want, batch=25_000)
        spool.take(None)  # type: ignore[arg-type]
        seg = next(s for s in spool._live if s.native is not None and not s.in_memory)
        size = seg.path.stat().st_size
        assert size > 3 << 20
        mib = 1 << 20
        _wait(lambda: seg.native.synced >= (size - mib) // mib * mib - mib, "the writeback")
        synced = int(seg.native.synced)
        assert synced % mib == 0 and synced <= size - mib
        copier.stop()
        spool.detach()
        assert np.array_equal(_read_all(spool), want)


def test_the_runway_never_takes_the_room_the_filesystem_must_keep(tmp_path: Path) -> None:
    # keep_free above what the filesystem has free: nothing is allocated ahead, the
    # copier writes as it did without a runway, and says how much went outside it
    ring = MappedRing(1 << 16)
    free = shutil.disk_usage(tmp_path).free
    want = events(3000)
    with _running(tmp_path, ring, keep_free=free + (1 << 30)) as (spool, copier):
        _wait(lambda: copier.runway.get("short_of_space", 0) >= 1, "a look at the free space")
        _feed(ring, want)
        spool.take(None)  # type: ignore[arg-type]
        copier.stop()
        runway = copier.runway
        assert runway["allocations"] == 0 and runway["allocated_bytes"] == 0
        on_disk = sum(p.stat().st_size for p in (tmp_path / "spool").glob("events.*.ring"))
        assert on_disk > 0 and runway["outside_bytes"] == on_disk
        spool.detach()
        assert np.array_equal(_read_all(spool), want)


def test_a_segment_the_runway_thread_is_allocating_in_is_kept_and_not_trimmed(
    tmp_path: Path,
) -> None:
    # The runway thread took the segment while it was active (or the standby) and is
    # in fallocate: Python may forget it, but its struct stays until the thread is
    # done; a trim waits for a later sync.
    copier = Copier(interval_ms=5, budget=None, frame_raw=FRAME_RAW, sync_bytes=8 << 20,
                    runway_s=60)  # fmt: skip
    try:
        path = tmp_path / "seg"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(fd, b"x" * 5000)
        libc = ctypes.CDLL(None, use_errno=True)
        keep_size = 1  # FALLOC_FL_KEEP_SIZE: as the runway thread allocates
        assert libc.fallocate(fd, keep_size, ctypes.c_long(5000), ctypes.c_long(1 << 20)) == 0
        assert _allocated(path) >= 1 << 20
        seg = copier.segment(fd, zstd=True, memory=False)
        seg.state, seg.alloc_end, seg.alloc_busy = native.DONE, 5000 + (1 << 20), 1
        assert copier.trim(seg, fd) is False
        copier.forget(seg)
        assert seg in copier._leaving
        seg.alloc_busy = 0
        copier.forget(copier.segment(fd, zstd=True, memory=False))
        assert copier._leaving == []
        # trimmed once the thread let go: the size stays, the blocks past it go back
        assert copier.trim(seg, fd) is True
        assert os.fstat(fd).st_size == 5000 and _allocated(path) <= 8192
        assert seg.alloc_off == 1 and seg.alloc_end == 0
        os.close(fd)
    finally:
        copier.close()


@needs_tools("mkfs.ext3", "mount")
def test_a_filesystem_that_cannot_allocate_ahead_is_written_as_before(tmp_path: Path) -> None:
    # ext3 (no extents) refuses fallocate: the runway stops and says why, the copier
    # writes on without it, and every record is kept.
    image, mnt = tmp_path / "ext3.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext3", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    ring = MappedRing(1 << 16)
    try:
        with _running(mnt, ring) as (spool, copier):
            want = events(3000)
            _wait(lambda: "error" in copier.runway, "the runway's first try")
            _feed(ring, want)
            copier.stop()
            runway = copier.runway
            assert runway["error"] == os.strerror(errno.EOPNOTSUPP)
            assert runway["allocations"] == 0 and runway["allocated_bytes"] == 0
            assert any(p.stat().st_size for p in (mnt / "spool").glob("events.*.ring"))
            spool.detach()
            assert np.array_equal(_read_all(spool), want)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_the_runway_allocates_only_the_standby_and_the_copier_moves_on_when_its_is_used(
    tmp_path: Path,
) -> None:
    # fallocate holds the inode's lock, which the copier's writes to that file take
    # too, and may wait seconds in the block allocator under a storm: the runway
    # allocates only in the standby, and the copier, once its disk segment's blocks
    # are used, goes on in the standby (allocated) rather than past them.
    ring = MappedRing(1 << 21)
    rng = np.random.default_rng(3)
    want = events(300_000)  # 7.2 MB of records zstd cannot shrink much
    want["ts"] = rng.integers(0, 2**63, len(want))
    want["pid"] = rng.integers(0, 2**32, len(want))
    with _running(tmp_path, ring) as (spool, copier):
        copier._c.runway_max = RUNWAY_MIN  # every segment's runway: 1 MiB
        for i in range(0, len(want), 25_000):
            _feed(ring, want[i : i + 25_000], batch=25_000)
            spool.take(None)  # type: ignore[arg-type]  # Python arms the next standby
            nxt = spool._standby
            assert nxt is not None
            _wait(lambda nxt=nxt: int(nxt.native.alloc_end) >= RUNWAY_MIN, "the standby's runway")
        disk = [s for s in spool._live if not s.in_memory and s.native is not None]
        # five or more segments of a MiB each, each the runway's blocks and no more
        # (its end given back once it was left); nothing was written past a runway
        assert len(disk) >= 5, [s.file_bytes for s in disk]
        for seg in disk[:-1]:
            assert seg.native.state == native.DONE
            assert 0 < seg.path.stat().st_size <= RUNWAY_MIN
            assert _allocated(seg.path) <= RUNWAY_MIN
        assert copier.runway["outside_bytes"] == 0
        copier.stop()
        spool.detach()
        assert np.array_equal(_read_all(spool), want)
