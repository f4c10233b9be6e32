/* The process filter shared by every hook. The map is created by the filter
 * object (filter.bpf.c); user space makes every other object reuse its fd,
 * so one set of tracked tgids steers all hooks. */
#pragma once

#include "common.h"

/* Set before load by user space. */
const volatile u32 kmo_self_tgid = 0;   /* the collector: never traced */
const volatile bool kmo_filter_on = false; /* false: system-wide */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);   /* tgid */
	__type(value, u8);
} kmo_tracked SEC(".maps");

static __always_inline bool kmo_tgid_wanted(u32 tgid)
{
	if (tgid == kmo_self_tgid)
		return false;
	if (!kmo_filter_on)
		return true;
	return bpf_map_lookup_elem(&kmo_tracked, &tgid) != NULL;
}

/* A CPU's memory of tgids the filter wanted, in a per-CPU value of the caller:
 * KMO_WANTED_SLOTS of them, each tgid in slot tgid % KMO_WANTED_SLOTS. The map
 * only grows (user space and the fork program add; nothing removes), so a tgid
 * once wanted stays wanted and a remembered yes needs no lookup; a no is asked
 * again each time (a new process of the tree may take a tgid that was not). */
#define KMO_WANTED_SLOTS 8

static __always_inline bool kmo_tgid_wanted_cached(u32 *slots, u32 tgid)
{
	u32 *slot = &slots[tgid & (KMO_WANTED_SLOTS - 1)];

	if (!kmo_filter_on)
		return kmo_tgid_wanted(tgid); /* a compare: nothing to remember */
	if (tgid && *slot == tgid)
		return true; /* never the collector's: it is never wanted, never kept */
	if (!kmo_tgid_wanted(tgid))
		return false;
	*slot = tgid;
	return true;
}

static __always_inline bool kmo_task_wanted(struct task_struct *task)
{
	return kmo_tgid_wanted(BPF_CORE_READ(task, tgid));
}
