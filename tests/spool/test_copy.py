"""The ring copy (RingSpool), on rings laid out like the kernel's (no BPF): what goes
in comes back in order, segments are retired only once their rows are in finished
parts, the first bytes go to memory and a disk that stalls is bridged there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf.ringbuf import RingBuffer
from kernmlops.spool.copy import RingSpool
from kernmlops.spool.frames import RAW_FRAME, VERSION
from kernmlops.spool.recovery import pending_spools
from tests.ebpf.test_ringbuf import EVENT, MappedRing, events


def _spool(folder: Path) -> RingSpool:
    info = {"hook": "h", "options": {}, "ring": "r", "object": "x.bpf.o"}
    return RingSpool(folder / ".spool", "events", EVENT.itemsize, info)


def _read_all(spool: RingSpool) -> np.ndarray:
    parts = list(spool.records(EVENT))
    return np.concatenate(parts) if parts else np.empty(0, EVENT)


def test_what_the_ring_held_comes_back_in_order_then_what_the_cpus_held(
    tmp_path: Path,
) -> None:
    ring = MappedRing(4096, start=4096 - 48)  # the copy wraps the end of the ring
    want = events(100)
    reader = RingBuffer(ring.fd, 4096)
    spool = _spool(tmp_path)
    spool._frame_raw = 7 * 24  # small frames: a copy is cut in several
    try:
        for lo, hi in ((0, 60), (60, 90)):
            ring.write_records(want[lo:hi])
            ring.sync()
            assert spool.take(reader) == (hi - lo) * 24
            ring.cons = ring.consumer()
        spool.append(want[90:])  # as if left in a CPU's batch at detach
        assert spool.pending == 100 * 24
        # read back a frame at a time: whole records each time, nothing twice
        parts = list(spool.records(EVENT))
        got = np.concatenate(parts)
    finally:
        reader.close()
        spool.close()
    assert np.array_equal(got, want)
    assert len(parts) >= 15 and all(len(p) <= 7 for p in parts)
    assert spool.pending == 0
    meta = json.loads((tmp_path / ".spool" / "events.json").read_text())
    assert meta["itemsize"] == EVENT.itemsize and meta["hook"] == "h"


def test_a_segment_read_to_its_end_is_retired_at_a_flush_and_deleted_once_finished(
    tmp_path: Path,
) -> None:
    spool = _spool(tmp_path)
    spool.append(events(10))
    assert len(_read_all(spool)) == 10
    spool.count("events", 10)
    spool.checkpoint({"events": 0})  # read to its end: a new segment starts
    files = sorted(p.name for p in (tmp_path / ".spool").iterdir())
    assert files == [
        "events.00000.json", "events.00000.ring", "events.00001.json", "events.00001.ring",
        "events.json",
    ]  # fmt: skip
    # the new segment knows the rows before it (what a recovery skips)
    before = json.loads((tmp_path / ".spool" / "events.00001.json").read_text())
    assert before["rows_before"] == {"events": 10}
    spool.append(events(5, first=10))
    spool.checkpoint({"events": 9})  # not yet in finished parts: kept, and not retired
    spool.drained()
    assert (tmp_path / ".spool" / "events.00000.ring").exists()
    assert (tmp_path / ".spool" / "events.00001.ring").exists()
    spool.checkpoint({"events": 10})
    spool.drained()  # the writer deletes it (an unlink may wait for the disk)
    assert not (tmp_path / ".spool" / "events.00000.ring").exists()
    assert [p.name for p in pending_spools(tmp_path)] == ["events.00001.ring"]
    assert np.array_equal(_read_all(spool), events(5, first=10))
    spool.remove()
    assert sorted((tmp_path / ".spool").iterdir()) == []


def test_a_retired_segment_says_so_before_its_file_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A kill between the two deletions leaves the json alone: it must say the segment
    # was retired (its rows are in finished parts), or recover would name it lost.
    spool = _spool(tmp_path)
    spool.append(events(10))
    spool.drained()
    spool.checkpoint({})  # the flush notes its size: what a deleted file would lose
    seg = tmp_path / ".spool" / "events.00000.json"
    assert json.loads(seg.read_text())["bytes"] > 0
    assert json.loads(seg.read_text())["retired"] is False
    assert len(_read_all(spool)) == 10
    spool.count("events", 10)
    real = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda p, **kw: None if p == seg else real(p, **kw))
    spool.checkpoint({"events": 10})  # retired, and its rows finished: deleted
    spool.drained()
    assert not seg.with_suffix(".ring").exists()
    assert json.loads(seg.read_text())["retired"] is True
    assert [p.name for p in pending_spools(tmp_path)] == ["events.00001.ring"]
    monkeypatch.undo()
    spool.remove()


def test_the_active_segments_file_deleted_after_a_flush_is_still_pending(
    tmp_path: Path,
) -> None:
    # Its json stays, never marked retired, and says what a flush found in it:
    # recover must see it (and name it lost), not take the spool for clean.
    spool = _spool(tmp_path)
    spool.append(events(10))
    spool.drained()
    spool.checkpoint({})
    spool.close()
    seg = tmp_path / ".spool" / "events.00000.ring"
    seg.unlink()
    assert pending_spools(tmp_path) == [seg]
    # a spool of before the mark: its json alone is no loss (as before)
    meta = json.loads(seg.with_suffix(".json").read_text())
    del meta["retired"]
    seg.with_suffix(".json").write_text(json.dumps(meta))
    assert pending_spools(tmp_path) == []


def test_the_spool_is_synced_at_each_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    spool = _spool(tmp_path)
    spool.append(events(3))
    spool.checkpoint({})
    spool.wait_synced()  # in a thread: the poll loop goes on copying rings
    assert synced
    spool.close()


def test_the_first_bytes_go_to_memory_the_rest_to_disk_in_order(tmp_path: Path) -> None:
    from kernmlops.spool.memory import SpoolMemory

    mem = tmp_path / "shm"  # stands for the tmpfs folder
    mem.mkdir()
    memory = SpoolMemory(mem, limit=50 * 24)  # 50 records
    info = {"hook": "h", "options": {}, "ring": "r", "object": "x.bpf.o"}
    spool = RingSpool(tmp_path / ".spool", "events", EVENT.itemsize, info, memory=memory)
    want = events(120)
    spool.append(want[:40])  # fits the budget
    spool.append(want[40:80])  # does not: a segment on disk begins
    spool.append(want[80:])
    spool.drained()
    assert [p.name for p in mem.glob("*.ring")] == ["events.00000.ring"]
    assert [p.name for p in (tmp_path / ".spool").glob("*.ring")] == ["events.00001.ring"]
    frame = RAW_FRAME.size + 40 * 24  # the budget counts the frame's header too
    assert (mem / "events.00000.ring").stat().st_size == frame
    assert memory.used == frame
    got = _read_all(spool)
    assert np.array_equal(got, want)
    spool.count("events", 120)
    spool.checkpoint({"events": 120})  # both read to their end: deleted, budget back
    spool.drained()
    assert memory.used == 0
    assert not (mem / "events.00000.ring").exists()
    assert not (tmp_path / ".spool" / "events.00001.ring").exists()
    # the next segment is in memory again
    spool.append(events(3, first=120))
    spool.drained()
    assert [p.name for p in mem.glob("*.ring")] == ["events.00002.ring"]
    assert memory.used == RAW_FRAME.size + 3 * 24
    spool.remove()
    assert memory.used == 0


def test_a_disk_that_stalls_is_bridged_in_memory_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first-fill may use the budget but its share for stalls; once on disk, a
    # writer held by the disk makes the queue pass STALL_QUEUED: the next bytes go to
    # a segment in memory (written by the loop, not queued), the disk gets the rest
    # again once the queue is down to half, and every record comes back in order.
    import threading

    from kernmlops.spool import copy as spool_mod
    from kernmlops.spool import segment as segment_mod
    from kernmlops.spool.memory import SpoolMemory

    rec = EVENT.itemsize + 8  # a record in the ring, header included
    frame = RAW_FRAME.size + 10 * rec  # an append of 10 records, in memory
    monkeypatch.setattr(spool_mod, "STALL_QUEUED", 20 * rec)
    monkeypatch.setattr(spool_mod, "WRITE_BATCH", 10 * rec)
    disk = threading.Event()
    batches: list[int] = []
    real_write_all = segment_mod.write_all

    real_runs = spool_mod._runs

    def write_all(fd: int, data: bytes) -> int:
        if threading.current_thread().name.startswith("spool-"):
            disk.wait(60)  # the disk stalls until the test lets it go
        return real_write_all(fd, data)

    def runs(chunks: list) -> object:  # what the writer took at once
        batches.append(sum(len(c) for _, c in chunks))
        return real_runs(chunks)

    monkeypatch.setattr(segment_mod, "write_all", write_all)
    monkeypatch.setattr(spool_mod, "_runs", runs)
    mem = tmp_path / "shm"
    mem.mkdir()
    memory = SpoolMemory(mem, limit=10 * frame, for_stalls=4 * frame)
    info = {"hook": "h", "options": {}, "ring": "r", "object": "x.bpf.o"}
    spool = RingSpool(tmp_path / ".spool", "events", EVENT.itemsize, info, memory=memory)
    want = events(200)
    for lo in range(0, 70, 10):  # 60 fit the first-fill's 60 records, 10 go to disk
        spool.append(want[lo : lo + 10])
    assert memory.used == 6 * frame
    for lo in range(70, 120, 10):  # the disk is stalled: 20 records queue, then memory
        spool.append(want[lo : lo + 10])
    assert spool._queued == 20 * rec
    assert memory.used == (6 + 4) * frame  # the stall's segment: its share, all of it
    disk.set()
    spool.drained()
    for lo in range(120, 200, 10):  # caught up: on to disk again
        spool.append(want[lo : lo + 10])
    spool.drained()
    assert memory.used == 10 * frame
    names = {p.name: p.parent.name for p in [*mem.glob("*.ring"), *tmp_path.glob(".spool/*.ring")]}
    assert names == {
        "events.00000.ring": "shm", "events.00001.ring": ".spool",
        "events.00002.ring": "shm", "events.00003.ring": ".spool",
    }  # fmt: skip
    assert sum(batches) == 100 * rec and max(batches) == 10 * rec  # a batch at a time
    got = _read_all(spool)
    assert np.array_equal(got, want)
    spool.remove()
    assert memory.used == 0


def test_a_disk_segment_is_compressed_in_frames_and_a_cut_frame_is_left(tmp_path: Path) -> None:
    # Once pyarrow (its zstd) is loaded, a segment on disk is a run of frames: records
    # come back the same, the file is smaller than the records, and a kill that cut
    # the last frame loses that frame only.
    import pyarrow  # noqa: F401  (the codec a collection has once its libraries are in)

    from kernmlops.spool.frames import FRAME, frames, segment_codec

    spool = _spool(tmp_path)
    want = events(3000)  # 72,000 bytes of records
    for lo in range(0, 3000, 500):
        spool.append(want[lo : lo + 500])
        spool.drained()  # one write each: one frame each
    seg = tmp_path / ".spool" / "events.00000.ring"
    meta = json.loads(seg.with_suffix(".json").read_text())
    assert meta["codec"] == "zstd" and segment_codec(seg) is not None
    data = seg.read_bytes()
    assert len(data) < 3000 * 24 // 2
    got = _read_all(spool)
    spool.close()
    assert np.array_equal(got, want)
    # the same bytes as recover reads them: whole frames, then one cut short
    pieces = list(frames(data, segment_codec(seg)))
    raw = np.frombuffer(b"".join(pieces), np.uint8)
    assert np.array_equal(decode_all(raw), want)
    size, _ = FRAME.unpack_from(data, 0)
    first = FRAME.size + size
    assert len(pieces) == 6 and first < len(data)
    cut = list(frames(data[: len(data) - 1], segment_codec(seg)))
    assert len(cut) == len(pieces) - 1 and cut == pieces[:-1]


def decode_all(raw: np.ndarray) -> np.ndarray:
    from kernmlops.ebpf.ringbuf import decode

    return decode(raw, 1, 0, len(raw), EVENT).records


def test_a_segment_opened_before_the_last_is_read_learns_its_rows_when_read(
    tmp_path: Path,
) -> None:
    # The budget ran out while the memory segment still held unread records: the disk
    # segment cannot know the rows made before it, and says so (null) until the
    # reading reaches it (recover then counts on from the segment before it). A
    # count taken when it was opened would make recover skip rows it never wrote.
    from kernmlops.spool.memory import SpoolMemory

    mem = tmp_path / "shm"
    mem.mkdir()
    spool = RingSpool(tmp_path / ".spool", "events", EVENT.itemsize, {},
                      memory=SpoolMemory(mem, limit=50 * 24))  # fmt: skip
    spool.append(events(40))
    spool.append(events(40, first=40))  # past the budget, with 40 records unread
    spool.drained()
    meta = tmp_path / ".spool" / "events.00001.json"
    assert json.loads(meta.read_text())["rows_before"] is None
    for records in spool.records(EVENT):  # counted as a hook counts
        spool.count("events", len(records))
    assert json.loads(meta.read_text())["rows_before"] == {"events": 40}
    assert json.loads((mem / "events.00000.json").read_text())["rows_before"] == {}
    spool.remove()


def test_segment_files_are_private_and_never_opened_through_a_link(tmp_path: Path) -> None:
    spool = RingSpool(tmp_path / ".spool", "events", EVENT.itemsize, {})
    first = tmp_path / ".spool" / "events.00000.ring"
    assert first.stat().st_mode & 0o777 == 0o600
    target = tmp_path / "root-file"
    target.write_text("keep")
    (tmp_path / ".spool" / "events.00001.ring").symlink_to(target)  # planted
    with pytest.raises(FileExistsError):
        spool._open_segment()
    assert target.read_text() == "keep"
    spool.remove()


def test_the_python_copy_writes_the_frames_the_copier_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bpf_build_dir: Path
) -> None:
    # Where the native library is missing, the spool's own writes (memory segments,
    # raw disk segments before pyarrow) are the same CRC32C frames, numpy's CRC in
    # them; the library's CRC reads them back.
    from kernmlops.ebpf import crc32c as crc_mod
    from kernmlops.spool.frames import iter_raw_frames
    from kernmlops.spool.memory import SpoolMemory

    want = events(3000)
    written = []
    for name, native in (("numpy", False), ("native", True)):
        if not native:
            monkeypatch.setattr(crc_mod, "_native", lambda: None)
        else:
            monkeypatch.undo()
        mem = tmp_path / name
        mem.mkdir()
        spool = RingSpool(tmp_path / f"{name}-spool", "events", EVENT.itemsize, {},
                          memory=SpoolMemory(mem, limit=1 << 20))  # fmt: skip
        spool._frame_raw = 1000 * 24  # three frames
        spool.append(want)
        spool.drained()
        data = (mem / "events.00000.ring").read_bytes()
        written.append(data)
        spool.close()
    assert crc_mod._native() is not None  # read with the library's CRC
    assert written[0] == written[1]
    found = list(iter_raw_frames(written[0]))
    assert [(f.reason, len(f.raw or b"")) for f in found] == [(None, 1000 * 24)] * 3
    raw = np.frombuffer(b"".join(f.raw or b"" for f in found), np.uint8)
    assert np.array_equal(decode_all(raw), want)
    meta = json.loads((tmp_path / "numpy" / "events.00000.json").read_text())
    assert meta["version"] == VERSION and "codec" not in meta


def test_a_damaged_frame_met_during_the_run_is_named_never_made_into_rows(
    tmp_path: Path,
) -> None:
    # The collection ends with the frame named (its records never become rows), and
    # the spool stays: recover makes the rows of every other frame.
    from kernmlops.errors import CollectionError
    from kernmlops.spool.memory import SpoolMemory

    mem = tmp_path / "shm"
    mem.mkdir()
    spool = RingSpool(tmp_path / ".spool", "events", EVENT.itemsize, {},
                      memory=SpoolMemory(mem, limit=1 << 20))  # fmt: skip
    spool.append(events(10))
    spool.append(events(20, first=10))  # a second frame, at byte 16 + 240
    seg = mem / "events.00000.ring"
    data = bytearray(seg.read_bytes())
    data[RAW_FRAME.size + 240 + RAW_FRAME.size + 100] ^= 0x10
    seg.write_bytes(bytes(data))
    got = []
    with pytest.raises(CollectionError) as caught:
        for records in spool.records(EVENT):
            got.append(records)
    assert str(caught.value).startswith(
        f"spool {seg}: the frame at byte 256 (480 bytes, 20 records) fails its CRC32C: "
        "its records are not made; the spool is kept"
    )
    assert np.array_equal(np.concatenate(got), events(10))
    assert spool.pending == 20 * 24  # not read: never retired
    spool.close()
    assert seg.exists()
