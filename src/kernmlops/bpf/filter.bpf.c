/* Follows a process tree: a child of a tracked process is tracked too. A new
 * process outside the tree whose tgid is tracked took the pid of a tracked
 * process that was reaped (pids are reused, at 32768 on small machines after
 * as many forks): that entry is stale, and goes. */
#include "filter.h"

const volatile bool kmo_follow_children = true;

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = BPF_CORE_READ(parent, tgid);
	u32 ctgid = BPF_CORE_READ(child, tgid);
	u8 one = 1;

	/* Threads share the tgid; only a new process needs an entry. */
	if (ptgid == ctgid)
		return 0;
	if (kmo_follow_children && bpf_map_lookup_elem(&kmo_tracked, &ptgid))
		bpf_map_update_elem(&kmo_tracked, &ctgid, &one, BPF_ANY);
	else
		bpf_map_delete_elem(&kmo_tracked, &ctgid);
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
