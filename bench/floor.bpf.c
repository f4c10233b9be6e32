/* The floor of bench/overhead.py: the cheapest useful probe on the scheduler.
 * It counts sched_switch in a per-CPU slot and does nothing else, so a storm's
 * slowdown under it is what attaching any program to the tracepoint costs. */
#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} switches SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_switch)
{
	u32 zero = 0;
	u64 *n = bpf_map_lookup_elem(&switches, &zero);

	if (n)
		*n += 1;
	return 0;
}
