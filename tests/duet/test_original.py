"""``--method original``: the original asynchronous-duet analysis, checked
against an independent computation (brute-force pairs, plain per-run means,
scipy.stats.bootstrap BCa with the same seed), not against itself."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from kernmlops.duet.analysis import Options, analyze, pair_intervals
from kernmlops.duet.original import original_warmup, two_pointer_pairs
from kernmlops.duet.process import RESULT_SCHEMA

MS = 1_000_000


def _rows(suite, bench, kind, runid, order, pair, times_ns, starts_ns, parser="harness"):
    return [
        {
            "suite": suite, "benchmark": bench, "runid": runid, "kind": kind, "order": order,
            "pair": pair, "aa": False, "iteration": i, "epoch_start_ms": None,
            "iteration_start_ns": int(s), "iteration_end_ns": int(s + t),
            "iteration_time_ns": int(t), "timing": "measured", "side_status": "ok",
            "parser": parser, "source_file": "x",
        }
        for i, (t, s) in enumerate(zip(times_ns, starts_ns, strict=True))
    ]  # fmt: skip


def _duet_table(rng: np.random.Generator, runs: int = 8, n: int = 30, slow: float = 1.02):
    """Duet runs: A and B back to back, B offset by a random phase, so each
    iteration overlaps two of the other side's by uneven amounts."""
    rows = []
    for r in range(runs):
        for pair, scale, phase in (("A", 1.0, 0), ("B", slow, int(rng.integers(0, 20 * MS)))):
            t = (50 * MS * scale * rng.lognormal(0, 0.03, n)).astype(np.int64)
            starts = phase + np.concatenate([[0], np.cumsum(t)[:-1]])
            rows += _rows("loops", "mul", "duet", r, "AB" if r % 2 == 0 else "BA", pair, t, starts)
    return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")


def _independent_duet_means(df: pl.DataFrame, p: float) -> list[float]:
    """Every overlapping A/B pair (brute force), kept when the overlap exceeds
    p of each iteration's time; per run the plain mean of A - B."""
    means = []
    for runid in sorted(set(df["runid"].to_list())):
        run = df.filter(pl.col("runid") == runid)
        a = run.filter(pl.col("pair") == "A").rows(named=True)
        b = run.filter(pl.col("pair") == "B").rows(named=True)
        diffs = []
        for x in a:
            for y in b:
                ov = min(x["iteration_end_ns"], y["iteration_end_ns"]) - max(
                    x["iteration_start_ns"], y["iteration_start_ns"]
                )
                tx, ty = x["iteration_time_ns"], y["iteration_time_ns"]
                if ov > 0 and tx * p < ov and ty * p < ov:
                    diffs.append(tx - ty)
        if diffs:
            means.append(sum(diffs) / len(diffs))
    return means


def test_original_duet_estimate_and_interval_match_an_independent_bca():
    rng = np.random.default_rng(7)
    df = _duet_table(rng)
    analysis = analyze(df, Options(mds=False, seed=11))
    orig = analysis.benchmarks[0].comparisons["duet"].original
    means = np.array(_independent_duet_means(df, 0.4))
    assert orig.n_runs == len(means) == 8
    assert orig.estimate_ns == pytest.approx(means.mean(), rel=1e-12)
    ref = stats.bootstrap(
        (means,), np.mean, n_resamples=9999, method="BCa", confidence_level=0.95,
        rng=np.random.default_rng(11),
    )  # fmt: skip
    assert orig.ci_ns == pytest.approx(
        (ref.confidence_interval.low, ref.confidence_interval.high), rel=1e-9
    )
    # A - B is negative when B is 2 % slower; the verdict follows the interval
    lo, hi = orig.ci_ns
    expected = "slower" if hi < 0 else "faster" if lo > 0 else "none"
    assert orig.detected == expected
    summary = analysis.summary()["benchmarks"][0]["comparisons"]["duet"]["original"]
    assert summary["ci_b_minus_a_ns"] == pytest.approx([-hi, -lo])


def test_original_sequential_pairs_by_iteration_number():
    rng = np.random.default_rng(3)
    rows = []
    for r in range(6):
        for pair, scale in (("A", 1.0), ("B", 1.05)):
            t = (10 * MS * scale * rng.lognormal(0, 0.05, 12)).astype(np.int64)
            n = 12 if pair == "A" else 10  # B timed out early: its 2 last iterations unmatched
            t = t[:n]
            rows += _rows("loops", "mul", "sequential", r, None, pair, t, np.cumsum(t) - t)
    df = pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")
    orig = analyze(df, Options(mds=False, seed=5)).benchmarks[0].comparisons["sequential"].original
    means = []
    for r in range(6):
        a = df.filter((pl.col("runid") == r) & (pl.col("pair") == "A"))["iteration_time_ns"]
        b = df.filter((pl.col("runid") == r) & (pl.col("pair") == "B"))["iteration_time_ns"]
        means.append(np.mean([a[i] - b[i] for i in range(10)]))
    ref = stats.bootstrap((np.array(means),), np.mean, n_resamples=9999, method="BCa",
                          rng=np.random.default_rng(5))  # fmt: skip
    assert orig.n_pairs == 60 and orig.estimate_ns == pytest.approx(np.mean(means))
    assert orig.ci_ns == pytest.approx(tuple(ref.confidence_interval), rel=1e-9)
    assert orig.detected == "slower" and "B is slower than A" in orig.verdict


def test_two_pointer_misses_what_our_pairing_finds():
    # A0 spans B0 and B1; the walk moves past A0 after its first partner
    a_s, a_e = np.array([0, 100]), np.array([100, 200])
    b_s, b_e = np.array([10, 55]), np.array([55, 140])
    walk = two_pointer_pairs(a_s, a_e, b_s, b_e)
    assert (0, 1) not in walk and walk == [(0, 0), (1, 1)]
    ia, ib, _ = pair_intervals(a_s, a_e, b_s, b_e, min_overlap=0.01)
    assert (0, 1) in set(zip(ia.tolist(), ib.tolist(), strict=True))


def test_original_warmup_is_half_of_java_runs_counted_as_its_parsers_count():
    rows = []
    for suite, parser in (
        ("dacapo", "dacapo"),
        ("renaissance", "renaissance"),
        ("loops", "harness"),
    ):
        for pair in "AB":
            t = np.full(10, MS)
            rows += _rows(suite, "x", "duet", 0, "AB", pair, t, np.arange(10) * MS, parser)
    df = pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")
    kept = original_warmup(df).group_by("suite").agg(pl.col("iteration").min(), pl.len())
    got = {r["suite"]: (r["iteration"], r["len"]) for r in kept.iter_rows(named=True)}
    # DaCapo counts 1..10 (keep >= 5: ours 4..9); Renaissance 0..9 (keep >= 4.5: 5..9)
    assert got == {"dacapo": (4, 12), "renaissance": (5, 10), "loops": (0, 20)}


def test_our_auto_warmup_is_per_suite_and_configurable():
    rows = []
    for suite in ("scalabench", "loops"):
        for pair in "AB":
            for r in range(5):
                t = np.full(10, MS)
                rows += _rows(suite, "x", "sequential", r, None, pair, t, np.arange(10) * MS)
    df = pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")
    auto = {
        b.suite: b.comparisons["sequential"].n_a for b in analyze(df, Options(mds=False)).benchmarks
    }
    assert auto == {"scalabench": 25, "loops": 50}
    fixed = analyze(df, Options(warmup="2", mds=False)).benchmarks
    assert {b.suite: b.comparisons["sequential"].n_a for b in fixed} == {
        "scalabench": 40, "loops": 40
    }  # fmt: skip


@pytest.mark.parametrize("slow", [1.0, 1.01, 1.04, 0.97])
def test_every_interval_agrees_with_its_verdict(slow: float):
    df = _duet_table(np.random.default_rng(int(slow * 100)), slow=slow)
    c = analyze(df, Options(mds=False)).benchmarks[0].comparisons["duet"]
    lo, hi = c.diff_ci.low, c.diff_ci.high
    assert {"slower": lo > 0, "faster": hi < 0, "none": lo <= 0 <= hi}[c.detected]
    assert (c.ratio_ci.low > 1) == (lo > 0) and (c.ratio_ci.high < 1) == (hi < 0)
    o = c.original
    o_lo, o_hi = -o.ci_ns[1], -o.ci_ns[0]  # as B - A
    assert {"slower": o_lo > 0, "faster": o_hi < 0, "none": o_lo <= 0 <= o_hi}[o.detected]


def test_below_min_runs_the_original_verdict_keeps_its_numbers_and_says_it_is_not_reliable(
    tmp_path,
):
    """4 runs: the original's BCa verdict as the original gives it (its numbers kept),
    one line beneath saying it is not reliable, as analysis.json does; the exit status
    is the default method's, which calls the same runs inconclusive. With --min-runs 4
    the verdict stands alone."""
    import json

    from click.testing import CliRunner

    from kernmlops.duet.cli import duet_group

    df = _duet_table(np.random.default_rng(5), runs=4, slow=1.05)
    df.write_parquet(tmp_path / "duet-results.parquet")
    direct = analyze(df, Options(mds=False)).benchmarks[0].comparisons["duet"]
    assert direct.verdict.startswith("inconclusive: 4 runs, need ≥ 5")
    # an independent BCa over the runs' plain means: the original's numbers
    means = np.array(_independent_duet_means(df, 0.4))
    ref = stats.bootstrap((means,), np.mean, n_resamples=9999, method="BCa",
                          rng=np.random.default_rng(0))  # fmt: skip
    assert direct.original.ci_ns == pytest.approx(tuple(ref.confidence_interval), rel=1e-9)

    def run(*args: str):
        res = CliRunner().invoke(duet_group, ["analyze", str(tmp_path), "--no-mds", *args])
        summary = json.loads((tmp_path / "report" / "analysis.json").read_text())
        return res, summary["benchmarks"][0]["comparisons"]["duet"]["original"]

    ours, _ = run()
    res, original = run("--method", "original")
    assert res.exit_code == ours.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    at = lines.index(f"loops mul [duet] (original): {direct.original.verdict}")
    assert "B is slower than A: B - A +" in lines[at]
    said = "not reliable: 4 runs, fewer than --min-runs 5"
    assert lines[at + 1].startswith(f"warning: loops mul [duet] (original): {said}")
    assert sum(said in line for line in lines) == 1
    assert original["verdict"] == direct.original.verdict
    assert original["ci_b_minus_a_ns"] == pytest.approx([-x for x in ref.confidence_interval][::-1])
    assert original["reliable"] is False and original["note"].startswith(said)
    assert said in (tmp_path / "report" / "report.md").read_text()
    res, original = run("--method", "original", "--min-runs", "4")
    assert res.exit_code == 0 and "not reliable" not in res.output
    assert original["reliable"] is True and original["note"] is None


def test_two_sessions_of_one_suite_keep_their_runs_apart():
    """Two `duet run` folders of one config processed together: their run ids are
    alike (0..5 each), their artifacts (date, host) are not, and 12 runs are 12
    runs, by our method and the original's (which groups by its artifacts too),
    not 6 runs each pooling two sessions' iterations."""
    first = _duet_table(np.random.default_rng(1), runs=6).with_columns(
        pl.lit("Mon Nov 30 10:00:00 UTC 2026").alias("artifact_date"),
        pl.lit("host").alias("artifact_hostname"),
    )
    second = _duet_table(np.random.default_rng(2), runs=6).with_columns(
        pl.lit("Tue Dec  1 10:00:00 UTC 2026").alias("artifact_date"),
        pl.lit("host").alias("artifact_hostname"),
    )
    opts = Options(mds=False)
    alone = [analyze(t, opts).benchmarks[0].comparisons["duet"] for t in (first, second)]
    both = analyze(pl.concat([first, second]), opts).benchmarks[0].comparisons["duet"]
    assert both.n_runs == 12 and both.original.n_runs == 12
    assert both.n_pairs == sum(c.n_pairs for c in alone)
    assert both.original.n_pairs == sum(c.original.n_pairs for c in alone)
    # the original's estimate is the plain mean over runs: of the two sessions' alike
    assert both.original.estimate_ns == pytest.approx(
        np.mean([c.original.estimate_ns for c in alone])
    )
