// Test set in ebpf_exporter's tracing format: a trace per process whose name is
// "kmo-spn...", its root span the process's life from its first getppid(2) to
// its exit, and a child span per getppid call (its enter to its exit). The
// records lead with ebpf_exporter's span_base_t layout (tracing.bpf.h): trace
// id (hi, lo), parent span id, span id, start (bpf_ktime_get_ns) and duration.
// Each exit also sends a record with a zero trace id, which cannot be a span.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>

struct span_parent_t {
    u64 trace_id_hi;
    u64 trace_id_lo;
    u64 span_id;
};

struct span_base_t {
    struct span_parent_t parent;
    u64 span_id;
    u64 span_monotonic_timestamp_ns;
    u64 span_duration_ns;
};

struct call_span_t {
    struct span_base_t span_base;
    u32 tid;
    u32 nr;
};

struct process_span_t {
    struct span_base_t span_base;
    char comm[16];
    u32 tgid;
    u32 calls;
};

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} call_spans SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 256 * 1024);
} process_spans SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u32);
    __type(value, struct process_span_t);
} traced SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u32);
    __type(value, u64);
} entered SEC(".maps");

static __always_inline bool wanted(void)
{
    char comm[16];

    bpf_get_current_comm(comm, sizeof(comm));
    return comm[0] == 'k' && comm[1] == 'm' && comm[2] == 'o' && comm[3] == '-' &&
           comm[4] == 's' && comm[5] == 'p' && comm[6] == 'n';
}

SEC("tracepoint/syscalls/sys_enter_getppid")
int getppid_enter(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), ts = bpf_ktime_get_ns();
    u32 tgid = id >> 32, tid = (u32) id;
    struct process_span_t root = {};

    if (!wanted())
        return 0;
    if (!bpf_map_lookup_elem(&traced, &tgid)) {
        root.span_base.parent.trace_id_hi = tgid;
        root.span_base.parent.trace_id_lo = ts;
        root.span_base.span_id = ts;
        root.span_base.span_monotonic_timestamp_ns = ts;
        bpf_get_current_comm(root.comm, sizeof(root.comm));
        root.tgid = tgid;
        bpf_map_update_elem(&traced, &tgid, &root, BPF_NOEXIST);
    }
    bpf_map_update_elem(&entered, &tid, &ts, BPF_ANY);
    return 0;
}

SEC("tracepoint/syscalls/sys_exit_getppid")
int getppid_exit(struct trace_event_raw_sys_exit *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), ts = bpf_ktime_get_ns();
    u32 tgid = id >> 32, tid = (u32) id;
    struct process_span_t *root;
    struct call_span_t *span;
    u64 *start;

    start = bpf_map_lookup_elem(&entered, &tid);
    root = bpf_map_lookup_elem(&traced, &tgid);
    if (!start || !root)
        return 0;
    span = bpf_ringbuf_reserve(&call_spans, sizeof(*span), 0);
    if (span) {
        span->span_base.parent.trace_id_hi = root->span_base.parent.trace_id_hi;
        span->span_base.parent.trace_id_lo = root->span_base.parent.trace_id_lo;
        span->span_base.parent.span_id = root->span_base.span_id;
        span->span_base.span_id = 0; // none: the exporter makes one up
        span->span_base.span_monotonic_timestamp_ns = *start;
        span->span_base.span_duration_ns = ts - *start;
        span->tid = tid;
        span->nr = ctx->id;
        bpf_ringbuf_submit(span, 0);
    }
    __sync_fetch_and_add(&root->calls, 1);
    bpf_map_delete_elem(&entered, &tid);
    return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int process_exit(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), ts = bpf_ktime_get_ns();
    u32 tgid = id >> 32;
    struct process_span_t *root, *span;
    struct call_span_t *bad;

    if ((u32) id != tgid)
        return 0; // a thread's exit, not the process's
    root = bpf_map_lookup_elem(&traced, &tgid);
    if (!root)
        return 0;
    root->span_base.span_duration_ns = ts - root->span_base.span_monotonic_timestamp_ns;
    span = bpf_ringbuf_reserve(&process_spans, sizeof(*span), 0);
    if (span) {
        *span = *root;
        bpf_ringbuf_submit(span, 0);
    }
    bad = bpf_ringbuf_reserve(&call_spans, sizeof(*bad), 0);
    if (bad) {
        __builtin_memset(bad, 0, sizeof(*bad)); // trace id zero: not a span
        bad->tid = tgid;
        bpf_ringbuf_submit(bad, 0);
    }
    bpf_map_delete_elem(&traced, &tgid);
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
