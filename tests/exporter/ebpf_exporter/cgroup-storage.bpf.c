// Test set in ebpf_exporter's format: as cgroup-filter.bpf.c, with the cgroups
// marked in cgroup storage (cgroup_id_map type cgrp_storage): the exporter stores
// 1 on each matching cgroup; the program reads it from the current thread's.
#include <vmlinux.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"

#define GETPPID_NR 110 // x86-64

#define COUNTS(name)                                                                               \
    struct {                                                                                       \
        __uint(type, BPF_MAP_TYPE_HASH);                                                           \
        __uint(max_entries, 1024);                                                                 \
        __type(key, u64);                                                                          \
        __type(value, u64);                                                                        \
    } name SEC(".maps")

COUNTS(test_storage_matched_total);
COUNTS(test_storage_unmatched_total);

struct {
    __uint(type, BPF_MAP_TYPE_CGRP_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, u64);
} test_cgroup_storage SEC(".maps");

SEC("tp_btf/sys_enter")
int BPF_PROG(count_getppid_storage, struct pt_regs *regs, long id)
{
    char comm[16];
    struct cgroup *cgrp;
    u64 *mark, cgroup_id;

    if (id != GETPPID_NR)
        return 0;
    bpf_get_current_comm(comm, sizeof(comm));
    if (comm[0] != 'k' || comm[1] != 'm' || comm[2] != 'o' || comm[3] != '-' ||
        comm[4] != 'c' || comm[5] != 'g' || comm[6] != 's')
        return 0;
    cgrp = bpf_get_current_task_btf()->cgroups->dfl_cgrp;
    mark = bpf_cgrp_storage_get(&test_cgroup_storage, cgrp, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!mark)
        return 0;
    cgroup_id = BPF_CORE_READ(cgrp, kn, id);
    if (*mark)
        increment_map(&test_storage_matched_total, &cgroup_id, 1);
    else
        increment_map(&test_storage_unmatched_total, &cgroup_id, 1);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
