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

static __always_inline bool kmo_task_wanted(struct task_struct *task)
{
	return kmo_tgid_wanted(BPF_CORE_READ(task, tgid));
}
