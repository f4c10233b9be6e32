// Test set in ebpf_exporter's format: one perf event array sample per getppid(2)
// call by a thread whose name starts with "kmo-pea", carrying its process id and
// cgroup, then a field no label covers (each sample's own): the exporter counts
// samples by the labels' bytes only.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
    __uint(key_size, sizeof(u32));
    __uint(value_size, sizeof(u32));
} test_getppid_events_total SEC(".maps");

struct event_t {
    u32 tgid;
    u32 unused;
    u64 cgroup_id;
    u64 at_ns; // not a label: differs in every sample
};

SEC("tracepoint/syscalls/sys_enter_getppid")
int getppid_event(void *ctx)
{
    struct event_t ev = {};
    char comm[16];

    bpf_get_current_comm(comm, sizeof(comm));
    if (comm[0] != 'k' || comm[1] != 'm' || comm[2] != 'o' || comm[3] != '-' ||
        comm[4] != 'p' || comm[5] != 'e' || comm[6] != 'a')
        return 0;
    ev.tgid = bpf_get_current_pid_tgid() >> 32;
    ev.cgroup_id = bpf_get_current_cgroup_id();
    ev.at_ns = bpf_ktime_get_ns();
    bpf_perf_event_output(ctx, &test_getppid_events_total, BPF_F_CURRENT_CPU, &ev, sizeof(ev));
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
