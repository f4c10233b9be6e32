/* exporter set oncpu: CPU time of tasks (the job's, when filtered) by cgroup
 * (v2), in the scheduler's own account (se.sum_exec_runtime, as cgroup cpu.stat
 * keeps it), added when a task leaves the CPU. */
#include "exp_common.h"
#include "sched_wait.h"

/* Each job task's CPU time at its last switch out (kmo_quantum_of): a slot of
 * exp_oncpu_task_slots, else task storage. */
KMO_TASK_CPU_MAP(exp_oncpu_task);

/* What runs on this CPU and its CPU time when it came in. */
struct oncpu {
	u64 sum_exec_at_in;
	u32 pid;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct oncpu);
} exp_oncpu_cur SEC(".maps");

/* cgroup id -> ns on CPU. Cgroups come and go (a pod's, a job's): when the
 * map is full, a new cgroup evicts the least recently used one (a removed
 * cgroup's first), so new cgroups are always counted; a removed cgroup's
 * series stays until then. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, u64);
} cgroup_cpu_ns SEC(".maps");

static __always_inline int on_switch(bool btf, struct task_struct *prev, struct task_struct *next)
{
	u32 zero = 0, prev_pid = BPF_CORE_READ(prev, pid);
	struct oncpu *cur = bpf_map_lookup_elem(&exp_oncpu_cur, &zero);
	u64 cgid, sum, ns = 0;

	if (!cur)
		return 0;
	/* The quantum that ended (pid 0 is the idle task): from the task's own
	 * account (sched_wait.h: a switch in may never reach this program, and
	 * dropping the quantum after it lost a job's CPU time), else from its
	 * switch in on this CPU. A task whose switch in came before the exporter
	 * started is counted from its next quantum. */
	if (prev_pid && exp_task_wanted(prev)) {
		sum = BPF_CORE_READ(prev, se.sum_exec_runtime);
		if (!kmo_quantum_of(btf, &exp_oncpu_task, &exp_oncpu_task_slots,
				    &exp_oncpu_task_owners, prev, prev_pid, sum, &ns) &&
		    cur->pid == prev_pid && sum > cur->sum_exec_at_in)
			ns = sum - cur->sum_exec_at_in;
		if (ns) {
			cgid = exp_task_cgroup_id(prev);
			exp_count(&cgroup_cpu_ns, &cgid, ns);
		}
	} else if (prev_pid) {
		kmo_task_slot_free(btf, &exp_oncpu_task_slots, &exp_oncpu_task_owners, prev);
	}
	cur->pid = BPF_CORE_READ(next, pid);
	cur->sum_exec_at_in = BPF_CORE_READ(next, se.sum_exec_runtime);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(exp_oncpu_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(true, prev, next);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(exp_oncpu_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(false, prev, next);
}
