"""The run-level intervals of ``duet analyze`` (Options.interval), checked
against independent computations: brute-force enumeration of every sign
pattern, scipy's t intervals, and simulated A/A experiments whose truth is
known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from kernmlops.duet.analysis import (
    INTERVALS,
    Options,
    build_runs,
    compare,
    run_interval,
    signflip_interval,
    t_interval,
)
from tests.duet.test_stats import synthetic

EXACT = Options(resamples=1000)  # every group below has at most 1000 members


def _edges(p_value, est: float, scale: float, alpha: float = 0.05) -> tuple[float, float]:
    """The shifts where a p-value computed by brute force falls below alpha,
    by bisection from the estimate outwards."""
    out = []
    for direction in (-1.0, 1.0):
        inside, outside = est, est + direction * 10 * scale
        assert p_value(outside) < alpha <= p_value(inside)
        for _ in range(80):
            mid = (inside + outside) / 2
            inside, outside = (mid, outside) if p_value(mid) >= alpha else (inside, mid)
        out.append(inside)
    return out[0], out[1]


def _share_as_extreme(stats_of_patterns: np.ndarray, observed: float) -> float:
    return float(np.mean(np.abs(stats_of_patterns) >= abs(observed) * (1 - 1e-12)))


def test_one_order_equals_all_two_to_the_n_sign_patterns():
    x = np.random.default_rng(5).standard_t(3, 7) * 0.01 + 0.004
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=len(x))))  # 128 patterns

    def p_value(d):
        return _share_as_extreme((signs * (x - d)).mean(axis=1), (x - d).mean())

    lo, hi = _edges(p_value, x.mean(), np.ptp(x))
    ci = signflip_interval((x,), EXACT, np.random.default_rng(0))
    assert ci.low == pytest.approx(lo, abs=1e-12) and ci.high == pytest.approx(hi, abs=1e-12)
    assert ci.low < x.mean() < ci.high


def test_two_orders_equal_flips_of_all_sign_patterns():
    # 6 AB and 6 BA runs with an order bias: the group is every sign pattern
    # (of all 2^12) that flips as many AB runs as BA runs
    rng = np.random.default_rng(6)
    ab, ba = rng.standard_t(3, 6) * 0.01 + 0.03, rng.standard_t(3, 6) * 0.01 - 0.02
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=12)))
    signs = signs[(signs[:, :6] < 0).sum(axis=1) == (signs[:, 6:] < 0).sum(axis=1)]
    assert len(signs) == 924

    def p_value(d):
        flipped = signs * np.concatenate([ab - d, ba - d])
        sims = (flipped[:, :6].mean(axis=1) + flipped[:, 6:].mean(axis=1)) / 2
        return _share_as_extreme(sims, ((ab - d).mean() + (ba - d).mean()) / 2)

    est = (ab.mean() + ba.mean()) / 2
    lo, hi = _edges(p_value, est, np.ptp(np.concatenate([ab, ba])))
    ci = signflip_interval((ab, ba), EXACT, np.random.default_rng(0))
    assert ci.low == pytest.approx(lo, abs=1e-12) and ci.high == pytest.approx(hi, abs=1e-12)


def test_unequal_orders_are_a_permutation_of_ab_and_mirrored_ba_runs():
    # AB values minus d and d minus BA values are exchangeable under "the shift is d"
    rng = np.random.default_rng(7)
    ab, ba = rng.standard_t(3, 6) * 0.01, rng.standard_t(3, 5) * 0.01 + 0.01
    first = np.array([[i in c for i in range(11)] for c in itertools.combinations(range(11), 6)])
    assert len(first) == 462  # every way to say which 6 of the 11 are AB

    def p_value(d):
        pooled = np.concatenate([ab - d, d - ba])
        sims = [(pooled[m].mean() - pooled[~m].mean()) / 2 for m in first]
        return _share_as_extreme(np.array(sims), ((ab - d).mean() - (d - ba).mean()) / 2)

    lo, hi = _edges(p_value, (ab.mean() + ba.mean()) / 2, 0.05)
    ci = signflip_interval((ab, ba), EXACT, np.random.default_rng(0))
    assert ci.low == pytest.approx(lo, abs=1e-12) and ci.high == pytest.approx(hi, abs=1e-12)


def test_random_sign_patterns_approach_the_exact_interval_and_follow_the_seed():
    rng = np.random.default_rng(8)
    strata = (rng.standard_t(3, 7) * 0.01, rng.standard_t(3, 7) * 0.01)  # 3432 members
    exact = signflip_interval(strata, Options(resamples=5000), np.random.default_rng(0))
    some = [signflip_interval(strata, Options(resamples=2000), np.random.default_rng(s))
            for s in range(3)]  # fmt: skip
    width = exact.high - exact.low
    for ci in some:
        assert abs(ci.low - exact.low) < 0.05 * width and abs(ci.high - exact.high) < 0.05 * width
    assert len({(c.low, c.high) for c in some}) == 3  # the draws differ by seed ...
    again = signflip_interval(strata, Options(resamples=2000), np.random.default_rng(0))
    assert (again.low, again.high) == (some[0].low, some[0].high)  # ... and only by seed


def test_symmetric_runs_give_an_interval_centred_on_the_estimate():
    half = np.array([0.001, 0.004, 0.009, 0.02])
    x = 0.01 + np.concatenate([half, -half])
    ci = signflip_interval((x,), EXACT, np.random.default_rng(0))
    assert x.mean() - ci.low == pytest.approx(ci.high - x.mean(), abs=1e-15)
    assert ci.low < 0.01 < ci.high


def test_an_order_bias_leaves_the_interval_exactly_as_it_is():
    rng = np.random.default_rng(9)
    ab, ba = rng.standard_t(3, 10) * 0.01, rng.standard_t(3, 10) * 0.01
    plain = signflip_interval((ab, ba), Options(), np.random.default_rng(1))
    biased = signflip_interval((ab + 0.05, ba - 0.05), Options(), np.random.default_rng(1))
    assert biased.low == pytest.approx(plain.low, abs=1e-12)
    assert biased.high == pytest.approx(plain.high, abs=1e-12)
    # without the orders as strata the bias would count as spread
    pooled = signflip_interval((np.concatenate([ab + 0.05, ba - 0.05]),), Options(),
                               np.random.default_rng(1))  # fmt: skip
    assert pooled.high - pooled.low > 2 * (plain.high - plain.low)


def test_t_interval_is_scipys_welch_interval():
    rng = np.random.default_rng(10)
    ab, ba = rng.normal(0.01, 0.01, 10), rng.normal(0.0, 0.03, 8)
    # mean of the orders' means = (mean(ab) - mean(-ba)) / 2: Welch's two-sample interval / 2
    ref = stats.ttest_ind(ab, -ba, equal_var=False).confidence_interval(0.95)
    ci = t_interval((ab, ba), 0.95)
    assert ci.low == pytest.approx(ref.low / 2, rel=1e-9)
    assert ci.high == pytest.approx(ref.high / 2, rel=1e-9)


def test_five_runs_of_one_order_get_welchs_t_with_a_note():
    x = np.random.default_rng(11).normal(0.01, 0.01, 5)
    assert signflip_interval((x,), EXACT, np.random.default_rng(0)) is None  # p >= 2/32
    assert signflip_interval((x[:3], x[:3] + 0.001), EXACT, np.random.default_rng(0)) is None
    ci, made = run_interval((x,), Options(), np.random.default_rng(0))
    ref = stats.ttest_1samp(x, 0).confidence_interval(0.95)
    assert made == "t" and (ci.low, ci.high) == pytest.approx((ref.low, ref.high), rel=1e-9)
    assert signflip_interval((np.append(x, 0.02),), EXACT, np.random.default_rng(0))

    opts = Options(warmup="1", mds=False)
    runs = build_runs(synthetic(12, runs=5, effect=0.05), opts.warmup)[("syn", "loop", "duet")]
    c = compare(runs, "duet", False, opts)  # orders 3 AB + 2 BA: one stratum of 5
    assert c.unit == "run" and c.interval == "t" and c.detected == "slower"
    assert any("too few for a 95% sign-flip interval" in n for n in c.notes)
    g = np.log(c.runs["gm_ratio"].to_numpy())
    ref = stats.ttest_1samp(g, 0).confidence_interval(0.95)
    assert (c.ratio_ci.low, c.ratio_ci.high) == pytest.approx(
        (np.exp(ref.low), np.exp(ref.high)), rel=1e-9
    )


def _aa_experiments(n: int, seed: int, shift: float = 0.0, bias: float = 0.0):
    """Per-run log ratios of simulated duets, 10 runs per order, heavy-tailed
    (t, 3 degrees of freedom) like runs a foreign load sometimes disturbs."""
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_t(3, 10) * 0.01 + shift + bias, rng.standard_t(3, 10) * 0.01 + shift - bias)
        for _ in range(n)
    ]


def test_aa_false_positives_signflip_holds_five_percent_bca_does_not():
    experiments = _aa_experiments(400, seed=2024)
    rejects = {}
    for interval in ("signflip", "bca"):
        rng, opts = np.random.default_rng(0), Options(interval=interval)
        cis = [run_interval(e, opts, rng)[0] for e in experiments]
        rejects[interval] = np.array([not (c.low <= 0 <= c.high) for c in cis])
    fp_signflip, fp_bca = rejects["signflip"].mean(), rejects["bca"].mean()
    assert fp_signflip <= 0.07
    assert fp_bca >= fp_signflip + 0.02
    # the same experiments: BCa's extra rejections are not the sign-flip's
    only_bca = int((rejects["bca"] & ~rejects["signflip"]).sum())
    only_signflip = int((~rejects["bca"] & rejects["signflip"]).sum())
    assert only_bca >= 8 and only_bca >= 4 * only_signflip


def test_a_real_shift_is_covered_and_detected():
    rng, opts = np.random.default_rng(0), Options()
    cis = [run_interval(e, opts, rng)[0] for e in _aa_experiments(200, 99, shift=0.02, bias=0.01)]
    assert np.mean([c.low <= 0.02 <= c.high for c in cis]) >= 0.92
    assert np.mean([c.low > 0 for c in cis]) >= 0.9


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("effect", [0.0, 0.01, -0.03])
def test_every_interval_agrees_with_its_verdict(interval: str, effect: float):
    opts = Options(warmup="1", resamples=1000, interval=interval)
    runs = build_runs(synthetic(50, effect=effect), opts.warmup)[("syn", "loop", "duet")]
    c = compare(runs, "duet", effect == 0, opts)
    assert c.interval == interval and c.unit == "run"
    lo, hi = c.ratio_ci.low, c.ratio_ci.high
    assert c.detected == ("slower" if lo > 1 else "faster" if hi < 1 else "none")
    assert f"[{(lo - 1) * 100:+.2f}%, {(hi - 1) * 100:+.2f}%]" in c.verdict
    assert (c.diff_ci.low > 0) == (lo > 1) and (c.diff_ci.high < 0) == (hi < 1)
    if effect == -0.03:
        assert c.detected == "faster"
    # the MDS is found with the same interval: detected there, not one step below
    if c.mds is not None and c.mds > 0:
        from kernmlops.duet.analysis import detects

        assert detects(runs, "duet", opts, c.mds)
        assert not detects(runs, "duet", opts, c.mds - opts.slowdown_step)


def test_the_default_is_the_signflip_interval():
    assert Options().interval == "signflip" and INTERVALS == ("bca", "t", "signflip")
    with pytest.raises(ValueError, match="interval 'exact'"):
        Options(interval="exact")
