/* process_metadata: a snapshot of every task, written by a task iterator.
 * Reading the iterator's fd once runs the program for each task (thread) and
 * returns one fixed-size record per task; user space decodes the whole buffer
 * with the dtype derived from this struct's BTF.
 *
 * Between snapshots, each task of the scope that is forked or exec'd leaves a
 * record in the ring process_metadata_rb: the same fields, the event, and the
 * first bytes of the task's argument block (its argv, NUL-separated), read here
 * because the task may be gone, and its memory with it, by the time user space
 * reads the ring. User space drains the ring by mapping it (no system call per
 * record), as every hook's ring. */
#include "filter.h"

#define PF_KTHREAD 0x00200000 /* include/linux/sched.h */

const volatile bool kmo_leaders_only = false; /* one row per process, not thread */
const volatile bool kmo_capture_args = true; /* false: no argument block is read */

/* Scheduling policies (include/uapi/linux/sched.h), so the policy column also
 * comes out as a name. Values not listed here stay numeric only. */
enum process_metadata_policy {
	PROCESS_METADATA_POLICY_NORMAL = 0,
	PROCESS_METADATA_POLICY_FIFO = 1,
	PROCESS_METADATA_POLICY_RR = 2,
	PROCESS_METADATA_POLICY_BATCH = 3,
	PROCESS_METADATA_POLICY_IDLE = 5,
	PROCESS_METADATA_POLICY_DEADLINE = 6,
	PROCESS_METADATA_POLICY_EXT = 7,
};

struct process_metadata_record {
	u64 ts_uptime_us; /* when the iterator visited the task */
	/* task->start_time is CLOCK_MONOTONIC, the clock of ts_uptime_us */
	u64 start_uptime_us;
	/* task->start_boottime: CLOCK_BOOTTIME, what /proc/<pid>/stat's
	 * starttime counts (in clock ticks) */
	u64 start_boottime_ns;
	u64 cgroup_id; /* of the cgroup v2 (default hierarchy) cgroup: its inode */
	u32 pid;
	u32 tgid;
	u32 ppid; /* tgid of the real parent (0 for the init and kthreadd tasks) */
	s32 nice; /* static_prio - 120 */
	u32 policy;
	enum process_metadata_policy policy_name;
	bool kernel_thread;
	char comm[16];
};

/* Keeps the record struct in the object's BTF, where user space looks it up
 * by name (a type only used by a local variable may not be emitted). The
 * section is one libbpf ignores, like KMO_RING's markers. */
struct process_metadata_record *__kmo_iter_record_process_metadata
	__attribute__((section(".kmo.iter"), used));

/* The event that left a record in process_metadata_rb. */
enum process_metadata_event {
	PROCESS_METADATA_EVENT_FORK = 0, /* the new task, as its parent made it */
	PROCESS_METADATA_EVENT_EXEC = 1, /* the task with its new program's comm */
};

/* Bytes of a task's argument block a ring record holds (a power of two: the
 * read's size is bounded by a mask the verifier can follow). A longer block is
 * cut here; user space completes it from /proc when the process still runs it. */
#define PROCESS_METADATA_ARGS 512

struct process_metadata_event_record {
	struct process_metadata_record task;
	enum process_metadata_event event;
	/* mm->arg_end - mm->arg_start: what /proc/<pid>/cmdline returns, in bytes
	 * (0: no memory of its own, a kernel thread) */
	u32 args_size;
	/* bytes of args read: min(args_size, PROCESS_METADATA_ARGS), 0 if the read
	 * failed (a page not present, which a tracepoint cannot fault in) */
	u32 args_len;
	char args[PROCESS_METADATA_ARGS]; /* NUL-separated; bytes past args_len are stale */
};
/* Records of tasks forked or exec'd, each one, in the order they happened on a
 * CPU; one that finds the ring full is counted in drops (slot 0). */
KMO_RING(process_metadata_rb, process_metadata_event_record);

static __always_inline void fill(struct process_metadata_record *rec, struct task_struct *task)
{
	__builtin_memset(rec, 0, sizeof(*rec));
	rec->ts_uptime_us = kmo_uptime_us();
	rec->start_uptime_us = BPF_CORE_READ(task, start_time) / 1000;
	rec->start_boottime_ns = BPF_CORE_READ(task, start_boottime);
	rec->cgroup_id = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	rec->pid = BPF_CORE_READ(task, pid);
	rec->tgid = BPF_CORE_READ(task, tgid);
	rec->ppid = BPF_CORE_READ(task, real_parent, tgid);
	rec->nice = BPF_CORE_READ(task, static_prio) - 120;
	rec->policy = BPF_CORE_READ(task, policy);
	rec->policy_name = rec->policy;
	rec->kernel_thread = !!(BPF_CORE_READ(task, flags) & PF_KTHREAD);
	BPF_CORE_READ_STR_INTO(&rec->comm, task, comm);
}

SEC("iter/task")
int process_metadata(struct bpf_iter__task *ctx)
{
	struct seq_file *seq = ctx->meta->seq;
	struct task_struct *task = ctx->task;
	struct process_metadata_record rec;

	if (!task) /* the final call, after the last task */
		return 0;
	if (!kmo_task_wanted(task))
		return 0;
	if (kmo_leaders_only && BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return 0;
	fill(&rec, task);
	bpf_seq_write(seq, &rec, sizeof(rec));
	return 0;
}

/* The argument block of `mm`, the memory of the current task (bpf_probe_read_user
 * reads the current task's memory): at fork the parent's, which the child's is a
 * copy of (or, sharing it, is); at exec the new program's, written by the exec. */
static __always_inline void read_args(struct process_metadata_event_record *r,
				      struct mm_struct *mm)
{
	unsigned long start, end;
	u32 len;

	r->args_size = 0;
	r->args_len = 0;
	if (!mm)
		return;
	start = BPF_CORE_READ(mm, arg_start);
	end = BPF_CORE_READ(mm, arg_end);
	if (end <= start)
		return;
	r->args_size = end - start > 0xffffffff ? 0xffffffff : end - start;
	len = r->args_size < PROCESS_METADATA_ARGS ? r->args_size : PROCESS_METADATA_ARGS;
	/* len - 1 masked: 1..PROCESS_METADATA_ARGS, a range the verifier can see */
	if (!bpf_probe_read_user(r->args, ((len - 1) & (PROCESS_METADATA_ARGS - 1)) + 1,
				 (void *)start))
		r->args_len = len;
}

/* `args_of`: the task whose memory is the current one (the parent at fork). */
static __always_inline int seen(struct task_struct *task, struct task_struct *args_of,
				enum process_metadata_event event)
{
	struct process_metadata_event_record *r;

	if (kmo_leaders_only && BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return 0;
	r = KMO_RESERVE(process_metadata_rb, struct process_metadata_event_record, 0);
	if (!r)
		return 0;
	fill(&r->task, task);
	r->event = event;
	if (kmo_capture_args) {
		read_args(r, BPF_CORE_READ(args_of, mm));
	} else {
		r->args_size = 0;
		r->args_len = 0;
	}
	KMO_SUBMIT(process_metadata_rb, r);
	return 0;
}

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	/* The parent decides, as the filter's own fork program does: the child of a
	 * tracked process is in the scope before the filter's map may say so. */
	if (!kmo_task_wanted(parent) && !kmo_task_wanted(child))
		return 0;
	/* the tracepoint runs in the parent: its memory is the current one */
	return seen(child, parent, PROCESS_METADATA_EVENT_FORK);
}

static __always_inline int on_exec(struct task_struct *task)
{
	if (!kmo_task_wanted(task))
		return 0;
	return seen(task, task, PROCESS_METADATA_EVENT_EXEC);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(fork_btf, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(exec_btf, struct task_struct *p)
{
	return on_exec(p);
}

/* raw_tp variants for kernels without tp_btf (the arguments are the same). */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(fork_raw, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child);
}

SEC("raw_tp/sched_process_exec")
int BPF_PROG(exec_raw, struct task_struct *p)
{
	return on_exec(p);
}
