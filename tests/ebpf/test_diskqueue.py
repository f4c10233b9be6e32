"""The disk queue (native/diskqueue.c): the copier's frames for disk segments are
written by a thread of their own, so a write that waits (a filesystem a storm keeps
waiting) never stops the copy of the rings. A pipe nobody reads stands in for such
a filesystem: its write(2) waits until the other end is read, as long as we like."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from kernmlops.ebpf import copier as native
from kernmlops.ebpf.copier import Copier
from kernmlops.ebpf.ringbuf import decode, record_stride
from kernmlops.spool.frames import FRAME_RAW, iter_raw_frames
from tests.ebpf.test_ringbuf import EVENT, MappedRing, events

STRIDE = record_stride(EVENT.itemsize)


@pytest.fixture(autouse=True)
def _built(bpf_build_dir: object) -> None:
    assert native.available(), f"no {native.LIBRARY} beside the objects"


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _put(ring: MappedRing, records: np.ndarray) -> None:
    """Commit ``records`` into the ring, as the kernel does: records, then position."""
    ring.cons = ring.consumer()
    ring.write_records(records)
    os.pwrite(ring.fd, ring.data.tobytes(), 2 * ring.page)
    os.pwrite(ring.fd, np.uint64(ring.prod).tobytes(), ring.page)


class _Drain:
    """Reads the pipe's other end on a thread, once started: the writer's waits end."""

    def __init__(self, fd: int) -> None:
        self.fd, self.data = fd, bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while chunk := os.read(self.fd, 1 << 16):
            self.data += chunk

    def start(self) -> None:
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()

    def join(self) -> bytes:
        self._thread.join(30)
        assert not self._thread.is_alive()
        return bytes(self.data)


def _records(data: bytes) -> np.ndarray:
    raw = np.concatenate([np.frombuffer(f.raw or b"", np.uint8) for f in iter_raw_frames(data)])
    return decode(raw, 1, 0, len(raw), EVENT).records


_Piped = tuple[Copier, native.CopiedRing, native.Segment, MappedRing, int, int]


def _pipe_copier(queue_cap: int = native.QUEUE_CAP) -> _Piped:
    ring = MappedRing(1 << 16)
    copier = Copier(interval_ms=2, budget=None, frame_raw=FRAME_RAW, sync_bytes=8 << 20,
                    queue_cap=queue_cap)  # fmt: skip
    r, w = os.pipe()
    cr = copier.add("events", ring.fd, ring.size, wakes=False)
    seg = copier.segment(w, zstd=False, memory=False)  # raw frames: readable as they come
    copier.rotate(cr, seg)
    return copier, cr, seg, ring, r, w


def test_a_disk_write_that_waits_does_not_stop_the_copy(tmp_path: object) -> None:
    copier, cr, seg, ring, r, w = _pipe_copier()
    drain = _Drain(r)
    want = events(12_000)  # 288 KB of records: a ring of 64 KiB four times over
    try:
        copier.start()
        for i in range(0, len(want), 1000):
            _put(ring, want[i : i + 1000])
            # the copier moves the ring on while the writer waits in write(2)
            _wait(lambda: ring.consumer() == ring.prod, "the copier")
        assert cr.copied == len(want) * STRIDE
        # in the file (the pipe) only what its buffer took: the rest is queued, and
        # counts in the segment only once written
        assert seg.written < cr.copied and seg.queued == cr.copied - seg.written
        assert seg.file_bytes <= 1 << 16
        assert copier.stalls["queue_peak_bytes"] > 200_000 and copier.stalls["queue_full"] == 0
        # a rotation now would leave frames behind for the old segment: refused
        other = copier.segment(w, zstd=False, memory=False)
        assert not copier.rotate(cr, other, None, expect=(None, int(seg.written)))
        drain.start()  # the filesystem is back
        _wait(lambda: not seg.queued, "the writer")
        assert seg.written == cr.copied
        copier.stop()
    finally:
        drain.start()  # (a failure above: a writer that waits is let go)
        copier.close()
        os.close(w)
        os.close(ring.fd)
    got = drain.join()
    os.close(r)
    assert len(got) == seg.file_bytes
    assert np.array_equal(_records(got), want)  # every record, once, in order
    # the writer timed its longest write: the one that waited for the reader
    assert copier.stalls["longest_write_ms"] > 0 and copier.stalls["slow_writes"] >= 1


def test_a_full_queue_stops_the_copy_and_loses_nothing(tmp_path: object) -> None:
    # A queue of 96 KiB and a pipe of 64 KiB: past them the copier leaves the records
    # in the ring (as it would with no queue), and takes them once the writer moves.
    copier, cr, seg, ring, r, w = _pipe_copier(queue_cap=96 << 10)
    drain = _Drain(r)
    want = events(12_000)
    try:
        copier.start()
        sent = 0
        while not copier.stalls["queue_full"]:
            assert sent < len(want), "the queue never filled"
            _put(ring, want[sent : sent + 500])
            sent += 500
            deadline = time.monotonic() + 5
            while ring.consumer() != ring.prod and not copier.stalls["queue_full"]:
                assert time.monotonic() < deadline, "the copier stopped with room left"
                time.sleep(0.005)
        time.sleep(0.05)
        held = ring.prod - ring.consumer()  # what waits in the ring meanwhile
        assert held > 0 and ring.consumer() == cr.copied
        assert copier.stalls["queue_peak_bytes"] <= 96 << 10
        drain.start()
        _wait(lambda: ring.consumer() == ring.prod, "the copier, the queue emptied")
        for i in range(sent, len(want), 1000):
            _put(ring, want[i : i + 1000])
            _wait(lambda: ring.consumer() == ring.prod, "the copier")
        copier.stop()
        assert seg.queued == 0 and seg.written == cr.copied == len(want) * STRIDE
    finally:
        drain.start()  # (a failure above: a writer that waits is let go)
        copier.close()
        os.close(w)
        os.close(ring.fd)
    got = drain.join()
    os.close(r)
    assert np.array_equal(_records(got), want)


def test_once_the_copier_stops_its_last_frames_are_written_and_python_writes_directly(
    tmp_path: object,
) -> None:
    copier, _, seg, ring, r, w = _pipe_copier()
    drain = _Drain(r)
    drain.start()
    want = events(3000)
    try:
        copier.start()
        _put(ring, want[:2000])
        copier.stop()  # its last copy: queued, then written before stop returns
        assert seg.queued == 0 and seg.written == 2000 * STRIDE
        _put(ring, want[2000:])
        assert copier.copy_now() == 1000 * STRIDE  # no writer now: in the file at once
        assert seg.written == 3000 * STRIDE
    finally:
        drain.start()  # (a failure above: a writer that waits is let go)
        copier.close()
        os.close(w)
        os.close(ring.fd)
    got = drain.join()
    os.close(r)
    assert np.array_equal(_records(got), want)
