/* process_metadata: a snapshot of every task, written by a task iterator.
 * Reading the iterator's fd once runs the program for each task (thread) and
 * returns one fixed-size record per task; user space decodes the whole buffer
 * with the dtype derived from this struct's BTF. */
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
	__builtin_memset(&rec, 0, sizeof(rec));
	rec.ts_uptime_us = kmo_uptime_us();
	rec.start_uptime_us = BPF_CORE_READ(task, start_time) / 1000;
	rec.start_boottime_ns = BPF_CORE_READ(task, start_boottime);
	rec.cgroup_id = BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
	rec.pid = BPF_CORE_READ(task, pid);
	rec.tgid = BPF_CORE_READ(task, tgid);
	rec.ppid = BPF_CORE_READ(task, real_parent, tgid);
	rec.nice = BPF_CORE_READ(task, static_prio) - 120;
	rec.policy = BPF_CORE_READ(task, policy);
	rec.policy_name = rec.policy;
	rec.kernel_thread = !!(BPF_CORE_READ(task, flags) & PF_KTHREAD);
	BPF_CORE_READ_STR_INTO(&rec.comm, task, comm);
	bpf_seq_write(seq, &rec, sizeof(rec));
	return 0;
}
