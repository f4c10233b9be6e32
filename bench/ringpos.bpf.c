/* bench/ringpos.py: does the reader's way of storing the consumer position make the
 * kernel refuse records? Two programs on sched_switch send a 32-record batch every
 * 32 switches, as quanta_runtime does: one into a ring both CPUs share, one into a
 * ring of its CPU's own. Each refused output is timed, and the unread bytes the
 * ring reports right after are kept (a ring that was not full reports little). */
#include "common.h"

struct rec {
	u64 a, b, c;
	u32 d, e, f, g, h;
	u8 i, j;
};

struct batch {
	u32 n;
	u32 unused;
	u64 first_ns;
	struct rec recs[32];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 23);
} shared SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 23);
} own0 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 23);
} own1 SEC(".maps");

struct outputs {
	u64 sent, refused, refused_ns_max, unread_after_max;
};

/* key 0: the shared ring, key 1: the CPU's own */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct outputs);
} outputs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct batch);
} stage SEC(".maps");

static __always_inline void send(u32 which, void *ring)
{
	struct batch *b = bpf_map_lookup_elem(&stage, &which);
	struct outputs *o = bpf_map_lookup_elem(&outputs, &which);
	u64 t0, dt, unread;

	if (!b || !o || ++b->n < 32)
		return;
	b->n = 0;
	t0 = bpf_ktime_get_ns();
	if (!bpf_ringbuf_output(ring, b, sizeof(*b), BPF_RB_NO_WAKEUP)) {
		o->sent++;
		return;
	}
	dt = bpf_ktime_get_ns() - t0;
	unread = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	o->refused++;
	if (dt > o->refused_ns_max)
		o->refused_ns_max = dt;
	if (unread > o->unread_after_max)
		o->unread_after_max = unread;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(to_shared, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	send(0, &shared);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(to_own, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	if (bpf_get_smp_processor_id() == 0)
		send(1, &own0);
	else
		send(1, &own1);
	return 0;
}
