"""The ring reader against the kernel's own producer: freeing space never makes
the ring look full to a program writing into it."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import open_and_load
from kernmlops.ebpf.ringbuf import RingBuffer

pytestmark = pytest.mark.bpf

RING_BYTES = 1 << 16
RECORD = 56  # + the 8-byte header: 64 bytes a record

# One test run is a loop of 2^22 steps. Each step reads the consumer position
# (it must never go back) and, while the ring is under half full, writes a record:
# a refusal then means the producer read a consumer position that was not there.
SOURCE = r"""
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} rb SEC(".maps");

struct watch {
	u64 last_cons, backwards, refused, written, steps;
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
WATCH = np.dtype([(f, "<u8") for f in ("last_cons", "backwards", "refused", "written", "steps")])


@pytest.mark.parametrize("free", ["take_bytes", "spill", "drain"])
def test_freeing_space_never_shows_the_producer_a_full_ring(
    compile_bpf: Callable[[str, str], Path], free: str
) -> None:
    # struct.pack_into zeroes the position before writing it: the program saw the
    # consumer at 0 for a moment, a full ring, and refused the record.
    path = compile_bpf("ring_watch", SOURCE)
    with open_and_load(path, max_entries={"rb": RING_BYTES}) as obj:
        reader = RingBuffer(obj.map("rb").fd, RING_BYTES, np.dtype((np.void, RECORD)))
        opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
        fd = obj.programs["watch"].fd
        result: list[int] = []
        runner = threading.Thread(
            target=lambda: result.append(lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts)))
        )
        freed = 0
        try:
            runner.start()
            while runner.is_alive():  # the loop runs in the kernel, the GIL is free
                if free == "take_bytes":
                    freed += sum(len(c) for c in reader.take_bytes(RECORD)) // 64
                elif free == "spill":
                    reader.spill(RECORD)  # kept as bytes: the drain below counts them
                else:
                    freed += len(reader.drain())
            runner.join()
            freed += len(reader.drain())
        finally:
            reader.close()
        assert result == [0]
        watch = np.frombuffer(obj.map("seen").lookup(0)[: WATCH.itemsize], WATCH)[0]
    assert watch["steps"] == 1 << 22
    assert freed == watch["written"] > 1000  # the reader freed space all along
    assert watch["backwards"] == 0
    assert watch["refused"] == 0
