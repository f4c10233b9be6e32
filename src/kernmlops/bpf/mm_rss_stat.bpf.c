/* mm_rss_stat: each change of a process's RSS counters (kmem:rss_stat).
 *
 * The tracepoint fires for the mm being changed, which need not be current's
 * (reclaim by kswapd, khugepaged, process_vm_writev, and the teardown at exit,
 * which runs after current->mm is cleared). Its fields are the kernel's hash of
 * the mm pointer (mm_id), whether it is current's mm (curr), the counter, and
 * the counter's new value in bytes, summed over CPUs. The owner of an mm is
 * only knowable from an event with curr set: it is remembered per mm_id so
 * later events on that mm from other contexts are attributed too.
 *
 * mm_id is a hash of the mm's address, and a freed mm_struct is soon another
 * process's (the slab hands it to the next fork or exec). Nothing tells when
 * an mm is freed, but its teardown does: the owner itself changes the mm
 * without curr (exit clears current->mm first; exec drops the old mm after
 * switching to the new one), and a teardown only lowers counters. From then on
 * the entry is the dying mm's; an event on that mm_id without curr from
 * another process (a fork filling the child's copy, the new owner's own
 * teardown), or one from the owner that raises a counter (its own fork's
 * copy), is of a new mm: the entry is dropped, and the event judged by the
 * task changing it, as for any mm never seen with curr. */
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

/* An mm's owner, learned from events with curr set, whether the owner has
 * begun to tear it down, and each counter's last value. */
struct mm_owner {
	u32 tgid;
	u32 dying;
	s64 last[4]; /* by member (NR_MM_COUNTERS: 4) */
};

/* mm_id -> its owner. LRU: an mm that is gone is forgotten in time. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct mm_owner);
} mm_owner SEC(".maps");

SEC("tracepoint/kmem/rss_stat")
int rss_stat(struct trace_event_raw_rss_stat *ctx)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tgid = pid_tgid >> 32, mm_id = ctx->mm_id, owner = 0, member = ctx->member & 3;
	struct mm_rss_stat_event_batch *batch;
	struct mm_rss_stat_event *e;
	struct mm_owner *known;
	s64 size = ctx->size;
	u64 now;

	if (ctx->curr) {
		owner = tgid;
		if (!kmo_tgid_wanted(owner))
			return 0;
		known = bpf_map_lookup_elem(&mm_owner, &mm_id);
		if (known && known->tgid == owner && !known->dying) {
			known->last[member] = size;
		} else {
			struct mm_owner mine = { .tgid = owner };

			mine.last[member] = size;
			bpf_map_update_elem(&mm_owner, &mm_id, &mine, BPF_ANY);
		}
	} else {
		known = bpf_map_lookup_elem(&mm_owner, &mm_id);
		if (known && known->dying && (known->tgid != tgid || size > known->last[member])) {
			/* the dying mm was freed: this mm_id is a new mm's */
			bpf_map_delete_elem(&mm_owner, &mm_id);
		} else if (known) {
			/* the owner's teardown (exit, exec), or reclaim, khugepaged, ... */
			owner = known->tgid;
			if (owner == tgid)
				known->dying = 1;
			known->last[member] = size;
		}
		/* An mm never seen with curr: judge by the task changing it. */
		if (!kmo_tgid_wanted(owner ? owner : tgid))
			return 0;
	}
	e = KMO_BATCH_SLOT(mm_rss_stat_rb, batch);
	if (!e)
		return 0;
	now = bpf_ktime_get_ns();
	e->ts_uptime_us = now / 1000;
	e->size_bytes = size;
	e->pid = (u32)pid_tgid;
	e->tgid = tgid;
	e->mm_tgid = owner;
	e->mm_id = mm_id;
	e->member = ctx->member;
	e->curr = ctx->curr;
	KMO_BATCH_PUSH(mm_rss_stat_rb, batch, now, 0);
	return 0;
}
