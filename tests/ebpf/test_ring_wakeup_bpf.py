"""common.h's submits wake the collector exactly when a ring passes a quarter
(and each further quarter) of its size, and never for the records in between:
the poll loop sleeps on the rings' fds in an edge-triggered epoll."""

from __future__ import annotations

import ctypes
import select
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kernmlops.ebpf.libbpf import ProgTestRunOpts, lib
from kernmlops.ebpf.objects import BpfObject, open_and_load
from kernmlops.ebpf.ringbuf import RingBuffer, record_stride

pytestmark = pytest.mark.bpf

RING_BYTES = 1 << 16
QUARTER = RING_BYTES // 4
#: records per batch (KMO_BATCH_RECORDS, common.h)
BATCH_RECORDS = 64

# `submit` writes count[0] records, one reservation each (KMO_SUBMIT); `push`
# writes count[0] records into the per-CPU batch, which goes out whole every
# KMO_BATCH_RECORDS records (KMO_BATCH_PUSH).
SOURCE = r"""
#include "common.h"

struct rec { u64 seq; u64 pad[6]; };   /* 56 bytes: 64 in the ring */
struct small { u64 seq; u64 pad; };    /* 16 bytes: batches of 64 */

KMO_RING(rb, rec);
KMO_BATCHED_RING(brb, small);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} count SEC(".maps");

static long one(u32 i, void *c)
{
	struct rec *e = KMO_RESERVE(rb, struct rec, 0);

	if (!e)
		return 1;
	e->seq = i;
	KMO_SUBMIT(rb, e);
	return 0;
}

static long pushed(u32 i, void *c)
{
	struct small_batch *batch;
	struct small *s = KMO_BATCH_SLOT(brb, batch);

	if (!s)
		return 1;
	s->seq = i;
	KMO_BATCH_PUSH(brb, batch, bpf_ktime_get_ns(), 1);
	return 0;
}

SEC("raw_tp")
int submit(void *ctx)
{
	u32 zero = 0;
	u64 *n = bpf_map_lookup_elem(&count, &zero);

	if (n)
		bpf_loop(*n, one, NULL, 0);
	return 0;
}

SEC("raw_tp")
int push(void *ctx)
{
	u32 zero = 0;
	u64 *n = bpf_map_lookup_elem(&count, &zero);

	if (n)
		bpf_loop(*n, pushed, NULL, 0);
	return 0;
}
"""


def _run(obj: BpfObject, program: str, records: int) -> None:
    obj.map("count").update(0, np.uint64(records).tobytes())
    opts = ProgTestRunOpts(sz=ctypes.sizeof(ProgTestRunOpts))
    assert lib.bpf_prog_test_run_opts(obj.programs[program].fd, ctypes.byref(opts)) == 0


def _woken(ep: select.epoll) -> bool:
    return bool(ep.poll(0))


@pytest.fixture
def wake_obj(compile_bpf: Callable[[str, str], Path]) -> Iterator[BpfObject]:
    path = compile_bpf("ring_wakeup", SOURCE)
    with open_and_load(path, max_entries={"rb": RING_BYTES, "brb": RING_BYTES}) as obj:
        yield obj


def test_a_record_wakes_the_reader_at_each_quarter(wake_obj: BpfObject) -> None:
    stride = record_stride(56)
    per_quarter = QUARTER // stride  # 256 records
    reader = RingBuffer(wake_obj.map("rb").fd, RING_BYTES, np.dtype((np.void, 56)))
    ep = select.epoll()
    try:
        ep.register(reader.fd, select.EPOLLIN | select.EPOLLET)
        _run(wake_obj, "submit", per_quarter - 1)
        assert reader.pending_bytes() == (per_quarter - 1) * stride
        assert not _woken(ep)  # records wait, and nothing woke the reader
        _run(wake_obj, "submit", 1)  # the record that fills the first quarter
        assert _woken(ep)
        assert not _woken(ep)  # edge-triggered: reported once
        _run(wake_obj, "submit", per_quarter - 1)
        assert not _woken(ep)
        _run(wake_obj, "submit", 1)  # the second quarter
        assert _woken(ep)
        assert len(reader.drain()) == 2 * per_quarter
        # Drained: the count starts again from an empty ring.
        _run(wake_obj, "submit", per_quarter - 1)
        assert not _woken(ep)
        _run(wake_obj, "submit", 1)
        assert _woken(ep)
    finally:
        ep.close()
        reader.close()


def test_a_batch_wakes_the_reader_when_it_crosses_a_quarter(wake_obj: BpfObject) -> None:
    batch = 24 + BATCH_RECORDS * 16  # n, cpu, first_ns, last_ns, the records of 16 bytes
    stride = record_stride(batch)
    crossing = -(-QUARTER // stride)  # the batch that takes the ring past 16 KiB
    reader = RingBuffer(wake_obj.map("brb").fd, RING_BYTES, np.dtype((np.void, batch)))
    ep = select.epoll()
    try:
        ep.register(reader.fd, select.EPOLLIN | select.EPOLLET)
        _run(wake_obj, "push", (crossing - 1) * BATCH_RECORDS)
        assert reader.pending_bytes() == (crossing - 1) * stride
        assert not _woken(ep)
        _run(wake_obj, "push", BATCH_RECORDS - 1)  # staged in the per-CPU batch, not the ring
        assert not _woken(ep)
        _run(wake_obj, "push", 1)
        assert reader.pending_bytes() == crossing * stride
        assert _woken(ep)
    finally:
        ep.close()
        reader.close()
