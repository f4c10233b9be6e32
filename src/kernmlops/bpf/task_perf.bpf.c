/* task_perf: perf counters charged to the task that ran, quantum by quantum.
 *
 * User space opens one counting perf event per CPU and event (pid -1: the
 * whole CPU) and puts it in task_perf_counters at cpu * KMO_TASK_PERF_EVENTS
 * + event. At every context switch this program reads this CPU's counters
 * (bpf_perf_event_read_value: the value plus enabled and running time) and
 * emits what each grew by since the previous switch on this CPU: the count
 * of the quantum `prev` just ended. Summing a task's rows gives its own
 * count, whatever else shared its CPUs.
 *
 * A few events are counted by the kernel just after this tracepoint, when
 * the previous task is switched out (context-switches: in
 * perf_event_task_sched_out). Their growth over a quantum belongs to the task
 * switched out when it began, so each record also names that task (out_pid,
 * out_tgid) and user space charges those events to it.
 *
 * A quantum whose start was not seen on this CPU (a switch the program
 * missed; a few a second on a busy machine) mixes tasks: it is not emitted;
 * task_perf_stats counts such quanta and task_perf_unattributed what each
 * event grew by in them, so the loss is known. */
#include "filter.h"

#define KMO_TASK_PERF_EVENTS 8

/* Set before load: the number of events in use (<= KMO_TASK_PERF_EVENTS). */
const volatile u32 n_events = 0;

struct task_perf_event {
	u64 ts_uptime_us;                         /* the switch that ended the quantum */
	u64 count[KMO_TASK_PERF_EVENTS];          /* growth over the quantum */
	u64 cumulative[KMO_TASK_PERF_EVENTS];     /* this CPU's counter at the switch */
	u64 enabled_ns[KMO_TASK_PERF_EVENTS];     /* the counter's time enabled, cumulative */
	u64 running_ns[KMO_TASK_PERF_EVENTS];     /* ... and time on the PMU (multiplexing) */
	u32 cpu;
	u32 pid;      /* the task whose quantum ended (prev) */
	u32 tgid;
	u32 out_pid;  /* the task switched out when the quantum began */
	u32 out_tgid;
	u8 charge_task; /* pid's tgid is traced (and pid is not the idle task) */
	u8 charge_out;  /* out_pid's tgid is traced */
};

KMO_BATCHED_RING(task_perf_rb, task_perf_event);

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(u32));
	__uint(value_size, sizeof(u32));
	__uint(max_entries, KMO_TASK_PERF_EVENTS); /* set from user space */
} task_perf_counters SEC(".maps");

/* This CPU's counters at the last switch and who ran since. */
struct task_perf_cpu {
	u64 last[KMO_TASK_PERF_EVENTS];
	u32 pid;
	u32 out_pid;
	u32 out_tgid;
	u32 seen;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct task_perf_cpu);
} task_perf_state SEC(".maps");

/* 0: quanta not emitted (start unseen); 1: counter reads that failed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, u64);
} task_perf_stats SEC(".maps");

/* Per event: growth in quanta that were not emitted (start unseen). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KMO_TASK_PERF_EVENTS);
	__type(key, u32);
	__type(value, u64);
} task_perf_unattributed SEC(".maps");

static __always_inline void count_stat(u32 slot)
{
	u64 *n = bpf_map_lookup_elem(&task_perf_stats, &slot);

	if (n)
		*n += 1;
}

static __always_inline int on_switch(bool btf, struct task_struct *prev, struct task_struct *next)
{
	u32 zero = 0, cpu = bpf_get_smp_processor_id();
	u32 prev_pid = KMO_READ(btf, prev, pid), prev_tgid = KMO_READ(btf, prev, tgid);
	struct task_perf_cpu *st = bpf_map_lookup_elem(&task_perf_state, &zero);
	struct task_perf_event_batch *batch = NULL;
	struct task_perf_event *e = NULL;
	struct bpf_perf_event_value v;
	bool task, out, emit, unseen;
	u64 *lost;
	u64 now;
	u32 i;

	if (!st)
		return 0;
	task = prev_pid && kmo_tgid_wanted(prev_tgid);
	out = st->out_pid && kmo_tgid_wanted(st->out_tgid);
	emit = st->seen && st->pid == prev_pid && (task || out);
	unseen = st->seen && st->pid != prev_pid;
	if (unseen)
		count_stat(0);
	if (emit)
		e = KMO_BATCH_SLOT(task_perf_rb, batch);
	for (i = 0; i < KMO_TASK_PERF_EVENTS; i++) {
		if (i >= n_events)
			break;
		if (bpf_perf_event_read_value(&task_perf_counters, cpu * KMO_TASK_PERF_EVENTS + i,
					      &v, sizeof(v))) {
			count_stat(1);
			v.counter = st->last[i]; /* charge nothing for this event */
			v.enabled = 0;
			v.running = 0;
		}
		if (unseen) {
			u32 key = i;

			lost = bpf_map_lookup_elem(&task_perf_unattributed, &key);
			if (lost)
				*lost += v.counter - st->last[i];
		}
		if (e) {
			e->count[i] = v.counter - st->last[i];
			e->cumulative[i] = v.counter;
			e->enabled_ns[i] = v.enabled;
			e->running_ns[i] = v.running;
		}
		st->last[i] = v.counter;
	}
	if (e && batch) {
		now = bpf_ktime_get_ns();
		e->ts_uptime_us = now / 1000;
		e->cpu = cpu;
		e->pid = prev_pid;
		e->tgid = prev_tgid;
		e->out_pid = st->out_pid;
		e->out_tgid = st->out_tgid;
		e->charge_task = task;
		e->charge_out = out;
		KMO_BATCH_PUSH(task_perf_rb, batch, now, 0);
	}
	st->out_pid = prev_pid;
	st->out_tgid = prev_tgid;
	st->pid = KMO_READ(btf, next, pid);
	st->seen = 1;
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(task_perf_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(true, prev, next);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(task_perf_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return on_switch(false, prev, next);
}
