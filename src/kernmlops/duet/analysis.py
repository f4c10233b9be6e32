"""``duet analyze``: is B different from A, and how small a change could we see?

The method, step by step (every choice is an option of ``Options``):

1. **Warm-up**: the first iterations of each side of each run are dropped
   (``warmup``: a count, or a percentage of the side's iterations). The
   default, ``auto``, is the original tool's choice per suite: half of the
   iterations of the Java suites (renaissance, dacapo, scalabench, or any
   file read by the Renaissance or DaCapo parser), none elsewhere.
2. **Pairing** (duet and sync-duet runs): an A iteration and a B iteration of
   the same run are a pair when they overlap in time by at least
   ``min_overlap`` of the *longer* of the two::

       ratio = overlap / max(len A, len B),  overlap = min(ends) - max(starts)

   so both iterations spent most of their time side by side and saw the same
   interference. Touching iterations (overlap 0) never pair; a short iteration
   nested in a long one pairs only when their lengths are within
   1/min_overlap of each other; an iteration may pair with two of the other
   side's (equal lengths offset by about half). The trade-off, measured on
   this project's 2-vCPU VM under a load average of 15: dividing by the
   longer keeps pairs of similar lengths, which pulls ratios towards 1 (a 15 %
   slowdown injected into B read as +7 %), but dividing by the shorter (or
   pairing every overlap) read +15 % with a CI four times as wide, so it
   detected less: the longer it is.
3. **Per run**: the mean of the paired differences ``B - A`` and of the paired
   log ratios ``log(B / A)`` (its exp is the geometric-mean ratio), each pair
   weighted by the time the two iterations ran side by side (its overlap), so
   every moment of the run counts once however the iterations are cut.
   Sequential runs have no pairs: run i of A meets run i of B, and the per-run
   values are ``mean(B) - mean(A)`` and ``mean(log B) - mean(log A)``.
4. **Confidence intervals** of the mean over runs, the run being the unit
   that repeats (a process's layout, its CPUs and the machine's state differ
   between runs, not within one). Duet runs alternate the orders AB and BA
   (which side starts first and gets the first CPU list), so with at least 5
   runs of each order, each order's runs are a stratum: the estimate is the
   mean of the two orders' means (a CPU or start-order bias then cancels
   instead of widening the CI). ``interval`` picks how the run-level interval
   is made:

   - ``signflip`` (the default): a randomization interval, every shift d that
     a sign-flip test does not reject (see signflip_interval). It is exact
     when A and B are exchangeable (a run's value then is as likely as its
     mirror image about the true shift; with two orders, an AB run's as a BA
     run's), however heavy the tails, and so it is not widened. At 95 % it
     needs 6 runs of one order, or 5 of each; fewer get ``t``, with a note.
   - ``bca``: bootstrap BCa (scipy.stats.bootstrap), each order resampled on
     its own, widened for small samples by Hesterberg's factor
     ``t(n-k) / z * sqrt(m / (m - 1))`` (n values in k strata of m;
     ``expand``; 1.31 for 10 runs in 2 orders, 1.22 for 10 runs in one, 1.06
     for 30). Its skew correction, estimated from 10 runs, moves the interval
     away from 1 when one disturbed run moves the mean: simulated A/A duets
     with heavy-tailed runs fail it 7-12 % of the time instead of 5 %.
   - ``t``: Welch's t over the orders' means (symmetric, not widened;
     conservative when a few runs are disturbed).

   With fewer than ``min_runs`` runs there is no interval and no verdict
   ("inconclusive: 4 runs, need ≥ 5 for a verdict"), only the estimate over
   the runs: the iterations of one run share its layout, CPUs and machine
   state, so an interval over them (as if they were independent samples)
   leaves out the run-to-run variation and calls A/A duets biased that are
   not (2-4 runs of A/A duets whose runs differ by a few percent: 21 of 30
   duet and 12 of 30 sequential ones "failed" that way).
5. **Verdict**: B is slower (faster) when the CI of the geometric-mean ratio
   lies above (below) 1; the verdict names the CI's unit and kind ("95% CI
   over 10 runs, sign-flip"). The difference B - A is reported as that ratio and
   its CI times A's mean iteration time, so its interval says what the verdict
   says (a difference interval bootstrapped on its own can contain 0 beside a
   ratio interval that excludes 1). Mann-Whitney U on all iterations is
   reported beside it. For an A/A duet the verdict says whether the setup
   itself is biased. The original tool's analysis of the same rows
   (kernmlops.duet.original) is computed beside ours; ``method`` says which
   of the two verdicts leads.
6. **Minimum detectable slowdown**: B's iterations are made 0-15 % slower,
   later iterations shifted by the added time (so what overlaps changes), the
   runs are re-paired and re-tested; the MDS is the smallest slowdown on the
   grid whose CI lies above 1 (found by bisection; detection grows with the
   slowdown).
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    from scipy import stats
else:
    # imported at the first interval (0.7 s): `duet analyze` refuses a bad table first
    stats = lazy_import("scipy.stats")

RUN_KEYS = ("suite", "benchmark", "kind", "runid", "order")
#: what tells apart two sessions of one suite processed together (two `duet run`
#: folders, whose run ids are alike): the artifacts the original groups its runs
#: by too (its ARTIFACT_COL); without them run 0 of each would be one run
SESSION_KEYS = tuple(f"artifact_{n}" for n in ("date", "hostname", "lscpu", "meminfo", "uname"))


def run_keys(columns: list[str] | tuple[str, ...]) -> list[str]:
    """The columns that name one run in a table with ``columns``: RUN_KEYS, then
    the session artifacts it has."""
    return [*RUN_KEYS, *(c for c in SESSION_KEYS if c in columns)]


METHODS = ("kernmlops", "original")
#: how the run-level interval is made (see run_interval)
INTERVALS = ("bca", "t", "signflip")
JAVA_SUITES = ("renaissance", "dacapo", "scalabench")
JAVA_PARSERS = ("renaissance", "dacapo")


#: bounds of Options.resamples. The sign-flip group is an array of resamples x runs
#: and the bootstrap keeps one statistic per resample, so memory grows with it;
#: 100,000 (10x the original's 9,999) keeps that to a few hundred MB at most
MIN_RESAMPLES = 100
MAX_RESAMPLES = 100_000


@dataclass(frozen=True)
class Options:
    warmup: str = "auto"
    min_overlap: float = 0.4
    confidence: float = 0.95
    resamples: int = 2000
    min_runs: int = 5
    expand: bool = True
    seed: int = 0
    max_slowdown: float = 0.15
    slowdown_step: float = 0.0025
    mds: bool = True
    method: str = "kernmlops"
    interval: str = "signflip"

    def __post_init__(self) -> None:
        if self.interval not in INTERVALS:
            raise OptionError("interval", f"{self.interval!r}: one of {', '.join(INTERVALS)}")
        if self.method not in METHODS:
            raise OptionError("method", f"{self.method!r}: one of {', '.join(METHODS)}")
        if str(self.warmup).strip() != "auto":
            try:
                parse_warmup(self.warmup)
            except ValueError as err:
                raise OptionError("warmup", str(err)) from None
        if not 0 < self.min_overlap <= 1:
            raise OptionError("min_overlap", f"must be in (0, 1] (got {self.min_overlap})")
        if not 0.5 < self.confidence < 1:
            raise OptionError("confidence", f"must be between 0.5 and 1 (got {self.confidence})")
        if not MIN_RESAMPLES <= self.resamples <= MAX_RESAMPLES:
            raise OptionError(
                "resamples", f"must be {MIN_RESAMPLES} to {MAX_RESAMPLES} (got {self.resamples})"
            )
        if self.min_runs < 2:
            raise OptionError("min_runs", f"must be at least 2 (got {self.min_runs})")
        if self.seed < 0:  # numpy's generators take no negative seed
            raise OptionError("seed", f"must be 0 or more (got {self.seed})")


class OptionError(ValueError):
    """An Options field that cannot be: ``field`` names it (the CLI's option is
    ``--`` and the field with ``-`` for ``_``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field
        self.message = message


def parse_warmup(text: str | int) -> tuple[int, float]:
    """``"3"`` -> (3 iterations, 0); ``"10%"`` -> (0, 0.10)."""
    s = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", s)
    if m:
        frac = float(m.group(1)) / 100
        if frac >= 1:
            raise ValueError(f"warm-up {s}: must be below 100%")
        return 0, frac
    if re.fullmatch(r"\d+", s):
        return int(s), 0.0
    raise ValueError(f"warm-up {s!r}: a count (3) or a percentage (10%)")


def java_rows(columns: list[str]) -> pl.Expr:
    """Rows of a Java suite (the original's warm-up applies to them)."""
    java = pl.col("suite").is_in(list(JAVA_SUITES))
    if "parser" in columns:
        java = java | pl.col("parser").fill_null("").is_in(list(JAVA_PARSERS))
    return java


def after_warmup(warmup: str | int, columns: list[str] | None = None) -> pl.Expr:
    """True for the iterations kept: each side's first ones in each run are not.
    ``auto``: half of each side's iterations for the Java suites, none else."""
    if str(warmup).strip() == "auto":
        keys = [*run_keys(columns or []), "pair"]
        rank = pl.col("iteration").rank("ordinal").over(keys) - 1
        half = (pl.len().over(keys) * 0.5).floor()
        return ~java_rows(columns or []) | (rank >= half)
    count, frac = parse_warmup(warmup)
    if not count and not frac:
        return pl.lit(True)
    keys = [*run_keys(columns or []), "pair"]
    rank = pl.col("iteration").rank("ordinal").over(keys) - 1
    cut = pl.lit(count) if count else (pl.len().over(keys) * frac).floor()
    return rank >= cut


def drop_warmup(df: pl.DataFrame, warmup: str | int) -> pl.DataFrame:
    """Drop each side's first iterations in each run."""
    return df.filter(after_warmup(warmup, df.columns))


# --- pairing --------------------------------------------------------------------
def pair_intervals(
    a_start: np.ndarray,
    a_end: np.ndarray,
    b_start: np.ndarray,
    b_end: np.ndarray,
    min_overlap: float = 0.4,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices (into A, into B) of overlapping pairs and their overlap ratios.

    Each side's intervals are one after another (sorted, not overlapping each
    other). ratio = overlap / max(len A, len B); pairs need ratio >= min_overlap.
    """
    a_start, a_end = np.asarray(a_start, np.int64), np.asarray(a_end, np.int64)
    b_start, b_end = np.asarray(b_start, np.int64), np.asarray(b_end, np.int64)
    if not len(a_start) or not len(b_start):
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    a_order, b_order = np.argsort(a_start, kind="stable"), np.argsort(b_start, kind="stable")
    bs, be = b_start[b_order], b_end[b_order]
    # B intervals that can overlap A[i]: end > A.start and start < A.end
    lo = np.searchsorted(np.maximum.accumulate(be), a_start[a_order], side="right")
    hi = np.searchsorted(bs, a_end[a_order], side="left")
    counts = np.maximum(hi - lo, 0)
    ia = np.repeat(np.arange(len(a_order)), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    ib = np.repeat(lo, counts) + offsets
    ia, ib = a_order[ia], b_order[ib]
    overlap = np.minimum(a_end[ia], b_end[ib]) - np.maximum(a_start[ia], b_start[ib])
    longer = np.maximum(a_end[ia] - a_start[ia], b_end[ib] - b_start[ib])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(longer > 0, overlap / np.maximum(longer, 1), 0.0)
    keep = (overlap > 0) & (ratio >= min_overlap)
    return ia[keep], ib[keep], ratio[keep]


def inject_slowdown(start: np.ndarray, end: np.ndarray, slowdown: float) -> tuple[np.ndarray, ...]:
    """Each iteration ``slowdown`` longer; later iterations start later by the
    time added before them (the gaps between iterations are kept)."""
    start = np.asarray(start, np.int64)
    end = np.asarray(end, np.int64)
    if slowdown == 0 or not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    added = ((e - s) * slowdown).astype(np.int64)
    shift = np.concatenate([[0], np.cumsum(added)[:-1]])
    ns, ne = s + shift, e + shift + added
    out_s, out_e = np.empty_like(ns), np.empty_like(ne)
    out_s[order], out_e[order] = ns, ne
    return out_s, out_e


# --- statistics -------------------------------------------------------------------
@dataclass
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def _mean_of_means(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean([np.mean(s, axis=axis) for s in samples], axis=0)


def expansion(n: int, confidence: float, strata: int = 1) -> float:
    """Hesterberg's widening of bootstrap intervals for small samples: the
    bootstrap's variance has divisor n (not n - 1) and uses z, not t. With
    ``strata`` groups, t has n - strata degrees of freedom."""
    if n <= strata:
        return 1.0
    alpha = 1 - confidence
    per = n / strata  # observations per group (balanced)
    t = stats.t.ppf(1 - alpha / 2, n - strata)
    return float(t / stats.norm.ppf(1 - alpha / 2) * math.sqrt(per / (per - 1)))


def bootstrap_ci(
    samples: tuple[np.ndarray, ...],
    opts: Options,
    rng: np.random.Generator,
) -> Interval | None:
    """BCa CI of the mean of one sample; with several samples (strata, e.g.
    the runs of order AB and of order BA) of the mean of their means, each
    resampled on its own."""
    samples = tuple(np.asarray(s, float) for s in samples)
    if any(len(s) < 2 for s in samples):
        return None
    statistic = _mean_of_means
    estimate = float(statistic(*samples))
    if all(np.ptp(s) == 0 for s in samples):
        return Interval(estimate, estimate)
    n = max(len(s) for s in samples)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples are handled below
        res = stats.bootstrap(
            samples,
            statistic,
            n_resamples=opts.resamples,
            confidence_level=opts.confidence,
            method="BCa",
            vectorized=True,
            paired=False,
            batch=max(1, 4_000_000 // n),
            rng=rng,
        )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if opts.expand:
        k = expansion(sum(len(s) for s in samples), opts.confidence, len(samples))
        lo, hi = estimate - (estimate - lo) * k, estimate + (hi - estimate) * k
    return Interval(lo, hi)


def t_interval(samples: tuple[np.ndarray, ...], confidence: float) -> Interval | None:
    """Symmetric interval of the mean of the strata's means: Welch's standard
    error, Satterthwaite's degrees of freedom. Per-run log ratios of a duet are
    symmetric under "no difference" (A and B are exchangeable), so a sample's
    skew is noise: BCa's skew correction, estimated from 10 runs, moves the
    interval away from 1 whenever one disturbed run moves the mean."""
    samples = tuple(np.asarray(s, float) for s in samples)
    if any(len(s) < 2 for s in samples):
        return None
    k = len(samples)
    est = float(np.mean([s.mean() for s in samples]))
    v = [s.var(ddof=1) / len(s) / k**2 for s in samples]
    var = sum(v)
    if var == 0:
        return Interval(est, est)
    df = var**2 / sum(vi**2 / (len(s) - 1) for vi, s in zip(v, samples, strict=True))
    half = float(stats.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(var)
    return Interval(est - half, est + half)


def _signflip_coefficients(
    sizes: tuple[int, ...], resamples: int, rng: np.random.Generator
) -> tuple[np.ndarray, bool]:
    """The randomization group as rows of coefficients: row @ values is the
    statistic (mean of the strata's means) of one sign pattern, the observed one
    being the weights themselves. All of the group when it has at most
    ``resamples`` members (exact), else ``resamples`` random members.

    One stratum (or more than two): each value's sign flipped on its own. The
    two orders AB and BA: swapping the start order mirrors a run's ratio about
    the true one, so an AB value flipped is a BA value: the group relabels which
    of the AB values and mirrored BA values are AB (a two-sample permutation),
    and an order's bias cancels in every member instead of widening the CI."""
    n, k = sum(sizes), len(sizes)
    weights = np.concatenate([np.full(m, 1 / (k * m)) for m in sizes])
    if k == 2:
        n1, n2 = sizes
        mirror = np.concatenate([np.ones(n1), -np.ones(n2)])
        exact = math.comb(n, n1) <= resamples
        if exact:
            first = np.zeros((math.comb(n, n1), n), bool)
            for row, idx in enumerate(itertools.combinations(range(n), n1)):
                first[row, list(idx)] = True
        else:
            # the places of 0 .. n1-1 in a random permutation: a uniform n1-subset
            first = rng.permuted(np.broadcast_to(np.arange(n), (resamples, n)), axis=1) < n1
        coef = np.where(first, 1 / (2 * n1), -1 / (2 * n2)) * mirror
        return coef, exact
    exact = 2**n <= resamples
    if exact:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2.0 - 1.0
    else:
        signs = rng.integers(0, 2, (resamples, n)) * 2.0 - 1.0
    return signs * weights, exact


def signflip_interval(
    samples: tuple[np.ndarray, ...], opts: Options, rng: np.random.Generator
) -> Interval | None:
    """Randomization interval of the mean of the strata's means: every shift d
    that a sign-flip test of the values minus d does not reject at 1 -
    confidence. p is the share of the group (_signflip_coefficients) whose
    statistic is at least as far from 0 as the observed one; with random
    members (1 + count) / (resamples + 1). The same members test every d, so
    the kept shifts are one interval around the estimate, its ends computed in
    closed form. Exact, so not widened, when the runs' values are symmetric
    about the true shift (with two orders: when an AB run's value and a BA
    run's mirrored one are exchangeable), which A and B being exchangeable
    gives. None when the group is too small to reject any shift (at 95 % it
    needs 6 runs of one order, or 5 of each)."""
    samples = tuple(np.asarray(s, float) for s in samples)
    if any(len(s) < 2 for s in samples):
        return None
    coef, exact = _signflip_coefficients(tuple(len(s) for s in samples), opts.resamples, rng)
    x = np.concatenate(samples)
    k = len(samples)
    est = float(sum(s.mean() for s in samples) / k)
    # A member's statistic at shift d is a + u*b and the observed one is u (u = est - d):
    # |a + u*b| >= |u| holds on an interval of u around 0 (|b| <= 1), ends below
    a, b = coef @ (x - est), coef.sum(axis=1)
    whole = np.abs(b) > 1 - 1e-9  # the observed pattern (and its mirror) count at every d
    with np.errstate(divide="ignore", invalid="ignore"):
        r1 = np.where(whole, np.inf, a / (1 - b))
        r2 = np.where(whole, -np.inf, -a / (1 + b))
    hi = np.where(whole, np.inf, np.maximum(r1, r2))
    lo = np.where(whole, -np.inf, np.minimum(r1, r2))
    alpha = 1 - opts.confidence
    members = len(coef)
    # d is kept while at least `need` members count (p >= alpha); 1e-9: float noise
    if exact:  # p = count / members
        need = math.ceil(alpha * members - 1e-9)
    else:  # p = (1 + count) / (members + 1)
        need = math.ceil(alpha * (members + 1) - 1 - 1e-9)
    if need < 1:
        return None
    u_hi = float(np.partition(hi, members - need)[members - need])  # need-th largest
    u_lo = float(np.partition(lo, need - 1)[need - 1])  # need-th smallest
    if not (math.isfinite(u_hi) and math.isfinite(u_lo)):
        return None
    return Interval(est - u_hi, est - u_lo)


def run_interval(
    samples: tuple[np.ndarray, ...], opts: Options, rng: np.random.Generator
) -> tuple[Interval | None, str]:
    """The interval over runs that ``opts.interval`` names, and which one was
    made: too few runs for a sign-flip interval get Welch's t (the symmetric
    one that needs no group). Only BCa is widened: the others are small-sample
    intervals already."""
    if opts.interval == "signflip":
        ci = signflip_interval(samples, opts, rng)
        if ci is not None:
            return ci, "signflip"
    if opts.interval in ("signflip", "t"):
        return t_interval(samples, opts.confidence), "t"
    return bootstrap_ci(samples, opts, rng), "bca"


#: fewest runs of each order for strata (a bootstrap of fewer is crude)
STRATUM_MIN = 5


def _strata(values: np.ndarray, orders: list[Any]) -> tuple[np.ndarray, ...]:
    """Split by order (AB/BA) when each has at least STRATUM_MIN values: the
    sides' places (CPUs, who starts first) swap between orders, so an order's
    bias is removed from the spread instead of widening the CI."""
    groups = {o: values[[i for i, x in enumerate(orders) if x == o]] for o in set(orders)}
    if len(groups) > 1 and all(len(g) >= STRATUM_MIN for g in groups.values()):
        return tuple(groups[o] for o in sorted(groups, key=str))
    return (values,)


@dataclass
class Run:
    """One run's iterations of both sides, after warm-up removal."""

    key: tuple[Any, ...]
    a_start: np.ndarray
    a_end: np.ndarray
    a_time: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    b_time: np.ndarray
    #: full series before warm-up removal (timestamps shift on injection)
    b_all_start: np.ndarray | None = None
    b_all_end: np.ndarray | None = None
    b_all_time: np.ndarray | None = None
    b_kept: np.ndarray | None = None  # mask of kept iterations in the full series
    #: A's iterations before warm-up removal (None: as many as kept)
    n_a_all: int | None = None

    def counts_before_warmup(self) -> tuple[int, int]:
        """A's and B's iterations before warm-up removal."""
        a = len(self.a_time) if self.n_a_all is None else self.n_a_all
        b = len(self.b_time) if self.b_all_time is None else len(self.b_all_time)
        return a, b

    def slowed(self, slowdown: float) -> Run:
        if slowdown == 0:
            return self
        if self.b_all_start is None:
            s, e = inject_slowdown(self.b_start, self.b_end, slowdown)
            return Run(self.key, self.a_start, self.a_end, self.a_time, s, e,
                       self.b_time * (1 + slowdown))  # fmt: skip
        s, e = inject_slowdown(self.b_all_start, self.b_all_end, slowdown)
        assert self.b_kept is not None and self.b_all_time is not None
        k = self.b_kept
        return Run(self.key, self.a_start, self.a_end, self.a_time, s[k], e[k],
                   self.b_all_time[k] * (1 + slowdown))  # fmt: skip


@dataclass
class Comparison:
    """A against B for one benchmark and one kind of run."""

    kind: str
    aa: bool
    unit: str  # run: the CI is over runs | none: no CI (fewer runs than min_runs, or no data)
    n_runs: int
    n_pairs: int
    n_a: int
    n_b: int
    mean_a_ns: float
    mean_b_ns: float
    mean_diff_ns: float | None
    diff_ci: Interval | None
    gm_ratio: float | None
    ratio_ci: Interval | None
    mwu_p: float | None
    verdict: str
    detected: str  # slower | faster | none | unknown
    #: the interval made (see run_interval): signflip | t | bca; none below min_runs
    interval: str = "none"
    mds: float | None = None  # fraction; None: not within max_slowdown
    mds_note: str = ""
    notes: list[str] = field(default_factory=list)
    runs: pl.DataFrame | None = None
    pairs: pl.DataFrame | None = None
    original: Any = None  # kernmlops.duet.original.OriginalResult
    #: iterations before warm-up removal (None: as many as n_a, n_b)
    n_a_all: int | None = None
    n_b_all: int | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "aa": self.aa,
            "unit": self.unit,
            "interval": self.interval,
            "n_runs": self.n_runs,
            "n_pairs": self.n_pairs,
            "n_a": self.n_a,
            "n_b": self.n_b,
            "n_a_before_warmup": self.n_a if self.n_a_all is None else self.n_a_all,
            "n_b_before_warmup": self.n_b if self.n_b_all is None else self.n_b_all,
            "mean_a_ns": self.mean_a_ns,
            "mean_b_ns": self.mean_b_ns,
            "mean_diff_ns": self.mean_diff_ns,
            "diff_ci_ns": self.diff_ci.as_list() if self.diff_ci else None,
            "diff_note": "B - A: the ratio and its CI times A's mean iteration time",
            "gm_ratio": self.gm_ratio,
            "ratio_ci": self.ratio_ci.as_list() if self.ratio_ci else None,
            "mann_whitney_p": self.mwu_p,
            "verdict": self.verdict,
            "detected": self.detected,
            "mds": self.mds,
            "mds_note": self.mds_note,
            "notes": self.notes,
            "original": self.original.summary() if self.original is not None else None,
        }


def _detected(ci: Interval | None) -> str:
    if ci is None:
        return "unknown"
    if ci.low > 1:
        return "slower"
    if ci.high < 1:
        return "faster"
    return "none"


#: the intervals as a verdict names them
INTERVAL_LABELS = {"signflip": "sign-flip", "t": "Welch's t", "bca": "BCa"}


def ci_label(confidence: float, n_runs: int, interval: str) -> str:
    """What a verdict's interval is: "95% CI over 10 runs, sign-flip"."""
    return f"{confidence:.0%} CI over {n_runs} runs, {INTERVAL_LABELS.get(interval, interval)}"


def inconclusive(n_runs: int, min_runs: int, ratio: float) -> str:
    """The verdict of too few runs: the estimate over them, no interval."""
    return (
        f"inconclusive: {n_runs} run{'s' * (n_runs != 1)}, need ≥ {min_runs} for a verdict "
        f"(--min-runs): B/A {(ratio - 1) * 100:+.2f}% over them, no interval"
    )


def _verdict(detected: str, ratio: float | None, ci: Interval | None, aa: bool, label: str) -> str:
    """The verdict of an interval over runs, ``label`` (ci_label) saying which."""
    if ci is None or ratio is None:
        return "no verdict: too little data for a confidence interval"
    pct = f"{(ratio - 1) * 100:+.2f}% [{(ci.low - 1) * 100:+.2f}%, {(ci.high - 1) * 100:+.2f}%]"
    if aa:
        if detected == "none":
            return f"A/A consistent: no difference between A and itself ({pct}, {label})"
        return f"A/A FAILED: A differs from itself ({pct}, {label}): the setup is biased"
    if detected == "slower":
        return f"B is slower than A by {pct} ({label})"
    if detected == "faster":
        return f"B is faster than A: {pct} ({label})"
    return f"no difference detected ({pct}, {label})"


def _duet_values(
    runs: list[Run], opts: Options
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per run: paired differences, log ratios, and weights (overlap time)."""
    diffs, logs, weights = [], [], []
    for r in runs:
        ia, ib, _ = pair_intervals(r.a_start, r.a_end, r.b_start, r.b_end, opts.min_overlap)
        ta, tb = r.a_time[ia].astype(float), r.b_time[ib].astype(float)
        overlap = np.minimum(r.a_end[ia], r.b_end[ib]) - np.maximum(r.a_start[ia], r.b_start[ib])
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.log(tb / ta)
        keep = np.isfinite(g)  # a zero-length iteration has no ratio
        diffs.append((tb - ta)[keep])
        logs.append(g[keep])
        weights.append(overlap[keep].astype(float))
    return diffs, logs, weights


def _weighted_mean(values: np.ndarray, weights: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(values * weights, axis=axis) / np.sum(weights, axis=axis)


def _duet_ci(
    runs: list[Run], opts: Options, rng: np.random.Generator
) -> tuple[str, int, int, float | None, Interval | None, float | None, Interval | None, str]:
    diffs, logs, weights = _duet_values(runs, opts)
    used = [i for i, d in enumerate(diffs) if len(d)]
    n_pairs = int(sum(len(d) for d in diffs))
    if len(used) >= opts.min_runs:
        unit = "run"
        d = np.array([_weighted_mean(diffs[i], weights[i]) for i in used])
        g = np.array([_weighted_mean(logs[i], weights[i]) for i in used])
        orders = [runs[i].key[4] for i in used]
        d_strata, g_strata = _strata(d, orders), _strata(g, orders)
        dci = None  # the difference's CI follows from the ratio's (see compare)
        gci, made = run_interval(g_strata, opts, rng)
        mean_d, mean_g = float(_mean_of_means(*d_strata)), float(_mean_of_means(*g_strata))
    elif used:
        # Too few runs for an interval over them: the estimate alone. The pairs of
        # one run are not independent samples (see the module's step 4).
        unit = "none"
        d = np.array([_weighted_mean(diffs[i], weights[i]) for i in used])
        g = np.array([_weighted_mean(logs[i], weights[i]) for i in used])
        dci, gci, made = None, None, "none"
        mean_d, mean_g = float(d.mean()), float(g.mean())
    else:
        return "none", 0, n_pairs, None, None, None, None, "none"
    rci = Interval(math.exp(gci.low), math.exp(gci.high)) if gci else None
    return unit, len(used), n_pairs, mean_d, dci, math.exp(mean_g), rci, made


def _seq_ci(
    runs: list[Run], opts: Options, rng: np.random.Generator
) -> tuple[str, int, float | None, Interval | None, float | None, Interval | None, str]:
    both = [r for r in runs if len(r.a_time) and len(r.b_time)]
    if len(both) >= opts.min_runs:
        unit = "run"
        d = np.array([r.b_time.mean() - r.a_time.mean() for r in both])
        g = np.array([np.log(r.b_time).mean() - np.log(r.a_time).mean() for r in both])
        dci = None
        gci, made = run_interval((g,), opts, rng)
        mean_d, mean_g = float(d.mean()), float(g.mean())
    else:
        # Too few runs for an interval over them: the estimate alone, over the runs
        # with both sides. A run's iterations are not independent samples.
        unit = "none"
        if not both:
            return unit, 0, None, None, None, None, "none"
        d = np.array([r.b_time.mean() - r.a_time.mean() for r in both])
        g = np.array([np.log(r.b_time).mean() - np.log(r.a_time).mean() for r in both])
        dci, gci, made = None, None, "none"
        mean_d, mean_g = float(d.mean()), float(g.mean())
    rci = Interval(math.exp(gci.low), math.exp(gci.high)) if gci else None
    return unit, len(both), mean_d, dci, math.exp(mean_g), rci, made


#: how a side's status in duet-run.json reads in a sentence
_ENDED = {"failed": "failed", "timeout": "timed out", "error": "could not run",
          "not-started": "did not start"}  # fmt: skip


#: where a side's reason is, when no stderr of it names it
_PROCESS_SAID = "`duet process` named why in its warnings"


def _ending(side: str, sides: pl.DataFrame | None) -> tuple[str | None, str]:
    """How ``side``'s trials ended, from duet-run.json (kernmlops.duet.process.
    side_outcomes): (the account, or None where it is not at hand; where to look: the
    stderr file of its first run that did not end ok)."""
    rows = None if sides is None else sides.filter(pl.col("pair") == side)
    if rows is None or rows.height == 0:
        return None, _PROCESS_SAID
    counts = rows.group_by("status", "error").len().sort("len", "status", descending=[True, False])
    if counts.height == 1 and counts["status"][0] == "ok":
        return "it ended ok, but its result files gave none", _PROCESS_SAID
    parts = []
    for status, error, n in counts.iter_rows():
        what = _ENDED.get(status, status or "unknown")
        if error and error != status:
            what += f" ({error})"
        where = f"{n} of {rows.height} runs"
        if n == rows.height:
            where = f"all {n} runs" if n > 1 else "its only run"
        parts.append(f"{what} in {where}")
    failed = rows.filter(pl.col("status").fill_null("") != "ok").sort("runid", "order")
    named = failed["stderr"] if "stderr" in failed.columns else ()
    logs = list(dict.fromkeys(p for p in named if p))
    if not logs:  # it never started: no file of its own
        where = "duet-run.json has its error"
    else:
        more = len(logs) - 1
        where = f"its stderr: {logs[0]}" + (f" (and {more} more beside it)" if more else "")
    return ", ".join(parts), where


def _no_iteration(side: str, sides: pl.DataFrame | None) -> tuple[str, str]:
    """Why ``side`` has no iteration, from how its trials ended in duet-run.json
    (kernmlops.duet.process.side_outcomes), and where to look."""
    cause = f"{side} has no iteration in any run"
    how, where = _ending(side, sides)
    return (f"{cause}: {how}" if how else cause), where


def _no_iteration_either(sides: pl.DataFrame | None) -> tuple[str, str]:
    """Why neither side has an iteration (the benchmark has no row in the results),
    each side's account, and where to look."""
    (a_how, a_where), (b_how, b_where) = _ending("A", sides), _ending("B", sides)
    cause = "no iterations on either side"
    if a_how or b_how:
        cause += f" (A: {a_how or 'gave none'}; B: {b_how or 'gave none'})"
    if a_where == b_where:
        return cause, a_where

    def of(side: str, where: str) -> str:
        if where.startswith("its "):
            return f"{side}'s {where.removeprefix('its ')}"
        return f"{side}: {where}"

    return cause, f"{of('A', a_where)}; {of('B', b_where)}"


def no_data_cause(
    runs: list[Run], kind: str, opts: Options, n_pairs: int, sides: pl.DataFrame | None = None
) -> tuple[str, str] | None:
    """Why A and B of these runs cannot be compared: (the cause, what to do), or
    None when nothing stops it. In this order: a side with no iteration in any
    run (how it ended, from ``sides``: kernmlops.duet.process.side_outcomes), a
    side whose every iteration the warm-up drops, no run with both sides, and
    (duet and sync-duet runs) none of the ``n_pairs`` pairs overlapping by
    --min-overlap."""
    before = [r.counts_before_warmup() for r in runs]
    kept = [(len(r.a_time), len(r.b_time)) for r in runs]
    if not any(a or b for a, b in before):  # no row: a benchmark whose every side failed
        return _no_iteration_either(sides)
    for i, side in enumerate("AB"):
        if not sum(c[i] for c in before):
            return _no_iteration(side, sides)
    dropped = [side for i, side in enumerate("AB") if not sum(c[i] for c in kept)]
    if dropped:
        most = max(c[i] for c in before for i, side in enumerate("AB") if side in dropped)
        return (
            f"the warm-up ({opts.warmup}) drops every iteration of {' and '.join(dropped)}",
            f"lower --warmup below {most} (the most iterations a side has in a run)",
        )
    if kind == "sequential":
        return None  # no pairs: A's and B's iterations are compared as they are
    if not any(a and b for a, b in kept):
        a_runs = ", ".join(str(r.key[3]) for r, (a, _) in zip(runs, kept, strict=True) if a)
        b_runs = ", ".join(str(r.key[3]) for r, (_, b) in zip(runs, kept, strict=True) if b)
        return (
            "no run has iterations of both A and B",
            f"pairs come from one run (A's are in run(s) {a_runs}, B's in {b_runs})",
        )
    if n_pairs == 0:
        return (
            f"no A/B iterations overlap by {opts.min_overlap:.0%} of the longer one",
            "lower --min-overlap, or make the iterations of similar length",
        )
    return None


def compare(
    runs: list[Run], kind: str, aa: bool, opts: Options, sides: pl.DataFrame | None = None
) -> Comparison:
    """Compare A and B over ``runs`` of one kind (duet, syncduet, sequential).
    ``sides``: how each side of these runs ended (kernmlops.duet.process.
    side_outcomes), named when a side has no iteration."""
    rng = np.random.default_rng(opts.seed)
    a_all = np.concatenate([r.a_time for r in runs]) if runs else np.zeros(0)
    b_all = np.concatenate([r.b_time for r in runs]) if runs else np.zeros(0)
    notes: list[str] = []
    pairs_frame = None
    if kind == "sequential":
        unit, n_runs, mean_d, dci, ratio, rci, made = _seq_ci(runs, opts, rng)
        n_pairs = 0
    else:
        unit, n_runs, n_pairs, mean_d, dci, ratio, rci, made = _duet_ci(runs, opts, rng)
        pairs_frame = _pairs_frame(runs, opts)
    cause = no_data_cause(runs, kind, opts, n_pairs, sides)
    if cause:
        notes.append(f"{cause[0]}; {cause[1]}")
    few = unit != "run" and ratio is not None and not cause
    if few:
        notes.append(
            f"only {n_runs} run{'s' * (n_runs != 1)} with data (< --min-runs {opts.min_runs}): "
            "no interval and no verdict. The iterations of one run are not independent "
            "samples (they share its process layout, CPUs and machine state): an interval "
            "over them leaves the run-to-run variation out and finds differences that "
            "are not there; run more repetitions (duet_repetitions, sequential_repetitions)"
        )
    if unit == "run" and made != opts.interval:
        notes.append(
            f"{n_runs} runs are too few for a {opts.confidence:.0%} sign-flip interval (at 95% "
            "it needs 6 runs, or 5 of each order): the CI is Welch's t"
        )
    mwu_p = None
    if len(a_all) and len(b_all):
        mwu_p = float(stats.mannwhitneyu(a_all, b_all, alternative="two-sided").pvalue)
    detected = _detected(rci)
    mean_a = float(a_all.mean()) if len(a_all) else math.nan
    if ratio is not None and math.isfinite(mean_a):
        # B - A as the ratio times A's mean: its interval agrees with the verdict
        mean_d = mean_a * (ratio - 1)
        dci = Interval(mean_a * (rci.low - 1), mean_a * (rci.high - 1)) if rci else None
    if cause:
        verdict = f"no verdict: {cause[0]}"
    elif few and ratio is not None:
        verdict = inconclusive(n_runs, opts.min_runs, ratio)
    else:
        verdict = _verdict(detected, ratio, rci, aa, ci_label(opts.confidence, n_runs, made))
    cmp = Comparison(
        kind=kind,
        aa=aa,
        unit=unit,
        n_runs=n_runs,
        n_pairs=n_pairs,
        n_a=len(a_all),
        n_b=len(b_all),
        mean_a_ns=float(a_all.mean()) if len(a_all) else math.nan,
        mean_b_ns=float(b_all.mean()) if len(b_all) else math.nan,
        mean_diff_ns=mean_d,
        diff_ci=dci,
        gm_ratio=ratio,
        ratio_ci=rci,
        mwu_p=mwu_p,
        verdict=verdict,
        detected=detected,
        interval=made,
        notes=notes,
        runs=_runs_frame(runs, opts, kind),
        pairs=pairs_frame,
        n_a_all=sum(r.counts_before_warmup()[0] for r in runs),
        n_b_all=sum(r.counts_before_warmup()[1] for r in runs),
    )
    if not opts.mds:
        cmp.mds_note = MDS_SKIPPED  # not "not found": nothing was searched
    elif rci is not None:
        cmp.mds, cmp.mds_note = minimum_detectable_slowdown(runs, kind, opts)
    elif few:
        cmp.mds_note = f"needs ≥ {opts.min_runs} runs (--min-runs)"
    return cmp


def detects(runs: list[Run], kind: str, opts: Options, slowdown: float) -> bool:
    """Whether a ``slowdown`` injected into B is detected (the ratio CI above 1)."""
    rng = np.random.default_rng(opts.seed)
    slowed = [r.slowed(slowdown) for r in runs]
    rci = _seq_ci(slowed, opts, rng)[5] if kind == "sequential" else _duet_ci(slowed, opts, rng)[6]
    return _detected(rci) == "slower"


#: the note of a minimum detectable slowdown that was not looked for (--no-mds)
MDS_SKIPPED = "not computed (--no-mds)"


def minimum_detectable_slowdown(
    runs: list[Run], kind: str, opts: Options
) -> tuple[float | None, str]:
    """The smallest slowdown on the grid (0 .. max_slowdown) that is detected."""
    grid = np.round(np.arange(0, opts.max_slowdown + 1e-12, opts.slowdown_step), 6)
    if detects(runs, kind, opts, 0.0):
        return 0.0, "B is already detected slower without an injected slowdown"
    if not detects(runs, kind, opts, float(grid[-1])):
        return None, f"not detected up to {opts.max_slowdown:.0%}"
    lo, hi = 0, len(grid) - 1  # detects(grid[lo]) False, detects(grid[hi]) True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if detects(runs, kind, opts, float(grid[mid])):
            hi = mid
        else:
            lo = mid
    return float(grid[hi]), ""


def _runs_frame(runs: list[Run], opts: Options, kind: str) -> pl.DataFrame:
    rows = []
    for r in runs:
        row = {"runid": r.key[3], "order": r.key[4], "n_a": len(r.a_time), "n_b": len(r.b_time)}
        if kind == "sequential":
            ok = len(r.a_time) and len(r.b_time)
            row["n_pairs"] = 0
            row["mean_diff_ns"] = float(r.b_time.mean() - r.a_time.mean()) if ok else None
            row["gm_ratio"] = (
                float(np.exp(np.log(r.b_time).mean() - np.log(r.a_time).mean())) if ok else None
            )
        else:
            [d], [g], [w] = _duet_values([r], opts)
            row["n_pairs"] = len(d)
            row["mean_diff_ns"] = float(_weighted_mean(d, w)) if len(d) else None
            row["gm_ratio"] = float(np.exp(_weighted_mean(g, w))) if len(d) else None
        rows.append(row)
    schema = {"runid": pl.Int64, "order": pl.String, "n_a": pl.Int64, "n_b": pl.Int64,
              "n_pairs": pl.Int64, "mean_diff_ns": pl.Float64, "gm_ratio": pl.Float64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema, orient="row")


def _pairs_frame(runs: list[Run], opts: Options) -> pl.DataFrame:
    parts = []
    for r in runs:
        ia, ib, ratio = pair_intervals(r.a_start, r.a_end, r.b_start, r.b_end, opts.min_overlap)
        parts.append(
            pl.DataFrame(
                {
                    "runid": [r.key[3]] * len(ia),
                    "a_start_ns": r.a_start[ia],
                    "a_end_ns": r.a_end[ia],
                    "b_start_ns": r.b_start[ib],
                    "b_end_ns": r.b_end[ib],
                    "a_time_ns": r.a_time[ia],
                    "b_time_ns": r.b_time[ib],
                    "overlap_ratio": ratio,
                },
                schema_overrides={"runid": pl.Int64},
            )
        )
    return pl.concat(parts) if parts else pl.DataFrame()


# --- whole tables -----------------------------------------------------------------
def build_runs(df: pl.DataFrame, warmup: str) -> dict[tuple[str, str, str], list[Run]]:
    """{(suite, benchmark, kind): [Run, ...]} from a results table."""
    full = df.with_columns(after_warmup(warmup, df.columns).alias("_kept"))
    out: dict[tuple[str, str, str], list[Run]] = {}
    if full.height == 0:
        return out
    # Sequential runs of A and B are separate trials: runid pairs them, order is null.
    for key, grp in full.sort("iteration_start_ns", nulls_last=True).group_by(
        run_keys(full.columns), maintain_order=True
    ):
        a = grp.filter((pl.col("pair") == "A") & pl.col("_kept"))
        b_all = grp.filter(pl.col("pair") == "B")
        b = b_all.filter(pl.col("_kept"))

        def col(f: pl.DataFrame, c: str) -> np.ndarray:
            return f[c].fill_null(0).to_numpy().astype(np.int64)

        run = Run(
            key=tuple(key),
            a_start=col(a, "iteration_start_ns"),
            a_end=col(a, "iteration_end_ns"),
            a_time=col(a, "iteration_time_ns"),
            b_start=col(b, "iteration_start_ns"),
            b_end=col(b, "iteration_end_ns"),
            b_time=col(b, "iteration_time_ns"),
            b_all_start=col(b_all, "iteration_start_ns"),
            b_all_end=col(b_all, "iteration_end_ns"),
            b_all_time=col(b_all, "iteration_time_ns"),
            b_kept=b_all["_kept"].to_numpy().astype(bool),
            n_a_all=grp.filter(pl.col("pair") == "A").height,
        )
        out.setdefault((str(key[0]), str(key[1]), str(key[2])), []).append(run)
    for runs in out.values():
        runs.sort(key=lambda r: r.key[3])
    return out


@dataclass
class BenchmarkResult:
    suite: str
    benchmark: str
    aa: bool
    comparisons: dict[str, Comparison]


@dataclass
class Analysis:
    options: Options
    benchmarks: list[BenchmarkResult]
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "options": self.options.__dict__,
            "warnings": self.warnings,
            "benchmarks": [
                {
                    "suite": b.suite,
                    "benchmark": b.benchmark,
                    "aa": b.aa,
                    "comparisons": {k: c.summary() for k, c in b.comparisons.items()},
                }
                for b in self.benchmarks
            ],
        }


def analyze(
    df: pl.DataFrame, opts: Options | None = None, sides: pl.DataFrame | None = None
) -> Analysis:
    """Every benchmark of a results table, each kind of run compared, by our
    method and by the original tool's (``Comparison.original``). ``sides``: how
    each side of each trial ended (kernmlops.duet.process.side_outcomes), which
    names why a side has no iteration (it has no row in the table)."""
    from kernmlops.duet.original import compare_original, original_warmup

    opts = opts or Options()
    warns: list[str] = []
    bad = df.filter(pl.col("iteration_start_ns").is_null() & (pl.col("kind") != "sequential"))
    if bad.height:
        warns.append(f"{bad.height} duet iteration(s) without a start time cannot be paired")
    grouped = build_runs(df, opts.warmup)
    aa_of = {}
    if "aa" in df.columns:
        for row in df.group_by("suite", "benchmark").agg(pl.col("aa").any()).iter_rows():
            aa_of[(row[0], row[1])] = bool(row[2])
    results: dict[tuple[str, str], BenchmarkResult] = {}
    for (suite, bench, kind), runs in sorted(grouped.items()):
        aa = aa_of.get((suite, bench), False)
        res = results.setdefault((suite, bench), BenchmarkResult(suite, bench, aa, {}))
        ends = None
        if sides is not None:
            ends = sides.filter(
                (pl.col("suite") == suite)
                & (pl.col("benchmark") == bench)
                & (pl.col("kind") == kind)
            )
        res.comparisons[kind] = compare(runs, kind, aa, opts, ends)
    if sides is not None:
        # a benchmark (or a kind of its runs) whose sides gave no iteration has no row
        # in the table: named from how its trials ended, not left out in silence
        trials = sides.select("suite", "benchmark", "kind").unique().rows()
        for suite, bench, kind in sorted(set(trials) - set(grouped)):
            aa = aa_of.get((suite, bench), False)
            res = results.setdefault((suite, bench), BenchmarkResult(suite, bench, aa, {}))
            ends = sides.filter(
                (pl.col("suite") == suite)
                & (pl.col("benchmark") == bench)
                & (pl.col("kind") == kind)
            )
            res.comparisons[kind] = compare([], kind, aa, opts, ends)
        results = {key: results[key] for key in sorted(results)}
    # the original's run: ours without the order (its RUN_ID_COL), with the artifacts
    keys = [c for c in run_keys(df.columns) if c != "order"]
    kept = original_warmup(df, keys)
    for b in results.values():
        for kind, c in b.comparisons.items():
            rows = kept.filter(
                (pl.col("suite") == b.suite)
                & (pl.col("benchmark") == b.benchmark)
                & (pl.col("kind") == kind)
            )
            c.original = compare_original(
                rows, kind, b.aa, min_overlap=opts.min_overlap, confidence=opts.confidence,
                seed=opts.seed, min_runs=opts.min_runs, run=keys,
            )  # fmt: skip
    return Analysis(opts, list(results.values()), warns)
