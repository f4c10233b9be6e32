"""MLLB's features and MLP in Q20.11, written again for the tests with plain
Python integers, one decision at a time: an evaluator independent of the
package's (numpy in kernmlops.lb.features and fixed, C in bpf/lb_model.h),
following MLLB's definitions (src_len > src_preferred_len, delta < the
migration cost, loads / 1000, delta_faults / total_faults, nr_balance_failed >
cache_nice_tries) and its fixed-point code: values << 11, each product >> 11,
C's division (toward zero), ReLU, migrate when the logit > 0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

FBITS = 11
ONE = 1 << FBITS
LIMIT = (1 << 20) - 1  # |v| << 11 fits an int32


def _clamp(v: int) -> int:
    return max(-LIMIT, min(LIMIT, v))


def _cdiv(a: int, b: int) -> int:
    """C's integer division of a by b > 0."""
    q = abs(a) // b
    return -q if a < 0 else q


def features(row: Mapping[str, int], migration_cost_ns: int) -> list[int]:
    """The 15 Q20.11 features of one decision (canonical columns)."""
    flag = lambda name: (1 if row[name] else 0) << FBITS  # noqa: E731
    total, delta = _clamp(int(row["total_faults"])), _clamp(int(row["delta_faults"]))
    return [
        (1 if row["src_len"] > row["src_preferred_len"] else 0) << FBITS,
        (1 if row["delta_ns"] < migration_cost_ns else 0) << FBITS,
        flag("cpu_idle"),
        flag("cpu_not_idle"),
        flag("cpu_newly_idle"),
        flag("same_node"),
        flag("prefer_src"),
        flag("prefer_dst"),
        (_clamp(int(row["src_len"])) - 2) * ONE,
        _clamp(int(row["src_load"])) * ONE // 1000,
        _clamp(int(row["dst_load"])) * ONE // 1000,
        _clamp(int(row["dst_len"])) * ONE,
        _cdiv(delta * ONE, total) if total > 0 else delta * ONE,
        (1 if row["nr_balance_failed"] > row["cache_nice_tries"] else 0) << FBITS,
        flag("buddy_hot"),
    ]


def logit(
    x: Sequence[int], w1: Sequence[Sequence[int]], b1: Sequence[int], w2: Sequence[int], b2: int
) -> int:
    """The Q20.11 logit: w1 is 15 rows (features) of 10 (hidden units)."""
    out = b2
    for j in range(len(b1)):
        h = b1[j] + sum((x[k] * w1[k][j]) >> FBITS for k in range(len(x)))
        out += (max(h, 0) * w2[j]) >> FBITS
    return out
