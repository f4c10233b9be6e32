"""Switches counted apart from the hooks, for the tests of the sched_switch hooks: a
workload whose naps are switches out and back in, each nap with the kernel's own count
(:data:`NAPS`), and a second program on the tracepoint, as plain as can be
(:func:`counting_switches`), whose counts are the truth the hook's rows are checked
against."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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


#: the arrivals of the tasks named ``comm8`` whose switch in no program saw: found at
#: the task's next switch out (always seen: it is the task's own), where the last
#: switch this CPU showed the tracepoint did not bring the task in. Each with the
#: kernel's own evidence (rq->nr_switches grew by more than the switches shown: how
#: many were not), the wait the kernel added to its run_delay for it (run_delay's
#: growth since its switch out before), and the task that the last switch shown
#: brought in (the one that ran before it, as far as any program can tell); and the
#: switches out shown per process, to say whose switches out are never shown
UNSEEN_ARRIVALS = r"""
#include "common.h"

const volatile u64 comm8 = 0; /* the first 8 bytes of the followed tasks' name */

struct cpu_last { u64 nr_switches; u32 next_pid; u32 next_tgid; char next_comm[16]; };
struct task_last { u64 pcount; u64 run_delay; };
struct unseen {
	u64 pcount;	/* the task's pcount with this arrival */
	u64 delay_ns;	/* run_delay's growth since its switch out before */
	u64 arrivals;	/* pcount's growth since then: 1 */
	u64 skipped;	/* switches the kernel counted on this CPU and did not show */
	u32 pid;
	u32 before_pid;
	u32 before_tgid;
	u32 pad;
	char before_comm[16];
};

#define MAX_UNSEEN 1024

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct cpu_last);
} cpu_last SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, u32);
	__type(value, struct task_last);
} tasks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_UNSEEN);
	__type(key, u32);
	__type(value, struct unseen);
} unseen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} count SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 14);
	__type(key, u32);
	__type(value, u64);
} outs SEC(".maps");

static __always_inline void count_out(u32 tgid)
{
	u64 one = 1, *n = bpf_map_lookup_elem(&outs, &tgid);

	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&outs, &tgid, &one, BPF_NOEXIST);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(arrivals, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	u32 zero = 0, pid = prev->pid, i;
	struct cpu_last *cpu = bpf_map_lookup_elem(&cpu_last, &zero);
	/* this CPU's run queue, through a task on it that is not the idle task */
	u64 nr = (next->pid ? next : prev)->se.cfs_rq->rq->nr_switches, head = 0, *n;
	struct task_last now, *then;
	struct unseen *u;

	if (!cpu)
		return 0;
	count_out(prev->tgid); /* the idle task's too (tgid 0) */
	bpf_probe_read_kernel(&head, sizeof(head), prev->comm);
	if (pid && head == comm8) {
		now.pcount = prev->sched_info.pcount;
		now.run_delay = prev->sched_info.run_delay;
		then = bpf_map_lookup_elem(&tasks, &pid);
		n = bpf_map_lookup_elem(&count, &zero);
		if (n && then && cpu->nr_switches && cpu->next_pid != pid) {
			i = __sync_fetch_and_add(n, 1);
			u = bpf_map_lookup_elem(&unseen, &i);
			if (u) {
				u->pcount = now.pcount;
				u->delay_ns = now.run_delay - then->run_delay;
				u->arrivals = now.pcount - then->pcount;
				u->skipped = nr - cpu->nr_switches - 1;
				u->pid = pid;
				u->before_pid = cpu->next_pid;
				u->before_tgid = cpu->next_tgid;
				__builtin_memcpy(u->before_comm, cpu->next_comm, 16);
			}
		}
		bpf_map_update_elem(&tasks, &pid, &now, BPF_ANY);
	}
	cpu->nr_switches = nr;
	cpu->next_pid = next->pid;
	cpu->next_tgid = next->tgid;
	bpf_probe_read_kernel(cpu->next_comm, 16, next->comm);
	return 0;
}
"""

UNSEEN = np.dtype(
    [("pcount", "<u8"), ("delay_ns", "<u8"), ("arrivals", "<u8"), ("skipped", "<u8"),
     ("pid", "<u4"), ("before_pid", "<u4"), ("before_tgid", "<u4"), ("pad", "<u4"),
     ("before_comm", "S16")]
)  # fmt: skip


class UnseenArrivals:
    """The observer's findings while it is attached."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def of(self, pid: int) -> np.ndarray:
        """Task ``pid``'s arrivals that no program saw (:data:`UNSEEN`), in order."""
        total = int(np.frombuffer(self._obj.map("count").lookup(0), "<u8")[0])
        assert total <= 1024, f"{total} unseen arrivals: more than the observer keeps"
        raw = b"".join(self._obj.map("unseen").lookup(i) for i in range(total))
        rows = np.frombuffer(raw, UNSEEN)
        return np.sort(rows[rows["pid"] == pid], order="pcount")

    def outs_seen(self, tgid: int) -> int:
        """The switches out of process ``tgid``'s threads that reached the tracepoint."""
        raw = self._obj.map("outs").lookup(tgid)
        return 0 if raw is None else int(np.frombuffer(raw, "<u8")[0])


@contextlib.contextmanager
def unseen_arrivals(
    compile_bpf: Callable[[str, str], Path], *, comm: str
) -> Iterator[UnseenArrivals]:
    """The observer of :data:`UNSEEN_ARRIVALS` attached for the block, following the
    tasks named ``comm`` (up to 8 bytes: it compares 8, the name's NULs included)."""
    from kernmlops.ebpf.objects import open_and_load

    name = comm.encode()
    assert len(name) <= 8, "the observer compares 8 bytes of the name"
    path = compile_bpf("unseen_arrivals", UNSEEN_ARRIVALS)
    comm8 = int.from_bytes(name.ljust(8, b"\0"), "little")
    with open_and_load(path, globals_={"comm8": comm8}) as obj:
        obj.attach_all()
        yield UnseenArrivals(obj)


@dataclass
class SpooledSwitches:
    """The switch records in quanta_runtime's spool, decoded here (not by the
    collector), and the rows they give: a quanta_runtime row (its ``pid`` prev's)
    where a record has a run time, a quanta_queued_time row (its ``pid`` next's) where
    it has a wait."""

    records: int = 0
    rows: dict[str, int] = field(
        default_factory=lambda: {"quanta_runtime": 0, "quanta_queued_time": 0}
    )
    #: pid -> its quanta_runtime rows (switches out), and its quanta_queued_time rows
    #: (switches in)
    outs: Counter[int] = field(default_factory=Counter)
    ins: Counter[int] = field(default_factory=Counter)
    #: the first and last switch (CLOCK_MONOTONIC ns; 0: no record)
    first_ns: int = 0
    last_ns: int = 0

    @property
    def span_s(self) -> float:
        """Seconds from the first switch to the last."""
        return (self.last_ns - self.first_ns) / 1e9


def spooled_switches(*folders: Path, live: bool = False) -> SpooledSwitches:
    """Every quanta_switch record of the spool segments in ``folders`` (and below them)
    and the rows they give. A stopped spool (a copy, or one a killed collector left)
    has whole frames only; ``live``: the collector still writes it, so a segment whose
    file or json is not there (yet, or any more) is passed over, and so is a frame cut
    short at a segment's end (read once it is whole)."""
    from kernmlops.ebpf.btf import unbatch
    from kernmlops.ebpf.build import object_path
    from kernmlops.ebpf.ringbuf import decode, record_stride
    from kernmlops.ebpf.spec import object_spec
    from kernmlops.hooks.quanta_runtime import NO_TIME
    from kernmlops.spool.frames import format_of, iter_segment

    layout = object_spec(object_path("quanta_runtime")).ring_layouts()["quanta_switch_rb"]
    dtype = layout.batch if layout.batch is not None else layout.dtype
    stride = record_stride(dtype.itemsize)
    found = SpooledSwitches()
    segments = {p for folder in folders for p in folder.rglob("quanta_switch.*.ring")}
    for seg in sorted(segments, key=lambda p: p.name):
        try:
            meta = json.loads(seg.with_suffix(".json").read_text())
            data = seg.read_bytes()
        except (OSError, ValueError):
            if live:
                continue
            raise
        for frame in iter_segment(data, format_of(meta)):
            if live and frame.reason is not None:
                break  # the writer's frame, not whole yet
            assert frame.reason is None and frame.raw is not None, (seg, frame.reason)
            raw = np.frombuffer(frame.raw, np.uint8)
            assert len(raw) % stride == 0
            records = decode(raw, 1, 0, len(raw), dtype).records
            if layout.batch is not None:
                records = unbatch(records, layout)
            if not len(records):
                continue
            found.records += len(records)
            at = records["at_ns"]
            low, high = int(at.min()), int(at.max())
            found.first_ns = min(found.first_ns or low, low)
            found.last_ns = max(found.last_ns, high)
            ran = records["run_ns_hi"] != NO_TIME
            waited = records["queued_ns_hi"] != NO_TIME
            found.rows["quanta_runtime"] += int(ran.sum())
            found.rows["quanta_queued_time"] += int(waited.sum())
            found.outs.update(records["prev_pid"][ran].tolist())
            found.ins.update(records["next_pid"][waited].tolist())
    return found
