/* Shared by every kernmlops BPF object: includes, drop counting, ring output. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

/* Record fields become table columns (dtypes from BTF). A u64 is written as a
 * signed 64-bit column (Spark, Hive and pandas have no unsigned 64-bit type;
 * timestamps, durations and counts never reach 2^63); declare a field with
 * this type when it needs the full unsigned range (kernel addresses), and it
 * stays unsigned. */
typedef u64 kmo_full_u64;

/* A microsecond column the program fills with nanoseconds, as it read them: user
 * space divides (a 64-bit division in the program is tens of cycles per record
 * on the hottest paths). kmo_us_from_ns truncates (timestamps, like ns / 1000),
 * kmo_us_from_ns_round rounds to the nearest microsecond (durations). */
typedef u64 kmo_us_from_ns;
typedef u64 kmo_us_from_ns_round;
/* Nanoseconds after the record's batch's first_ns (KMO_BATCH_SLOT_AT). */
typedef u32 kmo_batch_ns;
/* Nanoseconds after the batch's record before it (after first_ns for its first):
 * small numbers, whose high bytes the spool's shuffled zstd frames reduce to
 * nothing: 12x for quanta's records against 7.7x with offsets, for the same
 * copier CPU (`python -m bench capacity`, alternated). KMO_BATCH_GAP. */
typedef u32 kmo_batch_gap_ns;

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

static __always_inline void kmo_count_drops(u32 slot, u64 records)
{
	u64 *n = bpf_map_lookup_elem(&drops, &slot);

	if (n)
		*n += records;
}

/* The collector drains a ring every batch_ms, or sooner once it is a quarter
 * full (BpfHook._due, DRAIN_FRACTION), and sleeps in between. A record that
 * takes its ring's unread bytes across a quarter of the ring (1/4, 2/4, 3/4)
 * wakes it; every other record goes in without a wake-up (an irq_work each, an
 * interrupt in a VM). The collector so sleeps through a quiet second instead of
 * polling against a burst, drains a storm's ring in quarters (each wake-up of
 * the collector costs it ~0.5 ms), and a crossing lost to two CPUs reserving at
 * once is made up at the next quarter. Two helper calls per record or batch.
 * `before` and `after`: unread bytes without and with the record. */
#define KMO_WAKE_SHIFT 2

static __always_inline u64 kmo_wake_flags(void *ring, u64 before, u64 after)
{
	u64 mask = ~((bpf_ringbuf_query(ring, BPF_RB_RING_SIZE) >> KMO_WAKE_SHIFT) - 1);

	return (before & mask) != (after & mask) ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* The space a record of `bytes` takes in a ring: an 8-byte header, 8-aligned. */
#define KMO_RING_BYTES(bytes) (((bytes) + 8 + 7) & ~7ULL)

/* Ring groups: on a large machine a hook's ring is N rings, one per group of
 * CPUs, each drained by its own copier thread (hooks/bpf.py, ring_groups: by
 * default one per 16 CPUs, what one copier was measured to keep up with). A CPU
 * writes into ring cpu / cpus_per_group. Ring 0 is the map `name` itself, the
 * others are made by user space and put in `name`_groups (an array of maps;
 * its lookup is inlined by the verifier). Set before load; with one group
 * (the default on every machine of up to 16 CPUs) the verifier drops the
 * lookup as dead code: what is left of it is one load of a read-only global
 * (a cached line) where a program names its ring. An object without rings may
 * define KMO_NO_RINGS first: no settings in it then (doctor's probes load
 * without a .rodata). */
#ifndef KMO_NO_RINGS
const volatile u32 kmo_ring_groups = 1;
/* cpu >> shift where the group's size is a power of two, else cpu / per_group
 * (a division costs ~20 cycles more): shift < 0 asks for the division. */
const volatile s32 kmo_ring_group_shift = 0;
const volatile u32 kmo_ring_group_cpus = 1;

static __always_inline void *kmo_ring_of(void *ring, void *groups)
{
	u32 cpu, group;
	void *r;

	if (kmo_ring_groups <= 1)
		return ring;
	cpu = bpf_get_smp_processor_id();
	group = kmo_ring_group_shift >= 0 ? cpu >> kmo_ring_group_shift
					  : cpu / kmo_ring_group_cpus;
	r = bpf_map_lookup_elem(groups, &group);
	return r ? r : ring; /* a CPU past the last group (hotplug): ring 0 */
}
#endif /* KMO_NO_RINGS */

/* The ring of this CPU's group among ring `name`'s (KMO_RING). */
#define KMO_RING_OF(name) kmo_ring_of(&(name), &(name##_groups))

/* Submit a record reserved in `ring` (the reservation is already unread bytes).
 * The CPU cannot change in between (programs run with migration off): the same
 * ring as KMO_RESERVE's. */
#define KMO_SUBMIT(ring, rec)                                                  \
	({                                                                     \
		void *__rb = KMO_RING_OF(ring);                                \
		u64 __after = bpf_ringbuf_query(__rb, BPF_RB_AVAIL_DATA);      \
		u64 __len = KMO_RING_BYTES(sizeof(*(rec)));                    \
		bpf_ringbuf_submit((rec), kmo_wake_flags(__rb,                 \
							 __after - __len,      \
							 __after));            \
	})

/* Reserve a record of the given struct in a ring, counting a drop when full. */
#define KMO_RESERVE(ring, type, slot)                                          \
	({                                                                     \
		type *__r = bpf_ringbuf_reserve(KMO_RING_OF(ring), sizeof(type), 0); \
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
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);                      \
		__uint(max_entries, 1);                                        \
		__type(key, u32);                                              \
		/* the kernel compares no ring's size: a page-sized template */ \
		__array(values, struct {                                       \
			__uint(type, BPF_MAP_TYPE_RINGBUF);                    \
			__uint(max_entries, 4096);                             \
		});                                                            \
	} name##_groups SEC(".maps");                                          \
	struct record *__kmo_ring_##name                                       \
		__attribute__((section(".kmo.records"), used))

/* A field of a kernel struct (one accessor, dots allowed: `se.vruntime`). In a
 * tp_btf program the arguments are BTF-typed pointers: a plain load, CO-RE
 * relocated, that costs a nanosecond. In a raw_tp program it must go through
 * bpf_probe_read_kernel (a helper call each, tens of ns). Hot-path code is
 * written once as an always-inline function taking `btf`; each program passes
 * a constant, so the compiler keeps only one branch. */
#define KMO_READ(btf, ptr, field) ((btf) ? (ptr)->field : BPF_CORE_READ(ptr, field))

/* A batched ring, for programs on the hottest paths (a record per context
 * switch). Records are written into a per-CPU batch and the batch goes to the
 * ring whole: one bpf_ringbuf_output per KMO_BATCH_RECORDS records instead of
 * a reservation per record, which takes the ring's lock shared by all CPUs.
 * A batch also goes out once its first record is KMO_BATCH_MAX_AGE_NS old
 * (checked at the next record), so rows reach the collection in time; what a
 * CPU still holds when the programs are detached is read by user space from
 * <name>_stage. The ring's layout is the record's (KMO_RING); the marker
 * `__kmo_batch_<name>` tells user space the ring carries batches. The output's
 * lock and copy cost ~400 ns: 64 records a batch left quanta_runtime's program
 * 3 ns a switch cheaper than 32, 128 another 2 (`python -m bench hotpath`).
 *
 * The header is padded so that it and the ring's 8-byte record header fill
 * whole records: every record of every batch then sits at a multiple of its
 * size in the ring, where the spool byte-shuffles compressed frames at that
 * size (kernmlops.spool.frames.shuffle). Unpadded, each batch moved the
 * records' phase by 24 bytes and mixed their fields in the shuffled planes:
 * padded, the copier compresses 1.6x the quanta records per CPU-second into
 * ~9% fewer bytes (`python -m bench capacity`, alternated). */
#define KMO_BATCH_RECORDS 64
#define KMO_BATCH_MAX_AGE_NS (50ULL * 1000 * 1000)
#define KMO_BATCH_HEAD 32 /* the ring's record header (8), n, cpu, first_ns, last_ns */
#define KMO_BATCH_PAD(record) \
	((sizeof(struct record) - KMO_BATCH_HEAD % sizeof(struct record)) % sizeof(struct record))

#define KMO_BATCHED_RING(name, record)                                         \
	struct record##_batch {                                                \
		u32 n;                                                         \
		u32 cpu; /* the CPU whose batch it is */                       \
		u64 first_ns;                                                  \
		u64 last_ns; /* the time of its last record (KMO_BATCH_GAP) */ \
		u8 pad[KMO_BATCH_PAD(record)]; /* unused: zeros */             \
		struct record recs[KMO_BATCH_RECORDS];                         \
	};                                                                     \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                       \
		__uint(max_entries, 1);                                        \
		__type(key, u32);                                              \
		__type(value, struct record##_batch);                          \
	} name##_stage SEC(".maps");                                           \
	KMO_RING(name, record);                                                \
	struct record##_batch *__kmo_batch_##name                              \
		__attribute__((section(".kmo.records"), used))

/* The next free record of this CPU's batch of `name` (call KMO_BATCH_PUSH once
 * it is filled), or NULL when the stage map cannot be read. */
#define KMO_BATCH_SLOT(name, batch)                                            \
	({                                                                     \
		u32 __zero = 0;                                                \
		(batch) = bpf_map_lookup_elem(&name##_stage, &__zero);         \
		(batch) ? &(batch)->recs[(batch)->n & (KMO_BATCH_RECORDS - 1)] \
			: NULL;                                                \
	})

/* Send this CPU's batch of `name` now; a batch the ring cannot take counts its
 * records as drops of `slot`. */
#define KMO_BATCH_SEND(name, batch, count, slot)                               \
	({                                                                     \
		void *__rb = KMO_RING_OF(name);                                \
		u64 __before = bpf_ringbuf_query(__rb, BPF_RB_AVAIL_DATA);     \
		u64 __flags = kmo_wake_flags(                                  \
			__rb, __before,                                        \
			__before + KMO_RING_BYTES(sizeof(*(batch))));          \
		if (bpf_ringbuf_output(__rb, (batch), sizeof(*(batch)),        \
				       __flags))                               \
			kmo_count_drops((slot), (count));                      \
		(batch)->n = 0;                                                \
	})

/* Like KMO_BATCH_SLOT, for records that keep their time as kmo_batch_ns (an
 * offset from the batch's first_ns, 4 bytes instead of 8): a batch is sent
 * before a record `now_ns` would be KMO_BATCH_MAX_AGE_NS or more after its
 * first (or before it), so every offset is below 2^32; and a new batch takes
 * `now_ns` as its first_ns and the CPU's number. */
#define KMO_BATCH_SLOT_AT(name, batch, now_ns, slot)                           \
	({                                                                     \
		u32 __zero = 0, __n;                                           \
		(batch) = bpf_map_lookup_elem(&name##_stage, &__zero);         \
		if (batch) {                                                   \
			__n = (batch)->n & (KMO_BATCH_RECORDS - 1);            \
			if (__n && (now_ns) - (batch)->first_ns >=             \
					   KMO_BATCH_MAX_AGE_NS) {             \
				KMO_BATCH_SEND(name, batch, __n, slot);        \
				__n = 0;                                       \
			}                                                      \
			if (!__n) {                                            \
				(batch)->first_ns = (now_ns);                  \
				(batch)->last_ns = (now_ns);                   \
				(batch)->cpu = bpf_get_smp_processor_id();     \
			}                                                      \
		}                                                              \
		(batch) ? &(batch)->recs[(batch)->n & (KMO_BATCH_RECORDS - 1)] \
			: NULL;                                                \
	})

/* A kmo_batch_gap_ns for the record KMO_BATCH_SLOT_AT gave at `now_ns`: the time
 * since the batch's record before it (0 for its first). A CPU's times never go
 * back, so a gap is below the batch's age (2^32 ns at most). */
#define KMO_BATCH_GAP(batch, now_ns)                                           \
	({                                                                     \
		u32 __gap = (now_ns) - (batch)->last_ns;                       \
		(batch)->last_ns = (now_ns);                                   \
		__gap;                                                         \
	})

/* Count the record just filled; send the batch when full or old. A batch the
 * ring cannot take counts its records as drops of `slot`. */
#define KMO_BATCH_PUSH(name, batch, now_ns, slot)                              \
	({                                                                     \
		u32 __n = ((batch)->n & (KMO_BATCH_RECORDS - 1)) + 1;          \
		if (__n == 1) {                                                \
			(batch)->first_ns = (now_ns);                          \
			(batch)->cpu = bpf_get_smp_processor_id();             \
		}                                                              \
		(batch)->n = __n;                                              \
		if (__n == KMO_BATCH_RECORDS ||                                \
		    (now_ns) - (batch)->first_ns >= KMO_BATCH_MAX_AGE_NS)      \
			KMO_BATCH_SEND(name, batch, __n, slot);                \
	})

static __always_inline u64 kmo_uptime_us(void)
{
	return bpf_ktime_get_ns() / 1000;
}
