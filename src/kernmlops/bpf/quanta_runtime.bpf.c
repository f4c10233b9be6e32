/* quanta_runtime: one row per on-CPU quantum; quanta_queued_time: the time a
 * task waited on a run queue, from wake-up (or preemption) to running.
 *
 * Both come from sched_switch alone, in one record per switch that user space
 * splits into the two tables: the quantum `prev` ended and the wait `next`
 * ended. Both durations are the scheduler's own accounts, read where the
 * kernel keeps them, so no wake-up program and no map of enqueue times:
 *
 * - the quantum is the growth of prev's se.sum_exec_runtime since it came in
 *   (charged for every class before this tracepoint), which is its growth
 *   since its last switch out, kept for each task (kmo_quantum_of, sched_wait.h:
 *   right where the switch in never reached this program);
 * - the wait is rq->clock minus next's sched_info.last_queued (sched_wait.h,
 *   shared with the exporter's runqlat): what the kernel adds to the task's
 *   run_delay for this arrival. A wait cut by a migration counts from the
 *   enqueue on the new CPU, as the kernel's last_queued does. Kernels without
 *   CONFIG_SCHED_INFO have no sched_info: the table stays empty there.
 *
 * The switch's time is the same run-queue clock, on the monotonic clock
 * (kmo_switch_time): the instant the kernel ended prev's quantum and began
 * next's, so a task's quantum is the time between its switches less the
 * kernel's IRQ and steal time. The raw_tp program (no BTF-typed pointers: three
 * helper calls to reach the clock) reads the time instead. */
#include "filter.h"
#include "sched_wait.h"

/* 32 bytes a switch (a storm writes tens of millions): the CPU is the batch's,
 * the time the gap since the batch's switch before (KMO_BATCH_GAP: small
 * numbers, which the spool compresses better than growing offsets), and each
 * duration is 48 bits
 * of nanoseconds, up to 78 hours (a longer one is written as that), split in a
 * low u32 and a high u16. A high half of KMO_NO_TIME means no such duration:
 * prev's quantum is not known (the idle task, a task not followed, a non-fair
 * task switched in before the program was attached), or next did not wait (no
 * sched_info). */
#define KMO_NO_TIME 0xffff
#define KMO_MAX_TIME ((((u64)KMO_NO_TIME - 1) << 32) | 0xffffffffULL)

struct quanta_switch_event {
	kmo_batch_gap_ns at_ns;	/* the switch: end of prev's quantum, start of next's */
	u16 run_ns_hi;		/* prev's quantum */
	u16 queued_ns_hi;	/* next's wait */
	u32 run_ns_lo;
	u32 queued_ns_lo;
	u32 prev_pid;
	u32 prev_tgid;
	u32 next_pid;
	u32 next_tgid;
};

KMO_BATCHED_RING(quanta_switch_rb, quanta_switch_event);

/* Each followed task's CPU time at its last switch out (kmo_quantum_of): a
 * slot of quanta_task_cpu_slots, else task storage. */
KMO_TASK_CPU_MAP(quanta_task_cpu);

/* What runs on this CPU, its CPU time when it came in and whether the filter
 * wants it; this CPU's clock. */
struct oncpu {
	u64 sum_exec_at_in; /* next->se.sum_exec_runtime at the switch in */
	u32 pid;
	u16 seen;
	u16 wanted;	    /* kmo_tgid_wanted(next's tgid) at the switch in */
	struct kmo_switch_clock clock;
	struct kmo_wanted_slots wanted_tasks; /* kmo_task_wanted_cached */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct oncpu);
} oncpu SEC(".maps");

/* Fair-class policies: SCHED_NORMAL, SCHED_BATCH, SCHED_IDLE. */
static __always_inline bool fair_policy(u32 policy)
{
	return policy == 0 || policy == 3 || policy == 5;
}

static __always_inline int on_switch(bool btf, struct task_struct *prev,
				     struct task_struct *next)
{
	u32 zero = 0, prev_pid = KMO_READ(btf, prev, pid), next_pid = KMO_READ(btf, next, pid);
	u32 prev_tgid = KMO_READ(btf, prev, tgid), next_tgid = KMO_READ(btf, next, tgid);
	struct oncpu *cur = bpf_map_lookup_elem(&oncpu, &zero);
	u64 run_ns = 0, queued_ns = 0;
	bool has_run = false, has_queued = false;
	struct quanta_switch_event_batch *batch;
	struct quanta_switch_event *e;
	bool prev_wanted, next_wanted;
	u64 now;

	if (!cur)
		return 0;

	/* Following a tree, the filter is a map lookup. A tgid enters before it
	 * first runs (or before the programs attach) and leaves only once its
	 * process is reaped, so prev's answer is the one it got when it came in on
	 * this CPU, and next's is a remembered yes for the tree's processes: no
	 * lookup a switch within the tree, one for a task outside it. System-wide the filter is a compare, and
	 * these branches are gone (kmo_filter_on is read-only: the verifier drops
	 * what it rules out). */
	if (kmo_filter_on && cur->seen && cur->pid == prev_pid)
		prev_wanted = cur->wanted;
	else
		prev_wanted = kmo_task_wanted_cached(btf, &cur->wanted_tasks, prev, prev_tgid);
	next_wanted = next_pid && kmo_task_wanted_cached(btf, &cur->wanted_tasks, next, next_tgid);

	/* The quantum that just ended (pid 0 is the idle task): from the task's
	 * own account where it has one (sched_wait.h: a switch in may never reach
	 * this program); else from its switch in on this CPU; else, for a task
	 * switched in before the program was attached (or unseen, and without
	 * storage), a fair task's slice start (prev_sum_exec_runtime: set when the
	 * task is picked, and reset when the kernel re-sets a running task) is the
	 * best estimate, and for other classes the quantum is not known. */
	if (prev_pid && prev_wanted) {
		u64 sum = KMO_READ(btf, prev, se.sum_exec_runtime);
		u64 slice_start = KMO_READ(btf, prev, se.prev_sum_exec_runtime);

		/* Read before the branches: clang would otherwise load through one
		 * register holding either `cur` or `prev`, which the verifier refuses. */
		barrier_var(slice_start);
		if (kmo_quantum_of(btf, &quanta_task_cpu, &quanta_task_cpu_slots,
				   &quanta_task_cpu_owners, prev, prev_pid, sum, &run_ns)) {
			has_run = true;
		} else if (cur->pid == prev_pid && cur->seen) {
			run_ns = sum - cur->sum_exec_at_in;
			has_run = true;
		} else if (fair_policy(KMO_READ(btf, prev, policy))) {
			run_ns = sum - slice_start;
			has_run = true;
		}
	} else if (prev_pid) {
		kmo_task_slot_free(btf, &quanta_task_cpu_slots, &quanta_task_cpu_owners, prev);
	}
	cur->pid = next_pid;
	cur->seen = 1;
	if (kmo_filter_on)
		cur->wanted = next_wanted;
	cur->sum_exec_at_in = KMO_READ(btf, next, se.sum_exec_runtime);

	if (btf && kmo_has_rq_clock(next)) {
		u64 clock = 0;

		if (next_wanted && kmo_has_sched_info(next)) {
			clock = kmo_rq_clock(btf, next);
			has_queued = kmo_queued_ns_at(btf, next, clock, &queued_ns);
		}
		if (!has_run && !has_queued)
			return 0;
		if (!clock)
			clock = kmo_rq_clock(btf, next_pid ? next : prev);
		now = kmo_switch_time(&cur->clock, clock,
				      kmo_clock_fresh(prev_pid, next_pid, has_queued, queued_ns));
	} else {
		if (next_wanted && kmo_has_sched_info(next))
			has_queued = kmo_queued_ns(btf, next, &queued_ns);
		if (!has_run && !has_queued)
			return 0;
		now = bpf_ktime_get_ns();
	}
	e = KMO_BATCH_SLOT_AT(quanta_switch_rb, batch, now, 0);
	if (!e)
		return 0;
	if (run_ns > KMO_MAX_TIME)
		run_ns = KMO_MAX_TIME;
	if (queued_ns > KMO_MAX_TIME)
		queued_ns = KMO_MAX_TIME;
	e->at_ns = KMO_BATCH_GAP(batch, now);
	e->run_ns_hi = has_run ? run_ns >> 32 : KMO_NO_TIME;
	e->run_ns_lo = run_ns;
	e->queued_ns_hi = has_queued ? queued_ns >> 32 : KMO_NO_TIME;
	e->queued_ns_lo = queued_ns;
	e->prev_pid = prev_pid;
	e->prev_tgid = prev_tgid;
	e->next_pid = next_pid;
	e->next_tgid = next_tgid;
	KMO_BATCH_PUSH(quanta_switch_rb, batch, now, 0);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(true, prev, next);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(false, prev, next);
}
