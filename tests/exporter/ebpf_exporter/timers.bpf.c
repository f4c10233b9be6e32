// Test set in ebpf_exporter's format: timer expirations keyed by the address of
// the timer's function, which the ksym decoder turns into its name. Built as
// ebpf_exporter builds its examples.
#include <vmlinux.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);
    __type(value, u64);
} test_timer_expirations_total SEC(".maps");

SEC("tp_btf/timer_expire_entry")
int BPF_PROG(test_timer_expire, struct timer_list *timer)
{
    u64 function = (u64)BPF_CORE_READ(timer, function);

    increment_map(&test_timer_expirations_total, &function, 1);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
