/* lb_kprobe: every can_migrate_task(p, env) decision of CFS's load balancer,
 * with what the MLLB study recorded (the lb_env, both runqueues, the task's
 * NUMA state) and the answer, read through BTF/CO-RE; optionally MLLB's
 * model evaluated beside it (shadow mode, lb_model.h).
 *
 * Two variants: fexit (arguments and return value in one program; preferred)
 * and kprobe + kretprobe (entry fills a per-CPU record, return completes
 * it: the function runs with the source runqueue locked and interrupts off,
 * so nothing else runs in between on that CPU). */
#include "filter.h"
#include "lb_model.h"

/* kernel/sched/fair.c, unchanged since 5.10 */
#define LBF_ACTIVE_LB 0x10
/* include/linux/sched.h */
#define PF_KTHREAD 0x00200000
/* kernel/kthread.c: bit 0 of struct kthread.flags (enum KTHREAD_BITS) */
#define KTHREAD_IS_PER_CPU 0

/* struct lb_env is private to kernel/sched/fair.c: only what we read, found
 * by name in the running kernel's BTF. */
struct lb_env___kmo {
	struct sched_domain *sd;
	struct rq *src_rq;
	int src_cpu;
	int dst_cpu;
	struct rq *dst_rq;
	enum cpu_idle_type idle;
	long imbalance;
	unsigned int flags;
} __attribute__((preserve_access_index));

/* cfs_rq->last went away with EEVDF (6.6) */
struct cfs_rq___buddies {
	struct sched_entity *next;
	struct sched_entity *last;
} __attribute__((preserve_access_index));

/* Since 5.17 a kthread's struct kthread is p->worker_private. */
struct task_struct___kthread {
	void *worker_private;
} __attribute__((preserve_access_index));

struct kthread___kmo {
	unsigned long flags;
} __attribute__((preserve_access_index));

struct lb_decision {
	u64 ts_uptime_us;
	s64 imbalance;
	s64 delta_ns; /* rq_clock_task(src_rq) - p->se.exec_start */
	u64 src_load; /* src_rq->cfs.avg.load_avg */
	u64 dst_load;
	u64 total_faults; /* p->total_numa_faults */
	u64 src_faults; /* the task's memory faults on src_cpu's node */
	u64 dst_faults;
	u64 numa_faults[LB_MAX_NODES]; /* per node (NUMA_MEM, private + shared) */
	u32 pid;
	u32 tgid;
	u32 src_cpu;
	u32 dst_cpu;
	u32 src_len; /* src_rq->nr_running */
	u32 src_numa_len; /* src_rq->nr_numa_running */
	u32 src_preferred_len; /* src_rq->nr_preferred_running */
	u32 dst_len;
	u32 nr_balance_failed; /* env->sd-> */
	u32 cache_nice_tries;
	u32 sd_flags;
	u32 lb_flags; /* env->flags after the call */
	s32 src_nid;
	s32 dst_nid;
	s32 numa_preferred_nid;
	s32 idle; /* raw enum cpu_idle_type of this kernel */
	s32 model_out; /* Q20.11 logit (shadow mode) */
	u32 infer_ns; /* features + model, bpf_ktime_get_ns around them */
	u8 cpu_idle;
	u8 cpu_not_idle;
	u8 cpu_newly_idle;
	u8 buddy_hot;
	u8 throttled;
	u8 p_running;
	u8 affine_ok; /* dst_cpu in p->cpus_ptr */
	u8 pcpu_kthread;
	u8 active_lb;
	u8 numa_faults_on; /* p->numa_faults allocated */
	u8 test_aggressive; /* hard constraints passed */
	u8 can_migrate; /* what the kernel returned */
	s8 model_pred; /* -1: no model */
	char comm[16];
};
KMO_RING(lb_decisions_rb, lb_decision);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct lb_decision);
} lb_scratch SEC(".maps");

/* Per CPU: 1 while the kprobe's record waits for its kretprobe. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} lb_pending SEC(".maps");

static __always_inline u8 cfs_throttled(struct cfs_rq **per_cpu, u32 cpu)
{
	struct cfs_rq *c = NULL;

	if (!bpf_core_field_exists(struct cfs_rq, throttle_count))
		return 0;
	if (bpf_probe_read_kernel(&c, sizeof(c), &per_cpu[cpu & (LB_MAX_CPUS - 1)]) || !c)
		return 0;
	return BPF_CORE_READ(c, throttle_count) != 0;
}

/* throttled_lb_pair(task_group(p), src, dst) */
static __always_inline u8 lb_throttled(struct task_struct *p, u32 src, u32 dst)
{
	struct task_group *tg;
	struct cfs_rq **per_cpu;

	if (!bpf_core_field_exists(p->sched_task_group))
		return 0;
	tg = BPF_CORE_READ(p, sched_task_group);
	if (!tg)
		return 0;
	per_cpu = BPF_CORE_READ(tg, cfs_rq);
	if (!per_cpu)
		return 0;
	return cfs_throttled(per_cpu, src) || cfs_throttled(per_cpu, dst);
}

static __always_inline u8 lb_pcpu_kthread(struct task_struct *p)
{
	struct task_struct___kthread *t = (void *)p;
	struct kthread___kmo *k;

	if (!(BPF_CORE_READ(p, flags) & PF_KTHREAD))
		return 0;
	if (!bpf_core_field_exists(t->worker_private) || !bpf_core_type_exists(struct kthread___kmo))
		return 0;
	k = BPF_CORE_READ(t, worker_private);
	if (!k)
		return 0;
	return (BPF_CORE_READ(k, flags) >> KTHREAD_IS_PER_CPU) & 1;
}

static __always_inline u8 lb_affine(struct task_struct *p, u32 cpu)
{
	const struct cpumask *mask = BPF_CORE_READ(p, cpus_ptr);
	unsigned long word = 0;

	if (!mask)
		return 0;
	if (bpf_probe_read_kernel(&word, sizeof(word), &mask->bits[(cpu & (LB_MAX_CPUS - 1)) / 64]))
		return 0;
	return (word >> (cpu % 64)) & 1;
}

/* The task's hinting faults on one node: task_faults(p, nid) of fair.c. */
static __always_inline u64 lb_node_faults(unsigned long *faults, u32 nid)
{
	unsigned long priv = 0, shared = 0;

	if (!faults || nid >= LB_MAX_NODES)
		return 0;
	/* task_faults_idx(NUMA_MEM = 0, nid, priv) = 2 * nid + priv */
	bpf_probe_read_kernel(&shared, sizeof(shared), &faults[2 * nid]);
	bpf_probe_read_kernel(&priv, sizeof(priv), &faults[2 * nid + 1]);
	return shared + priv;
}

static __always_inline u8 lb_buddy_hot(struct task_struct *p, struct rq *src_rq, u32 dst_len)
{
	struct sched_entity *se = &p->se;
	struct cfs_rq___buddies *cfs;

	if (!dst_len)
		return 0;
	if (bpf_core_field_exists(p->se.cfs_rq))
		cfs = (void *)BPF_CORE_READ(p, se.cfs_rq);
	else
		cfs = (void *)&src_rq->cfs;
	if (!cfs)
		return 0;
	if (BPF_CORE_READ(cfs, next) == se)
		return 1;
	if (bpf_core_field_exists(cfs->last) && BPF_CORE_READ(cfs, last) == se)
		return 1;
	return 0;
}

/* Everything but the answer, as the kernel sees it on entry. */
static __always_inline void lb_fill(struct lb_decision *d, struct task_struct *p,
				    struct lb_env___kmo *env)
{
	struct rq *src_rq = BPF_CORE_READ(env, src_rq), *dst_rq = BPF_CORE_READ(env, dst_rq);
	struct sched_domain *sd = BPF_CORE_READ(env, sd);
	unsigned long *faults = NULL;
	s32 idle = BPF_CORE_READ(env, idle);

	d->ts_uptime_us = kmo_uptime_us();
	d->pid = BPF_CORE_READ(p, pid);
	d->tgid = BPF_CORE_READ(p, tgid);
	d->src_cpu = BPF_CORE_READ(env, src_cpu);
	d->dst_cpu = BPF_CORE_READ(env, dst_cpu);
	d->imbalance = BPF_CORE_READ(env, imbalance);
	d->idle = idle;
	d->cpu_idle = idle == bpf_core_enum_value(enum cpu_idle_type, CPU_IDLE);
	d->cpu_newly_idle = idle == bpf_core_enum_value(enum cpu_idle_type, CPU_NEWLY_IDLE);
	d->cpu_not_idle = !d->cpu_idle && !d->cpu_newly_idle;
	d->src_len = BPF_CORE_READ(src_rq, nr_running);
	d->dst_len = BPF_CORE_READ(dst_rq, nr_running);
	if (bpf_core_field_exists(src_rq->nr_numa_running)) {
		d->src_numa_len = BPF_CORE_READ(src_rq, nr_numa_running);
		d->src_preferred_len = BPF_CORE_READ(src_rq, nr_preferred_running);
	} else { /* no NUMA balancing: no task prefers a node, the counts are 0 as
		  * on one node (MLLB's src_non_pref_nr: src_len > 0), as the
		  * offline data set fills them (dataset.impute_missing) */
		d->src_numa_len = 0;
		d->src_preferred_len = 0;
	}
	d->src_load = BPF_CORE_READ(src_rq, cfs.avg.load_avg);
	d->dst_load = BPF_CORE_READ(dst_rq, cfs.avg.load_avg);
	d->delta_ns = (s64)(BPF_CORE_READ(src_rq, clock_task) - BPF_CORE_READ(p, se.exec_start));
	d->nr_balance_failed = BPF_CORE_READ(sd, nr_balance_failed);
	d->cache_nice_tries = BPF_CORE_READ(sd, cache_nice_tries);
	d->sd_flags = BPF_CORE_READ(sd, flags);
	d->src_nid = lb_cpu_to_node(d->src_cpu);
	d->dst_nid = lb_cpu_to_node(d->dst_cpu);
	if (bpf_core_field_exists(p->numa_faults)) {
		faults = BPF_CORE_READ(p, numa_faults);
		d->numa_preferred_nid = BPF_CORE_READ(p, numa_preferred_nid);
		d->total_faults = BPF_CORE_READ(p, total_numa_faults);
	} else {
		d->numa_preferred_nid = -1;
		d->total_faults = 0;
	}
	d->numa_faults_on = faults != NULL;
#pragma unroll
	for (u32 n = 0; n < LB_MAX_NODES; n++)
		d->numa_faults[n] = n < lb_nr_nodes ? lb_node_faults(faults, n) : 0;
	d->src_faults = lb_node_faults(faults, d->src_nid);
	d->dst_faults = lb_node_faults(faults, d->dst_nid);
	d->buddy_hot = lb_buddy_hot(p, src_rq, d->dst_len);
	d->throttled = lb_throttled(p, d->src_cpu, d->dst_cpu);
	d->p_running = BPF_CORE_READ(p, on_cpu) != 0;
	d->affine_ok = lb_affine(p, d->dst_cpu);
	d->pcpu_kthread = lb_pcpu_kthread(p);
	d->test_aggressive = !d->throttled && !d->pcpu_kthread && d->affine_ok && !d->p_running;
	BPF_CORE_READ_STR_INTO(&d->comm, p, comm);
}

/* The answer, the flags it left, and the model beside it. */
static __always_inline void lb_finish(struct lb_decision *d, struct lb_env___kmo *env, int ret)
{
	struct lb_eval ev = {};
	bool filtered;

	d->can_migrate = ret != 0;
	d->lb_flags = BPF_CORE_READ(env, flags);
	d->active_lb = (d->lb_flags & LBF_ACTIVE_LB) != 0;
	lb_stat_add(LB_STAT_SEEN, 1);
	if (!lb_model_on) {
		d->model_pred = -1;
		d->model_out = 0;
		d->infer_ns = 0;
		return;
	}
	ev.in.delta_ns = d->delta_ns;
	ev.in.src_load = d->src_load;
	ev.in.dst_load = d->dst_load;
	ev.in.delta_faults = (s64)d->dst_faults - (s64)d->src_faults;
	ev.in.total_faults = d->total_faults;
	ev.in.src_len = d->src_len;
	ev.in.src_preferred_len = d->src_preferred_len;
	ev.in.dst_len = d->dst_len;
	ev.in.nr_balance_failed = d->nr_balance_failed;
	ev.in.cache_nice_tries = d->cache_nice_tries;
	ev.in.cpu_idle = d->cpu_idle;
	ev.in.cpu_not_idle = d->cpu_not_idle;
	ev.in.cpu_newly_idle = d->cpu_newly_idle;
	ev.in.same_node = d->src_nid == d->dst_nid;
	ev.in.prefer_src = d->numa_preferred_nid == d->src_nid;
	ev.in.prefer_dst = d->numa_preferred_nid == d->dst_nid;
	ev.in.buddy_hot = d->buddy_hot;
	lb_eval_model(&ev);
	d->model_out = ev.out;
	d->model_pred = ev.out > 0;
	d->infer_ns = ev.ns;
	lb_stat_add(LB_STAT_NS_SUM, ev.ns);
	lb_stat_max(LB_STAT_NS_MAX, ev.ns);
	lb_stat_add(LB_STAT_AGREE, d->model_pred == d->can_migrate);
	filtered = !d->p_running && d->test_aggressive && !d->active_lb;
	if (filtered) {
		lb_stat_add(LB_STAT_FILTERED, 1);
		if (d->model_pred)
			lb_stat_add(d->can_migrate ? LB_STAT_F_TP : LB_STAT_F_FP, 1);
		else
			lb_stat_add(d->can_migrate ? LB_STAT_F_FN : LB_STAT_F_TN, 1);
	}
}

SEC("fexit/can_migrate_task")
int BPF_PROG(lb_fexit_btf, struct task_struct *p, struct lb_env___kmo *env, int ret)
{
	struct lb_decision *d;

	if (!kmo_task_wanted(p))
		return 0;
	d = KMO_RESERVE(lb_decisions_rb, struct lb_decision, 0);
	if (!d)
		return 0;
	lb_fill(d, p, env);
	lb_finish(d, env, ret);
	KMO_SUBMIT(lb_decisions_rb, d);
	return 0;
}

/* kprobe variant: the entry keeps the record and env per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} lb_env_ptr SEC(".maps");

SEC("kprobe/can_migrate_task")
int BPF_KPROBE(lb_kprobe_raw, struct task_struct *p, struct lb_env___kmo *env)
{
	u32 zero = 0, *pending = bpf_map_lookup_elem(&lb_pending, &zero);
	struct lb_decision *d = bpf_map_lookup_elem(&lb_scratch, &zero);
	u64 *envp = bpf_map_lookup_elem(&lb_env_ptr, &zero);

	if (!pending || !d || !envp)
		return 0;
	*pending = 0;
	if (!kmo_task_wanted(p))
		return 0;
	lb_fill(d, p, env);
	*envp = (u64)env;
	*pending = 1;
	return 0;
}

SEC("kretprobe/can_migrate_task")
int BPF_KRETPROBE(lb_kretprobe_raw, int ret)
{
	u32 zero = 0, *pending = bpf_map_lookup_elem(&lb_pending, &zero);
	struct lb_decision *d = bpf_map_lookup_elem(&lb_scratch, &zero), *e;
	u64 *envp = bpf_map_lookup_elem(&lb_env_ptr, &zero);

	if (!pending || !d || !envp || !*pending)
		return 0;
	*pending = 0;
	e = KMO_RESERVE(lb_decisions_rb, struct lb_decision, 0);
	if (!e)
		return 0;
	__builtin_memcpy(e, d, sizeof(*e));
	lb_finish(e, (struct lb_env___kmo *)*envp, ret);
	KMO_SUBMIT(lb_decisions_rb, e);
	return 0;
}
