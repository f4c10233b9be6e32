"""Statistics on synthetic duets whose truth is known.

Each synthetic run has a shared, time-varying interference (both sides see the
same slow periods, as in a real duet), a small per-run bias of each side
(process layout, CPU), and independent per-iteration noise.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from kernmlops.duet.analysis import (
    Options,
    analyze,
    build_runs,
    compare,
    detects,
    drop_warmup,
    expansion,
)

BASE_NS = 20_000_000


def _side(rng, effect, interference, n, bias_sd, noise_sd):
    bias = rng.normal(0, bias_sd)
    t, rows = 0, []
    for i in range(n):
        slow = interference(t)
        d = int(BASE_NS * (1 + effect) * (1 + bias) * (1 + slow) * (1 + rng.normal(0, noise_sd)))
        rows.append((i, t, t + d, d))
        t += d + int(rng.integers(50_000, 150_000))  # spawn gap
    return rows


def synthetic(
    seed, effect=0.0, runs=10, n=40, kind="duet", bias_sd=0.003, noise_sd=0.02, slot_bias=0.0
):
    """A results table of ``runs`` duet (or sequential) runs. ``slot_bias``: the
    side that starts first (and gets the first CPU) is that much slower."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(runs):
        # bursts of interference: 0-40 % slower for 50-300 ms at random times
        bursts = [
            (rng.uniform(0, 1e9), rng.uniform(5e7, 3e8), rng.uniform(0, 0.4)) for _ in range(6)
        ]

        def interference(t, bursts=bursts):
            return sum(h for s, w, h in bursts if s <= t < s + w)

        first = "A" if r % 2 == 0 else "B"
        for pair, eff in (("A", 0.0), ("B", effect)):
            if kind != "sequential" and pair == first:
                eff = (1 + eff) * (1 + slot_bias) - 1
            if kind == "sequential":  # alone: its own interference, at another time
                own = [(rng.uniform(0, 1e9), rng.uniform(5e7, 3e8), rng.uniform(0, 0.4))
                       for _ in range(6)]  # fmt: skip

                def inter(t, own=own):
                    return sum(h for s, w, h in own if s <= t < s + w)
            else:
                inter = interference
            order = None if kind == "sequential" else ("AB" if r % 2 == 0 else "BA")
            for i, s, e, d in _side(rng, eff, inter, n, bias_sd, noise_sd):
                out.append(("syn", "loop", r, kind, order, pair, effect == 0, i, s, e, d))
    cols = ["suite", "benchmark", "runid", "kind", "order", "pair", "aa", "iteration",
            "iteration_start_ns", "iteration_end_ns", "iteration_time_ns"]  # fmt: skip
    return pl.DataFrame(out, schema=cols, orient="row")


def _cmp(df, opts, kind="duet"):
    runs = build_runs(df, opts.warmup)[("syn", "loop", kind)]
    return runs, compare(runs, kind, bool(df["aa"][0]), opts)


FAST = Options(warmup="1", resamples=1000, mds=False)


def test_aa_ci_contains_zero_in_at_least_90_percent_of_seeds():
    ratio_ok = diff_ok = 0
    seeds = range(60)
    for seed in seeds:
        _, c = _cmp(synthetic(seed), FAST)
        assert c.unit == "run" and c.n_runs == 10
        ratio_ok += c.ratio_ci.low <= 1 <= c.ratio_ci.high
        diff_ok += c.diff_ci.low <= 0 <= c.diff_ci.high
    assert ratio_ok / len(seeds) >= 0.90
    assert diff_ok / len(seeds) >= 0.90


def test_five_percent_slowdown_is_detected():
    hits = 0
    for seed in range(20):
        _, c = _cmp(synthetic(100 + seed, effect=0.05), FAST)
        hits += c.detected == "slower"
        assert c.ratio_ci.low <= 1.05 * 1.02 and c.ratio_ci.high >= 1.05 / 1.02
        assert "B is slower than A" in c.verdict or c.detected != "slower"
    assert hits >= 19


def test_aa_verdict_and_faster_b():
    _, aa = _cmp(synthetic(3), FAST)
    assert aa.aa and aa.verdict.startswith("A/A consistent")
    _, fast = _cmp(synthetic(4, effect=-0.08), FAST)
    assert fast.detected == "faster" and fast.verdict.startswith("B is faster")
    assert fast.gm_ratio == pytest.approx(0.92, abs=0.01)
    assert fast.mean_diff_ns == pytest.approx(-0.08 * BASE_NS, rel=0.15)


def test_minimum_detectable_slowdown_is_consistent():
    opts = Options(warmup="1", resamples=1000, mds=True)
    runs, c = _cmp(synthetic(11), opts)
    assert c.mds is not None and 0 < c.mds <= 0.03
    # the boundary the bisection found: detected there, not one step below
    assert detects(runs, "duet", opts, c.mds)
    assert not detects(runs, "duet", opts, c.mds - opts.slowdown_step)
    # a real slowdown well above the MDS is detected in fresh data
    _, real = _cmp(synthetic(12, effect=c.mds * 2), FAST)
    assert real.detected == "slower"


def test_sequential_runs_have_their_own_figures():
    _, c = _cmp(synthetic(21, effect=0.10, kind="sequential"), FAST, "sequential")
    assert c.kind == "sequential" and c.n_pairs == 0 and c.unit == "run"
    assert c.gm_ratio == pytest.approx(1.10, abs=0.04)
    _, few = _cmp(synthetic(22, effect=0.10, kind="sequential", runs=2), FAST, "sequential")
    assert few.unit == "none" and few.ratio_ci is None and few.detected == "unknown"
    assert few.verdict.startswith("inconclusive: 2 runs, need ≥ 5 for a verdict")
    assert any("run-to-run variation out" in n for n in few.notes)


def test_few_runs_give_the_estimate_without_an_interval_and_a_note():
    opts = Options(warmup="1", resamples=1000)
    _, c = _cmp(synthetic(5, runs=3), opts)
    assert c.unit == "none" and c.n_runs == 3 and c.n_pairs > 100 and c.ratio_ci is None
    assert c.mds is None and c.mds_note == "needs ≥ 5 runs (--min-runs)"
    # the estimate is the mean over the runs of each run's (overlap-weighted) log ratio
    per_run = np.log(c.runs["gm_ratio"].to_numpy())
    assert c.gm_ratio == pytest.approx(np.exp(per_run.mean()), rel=1e-12)
    assert any("are not independent samples" in n for n in c.notes)


def test_warmup_removal():
    df = synthetic(1, runs=2, n=10)
    assert drop_warmup(df, "2").height == df.height - 2 * 2 * 2
    assert drop_warmup(df, "30%").height == df.height - 3 * 2 * 2
    assert drop_warmup(df, "0").height == df.height
    kept = drop_warmup(df, "3")
    assert kept["iteration"].min() == 3
    with pytest.raises(ValueError):
        Options(warmup="ten")


def test_analyze_whole_table_and_expansion_factor():
    df = pl.concat([synthetic(31, effect=0.06), synthetic(32, effect=0.06, kind="sequential")])
    result = analyze(df, FAST)
    [bench] = result.benchmarks
    assert set(bench.comparisons) == {"duet", "sequential"}
    assert bench.comparisons["duet"].detected == "slower"
    # Hesterberg's factor, from its definition
    want = stats.t.ppf(0.975, 9) / stats.norm.ppf(0.975) * np.sqrt(10 / 9)
    assert expansion(10, 0.95) == pytest.approx(want)
    assert expansion(10, 0.95) == pytest.approx(1.2157, abs=1e-3)


def test_an_order_bias_cancels_and_does_not_widen_the_ci():
    # the first CPU is 10 % slower: AB runs say B is 9 % faster, BA runs 10 % slower
    _, c = _cmp(synthetic(41, slot_bias=0.10), FAST)
    ratios = c.runs["gm_ratio"].to_numpy()
    assert ratios.min() < 0.93 and ratios.max() > 1.07
    assert c.detected == "none" and abs(c.gm_ratio - 1) < 0.01
    assert c.ratio_ci.high - c.ratio_ci.low < 0.03
    _, five = _cmp(synthetic(42, effect=0.05, slot_bias=0.10), FAST)
    assert five.detected == "slower" and five.gm_ratio == pytest.approx(1.05, abs=0.01)


# --- why there is no verdict ------------------------------------------------------
def _sides(df: pl.DataFrame, **ended: tuple[str, str | None]) -> pl.DataFrame:
    """duet-run.json's account of each trial's sides (process.side_outcomes), every
    side "ok" but those in ``ended`` (pair: (status, error))."""
    from kernmlops.duet.process import SIDE_SCHEMA

    trials = df.select("suite", "benchmark", "runid", "kind", "order").unique()
    rows = [(*t, pair, *ended.get(pair, ("ok", None)), f"logs/{t[2]}.{pair}.stderr")
            for t in trials.iter_rows() for pair in "AB"]  # fmt: skip
    return pl.DataFrame(rows, schema=SIDE_SCHEMA, orient="row")


@pytest.mark.parametrize("kind", ["duet", "sequential"])
def test_a_side_failed_in_every_run_is_named_with_its_exit_status(kind: str):
    whole = synthetic(51, runs=6, n=8, kind=kind)
    df = whole.filter(pl.col("pair") == "A")  # B's command failed: no row of B at all
    sides = _sides(whole, B=("failed", "exit status 1"))
    runs = df["runid"].n_unique()
    [b] = analyze(df, FAST, sides).benchmarks
    c = b.comparisons[kind]
    cause = f"B has no iteration in any run: failed (exit status 1) in all {runs} runs"
    assert (c.n_a, c.n_b) == (df.height - runs, 0)  # warm-up 1: one per run and side
    assert c.verdict == f"no verdict: {cause}"
    # the first failed run's stderr, named (the others lie beside it)
    assert c.notes == [f"{cause}; its stderr: logs/0.B.stderr (and {runs - 1} more beside it)"]
    # one run timed out, the others failed; and without duet-run.json at hand
    first = (pl.col("pair") == "B") & (pl.col("runid") == 0)
    sides = sides.with_columns(
        pl.when(first).then(pl.lit("timeout")).otherwise(pl.col("status")).alias("status"),
        pl.when(first).then(None).otherwise(pl.col("error")).alias("error"),
    )
    c = analyze(df, FAST, sides).benchmarks[0].comparisons[kind]
    assert c.verdict == (
        "no verdict: B has no iteration in any run: "
        f"failed (exit status 1) in {runs - 1} of {runs} runs, timed out in 1 of {runs} runs"
    )
    c = analyze(df, FAST).benchmarks[0].comparisons[kind]
    assert c.notes == ["B has no iteration in any run; `duet process` named why in its warnings"]
    # A's file unreadable while its command ended ok
    df = whole.filter(pl.col("pair") == "B")
    c = analyze(df, FAST, _sides(whole)).benchmarks[0].comparisons[kind]
    assert c.verdict == (
        "no verdict: A has no iteration in any run: it ended ok, but its result files gave none"
    )


def test_a_warmup_that_drops_every_iteration_is_named_not_the_overlap():
    df = synthetic(52, runs=4, n=8)
    most = df.group_by("runid", "pair").len()["len"].max()
    opts = Options(warmup=str(most), resamples=1000, mds=False)
    [b] = analyze(df, opts, _sides(df)).benchmarks
    c = b.comparisons["duet"]
    assert (c.n_a, c.n_b, c.n_a_all, c.n_b_all) == (0, 0, df.height // 2, df.height // 2)
    assert c.verdict == f"no verdict: the warm-up ({most}) drops every iteration of A and B"
    assert c.notes == [
        f"the warm-up ({most}) drops every iteration of A and B; lower --warmup below {most} "
        "(the most iterations a side has in a run)"
    ]
    # one fewer keeps one per run and side: a comparison, with no such note
    c = analyze(df, Options(warmup=str(most - 1), resamples=1000, mds=False)).benchmarks[0]
    assert c.comparisons["duet"].n_pairs > 0
    assert not any("warm-up" in n for n in c.comparisons["duet"].notes)


def test_no_run_with_both_sides_and_no_overlap_are_told_apart():
    df = synthetic(53, runs=4, n=8)
    apart = df.filter((pl.col("pair") == "A") == (pl.col("runid") % 2 == 0))
    c = analyze(apart, FAST).benchmarks[0].comparisons["duet"]
    assert c.verdict == "no verdict: no run has iterations of both A and B"
    assert c.notes == ["no run has iterations of both A and B; pairs come from one run "
                       "(A's are in run(s) 0, 2, B's in 1, 3)"]  # fmt: skip
    # B's iterations an hour later: both sides in every run, no overlap
    hour = 3_600 * 10**9
    late = df.with_columns(
        pl.when(pl.col("pair") == "B").then(pl.col(c) + hour).otherwise(pl.col(c)).alias(c)
        for c in ("iteration_start_ns", "iteration_end_ns")
    )
    c = analyze(late, FAST).benchmarks[0].comparisons["duet"]
    assert c.n_pairs == 0 and c.verdict.startswith("no verdict: no A/B iterations overlap by 40%")
    assert c.notes == ["no A/B iterations overlap by 40% of the longer one; lower "
                       "--min-overlap, or make the iterations of similar length"]  # fmt: skip


# --- too few runs for a verdict ---------------------------------------------------
def _runs_of_ratios(ratios, kind="sequential", n=40, noise_sd=0.01, seed=0):
    """An A/A table whose run r has B/A = ratios[r] (what a run's own process layout,
    CPUs and machine state give it) and iterations tightly spread within the run."""
    rng = np.random.default_rng(seed)
    out = []
    for r, ratio in enumerate(ratios):
        order = None if kind == "sequential" else ("AB" if r % 2 == 0 else "BA")
        for pair, scale in (("A", 1.0), ("B", ratio)):
            t = 0
            for i in range(n):
                d = int(BASE_NS * scale * np.exp(rng.normal(0, noise_sd)))
                out.append(("syn", "loop", r, kind, order, pair, True, i, t, t + d, d))
                t += d + 100_000
    cols = ["suite", "benchmark", "runid", "kind", "order", "pair", "aa", "iteration",
            "iteration_start_ns", "iteration_end_ns", "iteration_time_ns"]  # fmt: skip
    return pl.DataFrame(out, schema=cols, orient="row")


def _run_log_ratios(df: pl.DataFrame) -> np.ndarray:
    """Each run's mean log B - mean log A, straight from the table (numpy)."""
    out = []
    for r in sorted(df["runid"].unique()):
        run = df.filter(pl.col("runid") == r)
        a = np.log(run.filter(pl.col("pair") == "A")["iteration_time_ns"].to_numpy())
        b = np.log(run.filter(pl.col("pair") == "B")["iteration_time_ns"].to_numpy())
        out.append(b.mean() - a.mean())
    return np.array(out)


def _bootstrap(values: np.ndarray, seed: int = 0, n: int = 20_000) -> tuple[float, float]:
    """Percentile bootstrap (numpy) of the mean of ``values``: 95% interval."""
    rng = np.random.default_rng(seed)
    means = rng.choice(values, (n, len(values))).mean(axis=1)
    return tuple(np.percentile(means, [2.5, 97.5]))


NONE = Options(warmup="0", resamples=1000, mds=False)


def test_four_runs_of_an_aa_duet_are_inconclusive_not_failed():
    # the four per-run B/A of a reported A/A duet (sequential, 4 runs of ./loop)
    df = _runs_of_ratios([0.891, 0.992, 1.022, 0.955])
    g = _run_log_ratios(df)
    # over runs, the unit that repeats, nothing says A differs from itself ...
    t = stats.ttest_1samp(g, 0).confidence_interval(0.95)
    assert t.low < 0 < t.high
    # ... while an interval over iterations, as if they were independent, excludes 1
    a = np.log(df.filter(pl.col("pair") == "A")["iteration_time_ns"].to_numpy())
    b = np.log(df.filter(pl.col("pair") == "B")["iteration_time_ns"].to_numpy())
    rng = np.random.default_rng(0)
    pooled = [rng.choice(b, len(b)).mean() - rng.choice(a, len(a)).mean() for _ in range(4000)]
    assert np.percentile(pooled, 97.5) < 0
    _, c = _cmp(df, NONE, "sequential")
    assert "FAILED" not in c.verdict and c.detected == "unknown"
    assert c.verdict == (
        f"inconclusive: 4 runs, need ≥ 5 for a verdict (--min-runs): B/A "
        f"{(np.exp(g.mean()) - 1) * 100:+.2f}% over them, no interval"
    )
    assert c.ratio_ci is None and c.unit == "none" and c.n_runs == 4
    assert c.gm_ratio == pytest.approx(np.exp(g.mean()), rel=1e-12)
    assert any("not independent" in n for n in c.notes)


@pytest.mark.parametrize("kind", ["duet", "sequential"])
def test_few_runs_with_run_to_run_variance_never_fail_an_aa_duet(kind: str):
    # A/A duets whose runs differ (each side 3% off on its own, per run), 2-4 runs:
    # none may be called biased, whatever the iterations within the runs say
    for seed in range(30):
        runs = 2 + seed % 3
        df = synthetic(300 + seed, runs=runs, kind=kind, bias_sd=0.03)
        _, c = _cmp(df, FAST, kind)
        assert not c.verdict.startswith("A/A FAILED"), c.verdict
        assert c.verdict.startswith(f"inconclusive: {runs} runs, need ≥ 5 for a verdict")


def test_a_real_difference_over_enough_runs_is_found_as_numpy_finds_it():
    rng = np.random.default_rng(7)
    ratios = 1.10 * np.exp(rng.normal(0, 0.02, 10))
    df = _runs_of_ratios(ratios).with_columns(pl.lit(False).alias("aa"))
    g = _run_log_ratios(df)
    _, c = _cmp(df, Options(warmup="0", resamples=1000, mds=False, interval="t"), "sequential")
    t = stats.ttest_1samp(g, 0).confidence_interval(0.95)
    assert c.unit == "run" and c.n_runs == 10
    assert (c.ratio_ci.low, c.ratio_ci.high) == pytest.approx(
        (np.exp(t.low), np.exp(t.high)), rel=1e-9
    )
    assert c.verdict.startswith("B is slower than A by")
    assert c.verdict.endswith("(95% CI over 10 runs, Welch's t)")
    # the default interval agrees with a numpy bootstrap over runs on the direction
    _, d = _cmp(df, NONE, "sequential")
    lo, hi = _bootstrap(g)
    assert d.detected == "slower" and lo > 0 and d.ratio_ci.low > 1
    sf_lo, sf_hi = np.log(d.ratio_ci.low), np.log(d.ratio_ci.high)
    assert sf_lo < g.mean() < sf_hi and lo < g.mean() < hi
    assert 0.5 < (sf_hi - sf_lo) / (hi - lo) < 2  # of one size: both over the 10 runs
    assert d.verdict.endswith("(95% CI over 10 runs, sign-flip)")
    # as few as --min-runs allows: 3 runs of a large difference still give a verdict
    few = df.filter(pl.col("runid") < 3)
    _, e = _cmp(few, Options(warmup="0", resamples=1000, mds=False, min_runs=3), "sequential")
    assert e.detected == "slower" and e.verdict.endswith("(95% CI over 3 runs, Welch's t)")


def test_every_verdict_names_its_interval():
    _, aa = _cmp(synthetic(3), FAST)
    assert aa.verdict.startswith("A/A consistent: no difference between A and itself (")
    assert aa.verdict.endswith(", 95% CI over 10 runs, sign-flip)")
    # B's times read twice as long: an A/A that fails
    _, biased = _cmp(synthetic(9, effect=0.0, bias_sd=0.0).with_columns(
        pl.when(pl.col("pair") == "B").then(pl.col("iteration_time_ns") * 2)
        .otherwise(pl.col("iteration_time_ns")).alias("iteration_time_ns")), FAST)  # fmt: skip
    assert biased.verdict.startswith("A/A FAILED: A differs from itself (+")
    assert biased.verdict.endswith(", 95% CI over 10 runs, sign-flip): the setup is biased")
