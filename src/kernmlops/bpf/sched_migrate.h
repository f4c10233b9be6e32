/* What a sched_migrate_task event says about the task: the CPU it leaves and
 * the kind of migration. Shared by the collector (sched_migrate) and the
 * exporter (migrations), so both classify a migration the same way.
 *
 * The tracepoint fires in set_task_cpu() before the task's CPU changes, so
 * the task's CPU is the one it leaves; it also fires when it stays. */
#ifndef KMO_SCHED_MIGRATE_H
#define KMO_SCHED_MIGRATE_H

enum sched_migrate_kind {
	/* on_rq == 0: placed on a CPU as it wakes up. This includes, mostly, a
	 * task that changes its own affinity: it sleeps until the stopper moved
	 * it (queued when the stopper preempted it before it slept). */
	SCHED_MIGRATE_KIND_WAKEUP = 0,
	/* on_rq != 0: moved while runnable (load balancing, NUMA, another
	 * task changing its affinity) */
	SCHED_MIGRATE_KIND_QUEUED = 1,
};

/* Before 5.16 (and where thread_info is not in the task) the CPU was task->cpu. */
struct task_struct___pre516 {
	unsigned int cpu;
} __attribute__((preserve_access_index));

static __always_inline u32 kmo_task_cpu(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return BPF_CORE_READ(p, thread_info.cpu);
	return BPF_CORE_READ((struct task_struct___pre516 *)p, cpu);
}

/* The kind of a migration from the task's raw on_rq (0, 1 queued, 2 migrating). */
static __always_inline enum sched_migrate_kind kmo_migrate_kind(int on_rq)
{
	return on_rq ? SCHED_MIGRATE_KIND_QUEUED : SCHED_MIGRATE_KIND_WAKEUP;
}

#endif /* KMO_SCHED_MIGRATE_H */
