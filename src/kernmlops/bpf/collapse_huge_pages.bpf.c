/* collapse_huge_pages: khugepaged's scans and collapses (huge_memory
 * tracepoints, also fired by madvise(MADV_COLLAPSE) in the caller), and the
 * ranges processes give to madvise and munmap: from the syscalls tracepoints
 * of those two calls where the kernel has them (user space attaches
 * madvise_enter / munmap_enter), else from raw_syscalls sys_enter kept in the
 * kernel only for those two syscall ids (madvise_munmap_btf / _raw). */
#include "filter.h"

/* --- khugepaged ------------------------------------------------------------ */
enum collapse_huge_pages_kind {
	COLLAPSE_HUGE_PAGES_KIND_SCAN_PMD = 0,	    /* mm_khugepaged_scan_pmd */
	COLLAPSE_HUGE_PAGES_KIND_COLLAPSE = 1,	    /* mm_collapse_huge_page */
	COLLAPSE_HUGE_PAGES_KIND_ISOLATE = 2,	    /* mm_collapse_huge_page_isolate */
	COLLAPSE_HUGE_PAGES_KIND_SWAPIN = 3,	    /* mm_collapse_huge_page_swapin */
	COLLAPSE_HUGE_PAGES_KIND_SCAN_FILE = 4,	    /* mm_khugepaged_scan_file */
	COLLAPSE_HUGE_PAGES_KIND_COLLAPSE_FILE = 5, /* mm_khugepaged_collapse_file */
};

/* One row per tracepoint hit; fields a kind does not have are 0. */
struct collapse_huge_pages_event {
	u64 ts_uptime_us;
	kmo_full_u64 mm; /* the mm_struct's address: joins the rows of one address space */
	/* scan_pmd, isolate, scan_file: the last page frame looked at;
	 * collapse_file: the new huge page's */
	u64 pfn;
	u64 address;	/* collapse_file: the virtual address */
	u64 file_index; /* collapse_file: the page-cache index */
	u32 tgid;	/* process owning the memory (0: not known) */
	u32 actor_pid;	/* thread doing the work: khugepaged, or a MADV_COLLAPSE caller */
	u32 actor_tgid;
	enum collapse_huge_pages_kind kind;
	enum scan_result result; /* the kernel's scan_result (labels from its BTF) */
	s32 referenced;
	s32 none_or_zero;
	s32 unmapped;
	s32 isolated; /* collapse: 1 if the pages were isolated */
	s32 swapped_in;
	s32 present;
	s32 swap;
	s32 nr;
	bool is_shmem;
	char actor_comm[16];
	char filename[64]; /* scan_file, collapse_file: the file's name */
};
KMO_RING(collapse_huge_pages_rb, collapse_huge_pages_event);

/* An isolate event names no mm; it always happens inside collapse_huge_page,
 * whose own event (with the mm) follows in the same thread, maybe after a
 * sleep on another CPU. So the isolate row waits in task storage. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct collapse_huge_pages_event);
} pending_isolate SEC(".maps");

struct mm_struct___owner {
	struct task_struct *owner; /* CONFIG_MEMCG only */
} __attribute__((preserve_access_index));

static __always_inline u32 owner_tgid(struct mm_struct *mm)
{
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task();
	struct mm_struct___owner *m = (void *)mm;

	if (BPF_CORE_READ(cur, mm) == mm) /* MADV_COLLAPSE: the caller's own memory */
		return BPF_CORE_READ(cur, tgid);
	if (bpf_core_field_exists(m->owner))
		return BPF_CORE_READ(m, owner, tgid);
	return 0;
}

static __always_inline bool wanted(u32 tgid)
{
	u32 actor = bpf_get_current_pid_tgid() >> 32;

	/* Either side being traced is enough; neither may be the collector. */
	if (tgid == kmo_self_tgid || actor == kmo_self_tgid)
		return false;
	return (tgid && kmo_tgid_wanted(tgid)) || kmo_tgid_wanted(actor);
}

static __always_inline void fill(struct collapse_huge_pages_event *e, struct mm_struct *mm,
				 u32 tgid, enum collapse_huge_pages_kind kind, int result)
{
	u64 id = bpf_get_current_pid_tgid();

	__builtin_memset(e, 0, sizeof(*e));
	e->ts_uptime_us = kmo_uptime_us();
	e->mm = (u64)mm;
	e->tgid = tgid;
	e->actor_pid = (u32)id;
	e->actor_tgid = id >> 32;
	e->kind = kind;
	e->result = result;
	bpf_get_current_comm(e->actor_comm, sizeof(e->actor_comm));
}

/* Reserve a zeroed, filled event, or NULL when not wanted or the ring is full. */
static __always_inline struct collapse_huge_pages_event *
start_event(struct mm_struct *mm, enum collapse_huge_pages_kind kind, int result)
{
	struct collapse_huge_pages_event *e;
	u32 tgid = owner_tgid(mm);

	if (!wanted(tgid))
		return NULL;
	e = KMO_RESERVE(collapse_huge_pages_rb, struct collapse_huge_pages_event, 0);
	if (e)
		fill(e, mm, tgid, kind, result);
	return e;
}

static __always_inline void read_filename(char *dst, void *ctx, u32 loc)
{
	/* __data_loc: offset in the low 16 bits, length in the high 16 */
	bpf_probe_read_kernel_str(dst, 64, ctx + (loc & 0xFFFF));
}

SEC("tracepoint/huge_memory/mm_khugepaged_scan_pmd")
int scan_pmd(struct trace_event_raw_mm_khugepaged_scan_pmd *ctx)
{
	struct collapse_huge_pages_event *e;

	e = start_event(ctx->mm, COLLAPSE_HUGE_PAGES_KIND_SCAN_PMD, ctx->status);
	if (!e)
		return 0;
	e->pfn = ctx->pfn;
	e->referenced = ctx->referenced;
	e->none_or_zero = ctx->none_or_zero;
	e->unmapped = ctx->unmapped;
	KMO_SUBMIT(collapse_huge_pages_rb, e);
	return 0;
}

SEC("tracepoint/huge_memory/mm_collapse_huge_page_isolate")
int isolate(struct trace_event_raw_mm_collapse_huge_page_isolate *ctx)
{
	struct collapse_huge_pages_event *e;

	e = bpf_task_storage_get(&pending_isolate, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!e)
		return 0;
	fill(e, NULL, 0, COLLAPSE_HUGE_PAGES_KIND_ISOLATE, ctx->status);
	e->pfn = ctx->pfn;
	e->none_or_zero = ctx->none_or_zero;
	e->referenced = ctx->referenced;
	e->isolated = 1; /* marks the stash as full; 0 again in the row */
	return 0;
}

SEC("tracepoint/huge_memory/mm_collapse_huge_page")
int collapse(struct trace_event_raw_mm_collapse_huge_page *ctx)
{
	struct collapse_huge_pages_event *e, *iso;
	struct mm_struct *mm = ctx->mm;
	u32 tgid = owner_tgid(mm);

	iso = bpf_task_storage_get(&pending_isolate, bpf_get_current_task_btf(), 0, 0);
	if (iso && iso->isolated) {
		iso->isolated = 0;
		if (wanted(tgid)) {
			e = KMO_RESERVE(collapse_huge_pages_rb, struct collapse_huge_pages_event, 0);
			if (e) {
				__builtin_memcpy(e, iso, sizeof(*e));
				e->mm = (u64)mm;
				e->tgid = tgid;
				KMO_SUBMIT(collapse_huge_pages_rb, e);
			}
		}
	}
	e = start_event(mm, COLLAPSE_HUGE_PAGES_KIND_COLLAPSE, ctx->status);
	if (!e)
		return 0;
	e->isolated = ctx->isolated;
	KMO_SUBMIT(collapse_huge_pages_rb, e);
	return 0;
}

SEC("tracepoint/huge_memory/mm_collapse_huge_page_swapin")
int swapin(struct trace_event_raw_mm_collapse_huge_page_swapin *ctx)
{
	struct collapse_huge_pages_event *e;

	e = start_event(ctx->mm, COLLAPSE_HUGE_PAGES_KIND_SWAPIN, ctx->ret);
	if (!e)
		return 0;
	e->swapped_in = ctx->swapped_in;
	e->referenced = ctx->referenced;
	KMO_SUBMIT(collapse_huge_pages_rb, e);
	return 0;
}

SEC("tracepoint/huge_memory/mm_khugepaged_scan_file")
int scan_file(struct trace_event_raw_mm_khugepaged_scan_file *ctx)
{
	struct collapse_huge_pages_event *e;

	e = start_event(ctx->mm, COLLAPSE_HUGE_PAGES_KIND_SCAN_FILE, ctx->result);
	if (!e)
		return 0;
	e->pfn = ctx->pfn;
	e->present = ctx->present;
	e->swap = ctx->swap;
	read_filename(e->filename, ctx, ctx->__data_loc_filename);
	KMO_SUBMIT(collapse_huge_pages_rb, e);
	return 0;
}

SEC("tracepoint/huge_memory/mm_khugepaged_collapse_file")
int collapse_file(struct trace_event_raw_mm_khugepaged_collapse_file *ctx)
{
	struct collapse_huge_pages_event *e;

	e = start_event(ctx->mm, COLLAPSE_HUGE_PAGES_KIND_COLLAPSE_FILE, ctx->result);
	if (!e)
		return 0;
	e->pfn = ctx->hpfn;
	e->file_index = ctx->index;
	e->address = ctx->addr;
	e->is_shmem = ctx->is_shmem;
	e->nr = ctx->nr;
	read_filename(e->filename, ctx, ctx->__data_loc_filename);
	KMO_SUBMIT(collapse_huge_pages_rb, e);
	return 0;
}

/* --- madvise and munmap ------------------------------------------------------ */
enum madvise_munmap_syscall {
	MADVISE_MUNMAP_SYSCALL_MADVISE = 0,
	MADVISE_MUNMAP_SYSCALL_MUNMAP = 1,
};

/* Advice values of include/uapi/asm-generic/mman-common.h, so the advice also
 * comes out as a name; values not listed stay numeric only. */
enum madvise_munmap_advice {
	MADVISE_MUNMAP_ADVICE_NORMAL = 0,
	MADVISE_MUNMAP_ADVICE_RANDOM = 1,
	MADVISE_MUNMAP_ADVICE_SEQUENTIAL = 2,
	MADVISE_MUNMAP_ADVICE_WILLNEED = 3,
	MADVISE_MUNMAP_ADVICE_DONTNEED = 4,
	MADVISE_MUNMAP_ADVICE_FREE = 8,
	MADVISE_MUNMAP_ADVICE_REMOVE = 9,
	MADVISE_MUNMAP_ADVICE_DONTFORK = 10,
	MADVISE_MUNMAP_ADVICE_DOFORK = 11,
	MADVISE_MUNMAP_ADVICE_MERGEABLE = 12,
	MADVISE_MUNMAP_ADVICE_UNMERGEABLE = 13,
	MADVISE_MUNMAP_ADVICE_HUGEPAGE = 14,
	MADVISE_MUNMAP_ADVICE_NOHUGEPAGE = 15,
	MADVISE_MUNMAP_ADVICE_DONTDUMP = 16,
	MADVISE_MUNMAP_ADVICE_DODUMP = 17,
	MADVISE_MUNMAP_ADVICE_WIPEONFORK = 18,
	MADVISE_MUNMAP_ADVICE_KEEPONFORK = 19,
	MADVISE_MUNMAP_ADVICE_COLD = 20,
	MADVISE_MUNMAP_ADVICE_PAGEOUT = 21,
	MADVISE_MUNMAP_ADVICE_POPULATE_READ = 22,
	MADVISE_MUNMAP_ADVICE_POPULATE_WRITE = 23,
	MADVISE_MUNMAP_ADVICE_DONTNEED_LOCKED = 24,
	MADVISE_MUNMAP_ADVICE_COLLAPSE = 25,
	MADVISE_MUNMAP_ADVICE_HWPOISON = 100,
	MADVISE_MUNMAP_ADVICE_SOFT_OFFLINE = 101,
	MADVISE_MUNMAP_ADVICE_GUARD_INSTALL = 102,
	MADVISE_MUNMAP_ADVICE_GUARD_REMOVE = 103,
};

struct madvise_munmap_event {
	u64 ts_uptime_us;
	u64 start;
	u64 length_bytes;
	u32 pid;
	u32 tgid;
	enum madvise_munmap_syscall syscall;
	s32 advice; /* madvise's third argument; -1 for munmap */
	enum madvise_munmap_advice advice_name;
};
KMO_RING(madvise_munmap_rb, madvise_munmap_event);

/* This architecture's syscall numbers, set by user space before load. */
const volatile long kmo_nr_madvise = -1;
const volatile long kmo_nr_munmap = -1;

static __always_inline int emit_range(bool madv, u64 start, u64 len, s32 advice)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct madvise_munmap_event *e;

	if (!kmo_tgid_wanted(pid_tgid >> 32))
		return 0;
	e = KMO_RESERVE(madvise_munmap_rb, struct madvise_munmap_event, 1);
	if (!e)
		return 0;
	e->ts_uptime_us = kmo_uptime_us();
	e->start = start;
	e->length_bytes = len;
	e->pid = (u32)pid_tgid;
	e->tgid = pid_tgid >> 32;
	e->syscall = madv ? MADVISE_MUNMAP_SYSCALL_MADVISE : MADVISE_MUNMAP_SYSCALL_MUNMAP;
	e->advice = madv ? advice : -1;
	e->advice_name = e->advice;
	KMO_SUBMIT(madvise_munmap_rb, e);
	return 0;
}

/* The syscalls tracepoints fire for their own call only: nothing to pay on
 * the machine's other syscalls. */
SEC("tracepoint/syscalls/sys_enter_madvise")
int madvise_enter(struct syscall_trace_enter *ctx)
{
	return emit_range(true, ctx->args[0], ctx->args[1], (s32)ctx->args[2]);
}

SEC("tracepoint/syscalls/sys_enter_munmap")
int munmap_enter(struct syscall_trace_enter *ctx)
{
	return emit_range(false, ctx->args[0], ctx->args[1], -1);
}

static __always_inline int on_sys_enter(struct pt_regs *regs, long id)
{
	bool madv = id == kmo_nr_madvise;

	/* Every syscall of the machine passes here: leave at once unless ours. */
	if (!madv && id != kmo_nr_munmap)
		return 0;
	return emit_range(madv, PT_REGS_PARM1_CORE_SYSCALL(regs), PT_REGS_PARM2_CORE_SYSCALL(regs),
			  madv ? (s32)PT_REGS_PARM3_CORE_SYSCALL(regs) : -1);
}

SEC("tp_btf/sys_enter")
int BPF_PROG(madvise_munmap_btf, struct pt_regs *regs, long id)
{
	return on_sys_enter(regs, id);
}

SEC("raw_tp/sys_enter")
int BPF_PROG(madvise_munmap_raw, struct pt_regs *regs, long id)
{
	return on_sys_enter(regs, id);
}
