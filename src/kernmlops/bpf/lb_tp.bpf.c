/* lb_tp: MLLB's model beside the load balancer on kernels without kprobes,
 * on sched_migrate_task (an approximation; kernmlops.lb.tracepoint).
 *
 * A pull by the load balancer is a task moved while queued, decided on the
 * destination CPU (detach_task runs there, with the source runqueue locked;
 * NUMA and affinity moves run on the source CPU's stopper instead). The
 * tracepoint fires after the task left the source queue and before its load
 * moves, so the source length is nr_running + 1. What the tracepoint cannot
 * see is filled in as the offline tracepoint data set does: no buddy (the
 * dequeue cleared it), no extra balance failures, and the idle type from the
 * destination's length (empty: newly idle, else not idle). Every such pull
 * is a decision the kernel answered "migrate", so agreement is the share the
 * model also answers 1.
 *
 * Each runqueue is read once, here, and the record holds exactly what the
 * model was given: the tracepoint data set takes its pulls' lengths, loads
 * and delta from this record (joined to sched_migrate's row by pid and
 * nr_migrations), so the data set's row and the shadow's decision are one
 * observation. The destination is read without its lock: a second read, a
 * few µs later, may see a wake-up land in between. */
#include "filter.h"
#include "lb_model.h"

struct lb_tp_decision {
	u64 ts_uptime_us;
	s64 delta_ns;
	u64 src_load;
	u64 dst_load;
	u64 total_faults;
	u64 src_faults;
	u64 dst_faults;
	u64 nr_migrations; /* se.nr_migrations before this move: the event's key with pid */
	s64 model_out;
	u64 infer_ns;
	u32 pid;
	u32 tgid;
	u32 src_cpu;
	u32 dst_cpu;
	u32 src_len;
	u32 src_preferred_len;
	u32 dst_len;
	s32 src_nid;
	s32 dst_nid;
	s32 numa_preferred_nid;
	s8 model_pred; /* -1: no model */
	u8 rq_valid;
	char comm[16];
};
KMO_RING(lb_tp_rb, lb_tp_decision);

/* Before 5.16 (and where thread_info is not in the task) the CPU was task->cpu. */
struct task_struct___pre516 {
	unsigned int cpu;
} __attribute__((preserve_access_index));

static __always_inline u32 lb_task_cpu(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return BPF_CORE_READ(p, thread_info.cpu);
	return BPF_CORE_READ((struct task_struct___pre516 *)p, cpu);
}

/* A CPU's runqueue reached from the task: its group's cfs_rq on that CPU
 * points to the CPU's rq (CONFIG_FAIR_GROUP_SCHED); the per-CPU variable
 * itself needs kallsyms entries kernels often leave out. */
static __always_inline struct rq *lb_cpu_rq(struct task_struct *p, u32 cpu)
{
	struct cfs_rq *cfs_rq = BPF_CORE_READ(p, se.cfs_rq), **per_cpu, *c = NULL;

	if (!cfs_rq || !bpf_core_field_exists(cfs_rq->rq) || !bpf_core_field_exists(cfs_rq->tg))
		return NULL;
	per_cpu = BPF_CORE_READ(cfs_rq, tg, cfs_rq);
	if (!per_cpu || bpf_probe_read_kernel(&c, sizeof(c), &per_cpu[cpu & (LB_MAX_CPUS - 1)]) || !c)
		return NULL;
	return BPF_CORE_READ(c, rq);
}

static __always_inline u64 lb_tp_node_faults(unsigned long *faults, u32 nid)
{
	unsigned long priv = 0, shared = 0;

	if (!faults || nid >= LB_MAX_NODES)
		return 0;
	bpf_probe_read_kernel(&shared, sizeof(shared), &faults[2 * nid]);
	bpf_probe_read_kernel(&priv, sizeof(priv), &faults[2 * nid + 1]);
	return shared + priv;
}

static __always_inline int on_migrate(struct task_struct *p, int dest_cpu)
{
	u32 src = lb_task_cpu(p), dst = dest_cpu;
	struct lb_tp_decision *d;
	struct lb_eval ev = {};
	struct rq *src_rq, *dst_rq;
	unsigned long *faults = NULL;

	/* queued, moved, and pulled by the destination */
	if (!BPF_CORE_READ(p, on_rq) || src == dst || bpf_get_smp_processor_id() != dst)
		return 0;
	if (!kmo_task_wanted(p))
		return 0;
	d = KMO_RESERVE(lb_tp_rb, struct lb_tp_decision, 0);
	if (!d)
		return 0;
	d->ts_uptime_us = kmo_uptime_us();
	d->pid = BPF_CORE_READ(p, pid);
	d->tgid = BPF_CORE_READ(p, tgid);
	d->nr_migrations = BPF_CORE_READ(p, se.nr_migrations);
	d->src_cpu = src;
	d->dst_cpu = dst;
	d->src_nid = lb_cpu_to_node(src);
	d->dst_nid = lb_cpu_to_node(dst);
	src_rq = lb_cpu_rq(p, src);
	dst_rq = lb_cpu_rq(p, dst);
	d->rq_valid = src_rq && dst_rq;
	d->src_len = 1; /* the task itself, already dequeued */
	d->src_preferred_len = 1;
	d->dst_len = 0;
	d->src_load = 0;
	d->dst_load = 0;
	d->delta_ns = 0;
	if (bpf_core_field_exists(p->numa_faults)) {
		faults = BPF_CORE_READ(p, numa_faults);
		d->numa_preferred_nid = BPF_CORE_READ(p, numa_preferred_nid);
		d->total_faults = BPF_CORE_READ(p, total_numa_faults);
	} else {
		d->numa_preferred_nid = -1;
		d->total_faults = 0;
	}
	if (src_rq) {
		d->src_len = BPF_CORE_READ(src_rq, nr_running) + 1;
		/* no NUMA balancing: no task prefers a node (0, as the data set's
		 * rows and the kprobe program have it) */
		d->src_preferred_len = 0;
		if (bpf_core_field_exists(src_rq->nr_preferred_running))
			d->src_preferred_len = BPF_CORE_READ(src_rq, nr_preferred_running) +
					       (d->numa_preferred_nid == d->src_nid);
		d->src_load = BPF_CORE_READ(src_rq, cfs.avg.load_avg);
		d->delta_ns = (s64)(BPF_CORE_READ(src_rq, clock_task) -
				    BPF_CORE_READ(p, se.exec_start));
	}
	if (dst_rq) {
		d->dst_len = BPF_CORE_READ(dst_rq, nr_running);
		d->dst_load = BPF_CORE_READ(dst_rq, cfs.avg.load_avg);
	}
	d->src_faults = lb_tp_node_faults(faults, d->src_nid);
	d->dst_faults = lb_tp_node_faults(faults, d->dst_nid);
	BPF_CORE_READ_STR_INTO(&d->comm, p, comm);
	lb_stat_add(LB_STAT_SEEN, 1);
	if (!lb_model_on) {
		d->model_pred = -1;
		d->model_out = 0;
		d->infer_ns = 0;
		KMO_SUBMIT(lb_tp_rb, d);
		return 0;
	}
	ev.in.delta_ns = d->delta_ns;
	ev.in.src_load = d->src_load;
	ev.in.dst_load = d->dst_load;
	ev.in.delta_faults = (s64)d->dst_faults - (s64)d->src_faults;
	ev.in.total_faults = d->total_faults;
	ev.in.src_len = d->src_len;
	ev.in.src_preferred_len = d->src_preferred_len;
	ev.in.dst_len = d->dst_len;
	ev.in.nr_balance_failed = 0;
	ev.in.cache_nice_tries = 1;
	ev.in.cpu_idle = 0;
	ev.in.cpu_newly_idle = d->dst_len == 0;
	ev.in.cpu_not_idle = d->dst_len != 0;
	ev.in.same_node = d->src_nid == d->dst_nid;
	ev.in.prefer_src = d->numa_preferred_nid == d->src_nid;
	ev.in.prefer_dst = d->numa_preferred_nid == d->dst_nid;
	ev.in.buddy_hot = 0;
	lb_eval_model(&ev);
	d->model_out = ev.out;
	d->model_pred = ev.out > 0;
	d->infer_ns = ev.ns;
	lb_stat_add(LB_STAT_NS_SUM, ev.ns);
	lb_stat_max(LB_STAT_NS_MAX, ev.ns);
	lb_stat_add(LB_STAT_AGREE, d->model_pred == 1);
	lb_stat_add(LB_STAT_FILTERED, 1);
	lb_stat_add(d->model_pred ? LB_STAT_F_TP : LB_STAT_F_FN, 1);
	KMO_SUBMIT(lb_tp_rb, d);
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(lb_tp_btf, struct task_struct *p, int dest_cpu)
{
	return on_migrate(p, dest_cpu);
}

SEC("raw_tp/sched_migrate_task")
int BPF_PROG(lb_tp_raw, struct task_struct *p, int dest_cpu)
{
	return on_migrate(p, dest_cpu);
}
