"""common.h's ring groups: with kmo_ring_groups > 1 a record goes to the ring of its
CPU's group (the array of rings user space filled), with the group found by a shift
or a division; a CPU without a ring in the array writes into ring 0; with one group
everything goes into the object's own ring, as before groups."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.ebpf.ringbuf import RingBuffer

pytestmark = pytest.mark.bpf

SIZE = 1 << 14
SOURCE = r"""
#include "common.h"

struct rec { u64 cpu; u64 seq; };

KMO_RING(rb, rec);

u64 seq = 0;

SEC("raw_tp")
int put(void *ctx)
{
	struct rec *e = KMO_RESERVE(rb, struct rec, 0);

	if (!e)
		return 0;
	e->cpu = bpf_get_smp_processor_id();
	e->seq = __sync_fetch_and_add(&seq, 1);
	KMO_SUBMIT(rb, e);
	return 0;
}
"""
REC = np.dtype([("cpu", "<u8"), ("seq", "<u8")])
TEST_RUN_ON_CPU = 1  # BPF_F_TEST_RUN_ON_CPU


def _run_on(fd: int, cpu: int) -> None:
    opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts), flags=TEST_RUN_ON_CPU, cpu=cpu)
    assert lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts)) == 0


@pytest.mark.parametrize(
    ("globals_", "filled", "want"),
    [
        ({}, 1, [[0, 1, 0, 1, 1], []]),  # one group: the object's own ring
        ({"kmo_ring_groups": 2, "kmo_ring_group_shift": 0}, 2, [[0, 0], [1, 1, 1]]),
        (
            {"kmo_ring_groups": 2, "kmo_ring_group_shift": -1, "kmo_ring_group_cpus": 1},
            2,
            [[0, 0], [1, 1, 1]],
        ),  # a group's size that is no power of two: a division
        ({"kmo_ring_groups": 2, "kmo_ring_group_shift": 0}, 1, [[0, 1, 0, 1, 1], []]),
    ],
    ids=["one", "shift", "division", "no-ring-for-cpu-1"],
)
def test_each_record_goes_to_its_cpus_groups_ring(
    compile_bpf: Callable[[str, str], Path], globals_: dict, filled: int, want: list[list[int]]
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("ring groups are tested with 2 CPUs at least")
    path = compile_bpf("ring_groups", SOURCE)
    groups = globals_.get("kmo_ring_groups", 1)
    extra = -1
    with open_and_load(path, globals_=globals_,
                       max_entries={"rb": SIZE, "rb_groups": groups}) as obj:  # fmt: skip
        rings = [RingBuffer(obj.map("rb").fd, SIZE, REC)]
        try:
            outer = obj.map("rb_groups")
            outer.update(0, obj.map("rb").fd.to_bytes(4, "little"))
            extra = libbpf.create_ringbuf("rb_g1", SIZE)
            rings.append(RingBuffer(extra, SIZE, REC))
            if filled == 2:
                outer.update(1, extra.to_bytes(4, "little"))
            fd = obj.programs["put"].fd
            for cpu in (0, 1, 0, 1, 1):
                _run_on(fd, cpu)
            got = [ring.drain() for ring in rings]
        finally:
            for ring in rings:
                ring.close()
            if extra >= 0:
                os.close(extra)
        assert obj.map("drops").percpu_total(0) == 0
    assert [g["cpu"].tolist() for g in got] == want
    # every record once, each ring's in the order they were written
    seqs = [g["seq"].tolist() for g in got]
    assert sorted(s for part in seqs for s in part) == list(range(5))
    assert all(part == sorted(part) for part in seqs)
