/* mm_rss_stat: each change of a process's RSS counters (kmem:rss_stat).
 *
 * The tracepoint fires for the mm being changed, which need not be current's
 * (reclaim by kswapd, khugepaged, process_vm_writev, and the teardown at exit,
 * which runs after current->mm is cleared). Its fields are the kernel's hash of
 * the mm pointer (mm_id), whether it is current's mm (curr), the counter, and
 * the counter's new value in bytes, summed over CPUs. The owner of an mm is
 * only knowable from an event with curr set: it is remembered per mm_id so
 * later events on that mm from other contexts are attributed too. */
#include "filter.h"

/* The kernel's counters (an anonymous enum: MM_FILEPAGES, ...), named here so
 * the column gets labels. */
enum mm_rss_member {
	MM_RSS_MEMBER_FILE = MM_FILEPAGES,
	MM_RSS_MEMBER_ANON = MM_ANONPAGES,
	MM_RSS_MEMBER_SWAP = MM_SWAPENTS,
	MM_RSS_MEMBER_SHMEM = MM_SHMEMPAGES,
};

struct mm_rss_stat_event {
	u64 ts_uptime_us;
	s64 size_bytes; /* the counter's new value */
	u32 pid;        /* the task running when the counter changed */
	u32 tgid;
	u32 mm_tgid;    /* the process whose mm it is; 0 when not (yet) known */
	u32 mm_id;      /* the kernel's hash of the mm pointer */
	enum mm_rss_member member;
	bool curr;      /* the mm is the running task's own */
};
KMO_BATCHED_RING(mm_rss_stat_rb, mm_rss_stat_event);

/* mm_id -> tgid of its owner, learned from events with curr set. LRU: an mm
 * that is gone is forgotten in time. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, u32);
} mm_owner SEC(".maps");

SEC("tracepoint/kmem/rss_stat")
int rss_stat(struct trace_event_raw_rss_stat *ctx)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tgid = pid_tgid >> 32, mm_id = ctx->mm_id, owner = 0, *known;
	struct mm_rss_stat_event_batch *batch;
	struct mm_rss_stat_event *e;
	u64 now;

	if (ctx->curr) {
		owner = tgid;
		if (!kmo_tgid_wanted(owner))
			return 0;
		known = bpf_map_lookup_elem(&mm_owner, &mm_id);
		if (!known || *known != owner)
			bpf_map_update_elem(&mm_owner, &mm_id, &owner, BPF_ANY);
	} else {
		known = bpf_map_lookup_elem(&mm_owner, &mm_id);
		if (known)
			owner = *known;
		/* An mm never seen with curr: judge by the task changing it. */
		if (!kmo_tgid_wanted(owner ? owner : tgid))
			return 0;
	}
	e = KMO_BATCH_SLOT(mm_rss_stat_rb, batch);
	if (!e)
		return 0;
	now = bpf_ktime_get_ns();
	e->ts_uptime_us = now / 1000;
	e->size_bytes = ctx->size;
	e->pid = (u32)pid_tgid;
	e->tgid = tgid;
	e->mm_tgid = owner;
	e->mm_id = mm_id;
	e->member = ctx->member;
	e->curr = ctx->curr;
	KMO_BATCH_PUSH(mm_rss_stat_rb, batch, now, 0);
	return 0;
}
