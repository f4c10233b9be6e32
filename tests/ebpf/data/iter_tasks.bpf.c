#include "common.h"
SEC("iter/task")
int dump_task(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task) return 0;
	BPF_SEQ_PRINTF(ctx->meta->seq, "%d\n", task->pid);
	return 0;
}
