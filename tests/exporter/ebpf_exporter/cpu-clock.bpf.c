// Test set in ebpf_exporter's format: cpu-clock samples per CPU from a software
// perf event (type 1 = PERF_TYPE_SOFTWARE, config 0 = PERF_COUNT_SW_CPU_CLOCK).
#include <vmlinux.h>
#include <bpf/bpf_tracing.h>
#include "maps.bpf.h"

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} cpu_clock_samples_total SEC(".maps");

SEC("perf_event/type=1,config=0,frequency=97")
int on_cpu_clock(struct bpf_perf_event_data *ctx)
{
    u32 zero = 0;

    increment_map_nosync(&cpu_clock_samples_total, &zero, 1);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
