/* cpu_profile: a sample per cpu-clock tick on every CPU, with the ids of its
 * kernel and user stacks in a stack map; user space reads each new stack once
 * and symbolizes it (kallsyms, /proc/<pid>/maps + ELF symbols). */
#include "filter.h"

/* Frames kept per stack (the kernel's default perf_event_max_stack). */
#define KMO_STACK_DEPTH 127

struct cpu_profile_sample {
	u64 ts_uptime_us;
	u32 cpu;
	u32 pid;
	u32 tgid;
	/* Ids in `stacks`, or -errno: -EFAULT no such stack (a user stack of a
	 * kernel thread, a kernel stack of a sample taken in user mode),
	 * -EEXIST its hash bucket holds another stack (map too small). */
	s32 kernel_stack_id;
	s32 user_stack_id;
	char comm[16];
};

KMO_RING(cpu_profile_rb, cpu_profile_sample);

/* max_entries is set from user space before load (option stack_entries). */
struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(u32));
	__uint(value_size, KMO_STACK_DEPTH * sizeof(u64));
} stacks SEC(".maps");

const volatile bool kmo_sample_idle = false; /* pid 0, the idle task */

SEC("perf_event")
int cpu_profile_sample(struct bpf_perf_event_data *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 pid = (u32)id, tgid = id >> 32;
	struct cpu_profile_sample *e;

	if (!pid && !kmo_sample_idle)
		return 0;
	if (pid && !kmo_tgid_wanted(tgid))
		return 0;
	e = KMO_RESERVE(cpu_profile_rb, struct cpu_profile_sample, 0);
	if (!e)
		return 0;
	e->ts_uptime_us = kmo_uptime_us();
	e->cpu = bpf_get_smp_processor_id();
	e->pid = pid;
	e->tgid = tgid;
	e->kernel_stack_id = bpf_get_stackid(ctx, &stacks, 0);
	e->user_stack_id = pid ? bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK) : -14;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	KMO_SUBMIT(cpu_profile_rb, e);
	return 0;
}
