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
	__type(value, u64); /* the process's start_time (ns); 0: added by user space */
} kmo_tracked SEC(".maps");

static __always_inline bool kmo_tgid_wanted(u32 tgid)
{
	if (tgid == kmo_self_tgid)
		return false;
	if (!kmo_filter_on)
		return true;
	return bpf_map_lookup_elem(&kmo_tracked, &tgid) != NULL;
}

/* kmo_task_wanted_cached: a CPU's memory of processes the filter wanted, in a
 * per-CPU value of the caller: KMO_WANTED_SLOTS of them, each in slot
 * tgid % KMO_WANTED_SLOTS, kept as the tgid and the process (its group
 * leader's task_struct). While a process lives the filter keeps its tgid (user
 * space and the fork program add; a tgid leaves once its process is reaped, or
 * when a fork outside the tree reuses it), so a remembered yes for that
 * process needs no lookup; a new process with the tgid is another leader, and
 * asked again. A no is asked again each time (a new process of the tree may
 * take a tgid that was not). */
#define KMO_WANTED_SLOTS 8

struct kmo_wanted_slots {
	u32 tgid[KMO_WANTED_SLOTS];
	u64 leader[KMO_WANTED_SLOTS];
};

static __always_inline bool kmo_task_wanted_cached(bool btf, struct kmo_wanted_slots *slots,
						   struct task_struct *task, u32 tgid)
{
	u32 at = tgid & (KMO_WANTED_SLOTS - 1);

	if (!kmo_filter_on)
		return kmo_tgid_wanted(tgid); /* a compare: nothing to remember */
	/* never the collector's: it is never wanted, never kept */
	if (tgid && slots->tgid[at] == tgid &&
	    slots->leader[at] == (u64)KMO_READ(btf, task, group_leader))
		return true;
	if (!kmo_tgid_wanted(tgid))
		return false;
	slots->tgid[at] = tgid;
	slots->leader[at] = (u64)KMO_READ(btf, task, group_leader);
	return true;
}

static __always_inline bool kmo_task_wanted(struct task_struct *task)
{
	return kmo_tgid_wanted(BPF_CORE_READ(task, tgid));
}
