/* sched_migrate: one row per sched_migrate_task, i.e. per set_task_cpu(), with
 * both runqueues' length and load where the kernel lets us read them.
 *
 * The tracepoint fires before the task's CPU changes, so task_cpu(p) is the
 * CPU it leaves. It also fires when orig_cpu == dest_cpu (only a change
 * increments se.nr_migrations). */
#include "filter.h"
#include "sched_migrate.h" /* the CPU it leaves, the kind: shared with the exporter */

struct sched_migrate_event {
	u64 ts_uptime_us;
	/* cfs.avg of each runqueue (PELT averages); 0 unless rq_valid */
	u64 orig_load_avg;
	u64 dest_load_avg;
	u64 orig_util_avg;
	u64 dest_util_avg;
	/* the task's se.nr_migrations before this event (only a move counts): with
	 * pid, a key other programs on this tracepoint can record too */
	u64 nr_migrations;
	u32 pid;
	u32 tgid;
	u32 orig_cpu;
	u32 dest_cpu;
	u32 orig_nr_running; /* a task moved while queued is already dequeued from it */
	u32 dest_nr_running;
	u32 cpu; /* where the migration was decided */
	s32 on_rq; /* raw p->on_rq: 0, 1 queued, 2 migrating */
	enum sched_migrate_kind kind;
	bool rq_valid; /* both runqueues were read */
	char comm[16];
};
KMO_RING(sched_migrate_rb, sched_migrate_event);

/* Set before load (option `runqueues`). */
const volatile bool read_rq = true;

/* A CPU's struct rq, reached from the task: p->se.cfs_rq is the task's cfs_rq
 * (of its task group) on its current CPU, the group keeps one cfs_rq per CPU,
 * and each points to its CPU's runqueue (CONFIG_FAIR_GROUP_SCHED). The direct
 * way, bpf_per_cpu_ptr(&runqueues, cpu), needs the per-CPU variable in
 * kallsyms (CONFIG_KALLSYMS_ALL), which kernels often leave out. */
static __always_inline struct rq *cpu_rq_via(struct task_struct *p, u32 cpu)
{
	struct cfs_rq *cfs_rq = BPF_CORE_READ(p, se.cfs_rq), **per_cpu, *c = NULL;

	if (!cfs_rq || !bpf_core_field_exists(cfs_rq->rq) || !bpf_core_field_exists(cfs_rq->tg))
		return NULL;
	per_cpu = BPF_CORE_READ(cfs_rq, tg, cfs_rq);
	if (!per_cpu || bpf_probe_read_kernel(&c, sizeof(c), &per_cpu[cpu]) || !c)
		return NULL;
	return BPF_CORE_READ(c, rq);
}

static __always_inline bool read_runqueue(struct task_struct *p, u32 cpu, u32 *nr_running,
					  u64 *load_avg, u64 *util_avg)
{
	struct rq *rq;

	*nr_running = 0; /* ring records are not zeroed */
	*load_avg = 0;
	*util_avg = 0;
	if (!read_rq)
		return false;
	rq = cpu_rq_via(p, cpu);
	if (!rq)
		return false;
	*nr_running = BPF_CORE_READ(rq, nr_running);
	*load_avg = BPF_CORE_READ(rq, cfs.avg.load_avg);
	*util_avg = BPF_CORE_READ(rq, cfs.avg.util_avg);
	return true;
}

static __always_inline int on_migrate(struct task_struct *p, int dest_cpu)
{
	struct sched_migrate_event *e;
	bool orig_ok, dest_ok;

	if (!kmo_task_wanted(p))
		return 0;
	e = KMO_RESERVE(sched_migrate_rb, struct sched_migrate_event, 0);
	if (!e)
		return 0;
	e->ts_uptime_us = kmo_uptime_us();
	e->pid = BPF_CORE_READ(p, pid);
	e->tgid = BPF_CORE_READ(p, tgid);
	e->nr_migrations = BPF_CORE_READ(p, se.nr_migrations);
	e->orig_cpu = kmo_task_cpu(p);
	e->dest_cpu = dest_cpu;
	e->cpu = bpf_get_smp_processor_id();
	e->on_rq = BPF_CORE_READ(p, on_rq);
	e->kind = kmo_migrate_kind(e->on_rq);
	orig_ok = read_runqueue(p, e->orig_cpu, &e->orig_nr_running, &e->orig_load_avg,
				&e->orig_util_avg);
	dest_ok = read_runqueue(p, e->dest_cpu, &e->dest_nr_running, &e->dest_load_avg,
				&e->dest_util_avg);
	e->rq_valid = orig_ok && dest_ok;
	BPF_CORE_READ_STR_INTO(&e->comm, p, comm);
	KMO_SUBMIT(sched_migrate_rb, e);
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(migrate_btf, struct task_struct *p, int dest_cpu)
{
	return on_migrate(p, dest_cpu);
}

/* raw_tp variant for kernels without tp_btf (the arguments are the same). */
SEC("raw_tp/sched_migrate_task")
int BPF_PROG(migrate_raw, struct task_struct *p, int dest_cpu)
{
	return on_migrate(p, dest_cpu);
}
