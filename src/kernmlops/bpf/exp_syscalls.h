/* Shared by the exporter sets syscalls and syscalls_comm: system calls by
 * number (and by the calling thread's comm where EXP_SYSCALLS_BY_COMM is
 * defined), and failed calls by number and errno. */
#pragma once

#include "exp_common.h"

#define EXP_MAX_ERRNO 4095

struct sys_key {
#ifdef EXP_SYSCALLS_BY_COMM
	char comm[16];
#endif
	u32 nr;
};

struct sys_err_key {
#ifdef EXP_SYSCALLS_BY_COMM
	char comm[16];
#endif
	u32 nr;
	u32 err; /* positive errno */
};

#ifdef EXP_SYSCALLS_BY_COMM
/* Thread names churn (every container's, every worker's): when the map is
 * full, a new key evicts the least recently used one (its series goes, and
 * starts again from 0 if it comes back: a counter reset, which rate() takes),
 * so new names are always counted. LRU maps are preallocated: 16384 keys x
 * 8 bytes x possible CPUs each. */
#define EXP_SYS_MAP_TYPE BPF_MAP_TYPE_LRU_PERCPU_HASH
#define EXP_SYS_MAP_FLAGS 0
#else
/* By number only: at most a few hundred keys, never full. */
#define EXP_SYS_MAP_TYPE BPF_MAP_TYPE_PERCPU_HASH
#define EXP_SYS_MAP_FLAGS BPF_F_NO_PREALLOC
#endif

struct {
	__uint(type, EXP_SYS_MAP_TYPE);
	__uint(max_entries, 16384);
	__uint(map_flags, EXP_SYS_MAP_FLAGS);
	__type(key, struct sys_key);
	__type(value, u64);
} syscalls_total SEC(".maps");

struct {
	__uint(type, EXP_SYS_MAP_TYPE);
	__uint(max_entries, 16384);
	__uint(map_flags, EXP_SYS_MAP_FLAGS);
	__type(key, struct sys_err_key);
	__type(value, u64);
} syscall_errors_total SEC(".maps");

/* The number of the call a sys_exit belongs to, from the saved registers. */
static __always_inline long syscall_nr(struct pt_regs *regs)
{
#if defined(__TARGET_ARCH_x86)
	return BPF_CORE_READ(regs, orig_ax);
#elif defined(__TARGET_ARCH_arm64)
	return BPF_CORE_READ(regs, syscallno);
#else
	return -1;
#endif
}

static __always_inline int on_enter(long id)
{
	struct sys_key key;

	if (id < 0 || !exp_current_wanted()) /* -1: cancelled by a tracer or seccomp */
		return 0;
	__builtin_memset(&key, 0, sizeof(key));
#ifdef EXP_SYSCALLS_BY_COMM
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
#endif
	key.nr = id;
	exp_count(&syscalls_total, &key, 1);
	return 0;
}

static __always_inline int on_exit(struct pt_regs *regs, long ret)
{
	struct sys_err_key key;
	long nr;

	if (ret >= 0 || ret < -EXP_MAX_ERRNO)
		return 0;
	nr = syscall_nr(regs);
	if (nr < 0 || !exp_current_wanted())
		return 0;
	__builtin_memset(&key, 0, sizeof(key));
#ifdef EXP_SYSCALLS_BY_COMM
	bpf_get_current_comm(&key.comm, sizeof(key.comm));
#endif
	key.nr = nr;
	key.err = -ret;
	exp_count(&syscall_errors_total, &key, 1);
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(exp_sys_enter_btf, struct pt_regs *regs, long id)
{
	return on_enter(id);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(exp_sys_exit_btf, struct pt_regs *regs, long ret)
{
	return on_exit(regs, ret);
}

SEC("raw_tp/sys_enter")
int BPF_PROG(exp_sys_enter_raw, struct pt_regs *regs, long id)
{
	return on_enter(id);
}

SEC("raw_tp/sys_exit")
int BPF_PROG(exp_sys_exit_raw, struct pt_regs *regs, long ret)
{
	return on_exit(regs, ret);
}
