/* SPDX-License-Identifier: GPL-2.0 */
/* Map helpers for programs written for cloudflare/ebpf_exporter, by the names
 * its examples use: counters are one u64 per key; a histogram keeps its bucket
 * in the key's `bucket` field, and bucket max_bucket + 1 holds the sum of the
 * observed values. Implemented for kernmlops (see exporter/compat.py). */
#ifndef KMO_EE_MAPS_BPF_H
#define KMO_EE_MAPS_BPF_H

#include <bpf/bpf_helpers.h>
#include "bits.bpf.h"

/* The exp2 bucket of v: the smallest b with v <= 2^b (0 and 1 both give 0). */
static __always_inline u64 log2l_histogram(u64 v)
{
	u64 floor = log2l(v);

	return v > (1ULL << floor) ? floor + 1 : floor;
}

/* The value of `key`, created at zero if missing; NULL if the map is full. */
static __always_inline u64 *kmo_ee_value(void *map, void *key)
{
	u64 *value = bpf_map_lookup_elem(map, key);

	if (!value) {
		u64 zero = 0;

		/* another CPU may create it first: BPF_NOEXIST keeps its count */
		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		value = bpf_map_lookup_elem(map, key);
	}
	return value;
}

/* `into` = the value of `key` (created at zero); returns 0 from the caller when
 * the map cannot take the key. */
#define lookup_or_zero_init_key(map, key, into)                                \
	do {                                                                   \
		(into) = kmo_ee_value((map), (key));                           \
		if (!(into))                                                   \
			return 0;                                              \
	} while (0)

/* `into` = the element of an array map; returns 0 from the caller if missing. */
#define read_array_ptr(map, key, into)                                         \
	do {                                                                   \
		(into) = bpf_map_lookup_elem((map), (key));                    \
		if (!(into))                                                   \
			return 0;                                              \
	} while (0)

/* Adds `increment` to the u64 of `key` (atomically); returns the new count. */
static __always_inline int increment_map(void *map, void *key, u64 increment)
{
	u64 *value = kmo_ee_value(map, key);

	if (!value)
		return 0;
	__sync_fetch_and_add(value, increment);
	return *value;
}

/* As increment_map, without the atomic add (per-CPU maps need none). */
static __always_inline int increment_map_nosync(void *map, void *key, u64 increment)
{
	u64 *value = kmo_ee_value(map, key);

	if (!value)
		return 0;
	*value += increment;
	return *value;
}

/* Count one observation of `value` in bucket `slot` (clamped to max_bucket) of
 * `key`, and add `value` to the sum key (bucket max_bucket + 1). */
#define kmo_ee_observe(map, key, value, max_bucket, slot, add)                 \
	do {                                                                   \
		u64 kmo_value_ = (value);                                      \
		u64 kmo_slot_ = (slot);                                        \
                                                                               \
		(key).bucket = kmo_slot_ > (max_bucket) ? (max_bucket) : kmo_slot_; \
		add((map), &(key), 1);                                         \
		if (kmo_value_ > 0) {                                          \
			(key).bucket = (max_bucket) + 1;                       \
			add((map), &(key), kmo_value_);                        \
		}                                                              \
	} while (0)

/* exp2: bucket b counts values in (2^(b-1), 2^b]; 0 and 1 go to bucket 0. */
#define increment_exp2_histogram(map, key, value, max_bucket)                  \
	kmo_ee_observe(map, key, value, max_bucket, log2l_histogram(value), increment_map)
#define increment_exp2_histogram_nosync(map, key, value, max_bucket)           \
	kmo_ee_observe(map, key, value, max_bucket, log2l_histogram(value),    \
		       increment_map_nosync)

/* exp2zero: bucket 0 counts zeros only, bucket b >= 1 values in (2^(b-2), 2^(b-1)]. */
#define kmo_ee_exp2zero_slot(value) ((value) ? log2l_histogram(value) + 1 : 0)
#define increment_exp2zero_histogram(map, key, value, max_bucket)              \
	kmo_ee_observe(map, key, value, max_bucket, kmo_ee_exp2zero_slot(value), increment_map)
#define increment_exp2zero_histogram_nosync(map, key, value, max_bucket)       \
	kmo_ee_observe(map, key, value, max_bucket, kmo_ee_exp2zero_slot(value), \
		       increment_map_nosync)

#endif /* KMO_EE_MAPS_BPF_H */
