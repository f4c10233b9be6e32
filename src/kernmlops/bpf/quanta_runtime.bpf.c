/* quanta_runtime: one row per on-CPU quantum; quanta_queued_time: the time a
 * task waited on a run queue, from wake-up (or preemption) to running. */
#include "filter.h"

struct quanta_runtime_event {
	u64 ts_uptime_us; /* end of the quantum */
	u64 quanta_run_length_us;
	u32 cpu;
	u32 pid;
	u32 tgid;
};

struct quanta_queued_event {
	u64 ts_uptime_us; /* when the task started running */
	u64 quanta_queued_time_us;
	u32 cpu;
	u32 pid;
	u32 tgid;
};

KMO_RING(quanta_runtime_rb, quanta_runtime_event);
KMO_RING(quanta_queued_rb, quanta_queued_event);

/* What runs on this CPU, since when, and its CPU time when it came in. */
struct oncpu {
	u64 start_ns;
	u64 sum_exec_at_in; /* next->se.sum_exec_runtime at the switch in */
	u32 pid;
	u32 tgid;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct oncpu);
} oncpu SEC(".maps");

/* pid -> when it became runnable. LRU: a wake-up never followed by a
 * switch (task exited, filter changed) must not fill the map. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, u64);
} enqueued_ns SEC(".maps");

/* Kernels before 5.14 call it `state`. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

static __always_inline long task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___pre514 *)t, state);
}

static __always_inline void mark_enqueued(struct task_struct *p, u64 now)
{
	u32 pid = BPF_CORE_READ(p, pid);

	if (pid && kmo_task_wanted(p))
		bpf_map_update_elem(&enqueued_ns, &pid, &now, BPF_ANY);
}

static __always_inline int on_wakeup(struct task_struct *p)
{
	mark_enqueued(p, bpf_ktime_get_ns());
	return 0;
}

/* Fair-class policies: SCHED_NORMAL, SCHED_BATCH, SCHED_IDLE. */
static __always_inline bool fair_policy(u32 policy)
{
	return policy == 0 || policy == 3 || policy == 5;
}

static __always_inline int on_switch(bool preempt, struct task_struct *prev,
				     struct task_struct *next)
{
	u64 now = bpf_ktime_get_ns();
	u32 cpu = bpf_get_smp_processor_id();
	u32 zero = 0, prev_pid = BPF_CORE_READ(prev, pid), next_pid = BPF_CORE_READ(next, pid);
	u32 prev_tgid = BPF_CORE_READ(prev, tgid);
	struct oncpu *cur = bpf_map_lookup_elem(&oncpu, &zero);
	u64 *since, run_ns = 0;
	bool ended = false;

	if (!cur)
		return 0;

	/* The quantum that just ended (pid 0 is the idle task), in the
	 * scheduler's own CPU-time account: se.sum_exec_runtime is charged for
	 * every class before this tracepoint, so the quantum is its growth since
	 * the switch in. A few switches a second never reach tracepoint programs;
	 * when the switch in was not seen, a fair task's slice start
	 * (prev_sum_exec_runtime, reset whenever the task is picked) is the best
	 * estimate, and for other classes the quantum is not known. */
	if (prev_pid && kmo_tgid_wanted(prev_tgid)) {
		u64 sum = BPF_CORE_READ(prev, se.sum_exec_runtime);

		if (cur->pid == prev_pid && cur->start_ns) {
			run_ns = sum - cur->sum_exec_at_in;
			ended = true;
		} else if (fair_policy(BPF_CORE_READ(prev, policy))) {
			run_ns = sum - BPF_CORE_READ(prev, se.prev_sum_exec_runtime);
			ended = true;
		}
	}
	if (ended) {
		struct quanta_runtime_event *e =
			KMO_RESERVE(quanta_runtime_rb, struct quanta_runtime_event, 0);
		if (e) {
			e->ts_uptime_us = now / 1000;
			e->quanta_run_length_us = (run_ns + 500) / 1000;
			e->cpu = cpu;
			e->pid = prev_pid;
			e->tgid = prev_tgid;
			KMO_SUBMIT(e);
		}
	}

	/* A preempted task is still runnable: it waits on the queue from now. */
	if (prev_pid && task_state(prev) == 0)
		mark_enqueued(prev, now);

	cur->pid = next_pid;
	cur->tgid = BPF_CORE_READ(next, tgid);
	cur->start_ns = now;
	cur->sum_exec_at_in = BPF_CORE_READ(next, se.sum_exec_runtime);

	if (!next_pid)
		return 0;
	since = bpf_map_lookup_elem(&enqueued_ns, &next_pid);
	if (!since)
		return 0;
	if (now > *since) {
		struct quanta_queued_event *q =
			KMO_RESERVE(quanta_queued_rb, struct quanta_queued_event, 1);
		if (q) {
			q->ts_uptime_us = now / 1000;
			q->quanta_queued_time_us = (now - *since + 500) / 1000;
			q->cpu = cpu;
			q->pid = next_pid;
			q->tgid = cur->tgid;
			KMO_SUBMIT(q);
		}
	}
	bpf_map_delete_elem(&enqueued_ns, &next_pid);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(preempt, prev, next);
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(wakeup_btf, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(wakeup_new_btf, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(preempt, prev, next);
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(wakeup_raw, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(wakeup_new_raw, struct task_struct *p)
{
	return on_wakeup(p);
}
