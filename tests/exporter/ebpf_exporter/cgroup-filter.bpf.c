// Test set in ebpf_exporter's format: getppid(2) calls of "kmo-cgm" threads,
// counted per cgroup in one map when the exporter put their cgroup in
// test_cgroup_ids (cgroup-filter.yaml's cgroup_id_map), in another when not.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include "maps.bpf.h"

#define COUNTS(name)                                                                               \
    struct {                                                                                       \
        __uint(type, BPF_MAP_TYPE_HASH);                                                           \
        __uint(max_entries, 1024);                                                                 \
        __type(key, u64);                                                                          \
        __type(value, u64);                                                                        \
    } name SEC(".maps")

COUNTS(test_cgroup_matched_total);
COUNTS(test_cgroup_unmatched_total);

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);
    __type(value, u64);
} test_cgroup_ids SEC(".maps");

SEC("tracepoint/syscalls/sys_enter_getppid")
int count_getppid(void *ctx)
{
    char comm[16];
    u64 cgroup_id = bpf_get_current_cgroup_id();

    bpf_get_current_comm(comm, sizeof(comm));
    if (comm[0] != 'k' || comm[1] != 'm' || comm[2] != 'o' || comm[3] != '-' ||
        comm[4] != 'c' || comm[5] != 'g' || comm[6] != 'm')
        return 0;
    if (bpf_map_lookup_elem(&test_cgroup_ids, &cgroup_id))
        increment_map(&test_cgroup_matched_total, &cgroup_id, 1);
    else
        increment_map(&test_cgroup_unmatched_total, &cgroup_id, 1);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
