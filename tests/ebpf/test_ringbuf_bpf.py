"""The ring reader against the kernel's own producer: freeing space never makes
the ring look full to a program writing into it."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.ebpf.ringbuf import RingBuffer
from tests.conftest import skip_here

pytestmark = pytest.mark.bpf

RING_BYTES = 1 << 16
RECORD = 56  # + the 8-byte header: 64 bytes a record

# One test run is a loop of 2^22 steps. Each step reads the consumer position
# (it must never go back; each time it has moved on is a free the producer saw) and,
# while the ring is under half full, writes a record: a refusal then means the
# producer read a consumer position that was not there.
SOURCE = r"""
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} rb SEC(".maps");

struct watch {
	u64 last_cons, backwards, advances, refused, written, steps;
	u8 rec[56];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct watch);
} seen SEC(".maps");

struct loop_ctx {
	struct watch *w;
};

static long step(u32 i, struct loop_ctx *c)
{
	struct watch *w = c->w;
	u64 cons = bpf_ringbuf_query(&rb, BPF_RB_CONS_POS);

	w->steps++;
	if (cons < w->last_cons)
		w->backwards++;
	else if (cons > w->last_cons)
		w->advances++;
	w->last_cons = cons;
	if (bpf_ringbuf_query(&rb, BPF_RB_AVAIL_DATA) < (1 << 15)) {
		if (bpf_ringbuf_output(&rb, w->rec, sizeof(w->rec), BPF_RB_NO_WAKEUP))
			w->refused++;
		else
			w->written++;
	}
	return 0;
}

SEC("raw_tp")
int watch(void *ctx)
{
	u32 zero = 0;
	struct loop_ctx c = { .w = bpf_map_lookup_elem(&seen, &zero) };

	if (c.w)
		bpf_loop(1 << 22, step, &c, 0);
	return 0;
}
"""
FIELDS = ("last_cons", "backwards", "advances", "refused", "written", "steps")
WATCH = np.dtype([(f, "<u8") for f in FIELDS])
#: frees the producer must have seen: runs repeat until then (a busy machine may
#: leave the reader off its CPU for a whole run)
ADVANCES = 1000
#: how long runs may repeat to see them
DEADLINE_S = 60


@pytest.mark.parametrize("free", ["take_bytes", "spill", "drain"])
def test_freeing_space_never_shows_the_producer_a_full_ring(
    compile_bpf: Callable[[str, str], Path], free: str
) -> None:
    # struct.pack_into zeroes the position before writing it: the program saw the
    # consumer at 0 for a moment, a full ring, and refused the record.
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        skip_here("needs 2 CPUs: the reader frees the ring while the program runs")
    path = compile_bpf("ring_watch", SOURCE)
    with open_and_load(path, max_entries={"rb": RING_BYTES}) as obj:
        reader = RingBuffer(obj.map("rb").fd, RING_BYTES, np.dtype((np.void, RECORD)))
        fd = obj.programs["watch"].fd
        freed = runs = 0
        deadline = time.monotonic() + DEADLINE_S
        try:
            # The program and the reader on CPUs of their own: this kernel does not
            # preempt the program's loop, so a reader queued behind it on its CPU
            # would free nothing until the run ends (the producer then sees no free).
            os.sched_setaffinity(0, {cpus[1]})
            while True:
                freed += _run_while_freeing(fd, reader, free, cpus[0])
                runs += 1
                watch = np.frombuffer(obj.map("seen").lookup(0)[: WATCH.itemsize], WATCH)[0]
                if watch["advances"] >= ADVANCES or time.monotonic() > deadline:
                    break
        finally:
            os.sched_setaffinity(0, cpus)
            reader.close()
    assert watch["steps"] == runs << 22
    assert freed == watch["written"]  # every record written was freed, counted once
    # the reader freed space while the program watched: the test saw what it tests
    assert watch["advances"] >= ADVANCES, (runs, watch)
    assert watch["backwards"] == 0
    assert watch["refused"] == 0


def _run_while_freeing(fd: int, reader: RingBuffer, free: str, cpu: int) -> int:
    """One run of the program on ``cpu`` while this thread frees the ring the ``free``
    way; the records freed, the ring emptied after the run."""
    opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
    result: list[int] = []

    def run() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread's own CPU
        result.append(lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts)))

    runner = threading.Thread(target=run)
    freed = 0
    runner.start()
    while runner.is_alive():  # the loop runs in the kernel, the GIL is free
        if free == "take_bytes":
            freed += sum(len(c) for c in reader.take_bytes(RECORD)) // 64
        elif free == "spill":
            reader.spill(RECORD)  # kept as bytes: the drain below counts them
        else:
            freed += len(reader.drain())
    runner.join()
    assert result == [0]
    return freed + len(reader.drain())
