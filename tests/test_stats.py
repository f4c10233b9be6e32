"""The one percentile definition: the smallest value with at least q of the values at
or below it, against counts made here and against numpy and Spark's definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernmlops.stats import quantile, quantile_of_counts, quantile_rank


def test_a_percentile_is_a_value_that_occurred_with_q_of_the_values_at_or_below_it() -> None:
    values = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    # Spark's percentile_approx(1..10, q) for these q (its documented definition)
    assert [quantile(values, q) for q in (0, 0.1, 0.15, 0.5, 0.55, 0.9, 0.99, 1)] == [
        1, 1, 2, 5, 6, 9, 10, 10,
    ]  # fmt: skip
    # linear interpolation would give 5.5, polars' nearest rank 6: here 5 of 10 are <= 5
    assert quantile(np.array([10, 1, 7, 3, 9, 2, 8, 4, 6, 5]), 0.5) == 5
    assert math.isnan(quantile(np.array([]), 0.5))


def test_the_rank_is_exact_where_q_n_is_not_in_floating_point() -> None:
    values = np.arange(1, 101)
    assert 0.07 * 100 > 7  # 7.000000000000001
    assert quantile_rank(100, 0.07) == 6 and quantile(values, 0.07) == 7
    # numpy rounds q n up in floating point, as Spark does (percentile_approx of 1..100
    # at 0.07 is 8, measured with pyspark 4.3)
    assert np.quantile(values, 0.07, method="inverted_cdf") == 8
    with pytest.raises(ValueError, match="between 0 and 1"):
        quantile_rank(10, 1.5)


@pytest.mark.parametrize("seed", [1, 2])
def test_from_value_counts_as_from_the_values(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 30, 500)
    values, counts = np.unique(rows, return_counts=True)
    for q in (0, 0.25, 0.5, 0.9, 0.99, 1):
        assert quantile_of_counts(values, counts, q) == quantile(rows, q)
        assert quantile(rows, q) == np.quantile(rows, q, method="inverted_cdf")
