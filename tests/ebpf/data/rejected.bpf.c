/* The verifier must reject this: a map value is used without a NULL check. */
#include "common.h"

SEC("raw_tp/sched_switch")
int unchecked_lookup(void *ctx)
{
	u32 slot = bpf_get_prandom_u32(); /* unknown key: the lookup may fail */
	u64 *n = bpf_map_lookup_elem(&drops, &slot);

	*n += 1;
	return 0;
}
