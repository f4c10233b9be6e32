/* Shared by the exporter's metric sets (bpf/exp_*.bpf.c, each with its YAML
 * beside it): the job filter, and counters and histograms kept in BPF maps
 * that the exporter reads when Prometheus scrapes it.
 *
 * Histogram values are `struct { u64 slots[N]; u64 sum; }`: slot i counts
 * observations whose bucket is i (see the EXP_SLOT_* helpers, which match the
 * bucket types of the YAML), the last slot counts those above the largest
 * bucket (they only show in +Inf), and sum is the exact sum of the raw values.
 * Maps are per-CPU, so the programs add without atomics; the exporter sums
 * the CPUs. Programs never delete keys: every value is cumulative. Maps whose
 * keys churn (comms, cgroups) are LRU maps: the kernel evicts the least
 * recently used key to make room, and the series starts again from 0 if the
 * key comes back (a counter reset to Prometheus). */
#pragma once

#include "filter.h" /* kmo_self_tgid, kmo_filter_on, kmo_tracked (collect --export) */

/* Set before load by the exporter (--tgid, --comm, --cgroup); 0 / off: any. */
const volatile u32 exp_tgid = 0;
const volatile bool exp_comm_on = false;
const volatile char exp_comm[16] = {};
const volatile u64 exp_cgroup_id = 0;   /* cgroup v2 id (its kernfs inode) */
const volatile u32 exp_cgroup_level = 0; /* its depth below the root */

/* Inserts that failed because a metric map was full (slot 0), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} exp_map_full SEC(".maps");

/* Before 6.2 a cgroup kept its ancestors' ids rather than pointers. */
struct cgroup___pre62 {
	u64 ancestor_ids[0];
} __attribute__((preserve_access_index));

static __always_inline u64 exp_cgroup_ancestor(struct cgroup *cg, u32 level)
{
	struct cgroup *anc = NULL;
	u64 id = 0;

	if (bpf_core_field_exists(cg->ancestors)) {
		bpf_core_read(&anc, sizeof(anc), &cg->ancestors[level]);
		return anc ? BPF_CORE_READ(anc, kn, id) : 0;
	}
	bpf_core_read(&id, sizeof(id), &((struct cgroup___pre62 *)cg)->ancestor_ids[level]);
	return id;
}

/* The task's cgroup v2 id. */
static __always_inline u64 exp_task_cgroup_id(struct task_struct *t)
{
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/* In the --cgroup cgroup or below it. */
static __always_inline bool exp_cgroup_matches(struct task_struct *t)
{
	struct cgroup *cg;

	if (!exp_cgroup_id)
		return true;
	cg = BPF_CORE_READ(t, cgroups, dfl_cgrp);
	if (!cg || BPF_CORE_READ(cg, level) < (int)exp_cgroup_level)
		return false;
	return exp_cgroup_ancestor(cg, exp_cgroup_level) == exp_cgroup_id;
}

static __always_inline bool exp_comm_matches(struct task_struct *t)
{
	char comm[16];

	if (!exp_comm_on)
		return true;
	BPF_CORE_READ_STR_INTO(&comm, t, comm);
#pragma unroll
	for (int i = 0; i < 16; i++) {
		if (comm[i] != exp_comm[i])
			return false;
		if (!comm[i])
			break;
	}
	return true;
}

/* Whether the task belongs to the job the exporter watches. */
static __always_inline bool exp_task_wanted(struct task_struct *t)
{
	u32 tgid = BPF_CORE_READ(t, tgid);

	if (!kmo_tgid_wanted(tgid))
		return false;
	if (exp_tgid && tgid != exp_tgid)
		return false;
	return exp_comm_matches(t) && exp_cgroup_matches(t);
}

static __always_inline bool exp_current_wanted(void)
{
	return exp_task_wanted((struct task_struct *)bpf_get_current_task());
}

/* The value of key in a per-CPU map, created as `zero` if absent; NULL (and
 * counted) when the map is full. */
static __always_inline void *exp_value(void *map, const void *key, const void *zero)
{
	void *v = bpf_map_lookup_elem(map, key);
	u32 slot = 0;
	u64 *full;

	if (v)
		return v;
	/* NOEXIST: another CPU may have created it meanwhile; look again either way. */
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	v = bpf_map_lookup_elem(map, key);
	if (!v) {
		full = bpf_map_lookup_elem(&exp_map_full, &slot);
		if (full)
			*full += 1;
	}
	return v;
}

/* Add delta to a u64 counter in a per-CPU map. */
static __always_inline void exp_count(void *map, const void *key, u64 delta)
{
	u64 zero = 0, *v = exp_value(map, key, &zero);

	if (v)
		*v += delta;
}

/* floor(log2(v)) for v > 0. */
static __always_inline u32 exp_log2(u64 v)
{
	u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	return r | (u32)(v >> 1);
}

/* Bucket type exp2: slot i holds (2^(i-1), 2^i], slot 0 also 0 (le = 2^i). */
static __always_inline u32 exp_slot_exp2(u64 v)
{
	return v <= 1 ? 0 : exp_log2(v - 1) + 1;
}

/* Bucket type exp2zero: slot 0 holds 0 only, slot i >= 1 (2^(i-2), 2^(i-1)]. */
static __always_inline u32 exp_slot_exp2zero(u64 v)
{
	return v == 0 ? 0 : exp_slot_exp2(v) + 1;
}

/* Bucket type linear: slot i holds the value i (the program divides first). */
static __always_inline u32 exp_slot_linear(u64 v)
{
	return v > 0xFFFFFFFFULL ? 0xFFFFFFFF : (u32)v;
}

/* Bucket type fixed: the first slot whose bound (an array of u64, the YAML's
 * bucket_keys in raw units) holds v; past the last bound, the overflow slot. */
#define EXP_SLOT_FIXED(v, bounds)                                              \
	({                                                                     \
		u32 __i = 0;                                                   \
		for (; __i < sizeof(bounds) / sizeof((bounds)[0]); __i++)      \
			if ((v) <= (bounds)[__i])                              \
				break;                                         \
		__i;                                                           \
	})

/* Count one observation of v in bucket slot of histogram value h; a slot past
 * the last bucket lands in the overflow slot. */
#define EXP_OBSERVE(h, slot, v)                                                \
	do {                                                                   \
		u32 __n = sizeof((h)->slots) / sizeof((h)->slots[0]);          \
		u32 __s = (slot);                                              \
		if (__s > __n - 1)                                             \
			__s = __n - 1;                                         \
		(h)->slots[__s] += 1;                                          \
		(h)->sum += (v);                                               \
	} while (0)

/* Observe a duration read in ns in an exp2 histogram kept in µs. The slot is
 * the µs rounded up: le = 2^i µs holds no wait longer than 2^i µs (truncated,
 * a 1.9 µs wait counted as <= 1 µs, a 4.9 µs one as <= 4 µs). The sum is the
 * µs rounded to the nearest: truncated, each observation lost half a µs. */
#define EXP_OBSERVE_NS_AS_US(h, ns)                                            \
	do {                                                                   \
		u64 __ns = (ns);                                               \
		EXP_OBSERVE(h, exp_slot_exp2((__ns + 999) / 1000),             \
			    (__ns + 500) / 1000);                              \
	} while (0)
