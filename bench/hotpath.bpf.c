/* bench/hotpath.py: quanta_runtime's sched_switch program built up in steps, to
 * find what each part of it costs (kernel.bpf_stats ns per run). Built once per
 * step with -DSTEP=N; step N does what step N-1 does and one thing more:
 *
 *   0  count the switch in a per-CPU slot (bench/floor.bpf.c's floor)
 *   1  read prev's and next's pid, tgid, CPU time; keep the per-CPU "on CPU" state
 *   2  next's run-queue wait (sched_info.last_queued, its run queue's clock)
 *   3  bpf_ktime_get_ns()
 *   4  fill a record in the per-CPU batch (values in ns, as read)
 *   5  the record in microseconds (three divisions, as quanta_runtime writes it)
 *   6  send the batch to the ring every 32 records (quanta_runtime's program)
 *   7  step 6 with the switch's time from the run queue's clock, put on
 *      bpf_ktime_get_ns()'s clock by a per-CPU offset read once a millisecond
 *      (kmo_switch_time, sched_wait.h, as quanta_runtime reads it)
 *   8  step 7, also reading bpf_ktime_get_ns() per record to histogram how far
 *      the two times are apart (map `apart`: 250-ns buckets; see hotpath.py)
 *   9  step 7 with prev's quantum from its own account, kept in task storage
 *      at every switch out (kmo_quantum_of as quanta_runtime had it until the
 *      slots: a helper call a switch)
 *  10  step 7 with prev's quantum from its own account, kept in a slot of an
 *      array, task storage only where another task owns the slot
 *      (kmo_quantum_of, sched_wait.h: quanta_runtime's program)
 */
#include "filter.h"
#include "sched_wait.h"

#ifndef STEP
#define STEP 6
#endif

struct hot_event {
	u64 ts_uptime_us;
	u64 run_length_us;
	u64 queued_time_us;
	u32 cpu;
	u32 prev_pid;
	u32 prev_tgid;
	u32 next_pid;
	u32 next_tgid;
	u8 has_run;
	u8 has_queued;
};

KMO_BATCHED_RING(hot_rb, hot_event);

struct oncpu {
	u64 sum_exec_at_in;
	u32 pid;
	u32 seen;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct oncpu);
} oncpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} switches SEC(".maps");

/* steps 9 and 10: each task's CPU time at its last switch out */
KMO_TASK_CPU_MAP(task_cpu);

/* step 9: the task-storage record at every switch out, as kmo_quantum_of kept
 * it before the slots (quanta_runtime's program at 5177fba). */
static __always_inline bool quantum_stored(struct task_struct *prev, u64 sum, u64 *ns)
{
	struct kmo_task_cpu *t;
	u64 arrivals = 0;
	bool known;

	t = bpf_task_storage_get(&task_cpu, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!t)
		return false;
	if (bpf_core_field_exists(prev->sched_info)) {
		arrivals = prev->sched_info.pcount;
		known = arrivals == t->arrivals + 1;
	} else {
		known = t->sum_at_out != 0;
	}
	known = known && sum >= t->sum_at_out;
	if (known)
		*ns = sum - t->sum_at_out;
	t->sum_at_out = sum;
	t->arrivals = arrivals;
	return known;
}

/* step 7: this CPU's offset from the run-queue clock to bpf_ktime_get_ns() */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct kmo_switch_clock);
} offset SEC(".maps");

/* step 8: ktime - (rq clock + offset) per record, APART_BUCKETS buckets of 250 ns
 * centred on 0 (the first and last also hold everything beyond) */
#define APART_BUCKETS 64
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, APART_BUCKETS);
	__type(key, u32);
	__type(value, u64);
} apart SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(hot_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	u32 zero = 0;
#if STEP == 0
	u64 *n = bpf_map_lookup_elem(&switches, &zero);

	if (n)
		*n += 1;
	return 0;
#else
	u32 prev_pid = prev->pid, next_pid = next->pid;
	u32 prev_tgid = prev->tgid, next_tgid = next->tgid;
	struct oncpu *cur = bpf_map_lookup_elem(&oncpu, &zero);
	u64 run_ns = 0, queued_ns = 0, now = 0;
	bool has_run = false, has_queued = false;

	if (!cur)
		return 0;
	if (prev_pid && kmo_tgid_wanted(prev_tgid)) {
		u64 sum = prev->se.sum_exec_runtime;
		u64 slice_start = prev->se.prev_sum_exec_runtime;

		barrier_var(slice_start);
#if STEP == 9
		if (quantum_stored(prev, sum, &run_ns)) {
			has_run = true;
		} else
#elif STEP >= 10
		if (kmo_quantum_of(true, &task_cpu, &task_cpu_slots, &task_cpu_owners, prev,
				   prev_pid, sum, &run_ns)) {
			has_run = true;
		} else
#endif
		if (cur->pid == prev_pid && cur->seen) {
			run_ns = sum - cur->sum_exec_at_in;
			has_run = true;
		} else if (prev->policy == 0 || prev->policy == 3 || prev->policy == 5) {
			run_ns = sum - slice_start;
			has_run = true;
		}
	}
#if STEP >= 10
	else if (prev_pid) {
		kmo_task_slot_free(true, &task_cpu_slots, &task_cpu_owners, prev);
	}
#endif
	cur->pid = next_pid;
	cur->seen = 1;
	cur->sum_exec_at_in = next->se.sum_exec_runtime;
#if STEP >= 2
	if (kmo_has_sched_info(next) && next_pid && kmo_tgid_wanted(next_tgid))
		has_queued = kmo_queued_ns(true, next, &queued_ns);
#endif
	if (!has_run && !has_queued)
		return 0;
#if STEP >= 7
	struct kmo_switch_clock *clock = bpf_map_lookup_elem(&offset, &zero);

	if (!clock)
		return 0;
	now = kmo_switch_time(clock, kmo_rq_clock(true, next_pid ? next : prev),
			      kmo_clock_fresh(prev_pid, next_pid, has_queued, queued_ns));
#elif STEP >= 3
	now = bpf_ktime_get_ns();
#endif
#if STEP >= 4
	{
		struct hot_event_batch *batch;
		struct hot_event *e = KMO_BATCH_SLOT(hot_rb, batch);

		if (!e)
			return 0;
#if STEP >= 5
		e->ts_uptime_us = now / 1000;
		e->run_length_us = (run_ns + 500) / 1000;
		e->queued_time_us = (queued_ns + 500) / 1000;
#else
		e->ts_uptime_us = now;
		e->run_length_us = run_ns;
		e->queued_time_us = queued_ns;
#endif
#if STEP == 8
		{
			s64 d = (s64)(bpf_ktime_get_ns() - now) + APART_BUCKETS / 2 * 250;
			u32 b = d < 0 ? 0 : d / 250 >= APART_BUCKETS ? APART_BUCKETS - 1 : d / 250;
			u64 *c = bpf_map_lookup_elem(&apart, &b);

			if (c)
				*c += 1;
		}
#endif
		e->cpu = bpf_get_smp_processor_id();
		e->prev_pid = prev_pid;
		e->prev_tgid = prev_tgid;
		e->next_pid = next_pid;
		e->next_tgid = next_tgid;
		e->has_run = has_run;
		e->has_queued = has_queued;
#if STEP >= 6
		KMO_BATCH_PUSH(hot_rb, batch, now, 0);
#else
		batch->n = (batch->n + 1) & (KMO_BATCH_RECORDS - 1);
#endif
	}
#else
	{
		u64 *n = bpf_map_lookup_elem(&switches, &zero);

		if (n)
			*n += run_ns + queued_ns + now; /* keep the reads */
	}
#endif
	return 0;
#endif
}
