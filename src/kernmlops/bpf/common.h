/* Shared by every kernmlops BPF object: includes, drop counting, ring output. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

/* Records a ring buffer could not take, per table slot and CPU. User space
 * sums the CPUs; slot i belongs to the i-th ring buffer the hook declares. */
#define KMO_MAX_TABLES 8
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, KMO_MAX_TABLES);
	__type(key, u32);
	__type(value, u64);
} drops SEC(".maps");

static __always_inline void kmo_count_drop(u32 slot)
{
	u64 *n = bpf_map_lookup_elem(&drops, &slot);

	if (n)
		*n += 1; /* per-CPU slot: no atomics needed */
}

/* Ring buffers are drained on a timer, so never wake the reader per record. */
#define KMO_SUBMIT(rec) bpf_ringbuf_submit((rec), BPF_RB_NO_WAKEUP)

/* Reserve a record of the given struct in a ring, counting a drop when full. */
#define KMO_RESERVE(ring, type, slot)                                          \
	({                                                                     \
		type *__r = bpf_ringbuf_reserve(&(ring), sizeof(type), 0);     \
		if (!__r)                                                      \
			kmo_count_drop(slot);                                  \
		__r;                                                           \
	})

/* A ring buffer of records of one struct. Besides the map, it leaves a marker
 * `__kmo_ring_<name>` of type `struct <record> *` in the section .kmo.records
 * (libbpf skips that section, so no map is made of it). User space finds the
 * record's struct through the marker's BTF and derives the numpy dtype from it:
 * the C struct is the only definition of the layout. max_entries is set from
 * user space before load. */
#define KMO_RING(name, record)                                                 \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_RINGBUF);                            \
		__uint(max_entries, 1 << 22);                                  \
	} name SEC(".maps");                                                   \
	struct record *__kmo_ring_##name                                       \
		__attribute__((section(".kmo.records"), used))

/* A field of a kernel struct (one accessor, dots allowed: `se.vruntime`). In a
 * tp_btf program the arguments are BTF-typed pointers: a plain load, CO-RE
 * relocated, that costs a nanosecond. In a raw_tp program it must go through
 * bpf_probe_read_kernel (a helper call each, tens of ns). Hot-path code is
 * written once as an always-inline function taking `btf`; each program passes
 * a constant, so the compiler keeps only one branch. */
#define KMO_READ(btf, ptr, field) ((btf) ? (ptr)->field : BPF_CORE_READ(ptr, field))

static __always_inline u64 kmo_uptime_us(void)
{
	return bpf_ktime_get_ns() / 1000;
}
