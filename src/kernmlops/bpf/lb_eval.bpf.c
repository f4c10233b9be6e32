/* lb_eval: MLLB's model alone, for checking and timing it in the kernel
 * with BPF_PROG_TEST_RUN (kernmlops.lb.shadow.run_in_kernel). An XDP program
 * because that type takes input, gives output and repeats with a measured
 * duration; the "packet" is one struct lb_eval: inputs in, logit and the
 * time of the evaluation out. Never attached. */
#include "lb_model.h"

SEC("xdp")
int lb_eval_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct lb_eval ev;

	if (data + sizeof(ev) > end)
		return XDP_ABORTED;
	__builtin_memcpy(&ev, data, sizeof(ev));
	lb_eval_model(&ev);
	__builtin_memcpy(data, &ev, sizeof(ev));
	return XDP_PASS;
}
