/* exporter set biolatency: block I/O latency (issue to completion) by device
 * and op, requests and bytes. The tp_btf / raw_tp tracepoints hand over the
 * `struct request *`, which joins issue and completion (see block_io.bpf.c). */
#include "exp_common.h"

#define BIO_MAX_SLOT 26 /* 2^26 µs = 67 s */

struct bio_key {
	u32 dev; /* kernel dev_t: major << 20 | minor */
	u32 op;  /* REQ_OP_* */
};

struct bio_hist {
	u64 slots[BIO_MAX_SLOT + 2];
	u64 sum; /* µs */
};

struct bio_start {
	u64 issue_ns;  /* 0 until issued */
	bool wanted;   /* the submitter is in the job */
	bool requeued; /* requeued: its next insert (maybe from a kworker) keeps the owner */
};

/* Request address -> its start. Plain hash: an in-flight request must not be
 * evicted; completed entries are deleted, stale ones overwritten on reuse. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u64);
	__type(value, struct bio_start);
} exp_bio_start SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct bio_key);
	__type(value, struct bio_hist);
} block_io_latency SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct bio_key);
	__type(value, u64);
} block_io_bytes SEC(".maps");

/* Before 5.17 a request pointed to its disk directly. */
struct request___pre517 {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct bio_key rq_key(struct request *rq)
{
	struct gendisk *disk;
	struct bio_key key = {};

	if (bpf_core_field_exists(rq->q->disk))
		disk = BPF_CORE_READ(rq, q, disk);
	else
		disk = BPF_CORE_READ((struct request___pre517 *)rq, rq_disk);
	if (disk)
		key.dev = BPF_CORE_READ(disk, major) << 20 | (BPF_CORE_READ(disk, first_minor) & 0xfffff);
	key.op = BPF_CORE_READ(rq, cmd_flags) & 0xff; /* REQ_OP_MASK */
	return key;
}

/* Inserted into an I/O scheduler: the submitter's context, which a later
 * dispatch (maybe from a kworker) no longer is. */
static __always_inline int on_insert(struct request *rq)
{
	u64 key = (u64)rq;
	struct bio_start *st = bpf_map_lookup_elem(&exp_bio_start, &key);
	struct bio_start fresh = {};

	if (st && st->requeued) {
		st->requeued = false;
		return 0;
	}
	fresh.wanted = exp_current_wanted();
	bpf_map_update_elem(&exp_bio_start, &key, &fresh, BPF_ANY);
	return 0;
}

static __always_inline int on_issue(struct request *rq)
{
	u64 key = (u64)rq;
	struct bio_start *st = bpf_map_lookup_elem(&exp_bio_start, &key);
	struct bio_start fresh = {};

	if (!st) {
		/* Issued directly: the issuing context is the submitter's. */
		fresh.wanted = exp_current_wanted();
		fresh.issue_ns = bpf_ktime_get_ns();
		bpf_map_update_elem(&exp_bio_start, &key, &fresh, BPF_ANY);
		return 0;
	}
	st->issue_ns = bpf_ktime_get_ns();
	st->requeued = false;
	return 0;
}

/* Requeued or merged away: a requeued request is issued again (keep its
 * owner); a merged one is freed without completing. */
static __always_inline int on_requeue(struct request *rq)
{
	u64 key = (u64)rq;
	struct bio_start *st = bpf_map_lookup_elem(&exp_bio_start, &key);

	if (st) {
		st->issue_ns = 0;
		st->requeued = true;
	}
	return 0;
}

static __always_inline int on_merge(struct request *rq)
{
	u64 key = (u64)rq;

	bpf_map_delete_elem(&exp_bio_start, &key);
	return 0;
}

static __always_inline int on_complete(struct request *rq, u32 nr_bytes)
{
	u64 now = bpf_ktime_get_ns(), key = (u64)rq, us;
	struct bio_start *st = bpf_map_lookup_elem(&exp_bio_start, &key);
	struct bio_key bkey;
	struct bio_hist zero, *h;

	if (!st)
		return 0;
	if (!st->wanted) {
		if (nr_bytes >= BPF_CORE_READ(rq, __data_len))
			bpf_map_delete_elem(&exp_bio_start, &key);
		return 0;
	}
	bkey = rq_key(rq);
	exp_count(&block_io_bytes, &bkey, nr_bytes);
	/* The tracepoint fires before the request advances: a partial
	 * completion leaves bytes behind and the request lives on. */
	if (nr_bytes < BPF_CORE_READ(rq, __data_len))
		return 0;
	if (st->issue_ns) {
		us = (now - st->issue_ns) / 1000;
		__builtin_memset(&zero, 0, sizeof(zero));
		h = exp_value(&block_io_latency, &bkey, &zero);
		if (h)
			EXP_OBSERVE(h, exp_slot_exp2(us), us);
	}
	bpf_map_delete_elem(&exp_bio_start, &key);
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
