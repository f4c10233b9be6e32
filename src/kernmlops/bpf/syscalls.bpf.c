/* syscalls: per (tgid, syscall) counts, errors and latency, aggregated in the
 * kernel. User space reads the map each interval and writes the deltas. */
#include "filter.h"

#define SYSCALL_HIST_SLOTS 32
#define SYSCALL_MAX_ERRNO 4095

struct syscall_key {
	u32 tgid;
	s32 syscall_id; /* -1 when a tracer or seccomp cancelled the call */
};

/* Cumulative since the key was created; summed over CPUs by user space. */
struct syscall_stats {
	u64 count;  /* entries */
	u64 errors; /* returns in [-4095, -1] (the kernel's IS_ERR_VALUE range) */
	u64 completed; /* returns with a known entry time */
	u64 total_latency_ns;
	/* slot i: latency in [2^i, 2^(i+1)) ns; slot 0 also holds 0 ns; the
	 * last slot everything from 2^31 ns (2.1 s) up */
	u64 latency_log2_hist[SYSCALL_HIST_SLOTS];
};

/* Keys of exited processes are deleted by user space after their last read,
 * so the map holds the live (tgid, syscall) pairs. Not preallocated: a
 * per-CPU value is ncpu x 296 bytes. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct syscall_key);
	__type(value, struct syscall_stats);
} syscall_stats SEC(".maps");

/* The call a thread is in. Task storage lives and dies with the task and is
 * not inherited by fork, so a child's first sys_exit (the return of fork
 * itself) finds nothing, and a thread that left through exit() leaves no
 * stale entry for a later thread with the same pid. */
struct syscall_start {
	u64 ts_ns;
	u32 tgid;
	s32 syscall_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct syscall_start);
} syscall_starts SEC(".maps");

static __always_inline u32 log2_slot(u64 v)
{
	u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r < SYSCALL_HIST_SLOTS ? r : SYSCALL_HIST_SLOTS - 1;
}

static __always_inline struct syscall_stats *stats_of(struct syscall_key *key)
{
	struct syscall_stats *s = bpf_map_lookup_elem(&syscall_stats, key);
	struct syscall_stats zero;

	if (s)
		return s;
	__builtin_memset(&zero, 0, sizeof(zero));
	/* NOEXIST: another CPU may have created it meanwhile; either way look again. */
	bpf_map_update_elem(&syscall_stats, key, &zero, BPF_NOEXIST);
	s = bpf_map_lookup_elem(&syscall_stats, key);
	if (!s)
		kmo_count_drop(0); /* map full */
	return s;
}

static __always_inline int on_enter(long id)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct syscall_key key = { .tgid = tgid, .syscall_id = id };
	struct syscall_stats *s;
	struct syscall_start *st;

	if (!kmo_tgid_wanted(tgid))
		return 0;
	s = stats_of(&key);
	if (s)
		s->count++; /* per-CPU value: no atomics needed */
	st = bpf_task_storage_get(&syscall_starts, bpf_get_current_task_btf(), 0,
				  BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!st)
		return 0;
	st->tgid = tgid;
	st->syscall_id = id;
	st->ts_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_exit(long ret)
{
	struct syscall_start *st;
	struct syscall_stats *s;
	struct syscall_key key;
	u64 delta, now = bpf_ktime_get_ns();

	/* Only a wanted thread has an entry time: no filter lookup here. */
	st = bpf_task_storage_get(&syscall_starts, bpf_get_current_task_btf(), 0, 0);
	if (!st || !st->ts_ns)
		return 0;
	delta = now - st->ts_ns;
	st->ts_ns = 0;
	key.tgid = st->tgid;
	key.syscall_id = st->syscall_id;
	/* The entry made the key, or found no room and counted the call as a drop
	 * (a key leaves the map only once its process is gone): a lookup, so a lost
	 * call is one drop, not two. */
	s = bpf_map_lookup_elem(&syscall_stats, &key);
	if (!s)
		return 0;
	if (ret < 0 && ret >= -SYSCALL_MAX_ERRNO)
		s->errors++;
	s->completed++;
	s->total_latency_ns += delta;
	s->latency_log2_hist[log2_slot(delta)]++;
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter_btf, struct pt_regs *regs, long id)
{
	return on_enter(id);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit_btf, struct pt_regs *regs, long ret)
{
	return on_exit(ret);
}

SEC("raw_tp/sys_enter")
int BPF_PROG(sys_enter_raw, struct pt_regs *regs, long id)
{
	return on_enter(id);
}

SEC("raw_tp/sys_exit")
int BPF_PROG(sys_exit_raw, struct pt_regs *regs, long ret)
{
	return on_exit(ret);
}
