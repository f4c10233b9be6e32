// Test set in ebpf_exporter's format: syscalls by thread name, and the sizes
// passed to write(2) on fd 999 (never open: the call fails at once) in the four
// bucket types. Built as ebpf_exporter builds its examples.
#include <vmlinux.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "maps.bpf.h"

#define PROBE_FD 999
#define MAX_EXP2 20
#define MAX_LINEAR 20

struct syscall_key_t {
    char comm[16];
    u64 id;
};

struct size_key_t {
    char comm[16];
    u32 fd;
    u64 bucket;
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, struct syscall_key_t);
    __type(value, u64);
} test_syscalls_total SEC(".maps");

#define SIZE_MAP(name)                                                                             \
    struct {                                                                                       \
        __uint(type, BPF_MAP_TYPE_HASH);                                                           \
        __uint(max_entries, 1024);                                                                 \
        __type(key, struct size_key_t);                                                            \
        __type(value, u64);                                                                        \
    } name SEC(".maps")

SIZE_MAP(write_size_exp2_bytes);
SIZE_MAP(write_size_exp2zero_bytes);
SIZE_MAP(write_size_linear_bytes);
SIZE_MAP(write_size_fixed_kilobytes);

static const u64 fixed_keys[] = { 10, 100, 1000, 10000 };

SEC("tp_btf/sys_enter")
int BPF_PROG(count_syscalls, struct pt_regs *regs, long id)
{
    struct syscall_key_t key = { .id = id };

    bpf_get_current_comm(&key.comm, sizeof(key.comm));
    increment_map(&test_syscalls_total, &key, 1);
    return 0;
}

SEC("raw_tp/sys_enter")
int observe_write(struct bpf_raw_tracepoint_args *ctx)
{
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    struct size_key_t key = {};
    u64 size, bucket;
    int i;

    if (ctx->args[1] != 1) // write(2) on x86-64
        return 0;
    if (PT_REGS_PARM1_CORE(regs) != PROBE_FD)
        return 0;
    size = PT_REGS_PARM3_CORE(regs);
    key.fd = PROBE_FD;
    bpf_get_current_comm(&key.comm, sizeof(key.comm));

    increment_exp2_histogram(&write_size_exp2_bytes, key, size, MAX_EXP2);
    increment_exp2zero_histogram(&write_size_exp2zero_bytes, key, size, MAX_EXP2);

    key.bucket = size > MAX_LINEAR ? MAX_LINEAR : size;
    increment_map(&write_size_linear_bytes, &key, 1);
    key.bucket = MAX_LINEAR + 1;
    increment_map(&write_size_linear_bytes, &key, size);

    bucket = fixed_keys[3];
    for (i = 3; i >= 0; i--) {
        if (size <= fixed_keys[i])
            bucket = fixed_keys[i];
    }
    key.bucket = bucket;
    increment_map(&write_size_fixed_kilobytes, &key, 1);
    key.bucket = fixed_keys[3] + 1;
    increment_map(&write_size_fixed_kilobytes, &key, size);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
