// Test set in ebpf_exporter's format that takes an errno from <linux/errno.h>,
// as some of its examples do: that header includes <asm/errno.h>, which
// Debian keeps in the architecture's folder (/usr/include/<triplet>/), a
// folder clang leaves out with -target bpf unless it is added (-idirafter).
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <linux/errno.h>

struct bad_fd_key_t {
    char comm[16];
    u64 err;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, struct bad_fd_key_t);
    __type(value, u64);
} test_errno_include_bad_fd_total SEC(".maps");

SEC("raw_tracepoint/sys_exit")
int count_bad_fd(struct bpf_raw_tracepoint_args *ctx)
{
    struct bad_fd_key_t key = {};
    u64 one = 1, *value;

    if ((long)ctx->args[1] != -EBADF)
        return 0;
    key.err = EBADF;
    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    value = bpf_map_lookup_elem(&test_errno_include_bad_fd_total, &key);
    if (value)
        __sync_fetch_and_add(value, 1);
    else
        bpf_map_update_elem(&test_errno_include_bad_fd_total, &key, &one, BPF_NOEXIST);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
