/* process_trace: fork, exec and exit of processes and threads. */
#include "filter.h"

enum process_trace_kind {
	PROCESS_TRACE_KIND_FORK = 0,
	PROCESS_TRACE_KIND_EXEC = 1,
	PROCESS_TRACE_KIND_EXIT = 2,
};

struct process_trace_event {
	u64 ts_uptime_us;
	u32 pid;
	u32 tgid;
	u32 ppid; /* tgid of the parent process */
	enum process_trace_kind kind;
	char comm[16];
	/* exec: the thread that called execve. A thread other than the leader that
	 * execs takes the leader's pid (the row's pid), and its own id ends here:
	 * no exit row follows for it. Otherwise the row's pid. */
	u32 old_pid;
};
KMO_RING(process_trace_rb, process_trace_event);

static __always_inline int emit(struct task_struct *task, enum process_trace_kind kind,
				u32 old_pid)
{
	struct process_trace_event *e;

	e = KMO_RESERVE(process_trace_rb, struct process_trace_event, 0);
	if (!e)
		return 0;
	e->ts_uptime_us = kmo_uptime_us();
	e->pid = BPF_CORE_READ(task, pid);
	e->old_pid = old_pid ? old_pid : e->pid;
	e->tgid = BPF_CORE_READ(task, tgid);
	e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	e->kind = kind;
	BPF_CORE_READ_STR_INTO(&e->comm, task, comm);
	KMO_SUBMIT(process_trace_rb, e);
	return 0;
}

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	/* The parent decides: a tracked parent's child is tracked from now on. */
	if (!kmo_task_wanted(parent) && !kmo_task_wanted(child))
		return 0;
	return emit(child, PROCESS_TRACE_KIND_FORK, 0);
}

static __always_inline int on_task(struct task_struct *task, enum process_trace_kind kind,
				   u32 old_pid)
{
	if (!kmo_task_wanted(task))
		return 0;
	return emit(task, kind, old_pid);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(fork_btf, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(exec_btf, struct task_struct *p, pid_t old_pid)
{
	return on_task(p, PROCESS_TRACE_KIND_EXEC, old_pid);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(exit_btf, struct task_struct *p)
{
	return on_task(p, PROCESS_TRACE_KIND_EXIT, 0);
}

/* raw_tp variants for kernels without tp_btf (the arguments are the same). */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(fork_raw, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child);
}

SEC("raw_tp/sched_process_exec")
int BPF_PROG(exec_raw, struct task_struct *p, pid_t old_pid)
{
	return on_task(p, PROCESS_TRACE_KIND_EXEC, old_pid);
}

SEC("raw_tp/sched_process_exit")
int BPF_PROG(exit_raw, struct task_struct *p)
{
	return on_task(p, PROCESS_TRACE_KIND_EXIT, 0);
}
