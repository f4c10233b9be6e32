/* A block request's life, shared by the collector (block_io.bpf.c) and the
 * exporter (exp_biolatency.bpf.c): which disk it is on, and when it was
 * inserted into a queue and issued to the driver, so both report the same
 * queue time (block_rq_insert -> block_rq_issue) and service time
 * (block_rq_issue -> block_rq_complete).
 *
 * Each program keeps a `struct kmo_rq_times` per request (in its own map,
 * keyed by the request's address, which joins the stages: only the tp_btf /
 * raw_tp tracepoints hand over the `struct request *`) and calls these at
 * each stage. A requeued request is inserted again before its next issue; its
 * queue time then runs from the new insert. A request issued with no insert
 * (no I/O scheduler, or one that issues directly) waited in no queue: its
 * queue time is 0. */
#pragma once

#include "common.h"

struct kmo_rq_times {
	u64 insert_ns; /* 0: not inserted (issued directly) */
	u64 issue_ns;  /* valid if issued */
	bool issued;
	bool requeued; /* its next insert keeps the request's owner */
};

/* Before 5.17 a request pointed to its disk directly. */
struct request___pre517 {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *kmo_rq_disk(struct request *rq)
{
	if (bpf_core_field_exists(rq->q->disk))
		return BPF_CORE_READ(rq, q, disk);
	return BPF_CORE_READ((struct request___pre517 *)rq, rq_disk);
}

/* The kernel's dev_t of the request's disk: major << 20 | minor (0: none). */
static __always_inline u32 kmo_rq_devt(struct request *rq)
{
	struct gendisk *disk = kmo_rq_disk(rq);

	if (!disk)
		return 0;
	return BPF_CORE_READ(disk, major) << 20 | (BPF_CORE_READ(disk, first_minor) & 0xfffff);
}

/* Inserted. Returns true when this starts a new request (the caller records its
 * owner), false when it is a requeued request coming back (the owner stays). */
static __always_inline bool kmo_rq_inserted(struct kmo_rq_times *t, u64 now)
{
	bool again = t->requeued;

	if (!again)
		__builtin_memset(t, 0, sizeof(*t));
	t->insert_ns = now;
	t->requeued = false;
	return !again;
}

static __always_inline void kmo_rq_issued(struct kmo_rq_times *t, u64 now)
{
	t->issue_ns = now;
	t->issued = true;
	t->requeued = false;
}

/* Requeued: it will be inserted (and issued) again. */
static __always_inline void kmo_rq_requeued(struct kmo_rq_times *t)
{
	t->insert_ns = 0;
	t->issue_ns = 0;
	t->issued = false;
	t->requeued = true;
}

/* Insert -> issue in ns; 0 when it was issued without an insert. Only
 * meaningful once issued. */
static __always_inline u64 kmo_rq_queue_ns(const struct kmo_rq_times *t)
{
	return t->issued && t->insert_ns && t->issue_ns > t->insert_ns ? t->issue_ns - t->insert_ns
									: 0;
}

/* Issue -> now (the completion) in ns; 0 when never issued. */
static __always_inline u64 kmo_rq_service_ns(const struct kmo_rq_times *t, u64 now)
{
	return t->issued ? now - t->issue_ns : 0;
}
