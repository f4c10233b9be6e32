"""Ring-buffer decoding on synthetic rings laid out like the kernel's.

FakeRing mimics kernel/bpf/ringbuf.c: positions grow without bound, a record
lives at ``pos & (size - 1)``, the data area is mapped twice in a row (so
``data[i] == data[i + size]``), each record has an 8-byte header (u32 length
with busy bit 31 and discard bit 30, u32 page offset) and is 8-byte aligned.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from kernmlops.ebpf.btf import RecordLayout
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.frames import empty_frame, records_to_frame
from kernmlops.ebpf.ringbuf import (
    BUSY_BIT,
    DISCARD_BIT,
    HEADER_SIZE,
    decode,
    record_stride,
)
from kernmlops.ebpf.spec import ring_layouts

EVENT = np.dtype([("ts", "<u8"), ("pid", "<u4"), ("kind", "<u4")])  # 16 bytes: stride 24
ODD = np.dtype([("a", "<u8"), ("b", "<u8"), ("c", "<u4")])  # 20 bytes: stride 32


class FakeRing:
    """Producer side of a BPF ring buffer, writing into a double-mapped array."""

    def __init__(self, size: int, start: int = 0) -> None:
        assert size & (size - 1) == 0 and start % 8 == 0
        self.size = size
        self.ring = np.zeros(size, np.uint8)
        self.cons = self.prod = start
        self.rng = np.random.default_rng(1)

    @property
    def data(self) -> np.ndarray:
        """The data area as user space maps it: twice in a row."""
        data = np.concatenate([self.ring, self.ring])
        assert np.array_equal(data[: self.size], data[self.size :])
        return data

    def _put(self, pos: int, raw: bytes) -> None:
        idx = (pos + np.arange(len(raw))) & (self.size - 1)
        self.ring[idx] = np.frombuffer(raw, np.uint8)

    def write(
        self, body: bytes, *, busy: bool = False, discard: bool = False, length: int | None = None
    ) -> int:
        """Append one record; return its position."""
        pos = self.prod
        length = len(body) if length is None else length
        word = length | (BUSY_BIT if busy else 0) | (DISCARD_BIT if discard else 0)
        pg_off = int(self.rng.integers(0, 2**32))  # never interpreted by the reader
        stride = record_stride(len(body))
        padding = bytes([0xEE]) * (stride - HEADER_SIZE - len(body))
        raw = word.to_bytes(4, "little") + pg_off.to_bytes(4, "little") + body + padding
        assert self.prod + stride - self.cons <= self.size, "ring full"
        self._put(pos, raw)
        self.prod += stride
        return pos

    def write_records(self, records: np.ndarray, **flags) -> list[int]:
        return [self.write(r.tobytes(), **flags) for r in np.atleast_1d(records)]

    def commit(self, pos: int) -> None:
        """Clear the busy bit of the record at ``pos`` (bpf_ringbuf_submit)."""
        idx = (pos + np.arange(4)) & (self.size - 1)
        word = int(self.ring[idx].view("<u4")[0]) & ~BUSY_BIT
        self._put(pos, word.to_bytes(4, "little"))

    def decode(self, dtype: np.dtype = EVENT, max_records: int | None = None):
        batch = decode(self.data, self.size, self.cons, self.prod, dtype, max_records)
        self.cons = batch.consumed
        return batch


def events(n: int, first: int = 0) -> np.ndarray:
    rec = np.zeros(n, EVENT)
    rec["ts"] = 1_000_000_000_000 + np.arange(first, first + n) * 7
    rec["pid"] = 100 + np.arange(first, first + n)
    rec["kind"] = np.arange(first, first + n) % 3
    return rec


# --- record_stride ------------------------------------------------------------
@pytest.mark.parametrize(
    ("itemsize", "stride"),
    [(0, 8), (1, 16), (8, 16), (9, 24), (16, 24), (20, 32), (24, 32), (40, 48), (96, 104)],
)
def test_record_stride(itemsize, stride):
    assert record_stride(itemsize) == stride


# --- decode -------------------------------------------------------------------
def test_empty_ring():
    ring = FakeRing(4096, start=4096 * 5 + 64)
    batch = ring.decode()
    assert batch.records.dtype == EVENT
    assert batch.records.shape == (0,)
    assert batch.consumed == 4096 * 5 + 64
    assert batch.discarded == 0


def test_producer_behind_consumer_is_empty():
    ring = FakeRing(4096)
    batch = decode(ring.data, ring.size, 96, 48, EVENT)
    assert len(batch.records) == 0
    assert batch.consumed == 96


def test_one_record_is_a_copy():
    ring = FakeRing(4096)
    want = events(1)
    ring.write_records(want)
    data = ring.data
    batch = decode(data, ring.size, ring.cons, ring.prod, EVENT)
    assert batch.records.dtype == EVENT
    assert batch.records.tolist() == want.tolist()
    assert batch.consumed == 24
    assert batch.discarded == 0
    assert not np.shares_memory(batch.records, data)
    data[:] = 0xFF  # the kernel reuses the space once the consumer moved on
    assert batch.records.tolist() == want.tolist()


def test_many_records_in_order_and_copied():
    ring = FakeRing(1 << 16)
    want = events(500)
    ring.write_records(want)
    data = ring.data
    batch = decode(data, ring.size, ring.cons, ring.prod, EVENT)
    assert batch.records.shape == (500,)
    assert np.array_equal(batch.records, want)
    assert batch.consumed == 500 * 24
    assert not np.shares_memory(batch.records, data)
    data[:] = 0
    assert np.array_equal(batch.records, want)


def test_batch_wraps_around_the_end():
    size = 256
    start = (1 << 40) + 3 * size + 200  # large positions: no 32-bit truncation
    ring = FakeRing(size, start=start)
    want = events(8)
    ring.write_records(want)  # 200..392: crosses the end of the data area
    assert (start & (size - 1)) + 8 * 24 > size
    batch = ring.decode()
    assert np.array_equal(batch.records, want)
    assert batch.consumed == start + 8 * 24
    # the next batch starts after the wrap
    more = events(5, first=8)
    ring.write_records(more)
    batch = ring.decode()
    assert np.array_equal(batch.records, more)
    assert ring.cons == ring.prod == start + 13 * 24


def test_ring_filled_to_capacity_from_the_middle():
    size = 256
    ring = FakeRing(size, start=128)
    want = np.zeros(8, ODD)  # stride 32: 8 records fill the ring exactly
    want["a"] = np.arange(8)
    want["b"] = np.uint64(2**63) + np.arange(8, dtype=np.uint64)
    want["c"] = 0xFFFFFFFF - np.arange(8)
    ring.write_records(want)
    assert ring.prod - ring.cons == size
    batch = ring.decode(ODD)
    assert np.array_equal(batch.records, want)
    assert batch.consumed == 128 + size


def test_busy_record_stops_the_batch():
    ring = FakeRing(4096, start=64)
    want = events(5)
    positions = [
        ring.write(want[0].tobytes()),
        ring.write(want[1].tobytes()),
        ring.write(want[2].tobytes(), busy=True),  # reserved, not submitted yet
        ring.write(want[3].tobytes()),
        ring.write(want[4].tobytes()),
    ]
    batch = ring.decode()
    assert np.array_equal(batch.records, want[:2])
    assert batch.consumed == positions[2] == 64 + 2 * 24
    assert batch.discarded == 0
    # still busy: nothing more, the consumer stays put
    batch = ring.decode()
    assert len(batch.records) == 0
    assert batch.consumed == positions[2]
    ring.commit(positions[2])
    batch = ring.decode()
    assert np.array_equal(batch.records, want[2:])
    assert batch.consumed == ring.prod == 64 + 5 * 24


def test_busy_first_record_returns_nothing():
    ring = FakeRing(4096)
    pos = ring.write(events(1).tobytes(), busy=True)
    ring.write_records(events(2, first=1))
    batch = ring.decode()
    assert len(batch.records) == 0
    assert batch.consumed == pos == 0


def test_discarded_records_are_skipped_consumed_and_counted():
    ring = FakeRing(4096)
    want = events(6)
    for i, rec in enumerate(want):
        ring.write(rec.tobytes(), discard=i in (1, 2, 5))
    batch = ring.decode()
    assert np.array_equal(batch.records, want[[0, 3, 4]])
    assert batch.discarded == 3
    assert batch.consumed == 6 * 24


def test_all_discarded():
    ring = FakeRing(4096)
    ring.write_records(events(4), discard=True)
    batch = ring.decode()
    assert len(batch.records) == 0
    assert batch.records.dtype == EVENT
    assert batch.discarded == 4
    assert batch.consumed == 4 * 24


def test_discarded_then_busy():
    ring = FakeRing(4096)
    want = events(4)
    ring.write(want[0].tobytes(), discard=True)
    ring.write(want[1].tobytes())
    busy = ring.write(want[2].tobytes(), busy=True)
    ring.write(want[3].tobytes(), discard=True)
    batch = ring.decode()
    assert np.array_equal(batch.records, want[1:2])
    assert batch.discarded == 1  # the discarded record after the busy one is not counted yet
    assert batch.consumed == busy
    ring.commit(busy)
    batch = ring.decode()
    assert np.array_equal(batch.records, want[2:3])
    assert batch.discarded == 1
    assert batch.consumed == ring.prod


def test_max_records_gives_partial_batches():
    ring = FakeRing(4096, start=4096 - 48)  # the second batch wraps
    want = events(5)
    ring.write_records(want)
    sizes = []
    got = []
    while True:
        batch = ring.decode(max_records=2)
        if not len(batch.records):
            break
        sizes.append(len(batch.records))
        got.append(batch.records)
    assert sizes == [2, 2, 1]
    assert np.array_equal(np.concatenate(got), want)
    assert ring.cons == ring.prod


def test_max_records_counts_discarded_records_of_its_batch_only():
    ring = FakeRing(4096)
    want = events(4)
    for i, rec in enumerate(want):
        ring.write(rec.tobytes(), discard=i in (1, 3))
    batch = ring.decode(max_records=2)
    assert np.array_equal(batch.records, want[:1])
    assert batch.discarded == 1
    assert batch.consumed == 48
    batch = ring.decode(max_records=0)
    assert len(batch.records) == 0
    assert batch.consumed == 48
    batch = ring.decode(max_records=10)
    assert np.array_equal(batch.records, want[2:3])
    assert batch.discarded == 1
    assert batch.consumed == 96


def test_record_of_wrong_length():
    ring = FakeRing(4096)
    ring.write_records(events(2))
    ring.write(events(1, first=2).tobytes(), length=12)  # same stride, other length
    with pytest.raises(ValueError, match="record of 12 bytes in a ring of 16-byte records"):
        ring.decode()


def test_avail_not_a_multiple_of_the_stride():
    ring = FakeRing(4096)
    ring.write_records(events(2))
    with pytest.raises(ValueError, match=r"ring holds 56 bytes, not a multiple of the 24-byte"):
        decode(ring.data, ring.size, 0, ring.prod + 8, EVENT)


def test_itemsize_not_a_multiple_of_eight():
    assert ODD.itemsize == 20
    ring = FakeRing(1024, start=1024 - 32)
    want = np.zeros(3, ODD)
    want["a"] = [1, 2, 3]
    want["b"] = [2**64 - 1, 0, 5]
    want["c"] = [7, 8, 9]
    ring.write_records(want)
    assert ring.prod - ring.cons == 3 * 32
    batch = ring.decode(ODD)
    assert batch.records.dtype == ODD
    assert np.array_equal(batch.records, want)
    assert batch.consumed == ring.prod


# --- records to frames --------------------------------------------------------
@pytest.fixture(scope="module")
def process_layout(bpf_build_dir) -> RecordLayout:
    return ring_layouts(object_path("process_trace", bpf_build_dir))["process_trace_rb"]


def test_ring_to_frame_with_btf_layout(process_layout):
    dtype = process_layout.dtype
    rec = np.zeros(4, dtype)
    rec["ts_uptime_us"] = [10, 20, 30, 40]
    rec["pid"] = [101, 102, 103, 104]
    rec["tgid"] = [100, 100, 103, 104]
    rec["ppid"] = [1, 1, 100, 103]
    rec["kind"] = [0, 1, 2, 99]  # 99: a value the enum does not name
    rec["comm"] = [b"bash", b"kworker/0:1H-kb", b"\xe4\xb8\xad\xe6", b"abcdefghijklmnop"]
    rec["old_pid"] = [101, 105, 103, 104]
    ring = FakeRing(4096, start=4096 - 40)
    ring.write_records(rec)
    batch = ring.decode(dtype)
    assert len(batch.records) == 4

    frame = records_to_frame(batch.records, process_layout)
    assert frame.columns == ["ts_uptime_us", "pid", "tgid", "ppid", "kind", "comm", "old_pid"]
    assert frame.schema == {
        "ts_uptime_us": pl.Int64,
        "pid": pl.UInt32,
        "tgid": pl.UInt32,
        "ppid": pl.UInt32,
        "kind": pl.String,
        "comm": pl.String,
        "old_pid": pl.UInt32,
    }
    assert frame.height == 4
    assert frame["ts_uptime_us"].to_list() == [10, 20, 30, 40]
    assert frame["pid"].to_list() == [101, 102, 103, 104]
    assert frame["tgid"].to_list() == [100, 100, 103, 104]
    assert frame["ppid"].to_list() == [1, 1, 100, 103]
    assert frame["kind"].to_list() == ["fork", "exec", "exit", None]
    assert frame["old_pid"].to_list() == [101, 105, 103, 104]
    # a comm cut inside a UTF-8 sequence decodes with a replacement character
    assert frame["comm"].to_list() == ["bash", "kworker/0:1H-kb", "中\ufffd", "abcdefghijklmnop"]


def test_frame_of_ascii_strings_only(process_layout):
    rec = np.zeros(2, process_layout.dtype)
    rec["comm"] = [b"a", b""]
    frame = records_to_frame(rec, process_layout)
    assert frame["comm"].to_list() == ["a", ""]
    assert frame["kind"].to_list() == ["fork", "fork"]


def test_comm_ends_at_first_nul(process_layout):
    rec = np.zeros(1, process_layout.dtype)
    rec["comm"] = [b"sh\x00rker/0:1"]
    frame = records_to_frame(rec, process_layout)
    assert frame["comm"].to_list() == ["sh"]


def test_empty_frame_has_the_same_schema(process_layout):
    empty = empty_frame(process_layout)
    assert empty.height == 0
    full = records_to_frame(np.zeros(1, process_layout.dtype), process_layout)
    assert empty.schema == full.schema


def test_frame_with_array_columns():
    dtype = np.dtype(
        {
            "names": ["ts", "hist", "state"],
            "formats": ["<u8", ("<u2", (4,)), "<i4"],
            "offsets": [0, 8, 16],
            "itemsize": 24,
        }
    )
    layout = RecordLayout("hist_event", dtype, {"state": {-1: "gone", 0: "idle"}}, ())
    rec = np.zeros(2, dtype)
    rec["ts"] = [5, 6]
    rec["hist"] = [[1, 2, 3, 4], [0, 0, 65535, 9]]
    rec["state"] = [-1, 0]
    ring = FakeRing(256, start=256 - 32)
    ring.write_records(rec)
    frame = records_to_frame(ring.decode(dtype).records, layout)
    assert frame.schema == {"ts": pl.UInt64, "hist": pl.Array(pl.UInt16, 4), "state": pl.String}
    assert frame.to_dicts() == [
        {"ts": 5, "hist": [1, 2, 3, 4], "state": "gone"},
        {"ts": 6, "hist": [0, 0, 65535, 9], "state": "idle"},
    ]


# --- RingBuffer on a mapped file laid out as the kernel maps a ring ---------------
class MappedRing(FakeRing):
    """A FakeRing behind a file: page 0 the consumer position, page 1 the producer
    position, then the data area twice (the kernel maps the same pages twice)."""

    def __init__(self, size: int, start: int = 0) -> None:
        import mmap
        import os

        super().__init__(size, start)
        self.page = mmap.PAGESIZE
        self.fd = os.memfd_create("kmo-test-ring")
        os.ftruncate(self.fd, 2 * self.page + 2 * size)
        self.sync()

    def sync(self) -> None:
        import os

        os.pwrite(self.fd, np.uint64(self.cons).tobytes(), 0)
        os.pwrite(self.fd, np.uint64(self.prod).tobytes(), self.page)
        os.pwrite(self.fd, self.data.tobytes(), 2 * self.page)

    def consumer(self) -> int:
        import os

        return int(np.frombuffer(os.pread(self.fd, 8, 0), "<u8")[0])


def test_spill_stops_at_a_busy_record_and_drain_decodes_spilled_first() -> None:
    from kernmlops.ebpf.ringbuf import RingBuffer

    ring = MappedRing(4096, start=4096 - 48)  # the spilled run wraps around the end
    want = events(10)
    positions = ring.write_records(want[:6])
    busy = ring.write(want[6].tobytes(), busy=True)
    ring.write_records(want[7:])
    ring.sync()
    reader = RingBuffer(ring.fd, 4096)  # no record type yet: spilling needs none
    try:
        assert reader.spill(EVENT.itemsize) == 6
        assert ring.consumer() == positions[0] + 6 * 24
        assert reader.spill(EVENT.itemsize) == 0  # still busy
        ring.cons = ring.consumer()
        ring.commit(busy)
        ring.sync()
        reader.dtype = EVENT
        got = reader.drain()
        assert np.array_equal(got, want)
        assert ring.consumer() == ring.prod
        assert reader.records == 10 and not reader.spilled
    finally:
        reader.close()


def test_drain_joins_a_batch_that_wraps_the_end_of_the_ring() -> None:
    # The data area is mapped once: a run that crosses the end comes in two pieces.
    from kernmlops.ebpf.ringbuf import RingBuffer

    ring = MappedRing(4096, start=3 * 4096 - 40)  # the 2nd record straddles the end
    want = events(50)
    ring.write_records(want)
    ring.sync()
    reader = RingBuffer(ring.fd, 4096, EVENT)
    try:
        first = reader.drain(max_records=20)
        assert np.array_equal(first, want[:20])
        assert ring.consumer() == 3 * 4096 - 40 + 20 * 24
        assert np.array_equal(reader.drain(), want[20:])
        assert ring.consumer() == ring.prod
        ring.cons = ring.prod
        more = events(5, first=50)
        ring.write_records(more)  # now wholly past the end: no join
        ring.sync()
        assert np.array_equal(reader.drain(), more)
    finally:
        reader.close()


def test_take_records_gives_each_record_of_its_own_length() -> None:
    """Records of several sizes (a span ring's), one that wraps the end, a
    discarded one skipped, a busy one ending the run until it is committed."""
    from kernmlops.ebpf.ringbuf import RingBuffer

    ring = MappedRing(4096, start=4096 - 48)  # the second record wraps the end
    bodies = [b"a" * 20, bytes(range(56)), b"ccc"]
    for body in bodies:
        ring.write(body)
    ring.write(b"gone" * 3, discard=True)
    busy = ring.write(b"late" * 5, busy=True)
    ring.write(b"after")
    ring.sync()
    reader = RingBuffer(ring.fd, 4096)
    try:
        assert reader.take_records() == bodies
        assert ring.consumer() == busy  # the discarded record's space freed too
        assert reader.discarded == 1 and reader.records == 3
        assert reader.take_records() == []  # still busy
        ring.cons = ring.consumer()
        ring.commit(busy)
        ring.sync()
        assert reader.take_records() == [b"late" * 5, b"after"]
        assert ring.consumer() == ring.prod
    finally:
        reader.close()


def test_records_to_table_is_arrow_with_the_frames_rows(process_layout):
    # What the collector's hooks hand over: Arrow, no polars; the same rows and types
    # polars reads (texts as large_string, enums as their labels, null if unnamed).
    import pyarrow as pa

    from kernmlops.ebpf.frames import records_to_table

    rec = np.zeros(3, process_layout.dtype)
    rec["pid"] = [7, 8, 9]
    rec["kind"] = [2, 99, 0]
    rec["comm"] = [b"sh\x00junk", b"\xff\xfe", b"x" * 16]
    table = records_to_table(rec, process_layout)
    assert isinstance(table, pa.Table)
    assert table.schema.field("pid").type == pa.uint32()
    assert table.schema.field("comm").type == pa.large_string()
    assert table.column("kind").to_pylist() == ["exit", None, "fork"]
    assert table.column("comm").to_pylist() == ["sh", "\ufffd\ufffd", "x" * 16]
    assert pl.from_arrow(table).equals(records_to_frame(rec, process_layout))


@pytest.mark.parametrize("numpy_scan", [True, False])
def test_copy_to_writes_the_ring_as_it_lies_up_to_a_busy_record(
    tmp_path, numpy_scan: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A spool's input: raw ring bytes (headers included) that decode() reads back, a
    # run that wraps the end in two writes, spilled bytes first, nothing past a busy record.
    import os
    import sys

    from kernmlops.ebpf.ringbuf import RingBuffer

    if not numpy_scan:  # the pure-Python header scan, used before numpy is imported
        monkeypatch.delitem(sys.modules, "numpy")
    ring = MappedRing(4096, start=3 * 4096 - 40)  # the 2nd record straddles the end
    want = events(60)
    ring.write_records(want[:5])
    ring.sync()
    reader = RingBuffer(ring.fd, 4096)
    out = os.open(tmp_path / "spool", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        assert reader.spill(EVENT.itemsize) == 5
        ring.cons = ring.consumer()
        ring.write_records(want[5:40])
        busy = ring.write(want[40].tobytes(), busy=True)
        ring.write_records(want[41:], discard=True)
        ring.sync()
        assert reader.copy_to(out, EVENT.itemsize) == 40 * 24
        assert ring.consumer() == busy
        assert reader.copy_to(out, EVENT.itemsize) == 0 and not reader.spilled
        ring.cons = ring.consumer()
        ring.commit(busy)
        ring.sync()
        assert reader.copy_to(out, EVENT.itemsize) == 20 * 24
        assert ring.consumer() == ring.prod
    finally:
        os.close(out)
        reader.close()
    raw = np.fromfile(tmp_path / "spool", np.uint8)
    got = decode(raw, 4096, 0, len(raw), EVENT)
    assert np.array_equal(got.records, want[:41]) and got.discarded == 19


def test_a_module_another_thread_is_importing_is_not_used_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # numpy half imported by the preload thread is in sys.modules already; using it
    # would wait on its import lock behind a thread the storm keeps off the CPU
    import importlib.machinery
    import sys
    import types

    from kernmlops.lazy import imported as _imported

    half = types.ModuleType("kmo_half")
    half.__spec__ = importlib.machinery.ModuleSpec("kmo_half", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kmo_half", half)
    assert not _imported("kmo_half")
    half.__spec__._initializing = False  # type: ignore[attr-defined]
    assert _imported("kmo_half")
    assert not _imported("kmo_never_imported")


def test_spilled_and_drained_records_keep_the_records_layout() -> None:
    # A C record with padding: joined by np.concatenate it came back packed (12
    # bytes, not 16), and a reader of its raw bytes (a view) misread every field.
    from kernmlops.ebpf.ringbuf import RingBuffer

    padded = np.dtype({"names": ["pid", "ts"], "formats": ["<u4", "<u8"], "offsets": [0, 8],
                       "itemsize": 16})  # fmt: skip
    want = np.zeros(6, padded)
    want["pid"], want["ts"] = range(1, 7), range(100, 106)
    ring = MappedRing(4096)
    ring.write_records(want[:3])
    ring.sync()
    reader = RingBuffer(ring.fd, 4096)
    try:
        assert reader.spill(padded.itemsize) == 3
        ring.cons = ring.consumer()
        ring.write_records(want[3:])
        ring.sync()
        reader.dtype = padded
        got = reader.drain()
        assert got.dtype == padded and got.dtype.itemsize == 16
        assert np.array_equal(got["pid"], want["pid"]) and np.array_equal(got["ts"], want["ts"])
        assert got.view(np.uint8).reshape(6, 16)[:, 8:].copy().view("<u8").ravel().tolist() == list(
            range(100, 106)
        )
    finally:
        reader.close()
