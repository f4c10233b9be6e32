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
