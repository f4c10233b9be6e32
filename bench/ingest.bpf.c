/* Ingest benchmark: one 32-byte record per syscall of one process.
 *
 * Built by bench/ingest.py with kernmlops.ebpf.build.compile_object. The
 * load generator's tgid (and the syscall it storms with) are set before load;
 * every matching sys_enter is counted in `seen` and streamed into `ingest_rb`,
 * so seen == drained + drops once the reader has caught up.
 */
#include "common.h"

struct ingest_event {
	u64 ts_uptime_ns;
	u32 pid;
	u32 tgid;
	s64 syscall_id;
	u32 cpu;
	u32 seq; /* low bits of the per-CPU sequence number: pads to 32 bytes */
};
KMO_RING(ingest_rb, ingest_event);

const volatile u32 target_tgid = 0;
const volatile s64 target_syscall = -1; /* -1: every syscall of target_tgid */
const volatile bool wakeup = false;     /* true: let libbpf's epoll reader be woken */

/* Matching sys_enter events, per CPU (slot 0). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} seen SEC(".maps");

static __always_inline int on_enter(long id)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct ingest_event *e;
	u32 zero = 0;
	u64 *n;

	if ((u32)(pid_tgid >> 32) != target_tgid)
		return 0;
	if (target_syscall >= 0 && id != target_syscall)
		return 0;
	n = bpf_map_lookup_elem(&seen, &zero);
	if (!n)
		return 0;
	*n += 1;
	e = KMO_RESERVE(ingest_rb, struct ingest_event, 0);
	if (!e)
		return 0;
	e->ts_uptime_ns = bpf_ktime_get_ns();
	e->pid = (u32)pid_tgid;
	e->tgid = pid_tgid >> 32;
	e->syscall_id = id;
	e->cpu = bpf_get_smp_processor_id();
	e->seq = (u32)*n;
	if (wakeup)
		bpf_ringbuf_submit(e, 0); /* adaptive: wake only an idle consumer */
	else
		KMO_SUBMIT(ingest_rb, e);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(ingest_btf, struct pt_regs *regs, long id)
{
	return on_enter(id);
}

SEC("raw_tp/sys_enter")
int BPF_PROG(ingest_raw, struct pt_regs *regs, long id)
{
	return on_enter(id);
}
