/* page_faults: one row per page fault (x86 exceptions tracepoints), or one
 * per sample_every faults of the traced tasks, counted per CPU. */
#include "filter.h"

/* Set before load: keep 1 fault in N (1: all). */
const volatile u32 sample_every = 1;
/* Set before load: count every fault of each process too (page_faults_by_tgid). */
const volatile bool count_by_tgid = false;

enum page_fault_kind {
	PAGE_FAULT_KIND_USER = 0,   /* the fault hit user mode code */
	PAGE_FAULT_KIND_KERNEL = 1, /* kernel code faulted (e.g. copy_to_user) */
};

struct page_fault_event {
	u64 ts_uptime_us;
	kmo_full_u64 address;    /* the faulting address (cr2) */
	kmo_full_u64 ip;         /* instruction pointer at the fault */
	u64 error_code; /* x86 page fault error code (X86_PF_* bits) */
	u32 pid;
	u32 tgid;
	u32 cpu;
	enum page_fault_kind kind;
};
KMO_BATCHED_RING(page_faults_rb, page_fault_event);

/* Faults of traced tasks seen on this CPU, sampled or not, by kind: the exact
 * counts the manifest keeps (rows are 1 in sample_every of them). */
struct page_faults_seen_value {
	u64 by_kind[2]; /* [enum page_fault_kind] */
	u64 not_by_tgid; /* faults page_faults_by_tgid had no room for */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct page_faults_seen_value);
} page_faults_seen SEC(".maps");

/* With count_by_tgid: every fault of each traced process, by kind (exact, as
 * page_faults_seen, for a part of the traced tasks: duet's sides). Shared by
 * the CPUs (atomic adds): a per-CPU hash would take max_entries x CPUs. */
struct page_faults_tgid_value {
	u64 by_kind[2]; /* [enum page_fault_kind] */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); /* sized before load (1 unless count_by_tgid) */
	__type(key, u32);
	__type(value, struct page_faults_tgid_value);
} page_faults_by_tgid SEC(".maps");

static __always_inline void count_tgid(u32 tgid, enum page_fault_kind kind,
				       struct page_faults_seen_value *seen)
{
	struct page_faults_tgid_value *t, zero = {};

	t = bpf_map_lookup_elem(&page_faults_by_tgid, &tgid);
	if (!t) {
		/* NOEXIST: another CPU may have made it in between */
		bpf_map_update_elem(&page_faults_by_tgid, &tgid, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&page_faults_by_tgid, &tgid);
	}
	if (t)
		__sync_fetch_and_add(&t->by_kind[kind & 1], 1);
	else
		seen->not_by_tgid += 1; /* the map is full: said in the manifest */
}

static __always_inline int on_fault(bool btf, unsigned long address, struct pt_regs *regs,
				    unsigned long error_code, enum page_fault_kind kind)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct page_fault_event_batch *batch;
	struct page_fault_event *e;
	struct page_faults_seen_value *seen;
	u32 zero = 0;
	u64 now, n;

	if (!kmo_tgid_wanted(pid_tgid >> 32))
		return 0;
	seen = bpf_map_lookup_elem(&page_faults_seen, &zero);
	if (!seen)
		return 0;
	seen->by_kind[kind & 1] += 1; /* per-CPU: no atomics needed */
	if (count_by_tgid)
		count_tgid(pid_tgid >> 32, kind, seen);
	/* one fault in N of both kinds together is kept */
	n = seen->by_kind[0] + seen->by_kind[1];
	if (sample_every > 1 && n % sample_every)
		return 0;
	e = KMO_BATCH_SLOT(page_faults_rb, batch);
	if (!e)
		return 0;
	now = bpf_ktime_get_ns();
	e->ts_uptime_us = now / 1000;
	e->address = address;
	e->ip = btf ? regs->ip : PT_REGS_IP_CORE(regs);
	e->error_code = error_code;
	e->pid = (u32)pid_tgid;
	e->tgid = pid_tgid >> 32;
	e->cpu = bpf_get_smp_processor_id();
	e->kind = kind;
	KMO_BATCH_PUSH(page_faults_rb, batch, now, 0);
	return 0;
}

SEC("tp_btf/page_fault_user")
int BPF_PROG(fault_user_btf, unsigned long address, struct pt_regs *regs,
	     unsigned long error_code)
{
	return on_fault(true, address, regs, error_code, PAGE_FAULT_KIND_USER);
}

SEC("tp_btf/page_fault_kernel")
int BPF_PROG(fault_kernel_btf, unsigned long address, struct pt_regs *regs,
	     unsigned long error_code)
{
	return on_fault(true, address, regs, error_code, PAGE_FAULT_KIND_KERNEL);
}

SEC("raw_tp/page_fault_user")
int BPF_PROG(fault_user_raw, unsigned long address, struct pt_regs *regs,
	     unsigned long error_code)
{
	return on_fault(false, address, regs, error_code, PAGE_FAULT_KIND_USER);
}

SEC("raw_tp/page_fault_kernel")
int BPF_PROG(fault_kernel_raw, unsigned long address, struct pt_regs *regs,
	     unsigned long error_code)
{
	return on_fault(false, address, regs, error_code, PAGE_FAULT_KIND_KERNEL);
}
