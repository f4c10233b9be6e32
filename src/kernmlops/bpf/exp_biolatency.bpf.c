/* exporter set biolatency: block I/O by device and op: queue time (insert to
 * issue), service time (issue to completion), requests and bytes.
 *
 * A request's stages are tracked as block_io.bpf.c tracks them (blk_rq.h,
 * shared): the tp_btf / raw_tp tracepoints hand over the `struct request *`,
 * which joins insert, issue and completion. A request is counted for the task
 * that submitted it (the inserting context, else the issuing one), so the job
 * filter follows the submitter, not the kworker that may dispatch later.
 *
 * Compiled twice: as is, and with EXP_BIO_JOBS (exp_biojobs.bpf.c), where each
 * key also carries the submitter's cgroup v2 id and process name, so one
 * exporter tells several jobs apart. */
#include "exp_common.h"
#include "blk_rq.h"

#ifdef EXP_BIO_JOBS
#define BIO_MAP(name) job_##name
/* Jobs come and go (a cgroup and a name per container): when a metric map is
 * full, a new key evicts the least recently used one (its series goes, and
 * starts from 0 if it comes back: a counter reset), so new jobs are always
 * counted. */
#define BIO_METRIC_MAP BPF_MAP_TYPE_LRU_PERCPU_HASH
#else
#define BIO_MAP(name) name
#define BIO_METRIC_MAP BPF_MAP_TYPE_PERCPU_HASH /* device x op: a few keys */
#endif

#define BIO_MAX_SLOT 26 /* 2^26 µs = 67 s */

struct bio_key {
#ifdef EXP_BIO_JOBS
	u64 cgroup;    /* the submitter's cgroup v2 id */
	char comm[16]; /* the submitter's process name (its thread group leader's comm) */
#endif
	u32 dev; /* kernel dev_t: major << 20 | minor */
	u32 op;  /* REQ_OP_* */
};

struct bio_hist {
	u64 slots[BIO_MAX_SLOT + 2];
	u64 sum; /* µs */
};

struct bio_start {
	struct kmo_rq_times t;
	bool wanted; /* the submitter is in the job */
#ifdef EXP_BIO_JOBS
	u64 cgroup;
	char comm[16];
#endif
};

/* Request address -> its start. Plain hash: an in-flight request must not be
 * evicted; completed entries are deleted, stale ones overwritten on reuse. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, struct bio_start);
} BIO_MAP(exp_bio_start) SEC(".maps");

/* issue -> completion */
struct {
	__uint(type, BIO_METRIC_MAP);
	__uint(max_entries, 1024);
	__type(key, struct bio_key);
	__type(value, struct bio_hist);
} BIO_MAP(block_io_latency) SEC(".maps");

/* insert -> issue (0 for a request issued without being queued) */
struct {
	__uint(type, BIO_METRIC_MAP);
	__uint(max_entries, 1024);
	__type(key, struct bio_key);
	__type(value, struct bio_hist);
} BIO_MAP(block_io_queue_latency) SEC(".maps");

struct {
	__uint(type, BIO_METRIC_MAP);
	__uint(max_entries, 1024);
	__type(key, struct bio_key);
	__type(value, u64);
} BIO_MAP(block_io_bytes) SEC(".maps");

static __always_inline struct bio_key rq_key(struct request *rq, struct bio_start *st)
{
	struct bio_key key = {};

	key.dev = kmo_rq_devt(rq);
	key.op = BPF_CORE_READ(rq, cmd_flags) & 0xff; /* REQ_OP_MASK */
#ifdef EXP_BIO_JOBS
	key.cgroup = st->cgroup;
	__builtin_memcpy(key.comm, st->comm, sizeof(key.comm));
#endif
	return key;
}

/* The current task submits the request. */
static __always_inline void set_owner(struct bio_start *st)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	st->wanted = exp_task_wanted(task);
#ifdef EXP_BIO_JOBS
	st->cgroup = exp_task_cgroup_id(task);
	BPF_CORE_READ_STR_INTO(&st->comm, task, group_leader, comm);
#endif
}

/* Inserted into an I/O scheduler: the submitter's context, which a later
 * dispatch (maybe from a kworker) no longer is. */
static __always_inline int on_insert(struct request *rq)
{
	u64 key = (u64)rq, now = bpf_ktime_get_ns();
	struct bio_start *st = bpf_map_lookup_elem(&BIO_MAP(exp_bio_start), &key);
	struct bio_start fresh = {};

	if (st && st->t.requeued) {
		kmo_rq_inserted(&st->t, now); /* back after a requeue: same owner */
		return 0;
	}
	kmo_rq_inserted(&fresh.t, now);
	set_owner(&fresh);
	bpf_map_update_elem(&BIO_MAP(exp_bio_start), &key, &fresh, BPF_ANY);
	return 0;
}

static __always_inline int on_issue(struct request *rq)
{
	u64 key = (u64)rq, now = bpf_ktime_get_ns();
	struct bio_start *st = bpf_map_lookup_elem(&BIO_MAP(exp_bio_start), &key);
	struct bio_start fresh = {};

	if (!st || st->t.issued) {
		/* Issued directly (or a stale entry at a reused address): the
		 * issuing context is the submitter's. */
		set_owner(&fresh);
		kmo_rq_issued(&fresh.t, now);
		bpf_map_update_elem(&BIO_MAP(exp_bio_start), &key, &fresh, BPF_ANY);
		return 0;
	}
	kmo_rq_issued(&st->t, now);
	return 0;
}

/* Requeued: issued again later, after a new insert (keep its owner). */
static __always_inline int on_requeue(struct request *rq)
{
	u64 key = (u64)rq;
	struct bio_start *st = bpf_map_lookup_elem(&BIO_MAP(exp_bio_start), &key);

	if (st)
		kmo_rq_requeued(&st->t);
	return 0;
}

/* Merged into another request: freed without completing. */
static __always_inline int on_merge(struct request *rq)
{
	u64 key = (u64)rq;

	bpf_map_delete_elem(&BIO_MAP(exp_bio_start), &key);
	return 0;
}

static __always_inline int on_complete(struct request *rq, u32 nr_bytes)
{
	u64 now = bpf_ktime_get_ns(), key = (u64)rq;
	struct bio_start *st = bpf_map_lookup_elem(&BIO_MAP(exp_bio_start), &key);
	struct bio_key bkey;
	struct bio_hist zero, *h;

	if (!st)
		return 0;
	if (!st->wanted) {
		if (nr_bytes >= BPF_CORE_READ(rq, __data_len))
			bpf_map_delete_elem(&BIO_MAP(exp_bio_start), &key);
		return 0;
	}
	bkey = rq_key(rq, st);
	exp_count(&BIO_MAP(block_io_bytes), &bkey, nr_bytes);
	/* The tracepoint fires before the request advances: a partial
	 * completion leaves bytes behind and the request lives on. */
	if (nr_bytes < BPF_CORE_READ(rq, __data_len))
		return 0;
	if (st->t.issued) {
		__builtin_memset(&zero, 0, sizeof(zero));
		h = exp_value(&BIO_MAP(block_io_latency), &bkey, &zero);
		if (h)
			EXP_OBSERVE_NS_AS_US(h, kmo_rq_service_ns(&st->t, now));
		h = exp_value(&BIO_MAP(block_io_queue_latency), &bkey, &zero);
		if (h)
			EXP_OBSERVE_NS_AS_US(h, kmo_rq_queue_ns(&st->t));
	}
	bpf_map_delete_elem(&BIO_MAP(exp_bio_start), &key);
	return 0;
}

SEC("tp_btf/block_rq_insert")
int BPF_PROG(exp_bio_insert_btf, struct request *rq)
{
	return on_insert(rq);
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(exp_bio_issue_btf, struct request *rq)
{
	return on_issue(rq);
}

SEC("tp_btf/block_rq_requeue")
int BPF_PROG(exp_bio_requeue_btf, struct request *rq)
{
	return on_requeue(rq);
}

SEC("tp_btf/block_rq_merge")
int BPF_PROG(exp_bio_merge_btf, struct request *rq)
{
	return on_merge(rq);
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(exp_bio_complete_btf, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	return on_complete(rq, nr_bytes);
}

SEC("raw_tp/block_rq_insert")
int BPF_PROG(exp_bio_insert_raw, struct request *rq)
{
	return on_insert(rq);
}

SEC("raw_tp/block_rq_issue")
int BPF_PROG(exp_bio_issue_raw, struct request *rq)
{
	return on_issue(rq);
}

SEC("raw_tp/block_rq_requeue")
int BPF_PROG(exp_bio_requeue_raw, struct request *rq)
{
	return on_requeue(rq);
}

SEC("raw_tp/block_rq_merge")
int BPF_PROG(exp_bio_merge_raw, struct request *rq)
{
	return on_merge(rq);
}

SEC("raw_tp/block_rq_complete")
int BPF_PROG(exp_bio_complete_raw, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	return on_complete(rq, nr_bytes);
}
