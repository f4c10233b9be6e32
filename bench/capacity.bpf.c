/* capacity: a producer that fills a ring with quanta_runtime's batches as fast as
 * the ring takes them, for bench/capacity.py.
 *
 * One test run (BPF_PROG_TEST_RUN) is a loop of `steps` steps; each step sends
 * the next of the TEMPLATES batches user space stored (real records of a storm,
 * cycling over more bytes than a frame holds, so compression sees what it would
 * see: no frame repeats itself, shuffled or not), while the ring has room for
 * it; a step that finds the ring three quarters full counts as `full` (the
 * reader is behind) and waits for the next. BATCH_BYTES is the batch's size from
 * the hook's BTF, TEMPLATES their number (-D both).
 */
#include "common.h"

#ifndef BATCH_BYTES
#error "BATCH_BYTES: the size of a quanta batch"
#endif
#ifndef TEMPLATES
#error "TEMPLATES: how many batches user space stores"
#endif

struct batch {
	u8 bytes[BATCH_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} rb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TEMPLATES);
	__type(key, u32);
	__type(value, struct batch);
} templates SEC(".maps");

struct gen {
	u64 sent, full, steps, next;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct gen);
} state SEC(".maps");

const volatile u32 steps = 1 << 20;

struct loop_ctx {
	struct gen *g;
	u64 room;
};

static long step(u32 i, struct loop_ctx *c)
{
	struct gen *g = c->g;
	u32 key = g->next % TEMPLATES;
	struct batch *b;

	g->steps++;
	if (bpf_ringbuf_query(&rb, BPF_RB_AVAIL_DATA) > c->room) {
		g->full++;
		return 0;
	}
	b = bpf_map_lookup_elem(&templates, &key);
	if (!b)
		return 1;
	if (bpf_ringbuf_output(&rb, b, sizeof(*b), BPF_RB_NO_WAKEUP) == 0) {
		g->sent++;
		g->next++;
	}
	return 0;
}

SEC("raw_tp")
int produce(void *ctx)
{
	u32 zero = 0;
	struct loop_ctx c = {
		.g = bpf_map_lookup_elem(&state, &zero),
		.room = bpf_ringbuf_query(&rb, BPF_RB_RING_SIZE) / 4 * 3,
	};

	if (c.g)
		bpf_loop(steps, step, &c, 0);
	return 0;
}
