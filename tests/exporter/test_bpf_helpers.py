"""The bucket helpers of bpf/exp_common.h, run in the kernel (BPF_PROG_TEST_RUN),
agree with the bounds the exporter writes as ``le``."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.exporter.histogram import Buckets, bucket_bounds, slot_of

pytestmark = pytest.mark.bpf

#: The one-entry histogram map both programs observe into, as the exporter's
#: objects declare theirs: ``slots`` (the buckets, the overflow) then the sum.
HIST_MAP = r"""
#include "exp_common.h"

struct hist {
	u64 slots[%(slots)s]; /* %(why)s */
	u64 sum;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct hist);
} hist SEC(".maps");
"""

SOURCE = HIST_MAP % {"slots": "4 + 2", "why": "exp2, bucket_max 4: slots 0..4 and the overflow"}
SOURCE += r"""
static const u64 fixed_bounds[3] = { 3, 10, 250 };

/* args[0]: the value, args[1]: 0 exp2 (and observe it), 1 exp2zero, 2 linear,
 * 3 fixed */
SEC("raw_tp")
int slot(struct bpf_raw_tracepoint_args *ctx)
{
	u64 v = ctx->args[0];
	u32 zero = 0;
	struct hist *h;

	if (ctx->args[1] == 1)
		return exp_slot_exp2zero(v);
	if (ctx->args[1] == 2)
		return exp_slot_linear(v);
	if (ctx->args[1] == 3)
		return EXP_SLOT_FIXED(v, fixed_bounds);
	h = bpf_map_lookup_elem(&hist, &zero);
	if (h)
		EXP_OBSERVE(h, exp_slot_exp2(v), v);
	return exp_slot_exp2(v);
}
"""


VALUES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 1000, 1024, 1025, 2**20, 2**20 + 1]
VALUES += [2**32 - 1, 2**32, 2**32 + 1, 2**63, 2**64 - 1]


def run(fd: int, value: int, kind: int) -> int:
    args = (ctypes.c_uint64 * 2)(value, kind)
    opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
    opts.ctx_in = ctypes.cast(args, ctypes.c_void_p)
    opts.ctx_size_in = ctypes.sizeof(args)
    rc = lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts))
    assert rc == 0, f"BPF_PROG_TEST_RUN failed: {rc}"
    return opts.retval


def test_kernel_slots_match_the_exported_bounds(compile_bpf: Callable[[str, str], Path]) -> None:
    path = compile_bpf("exp_slots", SOURCE)
    with open_and_load(path) as obj:
        fd = obj.programs["slot"].fd
        wide = bucket_bounds("exp2", 70)  # wide enough that nothing is clamped
        for v in VALUES:
            assert run(fd, v, 0) == slot_of("exp2", v, wide), v
            assert run(fd, v, 1) == slot_of("exp2zero", v, wide), v
            assert run(fd, v, 2) == min(v, 2**32 - 1), v
            assert run(fd, v, 3) == slot_of("fixed", v, (3.0, 10.0, 250.0)), v
        raw = obj.map("hist").lookup(0)
        assert raw is not None
        words = np.frombuffer(raw, dtype="<u8")
    # The observed histogram: each value in the slot of its bound, the large
    # ones in the overflow slot, and the exact sum (mod 2^64, as u64 adds).
    b = Buckets(bucket_bounds("exp2", 4))
    expected = np.zeros(b.value_words, dtype=np.uint64)
    for v in VALUES:
        expected[slot_of("exp2", v, b.bounds)] += 1
    expected[-1] = sum(VALUES) % 2**64
    assert words.tolist() == expected.tolist()
    cumulative = b.cumulative(words[: b.nslots]).tolist()
    assert cumulative == [sum(v <= bound for v in VALUES) for bound in b.bounds] + [len(VALUES)]


NS_SOURCE = HIST_MAP % {
    "slots": "12 + 2",
    "why": "exp2 in µs, bucket_max 12 (4.096 ms) and the overflow",
}
NS_SOURCE += r"""
/* args[0]: a duration in ns, observed as runqlat and biolatency observe theirs */
SEC("raw_tp")
int observe(struct bpf_raw_tracepoint_args *ctx)
{
	u32 zero = 0;
	struct hist *h = bpf_map_lookup_elem(&hist, &zero);

	if (h)
		EXP_OBSERVE_NS_AS_US(h, ctx->args[0]);
	return 0;
}
"""

#: durations in ns around the µs bounds: 1,500 ns is above le=1e-06, 4,999 ns above 4e-06
NS_VALUES = [0, 1, 999, 1000, 1001, 1500, 1999, 2000, 2001, 3999, 4000, 4001, 4999]
NS_VALUES += [8_000, 8_900, 1_000_000, 4_096_000, 4_096_001, 10_000_000]


def test_a_duration_in_ns_lands_in_the_bucket_whose_le_holds_it(
    compile_bpf: Callable[[str, str], Path],
) -> None:
    """Each wait is counted in the first bucket whose ``le`` (µs times 1e-6, as
    runqlat's and biolatency's are served) is at least the wait, and the sum is
    the waits' total to the nearest µs each."""
    path = compile_bpf("exp_ns_as_us", NS_SOURCE)
    with open_and_load(path) as obj:
        fd = obj.programs["observe"].fd
        for ns in NS_VALUES:
            run(fd, ns, 0)
        raw = obj.map("hist").lookup(0)
        assert raw is not None
        words = np.frombuffer(raw, dtype="<u8")
    b = Buckets(bucket_bounds("exp2", 12), multiplier=1e-6)
    seconds = [ns / 1e9 for ns in NS_VALUES]
    # Prometheus' le: the count of observations at most the bound
    want = [sum(s <= bound * 1e-6 for s in seconds) for bound in b.bounds] + [len(seconds)]
    assert b.cumulative(words[: b.nslots]).tolist() == want
    assert abs(float(b.sums(words)[()]) - sum(seconds)) <= len(seconds) * 0.5e-6
