/* The run-queue wait that ends when a task is switched in, from the scheduler's
 * own account: shared by the collector (quanta_runtime's quanta_queued_time) and
 * the exporter (runqlat), so both measure the same wait.
 *
 * rq->clock minus the task's sched_info.last_queued: the run-queue clock was
 * updated at the top of __schedule, and last_queued is stamped by the kernel
 * when the task is enqueued (a wake-up) or preempted while still runnable, and
 * cleared when it arrives, just after the sched_switch tracepoint. It is what
 * the kernel adds to the task's run_delay (/proc/<pid>/schedstat) for this
 * arrival. Kernels without CONFIG_SCHED_INFO have no sched_info.
 *
 * Everything is __always_inline on the hot path: including this header adds
 * no instruction to the programs that use it. Needs common.h (KMO_READ). */
#ifndef KMO_SCHED_WAIT_H
#define KMO_SCHED_WAIT_H

/* The queue wait needs the kernel's sched_info and a way to this CPU's run
 * queue: next->se.cfs_rq->rq, which the kernel points at the run queue of the
 * CPU the task is on (set_task_rq) for every class. (The per-CPU `runqueues`
 * itself is out of reach without CONFIG_KALLSYMS_ALL.) */
static __always_inline bool kmo_has_sched_info(struct task_struct *t)
{
	return bpf_core_field_exists(t->sched_info) && bpf_core_field_exists(t->se.cfs_rq);
}

static __always_inline u64 kmo_rq_clock(bool btf, struct task_struct *t)
{
	if (btf)
		return t->se.cfs_rq->rq->clock;
	return BPF_CORE_READ(t, se.cfs_rq, rq, clock);
}

/* The wait (ns) that ends as `next` is switched in; false (and *ns untouched)
 * when it was not queued (a task that never left the CPU) or the clocks
 * disagree. Call only where kmo_has_sched_info(next). `btf`: next is a tp_btf
 * argument. */
static __always_inline bool kmo_queued_ns(bool btf, struct task_struct *next, u64 *ns)
{
	u64 queued_at = KMO_READ(btf, next, sched_info.last_queued);
	u64 clock;

	if (!queued_at)
		return false;
	clock = kmo_rq_clock(btf, next);
	if (clock < queued_at)
		return false;
	*ns = clock - queued_at;
	return true;
}

#endif /* KMO_SCHED_WAIT_H */
