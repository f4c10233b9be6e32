/* block_io: one row per completed block request, from block_rq_insert,
 * block_rq_issue, block_rq_requeue, block_rq_merge and block_rq_complete.
 *
 * tp_btf / raw_tp rather than the classic tracepoints: only they hand us the
 * `struct request *`, which joins the three stages of one request (the classic
 * records carry dev + sector, which is ambiguous and moves on partial
 * completions), and which holds nr_phys_segments and the raw cmd_flags (the
 * classic records only have the lossy rwbs string).
 *
 * A request's start lives in a hash map keyed by its address until it
 * completes, so a request issued before one drain of the ring and completed
 * after it is recorded like any other: rows are only written at completion. */
#include "filter.h"
#include "blk_rq.h" /* the request's stages and times, shared with exp_biolatency */

struct block_io_event {
	u64 ts_uptime_us; /* completion */
	u64 sector; /* first sector, at issue */
	u64 queue_to_issue_us; /* insert -> issue; valid if inserted && issued */
	u64 issue_to_complete_us; /* valid if issued */
	/* rq->start_time_ns -> complete: from the request's allocation for the I/O,
	 * the span /proc/diskstats adds to its time reading / writing (KernMLOps'
	 * block_latency_us); valid if alloc_timed */
	u64 alloc_to_complete_us;
	u32 major;
	u32 minor;
	u32 bytes; /* bytes completed (the sum over partial completions) */
	u32 cmd_flags; /* raw: REQ_OP in the low bits, enum req_flag_bits above */
	u32 inflight; /* requests in flight on the device at issue, this one included */
	/* their segments and their size in 4 KiB units (bytes rounded up), this
	 * one's included: KernMLOps' queue lengths */
	u32 inflight_segments;
	u32 inflight_4k_ios;
	u32 pid; /* the inserting task, else the issuing one */
	u32 tgid;
	u32 cpu; /* the CPU the completion ran on */
	u32 issue_cpu; /* the CPU that issued it to the driver */
	u16 segments; /* nr_phys_segments at issue */
	u8 error; /* blk_status_t of the completion */
	bool inserted; /* went through an I/O scheduler / queue (insert seen) */
	bool issued; /* issue seen (a flush's parent request completes without) */
	bool alloc_timed; /* the request has a start_time_ns (iostats or a scheduler) */
	char comm[16];
};
/* Completions leave in per-CPU batches (one ring output per batch). */
KMO_BATCHED_RING(block_io_rb, block_io_event);

/* Slots of block_io_stats. */
enum block_io_stat {
	STAT_MAP_FULL = 0, /* a request could not be tracked: counted as a drop */
	/* completions of requests whose start was not seen (issued before the hook
	 * started, or while the kernel skipped the programs); a request completed in
	 * parts counts once, at its last */
	STAT_UNKNOWN = 1,
	STAT_REQUEUED = 2,
	/* Requests whose completion the complete program never saw: found still
	 * tracked when their address starts a new request. On kernel 6.18 every BPF
	 * program on the block tracepoints (tp_btf, raw_tp and classic alike, in any
	 * process) is skipped for bursts of a few ms, about once a second under
	 * load, with no recursion miss counted (block_io loses completions,
	 * bench/README.md): the kernel does not run us, so we count what it left. */
	STAT_MISSED = 3,
	STAT_NR = 4,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_NR);
	__type(key, u32);
	__type(value, u64);
} block_io_stats SEC(".maps");

struct rq_info {
	struct kmo_rq_times t;
	u64 sector;
	u32 bytes;
	u32 done_bytes;
	u32 cmd_flags;
	u32 major;
	u32 minor;
	u32 inflight;
	u32 inflight_segments;
	u32 inflight_4k_ios;
	u32 pid;
	u32 tgid;
	u32 issue_cpu;
	u16 segments;
	bool wanted;
	char comm[16];
};

/* Request address -> its start. A plain hash, not LRU: an in-flight request
 * must never be evicted. Requests are preallocated per tag set, so the key
 * space is bounded; a completed request's entry is deleted, and a stale one is
 * overwritten when its address is reused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u64);
	__type(value, struct rq_info);
} rq_start SEC(".maps");

/* What a device has issued and not yet completed, and its completions as the
 * programs met them: user space sets them beside /proc/diskstats' count at the
 * stop (a disk's completions that neither a row nor a count holds were never
 * seen: the kernel skipped every program for them). Requests issued before the
 * hook started are not in the queue. */
struct dev_queue {
	s64 requests; /* first: a reader of the map may take it alone */
	/* segments << 32 | 4 KiB units: one atomic add moves both, so a reading is a
	 * pair that was true at one instant (three adds let another CPU's issue land
	 * between them). Neither goes below 0 (every take matches an add of the same
	 * request), so no borrow crosses the halves. */
	u64 size;
	/* Completions by their fate, counted in the entry the completion looks up
	 * anyway (no lookup more on the hot path): */
	u64 rows; /* a row (or a drop, where the ring was full) */
	u64 unwanted; /* no row: the filter did not want it, or the collector's own */
	u64 missed; /* STAT_MISSED, by disk */
	u64 unknown; /* STAT_UNKNOWN, by disk */
};

/* (major << 20 | minor) -> its queue. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct dev_queue);
} dev_inflight SEC(".maps");

static __always_inline void count(u32 slot)
{
	u64 *n = bpf_map_lookup_elem(&block_io_stats, &slot);

	if (n)
		*n += 1;
}

static __always_inline u32 dev_key(u32 major, u32 minor)
{
	return major << 20 | (minor & 0xfffff);
}

/* A request's size in 4 KiB units, rounded up (KernMLOps' 4k I/Os). */
static __always_inline u32 ios_4k(u32 bytes)
{
	return (u32)(((u64)bytes + 4095) >> 12);
}

/* A device's entry in dev_inflight, made on its first use; NULL when the map
 * has no room. */
static __always_inline struct dev_queue *dev_queue_of(u32 major, u32 minor)
{
	u32 key = dev_key(major, minor);
	struct dev_queue zero = {}, *q = bpf_map_lookup_elem(&dev_inflight, &key);

	if (q)
		return q;
	bpf_map_update_elem(&dev_inflight, &key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&dev_inflight, &key);
}

/* Add the request (sign 1, at its issue) to its device's queue or take it out
 * (sign -1); at issue, store the queue after it in info. The request count and
 * the size pair are two adds: another CPU's issue or completion can land
 * between them. */
static __always_inline void inflight_add(struct dev_queue *q, struct rq_info *info, s64 sign)
{
	u64 size = (u64)info->segments << 32 | (u64)ios_4k(info->bytes), after;
	s64 n;

	if (!q)
		return;
	n = __sync_fetch_and_add(&q->requests, sign) + sign;
	if (sign < 0)
		size = -size;
	after = __sync_fetch_and_add(&q->size, size) + size;
	if (sign > 0) {
		info->inflight = n;
		info->inflight_segments = after >> 32;
		info->inflight_4k_ios = (u32)after;
	}
}

/* What the request is at issue (merges are over by then). */
static __always_inline void snapshot(struct request *rq, struct rq_info *info)
{
	struct gendisk *disk = kmo_rq_disk(rq);

	info->sector = BPF_CORE_READ(rq, __sector);
	info->bytes = BPF_CORE_READ(rq, __data_len);
	info->segments = BPF_CORE_READ(rq, nr_phys_segments);
	info->cmd_flags = BPF_CORE_READ(rq, cmd_flags);
	info->major = disk ? BPF_CORE_READ(disk, major) : 0;
	info->minor = disk ? BPF_CORE_READ(disk, first_minor) : 0;
}

/* Fill the owner from the current task, applying the process filter. */
static __always_inline void set_owner(struct rq_info *info)
{
	u64 id = bpf_get_current_pid_tgid();

	info->pid = (u32)id;
	info->tgid = id >> 32;
	info->wanted = kmo_tgid_wanted(info->tgid);
	bpf_get_current_comm(&info->comm, sizeof(info->comm));
}

/* An entry marked issued whose completion we never saw (its address is being
 * reused): take it out of its device's in-flight count. */
static __always_inline void forget_issue(struct rq_info *info)
{
	if (info->t.issued) {
		inflight_add(dev_queue_of(info->major, info->minor), info, -1);
		info->t.issued = false;
	}
}

/* A tracked request's address starts a new request (insert), or is issued
 * again without a requeue: the old one completed unseen. It is counted on its
 * disk, known once it was issued; else on the new request's (the same
 * preallocated request of the same tag set: the same disk but where disks share
 * one, as NVMe namespaces do). */
static __always_inline void missed(struct request *rq, struct rq_info *info)
{
	struct gendisk *disk;
	struct dev_queue *q;

	if (!info->t.requeued) {
		count(STAT_MISSED);
		if (info->major || info->minor) {
			q = dev_queue_of(info->major, info->minor);
		} else {
			disk = kmo_rq_disk(rq);
			q = disk ? dev_queue_of(BPF_CORE_READ(disk, major),
						BPF_CORE_READ(disk, first_minor))
				 : NULL;
		}
		if (q)
			__sync_fetch_and_add(&q->missed, 1);
	}
	forget_issue(info);
}

static __always_inline int on_insert(struct request *rq)
{
	u64 key = (u64)rq;
	struct rq_info *info = bpf_map_lookup_elem(&rq_start, &key);
	struct rq_info fresh = {};

	if (info && info->t.requeued) {
		/* Inserted again after a requeue: keep the owner. */
		kmo_rq_inserted(&info->t, bpf_ktime_get_ns());
		return 0;
	}
	if (info)
		missed(rq, info); /* stale: this address is a new request */
	kmo_rq_inserted(&fresh.t, bpf_ktime_get_ns());
	set_owner(&fresh);
	if (bpf_map_update_elem(&rq_start, &key, &fresh, BPF_ANY))
		count(STAT_MAP_FULL);
	return 0;
}

static __always_inline int on_issue(struct request *rq)
{
	u64 key = (u64)rq;
	struct rq_info *info = bpf_map_lookup_elem(&rq_start, &key);
	struct rq_info fresh = {};

	if (!info) {
		/* Issued directly (no scheduler, no insert): the issuing context is
		 * the submitter's. */
		set_owner(&fresh);
		if (bpf_map_update_elem(&rq_start, &key, &fresh, BPF_ANY)) {
			count(STAT_MAP_FULL);
			return 0;
		}
		info = bpf_map_lookup_elem(&rq_start, &key);
		if (!info)
			return 0;
	} else if (info->t.issued) {
		missed(rq, info); /* issued twice with no requeue between */
	}
	snapshot(rq, info);
	kmo_rq_issued(&info->t, bpf_ktime_get_ns());
	info->done_bytes = 0;
	info->issue_cpu = bpf_get_smp_processor_id();
	/* Every request counts toward its device's queue, wanted or not. */
	inflight_add(dev_queue_of(info->major, info->minor), info, 1);
	return 0;
}

static __always_inline int on_requeue(struct request *rq)
{
	u64 key = (u64)rq;
	struct rq_info *info = bpf_map_lookup_elem(&rq_start, &key);

	if (!info)
		return 0;
	count(STAT_REQUEUED);
	forget_issue(info);
	kmo_rq_requeued(&info->t); /* it is inserted again before its next issue */
	return 0;
}

/* A request merged into another is freed without completing. */
static __always_inline int on_merge(struct request *rq)
{
	u64 key = (u64)rq;
	struct rq_info *info = bpf_map_lookup_elem(&rq_start, &key);

	if (info) {
		forget_issue(info);
		bpf_map_delete_elem(&rq_start, &key);
	}
	return 0;
}

static __always_inline int on_complete(struct request *rq, u8 error, u32 nr_bytes)
{
	u64 now = bpf_ktime_get_ns(), key = (u64)rq, start = 0;
	struct rq_info *info = bpf_map_lookup_elem(&rq_start, &key);
	struct block_io_event_batch *batch;
	struct block_io_event *e;
	struct gendisk *disk;
	struct dev_queue *q;
	u32 left;

	/* The tracepoint fires before the request is advanced: a partial
	 * completion leaves bytes behind and the request lives on. */
	left = BPF_CORE_READ(rq, __data_len);
	if (!info) {
		if (nr_bytes < left)
			return 0; /* counted once, at its last part */
		count(STAT_UNKNOWN);
		disk = kmo_rq_disk(rq);
		q = disk ? dev_queue_of(BPF_CORE_READ(disk, major), BPF_CORE_READ(disk, first_minor))
			 : NULL;
		if (q)
			__sync_fetch_and_add(&q->unknown, 1);
		return 0;
	}
	if (nr_bytes < left) {
		info->done_bytes += nr_bytes;
		return 0;
	}
	if (!info->t.issued)
		snapshot(rq, info); /* e.g. a flush's parent, ended by the flush machinery */
	if (info->wanted) {
		e = KMO_BATCH_SLOT(block_io_rb, batch);
		if (e) {
			e->ts_uptime_us = now / 1000;
			e->sector = info->sector;
			e->inserted = info->t.insert_ns != 0;
			e->issued = info->t.issued;
			e->queue_to_issue_us = (kmo_rq_queue_ns(&info->t) + 500) / 1000;
			e->issue_to_complete_us = info->t.issued
							  ? (kmo_rq_service_ns(&info->t, now) + 500) / 1000
							  : 0;
			/* 0 where the kernel took no time stamp (no iostats, no scheduler);
			 * on the clock of bpf_ktime_get_ns (blk_time_get_ns) */
			if (bpf_core_field_exists(rq->start_time_ns))
				start = BPF_CORE_READ(rq, start_time_ns);
			e->alloc_timed = start && start <= now;
			e->alloc_to_complete_us = e->alloc_timed ? (now - start + 500) / 1000 : 0;
			e->major = info->major;
			e->minor = info->minor;
			e->bytes = info->done_bytes + nr_bytes;
			e->cmd_flags = info->cmd_flags;
			e->inflight = info->t.issued ? info->inflight : 0;
			e->inflight_segments = info->t.issued ? info->inflight_segments : 0;
			e->inflight_4k_ios = info->t.issued ? info->inflight_4k_ios : 0;
			e->pid = info->pid;
			e->tgid = info->tgid;
			e->cpu = bpf_get_smp_processor_id();
			e->issue_cpu = info->t.issued ? info->issue_cpu : 0;
			e->segments = info->segments;
			e->error = error;
			__builtin_memcpy(e->comm, info->comm, sizeof(e->comm));
			KMO_BATCH_PUSH(block_io_rb, batch, now, 0);
		}
	}
	q = dev_queue_of(info->major, info->minor);
	if (info->t.issued)
		inflight_add(q, info, -1);
	if (q)
		__sync_fetch_and_add(info->wanted ? &q->rows : &q->unwanted, 1);
	bpf_map_delete_elem(&rq_start, &key);
	return 0;
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(insert_btf, struct request *rq)
{
	return on_insert(rq);
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(issue_btf, struct request *rq)
{
	return on_issue(rq);
}

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(requeue_btf, struct request *rq)
{
	return on_requeue(rq);
}

SEC("tp_btf/block_rq_merge")
int BPF_PROG(merge_btf, struct request *rq)
{
	return on_merge(rq);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(complete_btf, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	return on_complete(rq, error, nr_bytes);
}

/* raw_tp variants for kernels without tp_btf (the arguments are the same). */
SEC("raw_tp/block_rq_insert")
int BPF_PROG(insert_raw, struct request *rq)
{
	return on_insert(rq);
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(issue_raw, struct request *rq)
{
	return on_issue(rq);
}

SEC("raw_tp/block_rq_requeue")
int BPF_PROG(requeue_raw, struct request *rq)
{
	return on_requeue(rq);
}

SEC("raw_tp/block_rq_merge")
int BPF_PROG(merge_raw, struct request *rq)
{
	return on_merge(rq);
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(complete_raw, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	return on_complete(rq, error, nr_bytes);
}
