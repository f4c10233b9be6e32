"""Switches counted apart from the hooks, for the tests of the sched_switch hooks: a
workload whose naps are switches out and back in, each nap with the kernel's own count
(:data:`NAPS`), and a second program on the tracepoint, as plain as can be
(:func:`counting_switches`), whose counts are the truth the hook's rows are checked
against."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: naps N US: N naps of US microseconds, each timed on CLOCK_MONOTONIC, with the
#: kernel's own counts of the switches (a C workload for tests.hooks.conftest.build_c)
NAPS = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/resource.h>
/* The kernel's own counts of this task's switches: in (sched_info's pcount,
 * /proc/self/schedstat) and out (voluntary and involuntary, /proc/self/status). */
static void switches(long *in, long *out)
{
	char line[256];
	long v;
	FILE *f = fopen("/proc/self/schedstat", "r");

	if (!f || fscanf(f, "%*llu %*llu %ld", in) != 1)
		exit(2);
	fclose(f);
	*out = 0;
	if (!(f = fopen("/proc/self/status", "r")))
		exit(2);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
			*out += v;
		if (sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1)
			*out += v;
	}
	fclose(f);
}

/* The same count out, cheaply: one system call, no file. */
static long switched_out(void)
{
	struct rusage r;

	if (getrusage(RUSAGE_THREAD, &r))
		exit(2);
	return r.ru_nvcsw + r.ru_nivcsw;
}

/* naps N US: N times, read CLOCK_MONOTONIC, sleep US microseconds, read it
 * again; then print the kernel's switch counts over the naps, and for each nap
 * its two readings (ns) and the switches out the kernel counted between them
 * (0 where the timer expired before nanosleep reached schedule(): a vCPU the
 * host held for that long). */
int main(int argc, char **argv)
{
	long n = atol(argv[1]), us = atol(argv[2]), in0, out0, in1, out1;
	struct timespec *t = malloc(sizeof(*t) * 2 * n);
	long *s = malloc(sizeof(*s) * n);
	struct timespec nap = {0, us * 1000};

	switches(&in0, &out0);
	for (long i = 0; i < n; i++) {
		clock_gettime(CLOCK_MONOTONIC, &t[2 * i]);
		s[i] = switched_out();
		nanosleep(&nap, NULL);
		s[i] = switched_out() - s[i];
		clock_gettime(CLOCK_MONOTONIC, &t[2 * i + 1]);
	}
	switches(&in1, &out1);
	printf("%ld %ld\n", in1 - in0, out1 - out0);
	for (long i = 0; i < 2 * n; i += 2)
		printf("%lld %lld %ld\n", t[i].tv_sec * 1000000000LL + t[i].tv_nsec,
			t[i + 1].tv_sec * 1000000000LL + t[i + 1].tv_nsec, s[i / 2]);
	return 0;
}
"""

#: counts each switch in and out of a task, per pid: of every task, or only of the
#: children of ``parent_tgid``; and notes the pids seen named ``comm8`` (a task has its
#: name only from its exec: its switches as the shell's child and as taskset count too)
COUNTER = r"""
#include "common.h"

const volatile u32 parent_tgid = 0; /* 0: every task */
const volatile u64 comm8 = 0;       /* the first 8 bytes of the name noted; 0: none */

struct switches { u64 ins; u64 outs; };

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, u32);
	__type(value, struct switches);
} switches SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, u32);
} named SEC(".maps");

static __always_inline void count(struct task_struct *t, bool in)
{
	struct switches zero = {}, *c;
	u32 pid = t->pid, one = 1;
	u64 head = 0;

	if (!pid || (parent_tgid && t->real_parent->tgid != parent_tgid))
		return;
	if (comm8) {
		bpf_probe_read_kernel(&head, sizeof(head), t->comm);
		if (head == comm8)
			bpf_map_update_elem(&named, &pid, &one, BPF_ANY);
	}
	c = bpf_map_lookup_elem(&switches, &pid);
	if (!c) {
		bpf_map_update_elem(&switches, &pid, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&switches, &pid);
		if (!c)
			return;
	}
	__sync_fetch_and_add(in ? &c->ins : &c->outs, 1);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(observe, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	count(prev, false);
	count(next, true);
	return 0;
}
"""


#: each quantum of the children of ``parent_tgid`` as the kernel keeps it: the run
#: queue's clock at its switch in and out (rq->clock, as the scheduler set it for
#: each switch), and the IRQ and steal time that clock counts and the task is not
#: charged (the growth of rq->clock - rq->clock_task between the two)
RQ_QUANTA = r"""
#include "common.h"

const volatile u32 parent_tgid = 0;

struct quantum {
	u64 out_ns; /* CLOCK_MONOTONIC at the switch out's tracepoint */
	u64 in_clock;
	u64 out_clock;
	u64 uncharged_ns;
	u32 pid;
	u32 cpu;
};
struct came { u64 clock; u64 gap; };

#define MAX_QUANTA (1 << 14)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 12);
	__type(key, u32);
	__type(value, struct came);
} came_in SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_QUANTA);
	__type(key, u32);
	__type(value, struct quantum);
} quanta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} count SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(quantum_clocks, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	/* This CPU's run queue, through a task on it (a fair one: the children). */
	struct rq *rq = (prev->pid ? prev : next)->se.cfs_rq->rq;
	struct came now = {rq->clock, rq->clock - rq->clock_task}, *in;
	u32 pid = prev->pid, zero = 0, i;
	u64 *n;
	struct quantum *q;

	if (pid && prev->real_parent->tgid == parent_tgid) {
		in = bpf_map_lookup_elem(&came_in, &pid);
		n = bpf_map_lookup_elem(&count, &zero);
		if (in && n) {
			i = __sync_fetch_and_add(n, 1);
			q = bpf_map_lookup_elem(&quanta, &i);
			if (q) {
				q->out_ns = bpf_ktime_get_ns();
				q->in_clock = in->clock;
				q->out_clock = now.clock;
				q->uncharged_ns = now.gap - in->gap;
				q->pid = pid;
				q->cpu = bpf_get_smp_processor_id();
			}
			bpf_map_delete_elem(&came_in, &pid);
		}
	}
	pid = next->pid;
	if (pid && next->real_parent->tgid == parent_tgid)
		bpf_map_update_elem(&came_in, &pid, &now, BPF_ANY);
	return 0;
}
"""


class SwitchCounts:
    """The counter's readings while it is attached."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def of(self, pid: int) -> tuple[int, int] | None:
        """(switches in, switches out) of task ``pid``; None: none seen."""
        raw = self._obj.map("switches").lookup(pid)
        if raw is None:
            return None
        ins, outs = np.frombuffer(raw, "<u8").tolist()
        return ins, outs

    def named(self) -> dict[int, tuple[int, int]]:
        """pid -> (switches in, switches out) of every task seen with the noted name."""
        found = {}
        for key in self._obj.map("named"):  # its keys
            pid = int.from_bytes(key, "little")
            counts = self.of(pid)
            assert counts is not None  # noted at a switch, counted at the same one
            found[pid] = counts
        return found


@contextlib.contextmanager
def counting_switches(
    compile_bpf: Callable[[str, str], Path], *, parent_tgid: int = 0, comm: str = ""
) -> Iterator[SwitchCounts]:
    """The counter attached for the block: the switches of the children of
    ``parent_tgid`` (0: of every task), noting the tasks named ``comm`` (8 bytes: the
    counter compares them whole) where one is given."""
    from kernmlops.ebpf.objects import open_and_load

    assert comm == "" or len(comm.encode()) == 8, "the counter compares 8 bytes of the name"
    path = compile_bpf("switch_counter", COUNTER)
    comm8 = int.from_bytes(comm.encode(), "little")
    with open_and_load(path, globals_={"parent_tgid": parent_tgid, "comm8": comm8}) as obj:
        obj.attach_all()
        yield SwitchCounts(obj)


class RqQuanta:
    """The quanta the observer saw while it was attached."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def of(self, pid: int) -> np.ndarray:
        """Task ``pid``'s quanta in order: fields ``out_ns`` (CLOCK_MONOTONIC at the
        switch out's tracepoint), ``in_clock``, ``out_clock``, ``uncharged_ns``, ``cpu``."""
        fields = ("out_ns", "in_clock", "out_clock", "uncharged_ns")
        dtype = np.dtype([*((f, "<u8") for f in fields), ("pid", "<u4"), ("cpu", "<u4")])
        total = int(np.frombuffer(self._obj.map("count").lookup(0), "<u8")[0])
        assert total <= 1 << 14, f"{total} quanta: more than the observer keeps"
        rows = np.frombuffer(
            b"".join(self._obj.map("quanta").lookup(i) for i in range(total)), dtype
        )
        return np.sort(rows[rows["pid"] == pid], order="out_ns")


@contextlib.contextmanager
def rq_quanta(compile_bpf: Callable[[str, str], Path], *, parent_tgid: int) -> Iterator[RqQuanta]:
    """The observer of :data:`RQ_QUANTA` attached for the block, following the
    children of ``parent_tgid``."""
    from kernmlops.ebpf.objects import open_and_load

    path = compile_bpf("rq_quanta", RQ_QUANTA)
    with open_and_load(path, globals_={"parent_tgid": parent_tgid}) as obj:
        obj.attach_all()
        yield RqQuanta(obj)
