"""The spool's file format: raw frames with their CRC32C, what a damage costs and
where reading goes on (compressed frames: test_copy, tests/faults/test_damaged_spool)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kernmlops.spool.frames import RAW_FRAME


def _raw_segment(frames: list[bytes]) -> bytes:
    from kernmlops.spool.frames import raw_head

    return b"".join(raw_head(f) + f for f in frames)


def test_raw_frames_name_what_a_damage_cost_and_reading_goes_on() -> None:
    # A flipped record byte costs its frame (its header says how much); a damaged
    # header costs the stretch up to the next intact header, whatever the records
    # hold (the magic among them is no header without its own CRC); a kill's cut
    # is told from damage.
    from kernmlops.spool.frames import CUT, RAW_MAGIC_BYTES, iter_raw_frames

    rng = np.random.default_rng(5)
    recs = [rng.bytes(24 * n) for n in (10, 3, 7, 12)]
    recs[2] = recs[2][:24] + RAW_MAGIC_BYTES * 6 + recs[2][48:]  # the magic in the data
    data = _raw_segment(recs)
    starts = [0]
    for r in recs:
        starts.append(starts[-1] + RAW_FRAME.size + len(r))
    assert [f.raw for f in iter_raw_frames(data)] == recs

    flipped = bytearray(data)
    flipped[starts[1] + RAW_FRAME.size + 5] ^= 1
    found = list(iter_raw_frames(bytes(flipped)))
    assert [(f.start, f.end, f.reason, f.raw_bytes) for f in found[1:2]] == [
        (starts[1], starts[2], "a frame that fails its CRC32C", len(recs[1]))
    ]
    assert [f.raw for f in found] == [recs[0], None, recs[2], recs[3]]

    header = bytearray(data)
    header[starts[1] + 4] ^= 0x80  # its length
    found = list(iter_raw_frames(bytes(header)))
    assert [(f.start, f.end, f.reason, f.raw_bytes) for f in found[1:2]] == [
        (starts[1], starts[2], "a damaged frame header", None)
    ]
    assert [f.raw for f in found] == [recs[0], None, recs[2], recs[3]]

    for cut in (starts[3] + 3, starts[3] + RAW_FRAME.size + 5):  # in the header, the records
        *whole, last = iter_raw_frames(data[:cut])
        assert [f.raw for f in whole] == recs[:3]
        assert (last.start, last.end, last.reason) == (starts[3], cut, CUT)


def test_shuffled_frames_come_back_as_the_records_were(tmp_path: Path) -> None:
    # Every stride a header can name, with a tail of less than a record: the bytes
    # come back as they were, and the shuffle is the plain transpose of the records.
    import pyarrow as pa

    from kernmlops.spool.frames import (
        FRAME,
        SHUFFLED,
        iter_frames,
        raw_word,
        read_codec,
        shuffle,
        shuffle_stride,
        unshuffle,
    )
    from kernmlops.spool.segment import write_frame

    rng = np.random.default_rng(7)
    for stride in (8, 24, 32, 40, 1016):
        raw = rng.bytes(stride * 37 + 5)
        shuffled = shuffle(raw, stride)
        planes = np.frombuffer(raw[: stride * 37], np.uint8).reshape(37, stride)
        assert shuffled[: stride * 37] == planes.T.tobytes()
        assert shuffled[stride * 37 :] == raw[stride * 37 :]
        assert unshuffle(shuffled, stride) == raw
    assert shuffle_stride(4096, 32) == 32
    # a stride no header can name, or a frame without a whole record: not shuffled
    assert [shuffle_stride(4096, s) for s in (0, 12, 1024)] == [0, 0, 0]
    assert shuffle_stride(16, 32) == 0 and shuffle_stride(16 << 20, 32) == 0

    # records like a ring's: a clock that grows, a pid that repeats, small durations
    recs = np.zeros(500, [("at", "<u4"), ("pid", "<u4"), ("ns", "<u8"), ("x", "<u8")])
    recs["at"] = np.arange(500) * 1000
    recs["pid"] = 4242
    recs["ns"] = rng.integers(1000, 5000, 500)
    raw = recs.tobytes() + b"\1" * 8
    path = tmp_path / "seg"
    with path.open("wb") as f:
        plain = write_frame(f.fileno(), raw, pa.Codec("zstd"))
        both = plain + write_frame(f.fileno(), raw, pa.Codec("zstd"), 24)
    data = path.read_bytes()
    assert len(data) == both
    _, word = FRAME.unpack_from(data, plain)
    # the header says it: a reader of before (no flag) sees a size of over 2 GiB,
    # which no frame of its has, and names the frame as damaged
    assert word & SHUFFLED and word > 1 << 31 and raw_word(word) == (len(raw), 24)
    assert both - plain < plain  # the shuffled frame is the smaller
    assert [fr.raw for fr in iter_frames(data, read_codec())] == [raw, raw]


def _zstd_frame(raw: bytes) -> bytes:
    from kernmlops.spool.frames import frame_head, read_codec

    packed = read_codec().compress(raw, asbytes=True)
    return frame_head(len(packed), len(raw)) + packed


def _planted(path: Path, head: bytes, tail: bytes, far: int) -> int:
    """``path``: ``head``, a sparse hole, then ``tail`` at ``far``; where the tail is."""
    with path.open("wb") as f:
        f.write(head)
        f.seek(far)
        f.write(tail)
    return far


#: what a frame header that claims more than any frame held (256 MiB) is named
CLAIMS = "a damaged frame header (it claims {:,} bytes, over the 268,435,456 a frame holds at most)"


def test_a_frame_header_claiming_a_gib_of_records_is_damage() -> None:
    # A header is believed only up to what a frame ever held: zstd was handed the
    # size one claims (a buffer of 1 GiB here), now the frame is a damaged header,
    # and reading goes on at the next.
    from kernmlops.spool.frames import frame_head, iter_frames, read_codec

    rng = np.random.default_rng(11)
    a, b = rng.bytes(4000), rng.bytes(3000)
    small = read_codec().compress(b"x" * 50, asbytes=True)
    lying = frame_head(len(small), 1 << 30) + small  # 50 bytes' zstd data
    data = _zstd_frame(a) + lying + _zstd_frame(b)
    at = len(_zstd_frame(a))
    found = [(f.start, f.end, f.raw, f.reason) for f in iter_frames(data, read_codec())]
    assert found == [
        (0, at, a, None),
        (at, at + len(lying), None, CLAIMS.format(1 << 30)),
        (at + len(lying), len(data), b, None),
    ]


def test_a_frame_header_claiming_gibs_the_file_holds_is_never_read(tmp_path: Path) -> None:
    # A segment file of 4 GiB (sparse) with a header that claims 3 GiB, which the file
    # holds: zstd's (its size), a raw frame's (its CRCs right: only a hand makes
    # that). What it claims is never read, and reading goes on at the next intact
    # frame, however far: its reader holds a frame, never the file.
    import os
    import struct
    import tracemalloc

    from kernmlops.ebpf.crc32c import crc32c
    from kernmlops.spool.frames import (
        FRAME,
        RAW_MAGIC,
        ZSTD_MAGIC,
        SegmentFile,
        iter_frames,
        iter_raw_frames,
        raw_head,
        read_codec,
    )

    rng = np.random.default_rng(12)
    a, b = rng.bytes(4000), rng.bytes(3000)
    zstd_head = _zstd_frame(a) + FRAME.pack(3 << 30, 1 << 20) + ZSTD_MAGIC
    raw_lie = struct.pack("<III", RAW_MAGIC, 3 << 30, 0)
    raw_lie += crc32c(raw_lie).to_bytes(4, "little")
    files = {
        "zstd": (zstd_head, _zstd_frame(b), len(_zstd_frame(a))),
        "raw": (raw_head(a) + a + raw_lie, raw_head(b) + b, len(raw_head(a) + a)),
    }
    for name, (head, tail, lie_at) in files.items():
        path = tmp_path / f"{name}.ring"
        far = _planted(path, head, tail, 4 << 30)
        fd = os.open(path, os.O_RDONLY)
        tracemalloc.start()
        try:
            src = SegmentFile(fd)
            frames = iter_frames(src, read_codec()) if name == "zstd" else iter_raw_frames(src)
            found = [(f.start, f.end, f.raw, f.reason) for f in frames]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            os.close(fd)
        assert found == [
            (0, lie_at, a, None),
            (lie_at, far, None, CLAIMS.format(3 << 30)),
            (far, far + len(tail), b, None),
        ], name
        assert peak < 8 << 20, f"{name}: {peak:,} bytes held"


def test_a_segment_file_reads_as_its_bytes_do(tmp_path: Path) -> None:
    # Read from its file a window at a time, a segment gives the frames, damage and
    # cuts its bytes give; a search finds a magic across the windows' edges.
    import os

    from kernmlops.spool.frames import (
        RAW_MAGIC_BYTES,
        SCAN_BYTES,
        ZSTD_MAGIC,
        SegmentFile,
        iter_frames,
        iter_raw_frames,
        raw_head,
        read_codec,
    )

    rng = np.random.default_rng(13)
    recs = [rng.bytes(int(n)) for n in rng.integers(100_000, 400_000, 12)]
    zstd = [_zstd_frame(r) for r in recs]
    raw = [raw_head(r) + r for r in recs]
    for name, frames in (("zstd", zstd), ("raw", raw)):
        data = bytearray(b"".join(frames))
        ends = np.cumsum([len(f) for f in frames])
        data[ends[0] + 2] ^= 0x10  # a header (frame 1): reading goes on at the next
        data[ends[2] + 30] ^= 0x10  # records (frame 3): a raw frame's CRC fails
        data[ends[4] + 9] ^= 0x10  # a header again (frame 5)
        data[ends[5] : ends[7]] = bytes(ends[7] - ends[5])  # zeros (frames 6-7)
        for cut in (len(data), len(data) - 7):  # whole, and cut by a kill
            path = tmp_path / f"{name}.ring"
            path.write_bytes(data[:cut])
            fd = os.open(path, os.O_RDONLY)
            try:
                src = SegmentFile(fd)
                if name == "zstd":
                    pair = (
                        list(iter_frames(src, read_codec())),
                        list(iter_frames(bytes(data[:cut]), read_codec())),
                    )
                else:
                    pair = list(iter_raw_frames(src)), list(iter_raw_frames(bytes(data[:cut])))
            finally:
                os.close(fd)
            assert pair[0] == pair[1], (name, cut)
            assert [f.reason is None for f in pair[0]].count(False) >= 2

    # a magic across the edge of a window, from every start near it
    body = bytearray(rng.bytes(3 * SCAN_BYTES))
    for needle in (ZSTD_MAGIC, RAW_MAGIC_BYTES):
        for i in range(len(body) - 3):  # none but the planted ones
            if body[i : i + 4] == needle:
                body[i] ^= 0xFF
    for needle in (ZSTD_MAGIC, RAW_MAGIC_BYTES):
        data = bytearray(body)
        for at in (SCAN_BYTES - 2, 2 * SCAN_BYTES + 5, len(data) - 4):
            data[at : at + 4] = needle
        path = tmp_path / "find"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            src = SegmentFile(fd)
            for start in (0, 1, 7, SCAN_BYTES - 2, SCAN_BYTES - 1, 2 * SCAN_BYTES, len(data) - 4):
                assert src.find(needle, start) == bytes(data).find(needle, start), start
        finally:
            os.close(fd)


def test_every_reader_of_a_spool_refuses_a_header_claiming_more_than_a_frame_holds(
    tmp_path: Path,
) -> None:
    # One rule (256 MiB of records, zstd's bound of that packed): the collector's
    # read back (Segment.read_frame) and its hand-over to row workers (frame_spans)
    # refuse the claim as recover's readers do, before a byte of it is asked for.
    import os
    import struct

    import pytest

    from kernmlops.ebpf.crc32c import crc32c
    from kernmlops.errors import CollectionError
    from kernmlops.spool.frames import (
        FRAME_LIMIT,
        PACKED_LIMIT,
        RAW_MAGIC,
        claims_too_much,
        frame_head,
        raw_head,
        read_codec,
    )
    from kernmlops.spool.jobs import frame_spans
    from kernmlops.spool.segment import Segment

    assert claims_too_much(PACKED_LIMIT, FRAME_LIMIT) is None
    assert claims_too_much(PACKED_LIMIT + 1, 0) == CLAIMS.format(PACKED_LIMIT + 1)
    assert claims_too_much(0, FRAME_LIMIT + 1) == CLAIMS.format(FRAME_LIMIT + 1)
    a = np.random.default_rng(13).bytes(4000)
    small = read_codec().compress(b"x" * 50, asbytes=True)
    raw_lie = struct.pack("<III", RAW_MAGIC, 1 << 30, 0)  # its own CRC right
    raw_lie += crc32c(raw_lie).to_bytes(4, "little")
    for codec, first, lie in [
        (read_codec(), _zstd_frame(a), frame_head(len(small), 1 << 30) + small),
        (None, raw_head(a) + a, raw_lie + b"\0" * 64),
    ]:
        path = tmp_path / f"{codec is not None}.ring"
        path.write_bytes(first + lie)
        fd = os.open(path, os.O_RDONLY)
        try:
            compressed = codec is not None
            assert frame_spans(fd, 0, len(first), compressed) == [(0, len(first), len(a))]
            assert frame_spans(fd, 0, len(first + lie), compressed) is None
            seg = Segment(path, {}, fd=fd, codec=codec)
            assert seg.read_frame(codec, 8) == a
            with pytest.raises(CollectionError) as err:
                seg.read_frame(codec, 8)
            said = f"spool {path}: {CLAIMS.format(1 << 30)} at byte {len(first):,}"
            assert str(err.value).startswith(said), err.value
        finally:
            os.close(fd)
