"""The spool's file format: raw frames with their CRC32C, what a damage costs and
where reading goes on (compressed frames: test_copy, tests/faults/test_damaged_spool)."""

from __future__ import annotations

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
