"""The native ring copier (native/ringcopy.c) against a ring laid out as the kernel
lays it out (tests.ebpf.test_ringbuf.MappedRing), and against the kernel's own
producer: every committed record reaches the spool once, in order, in the files
kernmlops recover reads; nothing is taken from the ring that is not in a file."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import copier as native
from kernmlops.ebpf.copier import Copier
from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.ebpf.ringbuf import decode, record_stride
from kernmlops.spool.copy import RingSpool
from kernmlops.spool.frames import (
    FRAME,
    FRAME_RAW,
    RAW_FRAME,
    SHUFFLED,
    SHUFFLED_RAW_MAX,
    frames,
    iter_raw_frames,
    raw_head,
    segment_codec,
    shuffle,
    shuffle_stride,
)
from kernmlops.spool.memory import SpoolMemory
from tests.conftest import skip_here
from tests.ebpf.test_ringbuf import EVENT, MappedRing, events


@pytest.fixture(autouse=True)
def _built(bpf_build_dir: Path) -> None:
    """The library is built beside the objects (kernmlops build-bpf)."""
    assert native.available(), f"no {native.LIBRARY} in {bpf_build_dir}"


def _copier(budget: int = 0, interval_ms: int = 10) -> Copier:
    return Copier(
        interval_ms=interval_ms,
        budget=native.Budget(budget) if budget else None,
        frame_raw=FRAME_RAW,
        sync_bytes=8 << 20,
    )


def _mapped(size: int, start: int = 0) -> MappedRing:
    return MappedRing(size, start)


def _fill_and_copy(ring: MappedRing, copier: Copier, records: np.ndarray) -> int:
    """Write ``records`` into the ring (after what the copier freed) and have the
    copier copy once; the bytes it copied."""
    ring.cons = ring.consumer()
    ring.write_records(records)
    ring.sync()
    return copier.copy_now()


def _read_all(spool: RingSpool) -> np.ndarray:
    parts = list(spool.records(EVENT))
    return np.concatenate(parts) if parts else np.empty(0, EVENT)


def test_the_copy_stops_at_a_busy_record_and_wraps_whole(tmp_path: Path) -> None:
    ring = _mapped(4096, start=4096 - 48)  # the first run wraps around the end
    want = events(12)
    ring.write_records(want[:5])
    busy = ring.write(want[5].tobytes(), busy=True)
    ring.write_records(want[6:])
    ring.sync()
    copier = _copier()
    out = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        cr = copier.add("events", ring.fd, 4096, wakes=False)
        seg = copier.segment(out, zstd=False, memory=False)
        copier.rotate(cr, seg)
        copier.start()  # the thread's first pass, then it sleeps
        copier.stop()
        stride = record_stride(EVENT.itemsize)
        assert ring.consumer() == 4096 - 48 + 5 * stride  # up to the busy record
        assert seg.written == 5 * stride
        # a frame up to the data area's end, one after: each its header and records
        assert seg.file_bytes == 2 * RAW_FRAME.size + 5 * stride
        ring.cons = ring.consumer()
        ring.commit(busy)
        ring.sync()
        assert copier.copy_now() == 7 * stride
        assert ring.consumer() == ring.prod
        data = (tmp_path / "seg").read_bytes()
        found = list(iter_raw_frames(data))
        assert [(f.reason, len(f.raw or b"")) for f in found] == [
            (None, 2 * stride), (None, 3 * stride), (None, 7 * stride)
        ]  # fmt: skip
        # the header the Python copy writes for the same records, CRC included
        assert data[: RAW_FRAME.size] == raw_head(found[0].raw or b"")
        raw = np.frombuffer(b"".join(f.raw or b"" for f in found), np.uint8)
        got = decode(raw, 1, 0, len(raw), EVENT).records
        assert np.array_equal(got, want)
    finally:
        copier.close()
        os.close(out)
        os.close(ring.fd)


@pytest.mark.parametrize("zstd", [False, True])
def test_a_record_that_straddles_the_rings_end_is_copied_whole(tmp_path: Path, zstd: bool) -> None:
    # The copier maps the data area once (not the kernel's two views: each counts
    # in RSS), so the record that wraps past the end is joined before it is written.
    stride = record_stride(EVENT.itemsize)
    ring = _mapped(4096, start=4096 - stride + 8)  # the first record wraps
    want = events(100)
    ring.write_records(want)
    ring.sync()
    copier = _copier()
    out = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        cr = copier.add("events", ring.fd, 4096, wakes=False)
        seg = copier.segment(out, zstd=zstd, memory=False)
        copier.rotate(cr, seg)
        assert copier.copy_now() == 100 * stride
        assert ring.consumer() == ring.prod and seg.written == 100 * stride
        data = (tmp_path / "seg").read_bytes()
        if zstd:  # the wrapped record is a frame of its own, then the rest
            import pyarrow as pa

            pieces = list(frames(data, pa.Codec("zstd")))
            assert [len(p) for p in pieces] == [stride, 99 * stride]
        else:  # raw frames: a quarter ring at most, each with its CRC
            pieces = [f.raw or b"" for f in iter_raw_frames(data)]
            assert [len(p) for p in pieces] == [stride, 42 * stride, 42 * stride, 15 * stride]
        data = b"".join(pieces)
        raw = np.frombuffer(data, np.uint8)
        assert np.array_equal(decode(raw, 1, 0, len(raw), EVENT).records, want)
    finally:
        copier.close()
        os.close(out)
        os.close(ring.fd)


def test_a_write_that_fails_takes_nothing_from_the_ring(tmp_path: Path) -> None:
    ring = _mapped(4096)
    ring.write_records(events(10))
    ring.sync()
    copier = _copier()
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        cr = copier.add("events", ring.fd, 4096, wakes=False)
        copier.rotate(cr, copier.segment(full, zstd=False, memory=False))
        assert copier.copy_now() == 0
        assert cr.error == errno.ENOSPC
        assert ring.consumer() == 0  # every record still in the ring
        # the spool names the error (the session ends the collection: disk full)
        spool = RingSpool(tmp_path / "spool", "events", EVENT.itemsize, {})
        spool._ring, spool._copier = cr, copier
        with pytest.raises(OSError, match="No space left") as caught:
            spool.take(None)  # type: ignore[arg-type]
        assert caught.value.errno == errno.ENOSPC
        spool._ring = spool._copier = None
        spool.close()
    finally:
        copier.close()
        os.close(full)
        os.close(ring.fd)


@contextlib.contextmanager
def spool_on(
    ring: MappedRing,
    folder: Path,
    budget_records: int,
    shuffle: int = 0,
    *,
    runway_s: float = 0.0,
    keep_free: int = 0,
    sync_bytes: int = 8 << 20,
    start: bool = False,
) -> Iterator[tuple[RingSpool, Copier]]:
    """A spool the copier fills from ``ring`` (copies made with copy_now, or by its
    thread with ``start``), torn down as a hook tears it down: the copier's last
    copy, then the spool in Python."""
    stride = record_stride(EVENT.itemsize)
    memory = SpoolMemory(folder / "mem", limit=budget_records * stride)
    memory.folder.mkdir(parents=True)
    spool = RingSpool(folder / "spool", "events", EVENT.itemsize, {"ring": "events"},
                      memory=memory, shuffle=shuffle)  # fmt: skip
    copier = Copier(interval_ms=5 if start else 10, budget=memory.budget, frame_raw=FRAME_RAW,
                    sync_bytes=sync_bytes, runway_s=runway_s, keep_free=keep_free)  # fmt: skip
    spool.attach(copier, copier.add("events", ring.fd, ring.size, wakes=False, shuffle=shuffle))
    if start:
        copier.start()
    try:
        yield spool, copier
    finally:
        copier.stop()
        spool.detach()
        copier.close()
        spool.close()
        os.close(ring.fd)


def test_past_the_memory_budget_the_copier_goes_on_in_zstd_frames_on_disk(
    tmp_path: Path,
) -> None:
    ring = _mapped(1 << 14)
    want = events(1500)
    with spool_on(ring, tmp_path, budget_records=300) as (spool, copier):
        for i in range(0, 1500, 500):  # three fills, a copy each
            _fill_and_copy(ring, copier, want[i : i + 500])
        spool.take(None)  # type: ignore[arg-type]  # looks at what the copier did
        mem_segs = sorted((tmp_path / "mem").glob("events.*.ring"))
        disk_segs = sorted((tmp_path / "spool").glob("events.*.ring"))
        stride = record_stride(EVENT.itemsize)
        # Runs of a quarter ring (170 records): the first fits the budget (300), the
        # second would not and goes whole to the standby, and so on there.
        assert [p.stat().st_size for p in mem_segs] == [RAW_FRAME.size + 170 * stride]
        assert segment_codec(disk_segs[0]) is not None  # the standby: zstd frames
        # its json does not know its rows until the reading reaches it
        meta = disk_segs[0].with_suffix(".json")
        assert json.loads(meta.read_text())["rows_before"] is None
        got = _read_all(spool)
        assert np.array_equal(got, want)
        spool.count("events", len(got))
        assert json.loads(meta.read_text())["rows_before"] == {}
        # the files alone hold it all (what kernmlops recover reads)
        codec = segment_codec(disk_segs[0])
        pieces = [np.frombuffer(p, np.uint8) for p in frames(disk_segs[0].read_bytes(), codec)]
        (mem,) = [np.frombuffer(f.raw or b"", np.uint8)
                  for f in iter_raw_frames(mem_segs[0].read_bytes())]  # fmt: skip
        raw = np.concatenate([mem, *pieces])
        assert np.array_equal(decode(raw, 1, 0, len(raw), EVENT).records, want)
        # a frame per copy (each under FRAME_RAW), cut where a copy passes the ring's
        # end (the data area is mapped once): the 2nd and 3rd fills each pass it with
        # a record straddling the end, which is joined and framed alone
        assert len(pieces) == 1 + 3 + 3
        # a new standby waits after the one the copier took
        assert len(disk_segs) == 2 and disk_segs[1].stat().st_size == 0


def test_the_copier_shuffles_as_the_reader_unshuffles() -> None:
    # The library's shuffle (SSE2 where the stride is a multiple of 16, else byte by
    # byte) is the reader's (kernmlops.spool.frames.shuffle), tails included.
    lib = native.load()
    assert lib is not None
    rng = np.random.default_rng(3)
    for stride, n in ((32, 1000), (32, 7), (48, 333), (24, 500), (8, 17), (1016, 40)):
        raw = rng.bytes(stride * n + 8)
        out = ctypes.create_string_buffer(len(raw))
        lib.kmo_shuffle(out, raw, ctypes.c_uint64(len(raw)), ctypes.c_uint32(stride))
        assert out.raw == shuffle(raw, stride), (stride, n)


def test_the_copier_shuffles_the_frames_the_reader_expects_shuffled() -> None:
    # Which frames are shuffled is written twice, in C (the copier) and in Python (the
    # spool's own writes): both say the same for every stride and size near the edges.
    lib = native.load()
    assert lib is not None
    sizes = (0, 7, 8, 24, 32, 1000, 1016, 1024, SHUFFLED_RAW_MAX, SHUFFLED_RAW_MAX + 1)
    for stride in (0, 1, 8, 12, 24, 32, 48, 1008, 1016, 1024, 2048):
        for size in sizes:
            assert lib.kmo_shuffle_stride(size, stride) == shuffle_stride(size, stride), (
                stride, size)  # fmt: skip


def test_a_ring_with_a_stride_has_its_disk_frames_shuffled_and_read_back_whole(
    tmp_path: Path,
) -> None:
    # The same records through a copier that shuffles at the ring's record stride and
    # through one that does not: every frame on disk says it was shuffled, all come
    # back as they were (the spool's reading and the files alone), and they take
    # fewer bytes on disk.
    stride = record_stride(EVENT.itemsize)
    want = events(3000)
    sizes = {}
    for shuffle_at in (0, stride):
        folder = tmp_path / str(shuffle_at)
        ring = _mapped(1 << 16)
        with spool_on(ring, folder, budget_records=1, shuffle=shuffle_at) as (spool, copier):
            for i in range(0, 3000, 1000):
                _fill_and_copy(ring, copier, want[i : i + 1000])
            spool.take(None)  # type: ignore[arg-type]  # looks at what the copier did
            disk = sorted((folder / "spool").glob("events.*.ring"))[0]
            data = disk.read_bytes()
            words, at = [], 0
            while at < len(data):
                size, word = FRAME.unpack_from(data, at)
                words.append(word)
                at += FRAME.size + size
            assert all(bool(w & SHUFFLED) == bool(shuffle_at) for w in words), words
            raw = b"".join(frames(data, segment_codec(disk)))
            assert np.array_equal(decode(np.frombuffer(raw, np.uint8), 1, 0, len(raw),
                                         EVENT).records, want)  # fmt: skip
            assert np.array_equal(_read_all(spool), want)
            sizes[shuffle_at] = len(data)
    assert sizes[stride] < sizes[0], sizes


def test_a_segment_read_to_its_end_is_rotated_retired_and_deleted(tmp_path: Path) -> None:
    ring = _mapped(1 << 14)
    with spool_on(ring, tmp_path, budget_records=10_000) as (spool, copier):
        _fill_and_copy(ring, copier, events(100))
        assert len(_read_all(spool)) == 100
        spool.count("events", 100)
        first = sorted((tmp_path / "mem").glob("events.*.ring"))
        spool.checkpoint({"events": 0})  # rotated: a new tail in memory; the old retired
        _fill_and_copy(ring, copier, events(50, first=100))
        now = sorted((tmp_path / "mem").glob("events.*.ring"))
        assert len(now) == 2 and now[0] == first[0]
        frame = RAW_FRAME.size + 50 * record_stride(EVENT.itemsize)
        assert now[1].stat().st_size == frame
        assert json.loads(now[1].with_suffix(".json").read_text())["rows_before"] == {"events": 100}
        spool.checkpoint({"events": 100})  # its rows are in finished parts: deleted
        spool.drained()
        assert not first[0].exists()
        assert np.array_equal(_read_all(spool), events(50, first=100))
        assert spool.memory is not None and spool.memory.used == frame


def test_a_standby_taken_back_just_after_the_copier_took_it_up_stays(tmp_path: Path) -> None:
    # The budget ran out and the copier went on in the standby before Python looked;
    # a rotation then takes the standby back: it must stay, live, with its records
    # (deleting it, or arming another the copier already holds, would lose them).
    ring = _mapped(1 << 14)
    with spool_on(ring, tmp_path, budget_records=100) as (spool, copier):
        # a first run of 170 records is past the budget: the copier takes the standby
        _fill_and_copy(ring, copier, events(300))
        standby = spool._standby
        assert standby is not None and standby.native.state == native.ACTIVE
        with spool._cond:
            spool._drop_standby()
        assert standby.path.exists() and standby in spool._live
        assert spool._standby is None
        assert not copier.rings[0].ring.standby  # the copier holds no segment of the past
        assert np.array_equal(_read_all(spool), events(300))
        spool.count("events", 300)
        spool.checkpoint({"events": 300})  # read to its end: rotated, a standby again
        assert spool._standby is not None and spool._standby.native.state == native.STANDBY


def test_a_rotation_hands_the_copier_its_next_standby_in_the_same_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between a rotation and the next standby the copier of a spent budget has
    # nowhere to go and waits for Python, whose next step a storm delays by seconds:
    # the rotation gives both at once, and keeps the order of the segments' names.
    ring = _mapped(1 << 14)
    seen: list[bool] = []
    real = Copier.rotate

    def rotate(self: Copier, cr: native.CopiedRing, seg: native.Segment, *a: object) -> bool:
        done = real(self, cr, seg, *a)  # type: ignore[arg-type]
        seen.append(bool(cr.ring.standby))  # what the copier holds as it returns
        return done

    monkeypatch.setattr(Copier, "rotate", rotate)
    with spool_on(ring, tmp_path, budget_records=10_000) as (spool, copier):
        _fill_and_copy(ring, copier, events(100))
        assert len(_read_all(spool)) == 100
        spool.count("events", 100)
        old = spool._standby
        assert old is not None
        spool.checkpoint({"events": 0})  # read to its end: rotated
        assert seen == [True, True]  # (attach, then the rotation)
        new = spool._standby
        assert new is not None and new is not old and not old.path.exists()
        assert new.path.name > spool._tail.path.name  # the standby comes after the tail
        assert copier.rings[0].standby_waits == (0, 0.0)
        _fill_and_copy(ring, copier, events(50, first=100))
        assert np.array_equal(_read_all(spool), events(50, first=100))


def test_a_rotation_is_refused_where_the_copier_wrote_on_since_python_looked(
    tmp_path: Path,
) -> None:
    ring = _mapped(1 << 14)
    with spool_on(ring, tmp_path, budget_records=10_000) as (spool, copier):
        _fill_and_copy(ring, copier, events(100))
        assert len(_read_all(spool)) == 100
        spool.count("events", 100)
        tail, standby = spool._tail, spool._standby
        assert standby is not None
        # the copier writes 20 more after Python's last look, before the rotation
        ring.cons = ring.consumer()
        ring.write_records(events(20, first=100))
        ring.sync()
        real_sync = spool._sync
        spool._sync = lambda check=True: None  # type: ignore[method-assign]
        with spool._cond:
            copier.copy_now()
            spool._rotate()  # Python believes the tail read to its end
        spool._sync = real_sync  # type: ignore[method-assign]
        # nothing changed: the tail is still the copier's, with its standby
        assert spool._tail is tail and spool._standby is standby
        assert tail.native.state == native.ACTIVE and copier.rings[0].ring.standby
        assert np.array_equal(_read_all(spool), events(20, first=100))


def test_the_copier_counts_its_waits_for_a_standby(tmp_path: Path) -> None:
    ring = _mapped(4096)
    copier = _copier(budget=10 * record_stride(EVENT.itemsize))
    mem = os.open(tmp_path / "m", os.O_RDWR | os.O_CREAT, 0o600)
    disk = os.open(tmp_path / "d", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        cr = copier.add("events", ring.fd, 4096, wakes=False)
        copier.rotate(cr, copier.segment(mem, zstd=False, memory=True))
        # 40 records: the budget holds 10, and there is no standby to go on in
        assert _fill_and_copy(ring, copier, events(40)) == 0
        assert cr.ring.waiting and cr.standby_waits[0] == 1
        assert _fill_and_copy(ring, copier, events(0)) == 0  # still the same wait
        time.sleep(0.02)
        copier.set_standby(cr, copier.segment(disk, zstd=False, memory=False))
        waits, seconds = cr.standby_waits
        assert waits == 1 and seconds >= 0.02 and not cr.ring.waiting
        assert copier.copy_now() == 40 * record_stride(EVENT.itemsize)
    finally:
        copier.close()
        os.close(mem)
        os.close(disk)
        os.close(ring.fd)


def test_the_segment_after_a_deleted_one_knows_its_rows(tmp_path: Path) -> None:
    # The copier went on in the standby after the reading had finished the memory
    # segment: at the checkpoint that deletes the memory segment, the standby must
    # learn its rows_before (recover starts from the first segment left).
    ring = _mapped(1 << 14)
    with spool_on(ring, tmp_path, budget_records=300) as (spool, copier):
        _fill_and_copy(ring, copier, events(170))
        for records in spool.records(EVENT):
            spool.count("events", len(records))
        _fill_and_copy(ring, copier, events(500, first=170))  # past the budget: the standby
        (memory_seg,) = (tmp_path / "mem").glob("events.*.ring")
        spool.checkpoint({"events": 170})  # the memory segment's rows are finished
        spool.drained()
        assert not memory_seg.exists()
        first_left = sorted((tmp_path / "spool").glob("events.*.json"))[0]
        assert json.loads(first_left.read_text())["rows_before"] == {"events": 170}
        assert np.array_equal(_read_all(spool), events(500, first=170))


# The kernel's own producer: one test run is a loop that writes a record whenever
# the ring is under half full, numbering the records it wrote.
GENERATOR = r"""
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} rb SEC(".maps");

struct gen {
	u64 written, refused, steps;
	u64 rec[31];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct gen);
} state SEC(".maps");

struct loop_ctx {
	struct gen *g;
};

static long step(u32 i, struct loop_ctx *c)
{
	struct gen *g = c->g;

	g->steps++;
	if (bpf_ringbuf_query(&rb, BPF_RB_AVAIL_DATA) < (1 << 19)) {
		g->rec[0] = g->written;
		if (bpf_ringbuf_output(&rb, g->rec, sizeof(g->rec), BPF_RB_NO_WAKEUP))
			g->refused++;
		else
			g->written++;
	}
	return 0;
}

SEC("raw_tp")
int generate(void *ctx)
{
	u32 zero = 0;
	struct loop_ctx c = { .g = bpf_map_lookup_elem(&state, &zero) };

	if (c.g)
		bpf_loop(1 << 21, step, &c, 0);
	return 0;
}
"""
# The generator writes only while the ring is below half full, so a faster copier means
# more records and a longer run (4-54 s for 20 runs on one 2-vCPU VM, ~0.8 s a run in
# CI): 4 runs suffice for the copier to wake many times between them and for the spool
# to go to disk. The least they write, a half-full ring each (the copier emptying it
# only between runs), is 8,192 records, 2 MiB: twice the ring and the memory budget
# (8,192 measured in 2 of 12 runs here, up to 1.8M in the others).
RUNS = 4
GEN = np.dtype([("written", "<u8"), ("refused", "<u8"), ("steps", "<u8")])
RECORD = np.dtype([("seq", "<u8"), ("pad", "<u8", (30,))])  # 248 bytes: stride 256


@pytest.mark.bpf
@pytest.mark.parametrize("workers", [0, 2])
def test_the_copier_thread_keeps_up_with_the_kernel_and_keeps_every_record(
    compile_bpf: Callable[[str, str], Path], tmp_path: Path, workers: int
) -> None:
    # workers: zstd's threads compress each disk frame in 512-KiB jobs (one frame
    # still, read back by pyarrow's codec like any other)
    path = compile_bpf("copier_gen", GENERATOR)
    size = 1 << 20
    stride = record_stride(RECORD.itemsize)
    with open_and_load(path, max_entries={"rb": size}) as obj:
        # 1 MiB: the least the runs write (a half-full ring each, when the copier gets no
        # CPU between them on a loaded machine) still goes past it, onto disk
        memory = SpoolMemory(tmp_path / "mem", limit=1 << 20)
        memory.folder.mkdir()
        spool = RingSpool(tmp_path / "spool", "gen", RECORD.itemsize, {}, memory=memory)
        copier = Copier(interval_ms=5, budget=memory.budget, frame_raw=2 * FRAME_RAW,
                        sync_bytes=8 << 20, workers=workers)  # fmt: skip
        spool.attach(copier, copier.add("gen", obj.map("rb").fd, size, wakes=False))
        copier.start()
        opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
        fd = obj.programs["generate"].fd
        result: list[int] = []

        def written() -> int:
            return int(np.frombuffer(obj.map("state").lookup(0)[: GEN.itemsize], GEN)[0][0])

        def run() -> None:  # a run takes tens of ms: many, for the copier to wake between
            # more runs while the copier has not yet moved more than the ring holds: on a
            # loaded machine it may get no CPU during a few runs (4,096 written in 4)
            deadline = time.monotonic() + 30
            while len(result) < RUNS or (
                written() <= size // stride and time.monotonic() < deadline
            ):
                result.append(lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts)))

        runner = threading.Thread(target=run)
        try:
            runner.start()
            runner.join()
            # the copier thread's CPU as the kernel counts it (utime + stime, in clock
            # ticks), just before its last copy: what copier.cpu_s reports after it
            assert copier._thread is not None
            fields = Path(f"/proc/self/task/{copier._thread.native_id}/stat").read_text()
            utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
            kernel_s = (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
            copier.stop()
            assert kernel_s - 0.02 <= copier.cpu_s <= kernel_s + 0.1, (copier.cpu_s, kernel_s)
            assert copier.workers == workers  # libzstd took them
            spool.detach()
            gen = np.frombuffer(obj.map("state").lookup(0)[: GEN.itemsize], GEN)[0]
            parts = list(spool.records(RECORD))
            got = np.concatenate(parts)["seq"]
        finally:
            copier.close()
            spool.close()
    assert result == [0] * len(result) and len(result) >= RUNS
    assert gen["steps"] == len(result) << 21 and gen["refused"] == 0
    assert gen["written"] > size // stride  # more than the ring holds: it was copied all along
    assert np.array_equal(got, np.arange(gen["written"]))  # each once, in order
    on_disk = list((tmp_path / "spool").glob("gen.*.ring"))
    assert any(segment_codec(p) is not None and p.stat().st_size for p in on_disk)


def test_compression_workers_follow_the_cpu_count() -> None:
    # one thread compresses ~6M records/s; a storm makes ~0.5M/s per CPU
    assert [native.default_workers(n) for n in (1, 2, 4, 8, 16, 56, 192)] == [0, 0, 0, 1, 2, 7, 24]


def _thread_nice(tid: int) -> int:
    """The nice of thread ``tid`` as the kernel reports it (/proc/<pid>/task/<tid>/stat,
    field 19), not as Python remembers setting it."""
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def test_where_real_time_is_refused_the_copier_asks_for_the_highest_nice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # root in a cgroup without a real-time budget gets EPERM from SCHED_FIFO and may
    # still lower its nice: the copier takes that, for its own thread only
    if os.geteuid() != 0:
        skip_here("a lower nice needs root")

    def refused(*_: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(native.os, "sched_setscheduler", refused)
    copier = _copier()
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        copier.start(priority=1)  # returns once the thread has its priority
        tasks = Path("/proc/self/task")
        deadline = time.monotonic() + 10  # and its disk writer, started by the thread
        while not any((t / "comm").read_text().strip() == "kmo-writer" for t in tasks.iterdir()):
            assert time.monotonic() < deadline, "no disk writer thread"
            time.sleep(0.01)
        nices = {int(t.name): _thread_nice(int(t.name)) for t in Path("/proc/self/task").iterdir()}
        names = {int(t.name): (t / "comm").read_text().strip()
                 for t in Path("/proc/self/task").iterdir()}  # fmt: skip
    finally:
        copier.close()
    assert copier.priority == 0
    # root holds CAP_SYS_NICE: refused all the same, the error names the likely cause
    assert copier.priority_error == (
        "SCHED_FIFO 1: Operation not permitted despite CAP_SYS_NICE: a cgroup without a "
        "real-time budget (cpu.rt_runtime_us)"
    )
    assert copier.nice == native.FALLBACK_NICE
    # the kernel's view: the copier's threads at -20 (it and its disk writer, which
    # inherits it), this one as it was
    assert sorted(names[t] for t, n in nices.items() if n == native.FALLBACK_NICE) == [
        "kmo-copier",
        "kmo-writer",
    ]
    assert nices[threading.get_native_id()] == mine != native.FALLBACK_NICE


#: effective sets as /proc/<pid>/status writes them: CAP_SYS_NICE is bit 23
WITH_SYS_NICE = 1 << 23 | 1 << 38 | 1 << 39  # and CAP_PERFMON, CAP_BPF
WITHOUT_SYS_NICE = 1 << 38 | 1 << 39


def _soft_limits(monkeypatch: pytest.MonkeyPatch, rtprio: int, nice: int) -> None:
    """resource.getrlimit answers these soft RLIMIT_RTPRIO and RLIMIT_NICE for the
    test: raising a hard limit to set them takes CAP_SYS_RESOURCE, which a container's
    root may lack (both hard limits are 0 by default)."""
    real = resource.getrlimit
    limits = {resource.RLIMIT_RTPRIO: rtprio, resource.RLIMIT_NICE: nice}

    def getrlimit(which: int) -> tuple[int, int]:
        return (limits[which], limits[which]) if which in limits else real(which)

    monkeypatch.setattr(resource, "getrlimit", getrlimit)


def test_expected_priority_is_the_capability_where_it_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CAP_SYS_NICE grants SCHED_FIFO though neither rlimit would
    _soft_limits(monkeypatch, rtprio=0, nice=0)
    got = native.expected_priority(3, WITH_SYS_NICE)
    assert got == native.Priority(asked=3, kind="real-time", level=3, grant="CAP_SYS_NICE")
    assert str(got) == "SCHED_FIFO 3 (CAP_SYS_NICE)"
    # no priority asked: nothing to grant
    assert native.expected_priority(0, WITH_SYS_NICE) == native.Priority(0, "normal", 0)
    assert str(native.expected_priority(0)) == "normal priority (copier_priority 0)"


def test_expected_priority_without_the_capability_follows_rlimit_rtprio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # no CAP_SYS_NICE: an RLIMIT_RTPRIO at or above the priority grants it, below does not
    _soft_limits(monkeypatch, rtprio=5, nice=0)
    at, above = (native.expected_priority(p, WITHOUT_SYS_NICE) for p in (5, 6))
    assert at == native.Priority(5, "real-time", 5, grant="RLIMIT_RTPRIO 5")
    assert str(at) == "SCHED_FIFO 5 (RLIMIT_RTPRIO 5)"
    assert above == native.Priority(6, "normal", 0)
    _soft_limits(monkeypatch, rtprio=resource.RLIM_INFINITY, nice=0)
    unlimited = native.expected_priority(99, WITHOUT_SYS_NICE)
    assert unlimited == native.Priority(
        99, "real-time", 99, f"RLIMIT_RTPRIO {resource.RLIM_INFINITY}"
    )


def test_expected_priority_without_either_is_what_rlimit_nice_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # neither grants SCHED_FIFO: RLIMIT_NICE 40 allows nice -20 (20 - 40), 39 does not
    _soft_limits(monkeypatch, rtprio=0, nice=40)
    niced = native.expected_priority(1, WITHOUT_SYS_NICE)
    assert niced == native.Priority(1, "nice", -20, grant="RLIMIT_NICE 40")
    assert str(niced) == "nice -20, not real-time (no CAP_SYS_NICE; RLIMIT_NICE 40)"
    _soft_limits(monkeypatch, rtprio=0, nice=39)
    assert native.expected_priority(1, WITHOUT_SYS_NICE) == native.Priority(1, "normal", 0)


def test_expected_priority_with_neither_is_normal_as_this_process_limits_say() -> None:
    """This process's own soft limits lowered to 0 (always allowed), read back by
    resource.getrlimit: without CAP_SYS_NICE the copier gets normal priority."""
    saved = {w: resource.getrlimit(w) for w in (resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE)}
    try:
        for which, (_, hard) in saved.items():
            resource.setrlimit(which, (0, hard))
        assert [resource.getrlimit(w)[0] for w in saved] == [0, 0]
        plain = native.expected_priority(1, WITHOUT_SYS_NICE)
    finally:
        for which, limits in saved.items():
            resource.setrlimit(which, limits)
    assert plain == native.Priority(1, "normal", 0)
    assert str(plain) == "normal priority: SCHED_FIFO and a lower nice need CAP_SYS_NICE"


def test_a_refusal_despite_rlimit_rtprio_names_the_rlimit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CAP_SYS_NICE, RLIMIT_RTPRIO grants SCHED_FIFO and the kernel refuses it
    all the same (a cgroup without a real-time budget): the probe says what the
    prediction expected to grant it."""
    from kernmlops.host import capabilities

    def refused(*_: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(native.os, "sched_setscheduler", refused)
    # this process as if without CAP_SYS_NICE (bit 23)
    monkeypatch.setattr(capabilities, "effective", lambda: WITH_SYS_NICE & ~(1 << 23))
    _soft_limits(monkeypatch, rtprio=5, nice=0)
    got = native.probed_priority(1)  # tried in a thread of its own: this one keeps its nice
    why = ("SCHED_FIFO 1: Operation not permitted despite RLIMIT_RTPRIO 5: a cgroup "
           "without a real-time budget (cpu.rt_runtime_us)")  # fmt: skip
    assert got.refusal == why and got.grant is None
    # the lower nice is the kernel's to give: root's real CAP_SYS_NICE does
    if os.geteuid() == 0:
        assert (got.kind, got.level) == ("nice", native.FALLBACK_NICE)
        assert str(got) == f"nice -20, not real-time ({why})"


def test_priority_notes_say_what_the_copier_got() -> None:
    granted = {"native": True, "priority": 1}
    niced = {"native": True, "priority": 0, "error": "SCHED_FIFO 1: denied", "nice": -20}
    plain = {"native": True, "priority": 0, "error": "SCHED_FIFO 1: denied"}
    assert native.priority_notes([granted, {}]) == []
    assert native.priority_notes([niced]) == [
        "the ring copier runs at nice -20, not real-time (SCHED_FIFO 1: denied)"
    ]
    assert native.priority_notes([plain]) == [
        "the ring copier runs at normal priority (SCHED_FIFO 1: denied): a storm may keep "
        "it off the CPU and the rings overflow"
    ]


def test_rings_of_two_groups_each_with_its_copier_fill_one_spool(tmp_path: Path) -> None:
    """Ring groups: two rings, each moved by a copier of its own, write into one
    spool's segments (the first ring's). Every record arrives once and each ring's
    keep their order, past the memory budget too: whichever copier finds it spent
    takes the spool on to its disk standby, and the other follows it there."""
    rings = [_mapped(1 << 14), _mapped(1 << 14)]
    stride = record_stride(EVENT.itemsize)
    memory = SpoolMemory(tmp_path / "mem", limit=500 * stride)
    memory.folder.mkdir(parents=True)
    spool = RingSpool(tmp_path / "spool", "events", EVENT.itemsize, {"ring": "events"},
                      memory=memory)  # fmt: skip
    # one budget for both (the collection's)
    copiers = [Copier(interval_ms=10, budget=memory.budget, frame_raw=FRAME_RAW,
                      sync_bytes=8 << 20) for _ in rings]  # fmt: skip
    copied = [c.add("events", r.fd, r.size, wakes=False)
              for c, r in zip(copiers, rings, strict=True)]  # fmt: skip
    spool.attach(copiers[0], copied[0], [(copiers[1], copied[1])])
    want = [events(900), events(900, first=10_000)]
    try:
        for i in range(0, 900, 150):
            for c, r, w in zip(copiers, rings, want, strict=True):
                _fill_and_copy(r, c, w[i : i + 150])
        spool.take(None)  # type: ignore[arg-type]  # looks at what the copiers did
        got = _read_all(spool)
        assert copied[1].copied == 900 * stride and copied[0].copied == 900 * stride
    finally:
        for c in copiers:
            c.stop()
        spool.detach()
        for c in copiers:
            c.close()
        spool.close()
        for r in rings:
            os.close(r.fd)
    assert len(got) == 1800
    for w in want:  # each ring's records, once, in their order
        assert np.array_equal(got[np.isin(got["pid"], w["pid"])], w)
    assert list((tmp_path / "mem").glob("events.*.ring"))  # the budget's, then disk
    disk = [p for p in (tmp_path / "spool").glob("events.*.ring") if p.stat().st_size]
    assert disk and all(segment_codec(p) is not None for p in disk)


def _full_ring(size: int) -> tuple[MappedRing, int]:
    """A ring of ``size`` full of EVENT records (written at once, not one by one), and
    where its producer stands."""
    ring = _mapped(size)
    slot = np.dtype([("len", "<u4"), ("pg_off", "<u4"), ("body", EVENT)])  # header, body
    stride = record_stride(EVENT.itemsize)
    assert slot.itemsize == stride
    n = size // stride - 1
    recs = np.zeros(n, slot)
    recs["len"] = EVENT.itemsize
    body = events(n)
    body["kind"] = np.random.default_rng(2).integers(0, 1 << 20, n)  # for zstd to work on
    recs["body"] = body
    data = np.zeros(size, np.uint8)
    data[: n * stride] = recs.view(np.uint8)
    ring.prod = n * stride
    os.pwrite(ring.fd, np.uint64(ring.prod).tobytes(), ring.page)
    os.pwrite(ring.fd, np.concatenate([data, data]).tobytes(), 2 * ring.page)
    return ring, ring.prod


def test_the_copier_threads_cpu_time_is_read_when_asked_not_as_of_its_last_pass(
    tmp_path: Path,
) -> None:
    """cpu_s while the thread runs is its CPU time at that moment, as the kernel counts
    it (/proc's schedstat, read just before and after): not the count the thread keeps
    after each pass, which leaves out all of a long pass while it runs and what the
    thread did since (a copier's share of a second, status.copier.busy_peak, took a
    pass that ended in one window but began in the one before: above 1 under a storm).
    Here the thread starts, waits, then compresses a full 32-MiB ring in one pass."""
    ring, prod = _full_ring(32 << 20)
    copier = _copier(interval_ms=50)
    out = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    samples: list[tuple[float, float, float]] = []
    try:
        if not copier.compresses:
            skip_here("libzstd is missing")
        seg = copier.segment(out, zstd=True, memory=False)
        copier.rotate(copier.add("events", ring.fd, ring.size, wakes=False), seg)
        copier.start()
        assert copier._thread is not None
        schedstat = Path(f"/proc/self/task/{copier._thread.native_id}/schedstat")

        def ran_s() -> float:
            return int(schedstat.read_text().split()[0]) / 1e9

        while ring.consumer() != prod or len(samples) < 10:
            samples.append((ran_s(), copier.cpu_s, ran_s()))
        copier.stop()
        final = copier.cpu_s
    finally:
        copier.close()
        os.close(out)
        os.close(ring.fd)
    # the kernel's count of a running thread is brought up to date at each tick: up
    # to one behind the thread's own clock (HZ 100 at the least)
    tick = 0.01
    wrong = [s for s in samples if not s[0] <= s[1] <= s[2] + tick]
    assert not wrong, (len(wrong), len(samples), wrong[:3])
    assert samples[-1][1] <= final  # the count it kept after its last copy: final
    # the pass was long enough to be seen while it ran (its CPU between two samples)
    assert final - samples[0][1] > 0.02, (samples[0], final)


def test_the_copier_holds_its_buffers_and_its_zstd_context_from_its_start(
    tmp_path: Path,
) -> None:
    # An allocation after the start would take the process's mmap lock, which a
    # collector thread a storm keeps off the CPU may hold: every buffer a frame needs
    # is made (and its pages touched) before the first copy, and zstd compresses in
    # memory the copier holds (ZSTD_initStaticCCtx) where libzstd exports it.
    z = native.zstd()
    assert z is not None
    ring = _mapped(1 << 16)
    want = events(5000)
    with spool_on(ring, tmp_path, budget_records=0, shuffle=24, start=True) as (spool, copier):
        r = copier.rings[0].ring
        z.ZSTD_compressBound.restype = ctypes.c_size_t
        assert r.packed_cap >= z.ZSTD_compressBound(FRAME_RAW) + 8
        assert r.shuffled_cap >= FRAME_RAW and r.line_cap >= 64 << 10
        assert copier.static_zstd == hasattr(z, "ZSTD_initStaticCCtx")
        packed = r.packed
        for i in range(0, len(want), 1000):
            ring.cons = ring.consumer()
            ring.write_records(want[i : i + 1000])
            ring.sync()
            deadline = time.monotonic() + 30
            while ring.consumer() != ring.prod:
                assert time.monotonic() < deadline, "the copier"
                time.sleep(0.005)
        assert r.packed == packed  # never made again
        copier.stop()
        spool.detach()
        assert np.array_equal(_read_all(spool), want)  # the static context's frames read back
