/* One trivial program per attach type: doctor loads and attaches each alone
 * to learn what this kernel really allows (feature listings can be wrong). */
#define KMO_NO_RINGS /* as trivial as can be: no ring settings, no .rodata */
#include "common.h"

SEC("tracepoint/sched/sched_switch")
int probe_tracepoint(void *ctx) { return 0; }

SEC("raw_tp/sched_switch")
int probe_raw_tracepoint(void *ctx) { return 0; }

SEC("tp_btf/sched_switch")
int probe_tp_btf_prog(void *ctx) { return 0; }

SEC("iter/task")
int probe_iter_task(struct bpf_iter__task *ctx) { return 0; }

SEC("perf_event")
int probe_perf_event(void *ctx) { return 0; }

SEC("kprobe/vfs_read")
int probe_kprobe(void *ctx) { return 0; }

SEC("fentry/vfs_read")
int probe_fentry(void *ctx) { return 0; }
