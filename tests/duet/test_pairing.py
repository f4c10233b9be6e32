"""Overlap pairing on hand-made intervals, and slowdown injection."""

from __future__ import annotations

import numpy as np
import pytest

from kernmlops.duet.analysis import inject_slowdown, pair_intervals


def _pairs(a, b, min_overlap=0.4):
    a, b = np.array(a), np.array(b)
    ia, ib, ratio = pair_intervals(a[:, 0], a[:, 1], b[:, 0], b[:, 1], min_overlap)
    return sorted(zip(ia.tolist(), ib.tolist(), np.round(ratio, 6).tolist(), strict=True))


def test_identical_and_offset():
    assert _pairs([[0, 10]], [[0, 10]]) == [(0, 0, 1.0)]
    # offset by 3: overlap 7 of 10
    assert _pairs([[0, 10], [10, 20]], [[3, 13], [13, 23]]) == [(0, 0, 0.7), (1, 1, 0.7)]
    # offset by half: each A overlaps two Bs by 0.5
    assert _pairs([[0, 10], [10, 20]], [[5, 15]]) == [(0, 0, 0.5), (1, 0, 0.5)]
    # offset by 0.7: the 0.3 overlaps are too small, the 0.7 ones pair
    assert _pairs([[0, 10], [10, 20]], [[7, 17]]) == [(1, 0, 0.7)]


def test_touching_never_pairs():
    assert _pairs([[0, 10]], [[10, 20]], min_overlap=1e-9) == []
    assert _pairs([[10, 20]], [[0, 10]], min_overlap=1e-9) == []
    # the asynchronous-duet test case: [0,4],[4,8] against [0,5],[5,10]
    got = _pairs([[0, 4], [4, 8]], [[0, 5], [5, 10]], min_overlap=1e-9)
    assert [(i, j) for i, j, _ in got] == [(0, 0), (1, 0), (1, 1)]
    assert got[1][2] == pytest.approx(1 / 5)  # A1 and B0 share [4,5] of B0's 5


def test_nested_ratio_is_of_the_longer():
    # A [2,6] inside B [0,10]: overlap 4, longer 10 -> 0.4 (pairs at 0.4, not above)
    assert _pairs([[2, 6]], [[0, 10]]) == [(0, 0, 0.4)]
    assert _pairs([[2, 6]], [[0, 10]], min_overlap=0.41) == []
    assert _pairs([[0, 10]], [[2, 6]]) == [(0, 0, 0.4)]  # symmetric


def test_one_side_much_longer():
    a = [[i * 10, i * 10 + 10] for i in range(9)]  # nine short A iterations
    b = [[0, 30], [30, 60], [60, 90]]  # three B iterations, 3x longer
    assert _pairs(a, b) == []  # 10/30 < 0.4: nothing shares most of its time
    got = _pairs(a, b, min_overlap=0.3)
    assert [(i, j) for i, j, _ in got] == [(i, i // 3) for i in range(9)]
    assert {r for *_, r in got} == {round(1 / 3, 6)}


def test_gaps_empty_and_unsorted_input():
    assert _pairs([[0, 10]], [[20, 30]]) == []
    ia, ib, r = pair_intervals(np.array([]), np.array([]), np.array([0]), np.array([1]))
    assert len(ia) == len(ib) == len(r) == 0
    # input order does not matter: indices refer to the caller's arrays
    assert _pairs([[10, 20], [0, 10]], [[12, 22], [2, 12]]) == [(0, 0, 0.8), (1, 1, 0.8)]


def test_matches_brute_force_on_random_series():
    rng = np.random.default_rng(5)
    for _ in range(30):

        def series(n):
            lens = rng.integers(5, 40, n)
            gaps = rng.integers(0, 6, n)
            starts = np.cumsum(gaps + np.r_[0, lens[:-1]])
            return np.c_[starts, starts + lens]

        a, b = series(int(rng.integers(1, 30))), series(int(rng.integers(1, 30)))
        thr = float(rng.uniform(0.05, 0.9))
        want = []
        for i, (s1, e1) in enumerate(a):
            for j, (s2, e2) in enumerate(b):
                ov = min(e1, e2) - max(s1, s2)
                r = ov / max(e1 - s1, e2 - s2)
                if ov > 0 and r >= thr:
                    want.append((i, j, round(float(r), 6)))
        assert _pairs(a, b, thr) == sorted(want)


def test_inject_slowdown_shifts_later_iterations():
    start = np.array([0, 10, 25])
    end = np.array([10, 20, 35])  # gaps: 0 and 5
    s, e = inject_slowdown(start, end, 0.1)
    assert s.tolist() == [0, 11, 27]
    assert e.tolist() == [11, 22, 38]
    # unsorted input keeps the caller's order
    s2, e2 = inject_slowdown(start[::-1], end[::-1], 0.1)
    assert s2.tolist() == [27, 11, 0] and e2.tolist() == [38, 22, 11]
    assert inject_slowdown(start, end, 0.0)[0] is not None


def test_pairs_are_weighted_by_their_overlap():
    from kernmlops.duet.analysis import Options, Run, compare

    def arr(*v):
        return np.array(v, np.int64)

    # A: [0,10] and [10,22]; B: [0,16]. A0-B0 share 10, A1-B0 share 6.
    run = Run(("s", "b", "duet", 0, "AB"), arr(0, 10), arr(10, 22), arr(10, 12),
              arr(0), arr(16), arr(16))  # fmt: skip
    c = compare([run], "duet", False, Options(min_overlap=0.3, mds=False, resamples=200))
    want = np.exp((10 * np.log(16 / 10) + 6 * np.log(16 / 12)) / 16)
    assert c.n_pairs == 2 and c.gm_ratio == pytest.approx(want)
    # the run's own mean difference is weighted the same way
    assert c.runs["mean_diff_ns"][0] == pytest.approx((10 * 6 + 6 * 4) / 16)
    # the reported B - A is the ratio times A's mean, so it agrees with the ratio's CI
    assert c.mean_diff_ns == pytest.approx(11 * (want - 1))
