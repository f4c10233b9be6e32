// Test set in ebpf_exporter's format whose only libbpf header is
// <bpf/bpf_core_read.h>, as in some of its examples, whose own helper headers
// (beside them, not kernmlops' maps.bpf.h) include nothing either: libbpf 1.4
// and later include bpf_helpers.h from it (SEC, __always_inline, __kconfig,
// the helpers).
#include <vmlinux.h>
#include <bpf/bpf_core_read.h>

struct syscall_key_t {
    char comm[16];
    u64 id;
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, struct syscall_key_t);
    __type(value, u64);
} test_core_read_syscalls_total SEC(".maps");

extern int LINUX_KERNEL_VERSION __kconfig;

static __always_inline void count(struct syscall_key_t *key)
{
    u64 one = 1, *value = bpf_map_lookup_elem(&test_core_read_syscalls_total, key);

    if (value)
        __sync_fetch_and_add(value, 1);
    else
        bpf_map_update_elem(&test_core_read_syscalls_total, key, &one, BPF_NOEXIST);
}

SEC("raw_tracepoint/sys_enter")
int count_core_read_syscalls(struct bpf_raw_tracepoint_args *ctx)
{
    struct syscall_key_t key = { .id = ctx->args[1] };

    if (LINUX_KERNEL_VERSION == 0)
        return 0;
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    count(&key);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
