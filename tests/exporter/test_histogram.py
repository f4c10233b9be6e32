"""Bucket slots to cumulative Prometheus buckets, for every bucket type."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kernmlops.exporter.config import HistogramSpec
from kernmlops.exporter.histogram import Buckets, bucket_bounds, slot_of


def spec(**kw) -> HistogramSpec:
    return HistogramSpec(name="h", help="h", map="m", **kw)


@pytest.mark.parametrize(
    ("kind", "bucket_max", "keys", "expected"),
    [
        ("exp2", 4, None, (1, 2, 4, 8, 16)),
        ("exp2zero", 4, None, (0, 1, 2, 4, 8)),
        ("linear", 3, None, (0, 1, 2, 3)),
        ("fixed", None, [0.5, 10, 100], (0.5, 10, 100)),
    ],
)
def test_bounds(kind: str, bucket_max: int | None, keys: list | None, expected: tuple) -> None:
    assert bucket_bounds(kind, bucket_max, keys) == tuple(float(x) for x in expected)


@pytest.mark.parametrize("kind", ["exp2", "exp2zero", "linear", "fixed"])
def test_every_value_lands_in_the_slot_whose_bound_holds_it(kind: str) -> None:
    """The slot rule (bpf/exp_common.h, mirrored by slot_of) agrees with the
    bounds the exporter writes: value <= le of its slot, > le of the one before."""
    bounds = bucket_bounds(kind, 12, None) if kind != "fixed" else (3.0, 10.0, 250.0)
    for value in [0, 1, 2, 3, 4, 5, 7, 8, 9, 1000, 4095, 4096, 4097, 10**9]:
        slot = slot_of(kind, value, bounds)
        if slot == len(bounds):  # overflow: above every bound
            assert value > bounds[-1]
            continue
        assert value <= bounds[slot]
        assert slot == 0 or value > bounds[slot - 1]


def test_cumulative_counts_with_inf_and_overflow() -> None:
    b = Buckets.from_spec(spec(bucket_type="exp2", bucket_max=3))
    assert b.le == ("1.0", "2.0", "4.0", "8.0", "+Inf")
    assert (b.nslots, b.value_words) == (5, 6)
    slots = np.array([[3, 0, 2, 1, 4], [0, 0, 0, 0, 0]], dtype=np.uint64)
    assert b.cumulative(slots).tolist() == [[3, 3, 5, 6, 10], [0, 0, 0, 0, 0]]


def test_bucket_min_folds_lower_slots_into_the_first_bucket() -> None:
    b = Buckets.from_spec(spec(bucket_type="exp2", bucket_max=4, bucket_min=2))
    assert b.le == ("4.0", "8.0", "16.0", "+Inf")
    assert b.cumulative(np.array([5, 1, 1, 0, 2, 7], np.uint64)).tolist() == [7, 7, 9, 16]


def test_multiplier_scales_bounds_and_sum() -> None:
    b = Buckets.from_spec(
        spec(bucket_type="exp2", bucket_max=2, bucket_multiplier=1e-6, bucket_min=0)
    )
    assert b.le == ("1e-06", "2e-06", "4e-06", "+Inf")
    values = np.array([[1, 1, 1, 1, 1_000_010]], np.uint64)  # 4 slots, then the sum in µs
    assert b.sums(values).tolist() == pytest.approx([1.00001])


def test_exp2zero_and_linear_and_fixed_labels() -> None:
    assert Buckets.from_spec(spec(bucket_type="exp2zero", bucket_max=3)).le == (
        "0.0", "1.0", "2.0", "4.0", "+Inf",
    )  # fmt: skip
    lin = Buckets.from_spec(spec(bucket_type="linear", bucket_max=2, bucket_multiplier=10))
    assert lin.le == ("0.0", "10.0", "20.0", "+Inf")
    fixed = Buckets.from_spec(spec(bucket_type="fixed", bucket_keys=[0.5, 10, 1e6]))
    assert fixed.le == ("0.5", "10.0", "1e+06", "+Inf")


def test_without_exact_sum_each_observation_counts_as_its_upper_bound() -> None:
    b = Buckets.from_spec(spec(bucket_type="linear", bucket_max=3, sum=False))
    assert b.value_words == b.nslots == 5
    # two at 1, one at 3, one above 3 (counted as the last bound, 3)
    assert b.sums(np.array([0, 2, 0, 1, 1], np.uint64)).item() == 2 * 1 + 3 + 3


def test_random_observations_match_a_direct_count() -> None:
    """Slots filled by the kernel's rule give, once cumulative, exactly the
    number of observations <= each bound, and sum and count."""
    rng = random.Random(5)
    values = [int(rng.lognormvariate(5, 2)) for _ in range(5000)]
    for kind, kw in [
        ("exp2", {"bucket_max": 16}),
        ("exp2zero", {"bucket_max": 16}),
        ("linear", {"bucket_max": 300}),
        ("fixed", {"bucket_keys": [10, 100, 1000, 10000]}),
    ]:
        b = Buckets.from_spec(spec(bucket_type=kind, bucket_multiplier=0.001, **kw))
        words = np.zeros(b.value_words, np.uint64)
        for v in values:
            words[slot_of(kind, v, b.bounds)] += 1
            words[-1] += v
        cumulative = b.cumulative(words[: b.nslots]).tolist()
        direct = [sum(v <= bound for v in values) for bound in b.bounds] + [len(values)]
        assert cumulative == direct, kind
        assert b.sums(words).item() == pytest.approx(sum(values) * 0.001)


def test_wrong_slot_count_is_refused() -> None:
    b = Buckets.from_spec(spec(bucket_type="exp2", bucket_max=3))
    with pytest.raises(ValueError, match="4 slots, want 5"):
        b.cumulative(np.zeros(4, np.uint64))
