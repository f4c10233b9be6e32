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

/* Whether a task's run queue (and its clock) can be reached: next->se.cfs_rq
 * (CONFIG_FAIR_GROUP_SCHED; a constant once loaded). */
static __always_inline bool kmo_has_rq_clock(struct task_struct *t)
{
	return bpf_core_field_exists(t->se.cfs_rq);
}

static __always_inline u64 kmo_rq_clock(bool btf, struct task_struct *t)
{
	if (btf)
		return t->se.cfs_rq->rq->clock;
	return BPF_CORE_READ(t, se.cfs_rq, rq, clock);
}

/* The wait (ns) that ends as `next` is switched in, with its run queue's clock
 * already read (kmo_rq_clock); see kmo_queued_ns. */
static __always_inline bool kmo_queued_ns_at(bool btf, struct task_struct *next, u64 clock,
					     u64 *ns)
{
	u64 queued_at = KMO_READ(btf, next, sched_info.last_queued);

	if (!queued_at || clock < queued_at)
		return false;
	*ns = clock - queued_at;
	return true;
}

/* The wait (ns) that ends as `next` is switched in; false (and *ns untouched)
 * when it was not queued (a task that never left the CPU) or the clocks
 * disagree. Call only where kmo_has_sched_info(next). `btf`: next is a tp_btf
 * argument. */
static __always_inline bool kmo_queued_ns(bool btf, struct task_struct *next, u64 *ns)
{
	if (!KMO_READ(btf, next, sched_info.last_queued))
		return false;
	return kmo_queued_ns_at(btf, next, kmo_rq_clock(btf, next), ns);
}

/* The time of a switch on bpf_ktime_get_ns()'s clock (CLOCK_MONOTONIC), taken
 * from the run queue's clock instead of reading the time at every switch (32 ns
 * of a ~110-ns program on a VM's tsc; bench/README 17, 21).
 *
 * rq->clock is sched_clock as the scheduler last set it: at the top of
 * __schedule, or at the wake-up that asked for this switch (the kernel then
 * skips the update). It is the instant up to which the kernel charged prev's
 * CPU time and from which it charges next's, and what the queue wait ends at.
 * A per-CPU offset puts it on the monotonic clock. A reading of the offset
 * (ktime - rq->clock) is late by however long the scheduler ran since it set
 * its clock, never early, so the least reading is kept. It is read once the run
 * queue's clock moved KMO_CLOCK_SYNC_NS since the last reading, and only where
 * the clock is fresh: a switch out of a task (`fresh`), not one out of the idle
 * task, whose clock is the wake-up's and is older by the idle exit (~11 us in
 * this VM). The kept offset may grow by 1/1024 of the time since (more than
 * sched_clock and the monotonic clock drift apart: NTP slews at most 500 ppm),
 * so a drift that raises it is followed. */
#define KMO_CLOCK_SYNC_NS (1000ULL * 1000)

struct kmo_switch_clock {
	s64 offset; /* ktime - rq->clock, the least read (within the allowance) */
	u64 synced; /* rq->clock at the last reading; 0: none yet */
};

static __always_inline u64 kmo_switch_time(struct kmo_switch_clock *c, u64 rq_clock, bool fresh)
{
	s64 since = (s64)(rq_clock - c->synced);

	if (!c->synced || since < 0) {
		/* No fresh reading yet (or a clock that went back): the time itself. */
		u64 now = bpf_ktime_get_ns();

		c->offset = (s64)(now - rq_clock);
		c->synced = fresh ? rq_clock : 0;
		return now;
	}
	if (fresh && since >= (s64)KMO_CLOCK_SYNC_NS) {
		s64 seen = (s64)(bpf_ktime_get_ns() - rq_clock);
		s64 allowed = c->offset + (since >> 10);

		c->offset = seen < allowed ? seen : allowed;
		c->synced = rq_clock;
	}
	return rq_clock + c->offset;
}

#endif /* KMO_SCHED_WAIT_H */
