/* exporter set migrations: tasks (the job's, when filtered) moved to another
 * CPU, by kind: placed elsewhere as it woke up, or moved while runnable (load
 * balancing, affinity changes of a queued task, NUMA). */
#include "exp_common.h"
#include "sched_migrate.h" /* the CPU it leaves, the kind: as the collector's sched_migrate */

/* key: enum sched_migrate_kind (0 wakeup, 1 queued) */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, u64);
} task_migrations_total SEC(".maps");

/* Fires before the task's CPU changes, also when it stays where it is. */
static __always_inline int on_migrate(struct task_struct *p, int dest_cpu)
{
	u32 kind;
	u64 *n;

	if (kmo_task_cpu(p) == (u32)dest_cpu || !exp_task_wanted(p))
		return 0;
	kind = kmo_migrate_kind(BPF_CORE_READ(p, on_rq));
	n = bpf_map_lookup_elem(&task_migrations_total, &kind);
	if (n)
		*n += 1;
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(exp_migrate_btf, struct task_struct *p, int dest_cpu)
{
	return on_migrate(p, dest_cpu);
}

SEC("raw_tp/sched_migrate_task")
int BPF_PROG(exp_migrate_raw, struct task_struct *p, int dest_cpu)
{
	return on_migrate(p, dest_cpu);
}
