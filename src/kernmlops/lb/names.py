"""The names and constants of MLLB's features, without numpy or polars (the
kernel module's loader runs them in the lab, where imports are slow)."""

from __future__ import annotations

FEATURES: tuple[str, ...] = (
    "src_non_pref_nr",
    "delta_hot",
    "cpu_idle",
    "cpu_not_idle",
    "cpu_newly_idle",
    "same_node",
    "prefer_src",
    "prefer_dst",
    "src_len",
    "src_load",
    "dst_load",
    "dst_len",
    "delta_faults",
    "extra_fails",
    "buddy_hot",
)
NR_FEATURES = len(FEATURES)

#: Q20.11: 11 fractional bits in an int32, as MLLB's FXDPT_FBITS.
FBITS = 11
ONE = 1 << FBITS
#: Inputs are clamped so that value << 11 fits an int32 (|v| < 2^20).
Q_LIMIT = (1 << 20) - 1
