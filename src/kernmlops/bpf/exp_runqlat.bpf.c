/* exporter set runqlat: run-queue latency, from wake-up (or preemption) to
 * running, of every task (only the job's with --tgid, --comm or --cgroup); one
 * histogram for them all.
 *
 * The wait is the scheduler's own account, read at the switch in (sched_wait.h,
 * as the collector's quanta_queued_time). Kernels without it (no
 * CONFIG_SCHED_INFO) stamp wake-ups and preemptions in a map instead. */
#include "exp_common.h"
#include "sched_wait.h"

#define RUNQ_MAX_SLOT 26 /* 2^26 µs = 67 s */

struct runq_hist {
	u64 slots[RUNQ_MAX_SLOT + 2];
	u64 sum; /* µs */
};

/* One label set: key 0. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct runq_hist);
} runqueue_latency SEC(".maps");

/* Without sched_info: pid -> when it became runnable. LRU: a wake-up never
 * followed by a switch (the task exited) must not fill the map. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, u64);
} exp_runq_since SEC(".maps");

static __always_inline void enqueued(struct task_struct *p)
{
	u32 pid;
	u64 now;

	if (kmo_has_sched_info(p))
		return; /* the kernel keeps the account (a constant once loaded) */
	pid = BPF_CORE_READ(p, pid);
	if (!pid || !exp_task_wanted(p))
		return;
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&exp_runq_since, &pid, &now, BPF_ANY);
}

static __always_inline int on_switch(bool btf, struct task_struct *prev,
				     struct task_struct *next)
{
	u32 zero = 0, pid = BPF_CORE_READ(next, pid);
	struct runq_hist *h;
	u64 *since, ns;

	if (kmo_has_sched_info(next)) {
		if (!pid || !exp_task_wanted(next) || !kmo_queued_ns(btf, next, &ns))
			return 0;
	} else {
		/* A preempted task is still runnable: it waits on the queue from now. */
		if (kmo_task_state(false, prev) == 0)
			enqueued(prev);
		if (!pid)
			return 0;
		since = bpf_map_lookup_elem(&exp_runq_since, &pid);
		if (!since)
			return 0;
		ns = bpf_ktime_get_ns() - *since;
		bpf_map_delete_elem(&exp_runq_since, &pid);
	}
	h = bpf_map_lookup_elem(&runqueue_latency, &zero);
	if (h)
		EXP_OBSERVE_NS_AS_US(h, ns);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(exp_runq_wakeup_btf, struct task_struct *p)
{
	enqueued(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(exp_runq_wakeup_new_btf, struct task_struct *p)
{
	enqueued(p);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(exp_runq_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(true, prev, next);
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(exp_runq_wakeup_raw, struct task_struct *p)
{
	enqueued(p);
	return 0;
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(exp_runq_wakeup_new_raw, struct task_struct *p)
{
	enqueued(p);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(exp_runq_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(false, prev, next);
}
