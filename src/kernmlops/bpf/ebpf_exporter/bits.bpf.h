/* SPDX-License-Identifier: GPL-2.0 */
/* Integer log2 for programs written for cloudflare/ebpf_exporter: the names its
 * examples call, implemented for kernmlops (see exporter/compat.py). */
#ifndef KMO_EE_BITS_BPF_H
#define KMO_EE_BITS_BPF_H

/* floor(log2(v)), and 0 for v == 0: five halving steps, no loop for the verifier */
static __always_inline u64 log2(u32 v)
{
	u64 bits = 0;

	if (v >> 16) { v >>= 16; bits += 16; }
	if (v >> 8) { v >>= 8; bits += 8; }
	if (v >> 4) { v >>= 4; bits += 4; }
	if (v >> 2) { v >>= 2; bits += 2; }
	if (v >> 1) bits += 1;
	return bits;
}

/* floor(log2(v)) of a 64-bit value, 0 for v == 0 */
static __always_inline u64 log2l(u64 v)
{
	u32 high = v >> 32;

	return high ? 32 + log2(high) : log2((u32)v);
}

#endif /* KMO_EE_BITS_BPF_H */
