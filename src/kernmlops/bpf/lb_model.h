/* MLLB's model in the kernel: the 15 features in Q20.11 fixed point and the
 * 15 -> 10 ReLU -> 1 MLP, with the weights set by user space before load
 * (const volatile: the verifier sees constants). The arithmetic is the one
 * of kernmlops.lb.fixed and of the exported C header, bit for bit. */
#pragma once

#include "common.h"

#define LB_NR_FEAT 15
#define LB_NR_HIDDEN 10
#define LB_FBITS 11
#define LB_ONE (1LL << LB_FBITS)
#define LB_Q_LIMIT ((1LL << 20) - 1) /* |v| << 11 must fit an int32 */
#define LB_MAX_NODES 4
#define LB_MAX_CPUS 256

/* Set before load (kernmlops.lb.hook). */
const volatile bool lb_model_on = false;
const volatile s32 lb_w1[LB_NR_FEAT * LB_NR_HIDDEN] = {}; /* [feature][hidden] */
const volatile s32 lb_b1[LB_NR_HIDDEN] = {};
const volatile s32 lb_w2[LB_NR_HIDDEN] = {};
const volatile s32 lb_b2 = 0;
const volatile s64 lb_migration_cost_ns = 500000;
const volatile u32 lb_nr_nodes = 1;
const volatile u8 lb_cpu_node[LB_MAX_CPUS] = {};

/* What the features start from (kernmlops.lb.features.integer_parts). */
struct lb_inputs {
	s64 delta_ns;
	u64 src_load;
	u64 dst_load;
	s64 delta_faults;
	u64 total_faults;
	u32 src_len;
	u32 src_preferred_len;
	u32 dst_len;
	u32 nr_balance_failed;
	u32 cache_nice_tries;
	u8 cpu_idle;
	u8 cpu_not_idle;
	u8 cpu_newly_idle;
	u8 same_node;
	u8 prefer_src;
	u8 prefer_dst;
	u8 buddy_hot;
};

/* Shadow statistics, per CPU (user space sums them). "filtered": decisions
 * MLLB's filter keeps (task not running, hard constraints passed). */
enum lb_stat {
	LB_STAT_SEEN = 0,
	LB_STAT_AGREE,
	LB_STAT_FILTERED,
	LB_STAT_F_TP, /* model 1, kernel 1 */
	LB_STAT_F_FP, /* model 1, kernel 0 */
	LB_STAT_F_FN, /* model 0, kernel 1 */
	LB_STAT_F_TN, /* model 0, kernel 0 */
	LB_STAT_NS_SUM,
	LB_STAT_NS_MAX,
	LB_STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_STAT_MAX);
	__type(key, u32);
	__type(value, u64);
} lb_stats SEC(".maps");

static __always_inline void lb_stat_add(u32 slot, u64 v)
{
	u64 *n = bpf_map_lookup_elem(&lb_stats, &slot);

	if (n)
		*n += v; /* per-CPU slot */
}

static __always_inline void lb_stat_max(u32 slot, u64 v)
{
	u64 *n = bpf_map_lookup_elem(&lb_stats, &slot);

	if (n && v > *n)
		*n = v;
}

/* Branch-free arithmetic: BPF has no conditional move, so each comparison
 * would be a branch, and the verifier would walk every combination of them
 * (2^15 paths). Valid for |a|, |b| < 2^62, which every input is. The empty
 * asm keeps clang from turning the masks back into selects (branches). */
static __always_inline s64 lb_lt(s64 a, s64 b) /* 1 when a < b */
{
	u64 d = (u64)a - (u64)b, bit;

	/* clang must see neither a comparison nor a 0/1 value here */
	asm volatile("" : "+r"(d));
	bit = d >> 63;
	asm volatile("" : "+r"(bit));
	return bit;
}

static __always_inline s64 lb_min(s64 a, s64 b)
{
	return b + ((a - b) & -lb_lt(a, b));
}

static __always_inline s64 lb_max(s64 a, s64 b)
{
	return a - ((a - b) & -lb_lt(a, b));
}

static __always_inline s64 lb_clamp(s64 v)
{
	return lb_min(lb_max(v, -LB_Q_LIMIT), LB_Q_LIMIT);
}

static __always_inline u32 lb_cpu_to_node(u32 cpu)
{
	return lb_cpu_node[cpu & (LB_MAX_CPUS - 1)];
}

/* The Q20.11 features, in kernmlops.lb.features.FEATURES order. Flags in
 * struct lb_inputs are 0 or 1. */
static __always_inline void lb_features(const struct lb_inputs *in, s64 *x)
{
	s64 total = lb_clamp(in->total_faults), delta = lb_clamp(in->delta_faults);
	s64 sign = delta >> 63, q;

	x[0] = lb_lt(in->src_preferred_len, in->src_len) << LB_FBITS;
	x[1] = lb_lt(in->delta_ns, lb_migration_cost_ns) << LB_FBITS;
	x[2] = (s64)(in->cpu_idle & 1) << LB_FBITS;
	x[3] = (s64)(in->cpu_not_idle & 1) << LB_FBITS;
	x[4] = (s64)(in->cpu_newly_idle & 1) << LB_FBITS;
	x[5] = (s64)(in->same_node & 1) << LB_FBITS;
	x[6] = (s64)(in->prefer_src & 1) << LB_FBITS;
	x[7] = (s64)(in->prefer_dst & 1) << LB_FBITS;
	x[8] = (lb_clamp(in->src_len) - 2) * LB_ONE;
	/* loads are >= 0: unsigned division is C's truncation */
	x[9] = (u64)lb_clamp(in->src_load) * LB_ONE / 1000;
	x[10] = (u64)lb_clamp(in->dst_load) * LB_ONE / 1000;
	x[11] = lb_clamp(in->dst_len) * LB_ONE;
	/* delta * 2048 / total truncated toward zero (no signed division before
	 * BPF v4); total 0 divides by 1, which is MLLB's delta << 11 */
	q = (u64)((delta ^ sign) - sign) * LB_ONE / (u64)lb_max(total, 1);
	x[12] = (q ^ sign) - sign;
	x[13] = lb_lt(in->cache_nice_tries, in->nr_balance_failed) << LB_FBITS;
	x[14] = (s64)(in->buddy_hot & 1) << LB_FBITS;
}

/* The Q20.11 logit: migrate when > 0. */
static __always_inline s64 lb_mlp(const s64 *x)
{
	s64 out = lb_b2;

	/* Loops, not unrolled: the model runs once per decision with cold caches,
	 * and 150 unrolled products are ~6 KiB of machine code to fetch. */
#pragma clang loop unroll(disable)
	for (int j = 0; j < LB_NR_HIDDEN; j++) {
		s64 h = lb_b1[j], sign;

#pragma clang loop unroll(disable)
		for (int k = 0; k < LB_NR_FEAT; k++)
			h += (x[k] * (s64)lb_w1[k * LB_NR_HIDDEN + j]) >> LB_FBITS;
		sign = h >> 63; /* ReLU without a branch, as lb_lt */
		asm volatile("" : "+r"(sign));
		h &= ~sign;
		out += (h * (s64)lb_w2[j]) >> LB_FBITS;
	}
	return out;
}

/* One evaluation: the inputs in, the logit and its time out. */
struct lb_eval {
	struct lb_inputs in;
	s64 out; /* Q20.11 logit: migrate when > 0 */
	u64 ns; /* features + MLP, bpf_ktime_get_ns around them */
};

/* Features + MLP, timed. A global function: the verifier checks it once on
 * its own, instead of once per path of its callers. */
__noinline int lb_eval_model(struct lb_eval *e)
{
	s64 x[LB_NR_FEAT];
	u64 t0;

	if (!e)
		return 0;
	t0 = bpf_ktime_get_ns();
	lb_features(&e->in, x);
	e->out = lb_mlp(x);
	e->ns = bpf_ktime_get_ns() - t0;
	return 0;
}
