"""Percentiles: the one definition every figure kernmlops prints uses.

The q quantile of n values is the smallest value with at least q of them at or below
it: the value of rank ceil(q n) (from 1) in ascending order, the inverse of the
empirical CDF (Hyndman and Fan's type 1, numpy's ``method="inverted_cdf"`` but for
its floating-point rounding of q n; what
Spark's ``percentile_approx`` computes, exactly, below its accuracy's row count). It is
always a value that occurred (a whole µs, never an average of two), and it lies where
a CDF graph of the same rows reaches q. The graphs, the report's table summaries, the
duet summaries and the lb shadow report all take it from here.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike
else:
    np = lazy_import("numpy")

__all__ = ["quantile", "quantile_of_counts", "quantile_rank"]


def quantile_rank(n: int, q: float) -> int:
    """The index (from 0, in ascending order) of the ``q`` quantile of ``n`` values.
    Exact: 0.07 of 100 values is the 7th, not the 8th that 0.07 * 100 in floating
    point (7.000000000000001) rounds up to (numpy's inverted_cdf gives the 8th)."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, got {q}")
    if n <= 0:
        raise ValueError("no values")
    return max(math.ceil(Fraction(str(q)) * n) - 1, 0)


def quantile(values: ArrayLike, q: float) -> float:
    """The ``q`` quantile of ``values`` (see the module doc); NaN for none."""
    arr = np.asarray(values).ravel()
    if not arr.size:
        return math.nan
    k = quantile_rank(arr.size, q)
    return float(np.partition(arr, k)[k])


def quantile_of_counts(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """The ``q`` quantile of rows given as distinct ``values`` (ascending) and the rows
    of each: what :func:`quantile` gives on the rows themselves."""
    ends = np.cumsum(counts)
    if not ends.size or ends[-1] <= 0:
        return math.nan
    k = quantile_rank(int(ends[-1]), q)
    return float(values[np.searchsorted(ends, k, side="right")])
