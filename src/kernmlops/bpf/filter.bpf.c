/* Follows a process tree: a child of a tracked process is tracked too, until
 * it is reaped and freed (the map holds the tree's live processes: a build
 * forks more than its entries). A new process outside the tree whose tgid is
 * tracked took the pid of a tracked process that was reaped (pids are reused,
 * at 32768 on small machines after as many forks): that entry is stale, and
 * goes. */
#include "filter.h"

const volatile bool kmo_follow_children = true;

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = BPF_CORE_READ(parent, tgid);
	u32 ctgid = BPF_CORE_READ(child, tgid);
	u64 start;

	/* Threads share the tgid; only a new process needs an entry. */
	if (ptgid == ctgid)
		return 0;
	if (kmo_follow_children && bpf_map_lookup_elem(&kmo_tracked, &ptgid)) {
		start = BPF_CORE_READ(child, start_time);
		bpf_map_update_elem(&kmo_tracked, &ctgid, &start, BPF_ANY);
	} else {
		bpf_map_delete_elem(&kmo_tracked, &ctgid);
	}
	return 0;
}

/* A process's last task (its group leader) is freed after it was reaped: its
 * tgid leaves, unless a new process of the tree took the freed pid meanwhile
 * (another start time), or user space added it (0: kept). */
static __always_inline int on_free(struct task_struct *task)
{
	u32 pid = BPF_CORE_READ(task, pid), tgid = BPF_CORE_READ(task, tgid);
	u64 *start;

	if (pid != tgid)
		return 0;
	start = bpf_map_lookup_elem(&kmo_tracked, &tgid);
	if (start && *start && *start == BPF_CORE_READ(task, start_time))
		bpf_map_delete_elem(&kmo_tracked, &tgid);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(filter_fork_btf, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child);
}

SEC("raw_tp/sched_process_fork")
int BPF_PROG(filter_fork_raw, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child);
}

SEC("tp_btf/sched_process_free")
int BPF_PROG(filter_free_btf, struct task_struct *task)
{
	return on_free(task);
}

SEC("raw_tp/sched_process_free")
int BPF_PROG(filter_free_raw, struct task_struct *task)
{
	return on_free(task);
}
