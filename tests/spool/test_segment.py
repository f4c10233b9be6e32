"""One segment file's writes: a run of ring copies cut in frames."""

from __future__ import annotations

import numpy as np


def test_a_run_is_cut_in_frames_across_its_pieces() -> None:
    # The writer cuts a batch of ring copies into frames without joining the batch:
    # the same bytes, every frame full but the last, pieces split where a frame ends.
    from kernmlops.spool.segment import frames_of

    rng = np.random.default_rng(7)
    for size in (24, 48, 4096):
        for _ in range(50):
            run = [rng.bytes(int(n)) for n in rng.integers(0, 3 * size, rng.integers(1, 6))]
            frames_ = [bytes(f) for f in frames_of(run, size)]
            assert b"".join(frames_) == b"".join(run)
            assert all(len(f) == size for f in frames_[:-1])
            assert not frames_ or 0 < len(frames_[-1]) <= size
