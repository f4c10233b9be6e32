/* exporter set migrations: tasks of the job moved to another CPU, by kind:
 * placed elsewhere as it woke up, or moved while runnable (load balancing,
 * affinity changes of a queued task, NUMA). */
#include "exp_common.h"

/* key: 0 wakeup, 1 queued */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, u64);
} task_migrations_total SEC(".maps");

/* Before 5.16 (and where thread_info is not in the task) the CPU was task->cpu. */
struct task_struct___pre516 {
	unsigned int cpu;
} __attribute__((preserve_access_index));

static __always_inline u32 task_cpu(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return BPF_CORE_READ(p, thread_info.cpu);
	return BPF_CORE_READ((struct task_struct___pre516 *)p, cpu);
}

/* Fires before the task's CPU changes, also when it stays where it is. */
static __always_inline int on_migrate(struct task_struct *p, int dest_cpu)
{
	u32 kind;
	u64 *n;

	if (task_cpu(p) == (u32)dest_cpu || !exp_task_wanted(p))
		return 0;
	kind = BPF_CORE_READ(p, on_rq) ? 1 : 0;
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
