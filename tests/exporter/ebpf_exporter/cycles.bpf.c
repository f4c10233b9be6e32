// Test set in ebpf_exporter's format: a hardware event (type 0 =
// PERF_TYPE_HARDWARE, config 0 = cycles), which machines without a PMU refuse.
#include <vmlinux.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u32);
    __type(value, u64);
} cycles_total SEC(".maps");

SEC("perf_event/type=0,config=0,frequency=1")
int on_cycles(struct bpf_perf_event_data *ctx)
{
    u32 cpu = bpf_get_smp_processor_id();

    increment_map(&cycles_total, &cpu, ctx->sample_period);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
