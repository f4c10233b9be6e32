/* exporter set pagefaults: page faults (the job's, when filtered), by where
 * they hit (user or kernel mode), from the x86 exceptions tracepoints. */
#include "exp_common.h"

/* key: 0 user, 1 kernel */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, u64);
} page_faults_total SEC(".maps");

static __always_inline int on_fault(u32 kind)
{
	u64 *n;

	if (!exp_current_wanted())
		return 0;
	n = bpf_map_lookup_elem(&page_faults_total, &kind);
	if (n)
		*n += 1;
	return 0;
}

SEC("tp_btf/page_fault_user")
int BPF_PROG(exp_pf_user_btf)
{
	return on_fault(0);
}

SEC("tp_btf/page_fault_kernel")
int BPF_PROG(exp_pf_kernel_btf)
{
	return on_fault(1);
}

SEC("raw_tp/page_fault_user")
int BPF_PROG(exp_pf_user_raw)
{
	return on_fault(0);
}

SEC("raw_tp/page_fault_kernel")
int BPF_PROG(exp_pf_kernel_raw)
{
	return on_fault(1);
}
