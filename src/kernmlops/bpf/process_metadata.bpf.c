/* process_metadata: a snapshot of every task, written by a task iterator.
 * Reading the iterator's fd once runs the program for each task (thread) and
 * returns one fixed-size record per task; user space decodes the whole buffer
 * with the dtype derived from this struct's BTF.
 *
 * Between snapshots, each task of the scope that is forked or exec'd leaves the
 * same record in process_metadata_seen, keyed by (pid, event): a process that
 * starts and ends between two snapshots is recorded all the same. User space
 * takes the records out (lookup and delete) at each poll. */
#include "filter.h"

#define PF_KTHREAD 0x00200000 /* include/linux/sched.h */

const volatile bool kmo_leaders_only = false; /* one row per process, not thread */

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

/* The event that left a record in process_metadata_seen. */
enum process_metadata_event {
	PROCESS_METADATA_EVENT_FORK = 0, /* the new task, as its parent made it */
	PROCESS_METADATA_EVENT_EXEC = 1, /* the task with its new program's comm */
};

struct process_metadata_seen_key {
	u32 pid;
	enum process_metadata_event event;
};

/* Records of tasks forked or exec'd since user space last took them out. A
 * second exec of one pid before then replaces the first's record. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct process_metadata_seen_key);
	__type(value, struct process_metadata_record);
} process_metadata_seen SEC(".maps");

/* Records that found the map full (user space had not emptied it in time). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} process_metadata_lost SEC(".maps");

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

static __always_inline int seen(struct task_struct *task, enum process_metadata_event event)
{
	struct process_metadata_seen_key key = {};
	struct process_metadata_record rec;
	u32 zero = 0;
	u64 *lost;

	if (kmo_leaders_only && BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return 0;
	fill(&rec, task);
	key.pid = rec.pid;
	key.event = event;
	if (bpf_map_update_elem(&process_metadata_seen, &key, &rec, BPF_ANY)) {
		lost = bpf_map_lookup_elem(&process_metadata_lost, &zero);
		if (lost)
			*lost += 1;
	}
	return 0;
}

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	/* The parent decides, as the filter's own fork program does: the child of a
	 * tracked process is in the scope before the filter's map may say so. */
	if (!kmo_task_wanted(parent) && !kmo_task_wanted(child))
		return 0;
	return seen(child, PROCESS_METADATA_EVENT_FORK);
}

static __always_inline int on_exec(struct task_struct *task)
{
	if (!kmo_task_wanted(task))
		return 0;
	return seen(task, PROCESS_METADATA_EVENT_EXEC);
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
