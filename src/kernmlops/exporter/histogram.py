"""In-kernel bucket slots to Prometheus' cumulative buckets.

A histogram's map value is ``u64 slots[n + 1]`` and, with ``sum``, one more
``u64``: slot i counts observations at most ``bounds[i]`` (and above the
previous bound), the last slot those above every bound, which only +Inf
shows. The bound of each slot, by bucket type (v is the raw value the
program observed, see bpf/exp_common.h):

- exp2:     slot i holds (2^(i-1), 2^i], slot 0 also 0 and 1: le = 2^i
- exp2zero: slot 0 holds 0 only, slot i >= 1 (2^(i-2), 2^(i-1)]: le = 0, 1, 2, 4, ...
- linear:   slot i holds the value i: le = i
- fixed:    slot i holds (keys[i-1], keys[i]]: le = keys[i]

``le`` is the bound times ``bucket_multiplier`` (e.g. 1e-6: µs to seconds).
Buckets below ``bucket_min`` are not shown; being cumulative, their counts
are in the first bucket that is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from prometheus_client.utils import floatToGoString

from kernmlops.exporter.spec import HistogramSpec


@dataclass(frozen=True)
class Buckets:
    #: raw upper bound of each slot but the overflow one
    bounds: tuple[float, ...]
    multiplier: float = 1.0
    #: index of the first bucket shown
    first: int = 0
    #: the value holds the exact sum after the slots
    has_sum: bool = True

    @classmethod
    def from_spec(cls, spec: HistogramSpec) -> Buckets:
        return cls(
            bucket_bounds(spec.bucket_type, spec.bucket_max, spec.bucket_keys),
            spec.bucket_multiplier,
            spec.bucket_min,
            spec.sum,
        )

    @property
    def nslots(self) -> int:
        """Slots in the kernel's value: one per bound, plus the overflow slot."""
        return len(self.bounds) + 1

    @property
    def value_words(self) -> int:
        """u64 words of the map value."""
        return self.nslots + (1 if self.has_sum else 0)

    @property
    def le(self) -> tuple[str, ...]:
        """The ``le`` label of each bucket shown, +Inf last."""
        return (*(floatToGoString(b * self.multiplier) for b in self.bounds[self.first :]), "+Inf")

    def cumulative(self, slots: np.ndarray) -> np.ndarray:
        """``(..., nslots)`` slot counts -> ``(..., len(le))`` cumulative counts, +Inf last."""
        slots = np.asarray(slots, dtype=np.uint64)
        if slots.shape[-1] != self.nslots:
            raise ValueError(f"{slots.shape[-1]} slots, want {self.nslots}")
        total = np.cumsum(slots, axis=-1, dtype=np.uint64)
        return np.concatenate([total[..., self.first : len(self.bounds)], total[..., -1:]], axis=-1)

    def sums(self, values: np.ndarray) -> np.ndarray:
        """``_sum`` of each row of ``(..., value_words)`` values, in output units.

        Without an exact sum in the kernel, each observation counts as its
        bucket's upper bound (the overflow ones as the last bound): an upper
        estimate.
        """
        values = np.asarray(values, dtype=np.uint64)
        if self.has_sum:
            return values[..., self.nslots].astype(np.float64) * self.multiplier
        upper = np.array([*self.bounds, self.bounds[-1]], dtype=np.float64)
        return values[..., : self.nslots].astype(np.float64) @ upper * self.multiplier


def bucket_bounds(
    bucket_type: str, bucket_max: int | None, bucket_keys: list[float] | None = None
) -> tuple[float, ...]:
    """Raw upper bound of each slot (the overflow slot excluded)."""
    if bucket_type == "fixed":
        if not bucket_keys:
            raise ValueError("fixed buckets need bucket_keys")
        return tuple(float(k) for k in bucket_keys)
    if bucket_max is None:
        raise ValueError(f"{bucket_type} buckets need bucket_max")
    if bucket_type == "exp2":
        return tuple(float(2**i) for i in range(bucket_max + 1))
    if bucket_type == "exp2zero":
        return (0.0, *(float(2**i) for i in range(bucket_max)))
    if bucket_type == "linear":
        return tuple(float(i) for i in range(bucket_max + 1))
    raise ValueError(f"unknown bucket type {bucket_type!r}")


def slot_of(bucket_type: str, value: int, bounds: tuple[float, ...]) -> int:
    """The slot the kernel puts ``value`` in (the C helpers, in Python: for
    tests and for programs that want to check their own arithmetic)."""
    if bucket_type == "exp2":
        slot = 0 if value <= 1 else (value - 1).bit_length()
    elif bucket_type == "exp2zero":
        slot = 0 if value == 0 else (0 if value <= 1 else (value - 1).bit_length()) + 1
    elif bucket_type == "linear":
        slot = value
    else:
        slot = next((i for i, b in enumerate(bounds) if value <= b), len(bounds))
    return min(slot, len(bounds))
