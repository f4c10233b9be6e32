"""The original asynchronous-duet analysis, to compare with ours on the same data.

``duet analyze --method original`` gives the estimate, interval and verdict
that the original tool's processing (``duet/process.py``: ``preprocess_data``,
``compute_ci``, ``arbiter``) gives for the same iterations:

1. **Warm-up**: for the Java suites (renaissance, dacapo, scalabench) the
   iterations numbered below half the run's highest number are dropped (the
   number as the original's parsers give it: DaCapo/ScalaBench count from 1,
   Renaissance from 0); nothing for the other suites.
2. **Pairs**: duet runs are paired by the original's two-pointer walk over the
   two sides' iterations sorted by start (it advances the side that started
   first, so an iteration overlapping two of the other side's meets only the
   first: ours finds both), and a pair is kept when its overlap exceeds
   ``min_overlap`` (0.4) of *each* iteration's time. Sync-duet and sequential
   runs are paired by iteration number (A's i-th with B's i-th).
3. **Per run**: the plain mean of the pair differences, in the original's sign
   ``A - B`` (positive: B is faster).
4. **Interval**: ``scipy.stats.bootstrap`` of the mean over the runs (at least
   2), BCa, 9,999 resamples, 95 %: the original's call with scipy's defaults
   (``seed`` makes it repeatable; the original did not seed).
5. **Verdict**: a difference when the interval excludes 0. Mann-Whitney U
   (two-sided) over all iterations after warm-up, significant below 0.05.

Its numbers are the original's whatever the runs (from 2 on), for comparison with
its results; with fewer than ``--min-runs`` runs, where kernmlops' method gives no
verdict, the result says it is not reliable (``reliable``, ``note``): an interval
over so few runs leaves the run-to-run variation out.

Nothing here is weighted, stratified, widened or on a log scale: that is
kernmlops' own method (kernmlops.duet.analysis), the default.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

JAVA_SUITES = ("renaissance", "dacapo", "scalabench")
RESAMPLES = 9999
#: a run is one (suite, benchmark, kind, runid) as the original groups it
RUN = ("suite", "benchmark", "kind", "runid")


@dataclass
class OriginalResult:
    """One benchmark and kind of run, as the original reports it."""

    kind: str
    n_runs: int
    n_pairs: int
    #: mean over runs of each run's mean pair difference A - B (ns)
    estimate_ns: float | None
    ci_ns: tuple[float, float] | None  # A - B
    mwu_p: float | None
    detected: str  # slower | faster | none | unknown (B against A)
    verdict: str
    #: False with fewer runs than --min-runs (the verdict is the original's all the
    #: same); ``note`` says so in one line
    reliable: bool = True
    note: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "n_runs": self.n_runs,
            "n_pairs": self.n_pairs,
            "mean_a_minus_b_ns": self.estimate_ns,
            "ci_a_minus_b_ns": list(self.ci_ns) if self.ci_ns else None,
            "mean_b_minus_a_ns": -self.estimate_ns if self.estimate_ns is not None else None,
            "ci_b_minus_a_ns": [-self.ci_ns[1], -self.ci_ns[0]] if self.ci_ns else None,
            "mann_whitney_p": self.mwu_p,
            "detected": self.detected,
            "verdict": self.verdict,
            "reliable": self.reliable,
            "note": self.note,
        }


def original_warmup(df: pl.DataFrame, run: list[str] | tuple[str, ...] = RUN) -> pl.DataFrame:
    """Drop the first half of each Java-suite run as the original does (``run``: the
    columns that name a run, RUN and the session's artifacts as the caller has them)."""
    if df.height == 0:
        return df
    parser = pl.col("parser").fill_null("") if "parser" in df.columns else pl.lit("")
    number = pl.col("iteration") + pl.when(parser == "dacapo").then(1).otherwise(0)
    java = pl.col("suite").is_in(list(JAVA_SUITES))
    highest = number.max().over(list(run))
    return df.filter(~java | (number >= highest / 2))


def two_pointer_pairs(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> list[tuple[int, int]]:
    """The original's overlap walk: (index into A, index into B) of each
    overlapping pair it visits; both sides sorted by start beforehand."""
    pairs = []
    ia = ib = 0
    while ia < len(a_start) and ib < len(b_start):
        if min(a_end[ia], b_end[ib]) - max(a_start[ia], b_start[ib]) > 0:
            pairs.append((ia, ib))
        if a_start[ia] == b_start[ib]:
            if a_end[ia] <= b_end[ib]:
                ia += 1
            else:
                ib += 1
        elif a_start[ia] < b_start[ib]:
            ia += 1
        else:
            ib += 1
    return pairs


def _duet_run_diffs(run: pl.DataFrame, min_overlap: float) -> np.ndarray:
    sides = []
    for pair in ("A", "B"):
        side = run.filter(pl.col("pair") == pair).sort("iteration_start_ns")
        sides.append(
            tuple(
                side[c].to_numpy().astype(np.int64)
                for c in ("iteration_start_ns", "iteration_end_ns", "iteration_time_ns")
            )
        )
    (sa, ea, ta), (sb, eb, tb) = sides
    diffs = []
    for i, j in two_pointer_pairs(sa, ea, sb, eb):
        overlap = min(ea[i], eb[j]) - max(sa[i], sb[j])
        if ta[i] * min_overlap < overlap and tb[j] * min_overlap < overlap:
            diffs.append(float(ta[i]) - float(tb[j]))
    return np.asarray(diffs, float)


def _numbered_run_diffs(run: pl.DataFrame) -> np.ndarray:
    """A's and B's iterations with the same number (the mean of any repeats)."""
    by = run.group_by("iteration", "pair").agg(pl.col("iteration_time_ns").cast(pl.Float64).mean())
    a = by.filter(pl.col("pair") == "A").select("iteration", pl.col("iteration_time_ns").alias("a"))
    b = by.filter(pl.col("pair") == "B").select("iteration", pl.col("iteration_time_ns").alias("b"))
    both = a.join(b, on="iteration", how="inner")
    return (both["a"] - both["b"]).to_numpy().astype(float)


def run_means(
    df: pl.DataFrame,
    kind: str,
    min_overlap: float = 0.4,
    run_keys: list[str] | tuple[str, ...] = RUN,
) -> tuple[np.ndarray, int, list[Any]]:
    """Per run of one benchmark and kind: the mean pair difference A - B;
    also the number of pairs and the run ids (runs without pairs are left out)."""
    means, n_pairs, ids = [], 0, []
    for key, run in df.sort("runid").group_by(list(run_keys), maintain_order=True):
        d = _duet_run_diffs(run, min_overlap) if kind == "duet" else _numbered_run_diffs(run)
        if len(d):
            means.append(float(d.mean()))
            n_pairs += len(d)
            ids.append(key[3])
    return np.asarray(means, float), n_pairs, ids


def bca_interval(
    sample: np.ndarray, confidence: float, seed: int | None, resamples: int = RESAMPLES
) -> tuple[float, float] | None:
    """The original's ``bootstrap(data=(sample,), statistic=np.mean)``."""
    if len(sample) < 2:
        return None
    if np.ptp(sample) == 0:
        return float(sample[0]), float(sample[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.bootstrap(
            (sample,),
            np.mean,
            n_resamples=resamples,
            confidence_level=confidence,
            method="BCa",
            rng=np.random.default_rng(seed),
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def compare_original(
    df: pl.DataFrame,
    kind: str,
    aa: bool,
    *,
    min_overlap: float = 0.4,
    confidence: float = 0.95,
    seed: int | None = 0,
    resamples: int = RESAMPLES,
    min_runs: int = 2,
    run: list[str] | tuple[str, ...] = RUN,
) -> OriginalResult:
    """One benchmark's rows of one kind (warm-up already dropped); a verdict from fewer
    than ``min_runs`` runs (--min-runs) is not reliable, and says so."""
    means, n_pairs, _ = run_means(df, kind, min_overlap, run)
    ci = bca_interval(means, confidence, seed, resamples)
    a = df.filter(pl.col("pair") == "A")["iteration_time_ns"].to_numpy()
    b = df.filter(pl.col("pair") == "B")["iteration_time_ns"].to_numpy()
    mwu = float(stats.mannwhitneyu(a, b).pvalue) if len(a) and len(b) else None
    estimate = float(means.mean()) if len(means) else None
    if ci is None:
        detected = "unknown"
    elif ci[0] > 0:  # A - B above 0: B is faster
        detected = "faster"
    elif ci[1] < 0:
        detected = "slower"
    else:
        detected = "none"
    reliable = len(means) >= min_runs
    return OriginalResult(
        kind=kind,
        n_runs=len(means),
        n_pairs=n_pairs,
        estimate_ns=estimate,
        ci_ns=ci,
        mwu_p=mwu,
        detected=detected,
        verdict=_verdict(detected, estimate, ci, aa),
        reliable=reliable,
        note=None if reliable or ci is None else unreliable(len(means), min_runs),
    )


def unreliable(n_runs: int, min_runs: int) -> str:
    """The line that says a verdict of the original's from too few runs is not reliable."""
    return (
        f"not reliable: {n_runs} runs, fewer than --min-runs {min_runs}: its BCa interval "
        "over so few runs leaves the run-to-run variation out (kernmlops' method: inconclusive)"
    )


def _verdict(
    detected: str, estimate: float | None, ci: tuple[float, float] | None, aa: bool
) -> str:
    if ci is None or estimate is None:
        return "no verdict: fewer than 2 runs with pairs"
    # shown as B - A, like kernmlops' own verdicts (the original prints A - B)
    ms = f"{-estimate / 1e6:+.3f} ms [{-ci[1] / 1e6:+.3f}, {-ci[0] / 1e6:+.3f}]"
    if aa:
        if detected == "none":
            return f"A/A consistent: the interval of B - A contains 0 ({ms})"
        return f"A/A FAILED: the interval of B - A excludes 0 ({ms})"
    if detected == "slower":
        return f"B is slower than A: B - A {ms}"
    if detected == "faster":
        return f"B is faster than A: B - A {ms}"
    return f"no difference: the interval of B - A contains 0 ({ms})"
