// SPDX-License-Identifier: GPL-2.0
/*
 * kmo_lb: MLLB's learned load-balancing decision in a stock kernel.
 *
 * Part of kernmlops (kernmlops.lb.kmod builds and loads it). A kretprobe on
 * can_migrate_task(p, env) lets the kernel decide first, then, when the
 * kernel reached the cache-hotness part of the decision (every hard
 * constraint passed: not throttled, not a per-CPU kthread, dst allowed by
 * the task's affinity, migration not disabled, task not running, not an
 * active balance), evaluates the 15 -> 10 ReLU -> 1 MLP in Q20.11 fixed point
 * (the arithmetic of kernmlops.lb.fixed and bpf/lb_model.h) and, in replace
 * mode, returns its answer instead of the kernel's. Hard constraints are
 * never overridden.
 *
 * struct lb_env, struct rq, struct cfs_rq, struct task_group and struct
 * kthread are private to the kernel's sources: their field offsets come from
 * the running kernel's BTF, given at load time (parameter "layout"). Public
 * structures (task_struct, sched_domain, sched_avg) come from the headers
 * the module is built against.
 *
 * Parameters (/sys/module/kmo_lb/parameters/):
 *   mode     off | shadow | replace (read-write, switchable at run time)
 *   stats    counters, one "name value" per line (read-only)
 *   w1 b1 w2 b2   the model, Q20.11 integers, w1[feature * 10 + hidden]
 *   layout   field offsets (bytes), in enum kmo_layout's order
 *   migration_cost_ns   sysctl_sched_migration_cost the features use
 *   eval     write 17 raw inputs (struct kmo_inputs' order), read back
 *            "logit features..." (checks the arithmetic from user space)
 *   bench    write N: time N evaluations of the last eval inputs, read "N ns"
 * A wrong-shaped model or layout refuses the load: the kernel stays stock.
 */
#include <linux/module.h>
#include <linux/kprobes.h>
#include <linux/ktime.h>
#include <linux/sched/clock.h>
#include <linux/percpu.h>
#include <linux/sched.h>
#include <linux/sched/idle.h>
#include <linux/sched/topology.h>
#include <linux/topology.h>
#include <linux/cpumask.h>
#include <linux/string.h>
#include <linux/kernel.h>
#include <linux/kstrtox.h>

#ifndef CONFIG_X86_64
#error "kmo_lb reads can_migrate_task's arguments from x86-64 registers"
#endif

#define KMO_NR_FEAT 15
#define KMO_NR_HIDDEN 10
#define KMO_NR_INPUTS 17
#define KMO_FBITS 11
#define KMO_ONE (1LL << KMO_FBITS)
#define KMO_Q_LIMIT ((1LL << 20) - 1)

/* kernel/sched/fair.c (unchanged since 5.10) */
#define KMO_LBF_ACTIVE_LB 0x10
/* kernel/kthread.c: bit of struct kthread.flags (enum KTHREAD_BITS) */
#define KMO_KTHREAD_IS_PER_CPU 0

enum kmo_layout {
	L_ENV_SD,
	L_ENV_SRC_RQ,
	L_ENV_SRC_CPU,
	L_ENV_DST_CPU,
	L_ENV_DST_RQ,
	L_ENV_IDLE,
	L_ENV_FLAGS,
	L_RQ_NR_RUNNING,
	L_RQ_NR_NUMA_RUNNING,
	L_RQ_NR_PREFERRED_RUNNING,
	L_RQ_CLOCK_TASK,
	L_RQ_CFS,
	L_CFS_RQ_AVG,
	L_CFS_RQ_NEXT,
	L_CFS_RQ_LAST,
	L_CFS_RQ_THROTTLE_COUNT,
	L_TG_CFS_RQ,
	L_KTHREAD_FLAGS,
	L_NR,
};

enum kmo_mode { KMO_OFF = 0, KMO_SHADOW, KMO_REPLACE };
static const char *const kmo_mode_names[] = { "off", "shadow", "replace" };

enum kmo_stat {
	S_CALLS, /* can_migrate_task returns seen (mode != off) */
	S_HARD, /* answered by a hard constraint or active balance: left alone */
	S_DECISIONS, /* reached the heuristic: the model evaluated */
	S_AGREE, /* model == kernel */
	S_MODEL_YES_KERNEL_NO,
	S_MODEL_NO_KERNEL_YES,
	S_OVERRIDDEN, /* replace: the answer returned was the model's, not the kernel's */
	S_NS_SUM, /* reading the inputs + features + MLP, local_clock() around them */
	S_NS_MAX,
	S_NR,
};
static const char *const kmo_stat_names[] = {
	"calls", "hard_constraint", "decisions", "agree", "model_yes_kernel_no",
	"model_no_kernel_yes", "overridden", "ns_sum", "ns_max",
};

struct kmo_stats {
	u64 v[S_NR];
};
static DEFINE_PER_CPU(struct kmo_stats, kmo_stats);

static int w1[KMO_NR_FEAT * KMO_NR_HIDDEN];
static unsigned int w1_n;
module_param_array(w1, int, &w1_n, 0444);
MODULE_PARM_DESC(w1, "layer 1 weights, Q20.11, w1[feature * 10 + hidden] (150)");
static int b1[KMO_NR_HIDDEN];
static unsigned int b1_n;
module_param_array(b1, int, &b1_n, 0444);
MODULE_PARM_DESC(b1, "layer 1 biases, Q20.11 (10)");
static int w2[KMO_NR_HIDDEN];
static unsigned int w2_n;
module_param_array(w2, int, &w2_n, 0444);
MODULE_PARM_DESC(w2, "layer 2 weights, Q20.11 (10)");
static long b2 = LONG_MIN; /* LLONG_MIN: not given */
module_param(b2, long, 0444);
MODULE_PARM_DESC(b2, "layer 2 bias, Q20.11");
static int layout[L_NR];
static unsigned int layout_n;
module_param_array(layout, int, &layout_n, 0444);
MODULE_PARM_DESC(layout, "field offsets of private kernel structures, from BTF");
static long migration_cost_ns = 500000;
module_param(migration_cost_ns, long, 0444);
MODULE_PARM_DESC(migration_cost_ns, "sysctl_sched_migration_cost (ns)");

static int kmo_mode = KMO_OFF;

static int mode_set(const char *val, const struct kernel_param *kp)
{
	int i = sysfs_match_string(kmo_mode_names, val);

	if (i < 0)
		return -EINVAL;
	WRITE_ONCE(kmo_mode, i);
	return 0;
}

static int mode_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%s\n", kmo_mode_names[READ_ONCE(kmo_mode)]);
}

static const struct kernel_param_ops mode_ops = { .set = mode_set, .get = mode_get };
module_param_cb(mode, &mode_ops, NULL, 0644);
MODULE_PARM_DESC(mode, "off (stock) | shadow (count agreement) | replace (the model decides)");

static struct kretprobe kmo_rp;

static int stats_get(char *buf, const struct kernel_param *kp)
{
	u64 sum[S_NR] = {};
	int cpu, i, n = 0;

	for_each_possible_cpu(cpu) {
		struct kmo_stats *s = per_cpu_ptr(&kmo_stats, cpu);

		for (i = 0; i < S_NR; i++) {
			u64 v = READ_ONCE(s->v[i]);

			if (i == S_NS_MAX)
				sum[i] = max(sum[i], v);
			else
				sum[i] += v;
		}
	}
	for (i = 0; i < S_NR; i++)
		n += sysfs_emit_at(buf, n, "%s %llu\n", kmo_stat_names[i], sum[i]);
	n += sysfs_emit_at(buf, n, "missed %d\n", kmo_rp.nmissed);
	return n;
}

static const struct kernel_param_ops stats_ops = { .get = stats_get };
module_param_cb(stats, &stats_ops, NULL, 0444);
MODULE_PARM_DESC(stats, "counters (calls, decisions, agreement, overridden, ns)");

/* What the features start from (bpf/lb_model.h's struct lb_inputs). */
struct kmo_inputs {
	s64 delta_ns;
	s64 src_load;
	s64 dst_load;
	s64 delta_faults;
	s64 total_faults;
	s64 src_len;
	s64 src_preferred_len;
	s64 dst_len;
	s64 nr_balance_failed;
	s64 cache_nice_tries;
	s64 cpu_idle;
	s64 cpu_not_idle;
	s64 cpu_newly_idle;
	s64 same_node;
	s64 prefer_src;
	s64 prefer_dst;
	s64 buddy_hot;
};

static inline s64 kmo_clamp(s64 v)
{
	return clamp_t(s64, v, -KMO_Q_LIMIT, KMO_Q_LIMIT);
}

/* The Q20.11 features, in kernmlops.lb.features.FEATURES order. */
static void kmo_features(const struct kmo_inputs *in, s64 *x)
{
	s64 total = kmo_clamp(in->total_faults), delta = kmo_clamp(in->delta_faults);

	x[0] = (in->src_len > in->src_preferred_len) << KMO_FBITS;
	x[1] = (in->delta_ns < migration_cost_ns) << KMO_FBITS;
	x[2] = (s64)!!in->cpu_idle << KMO_FBITS;
	x[3] = (s64)!!in->cpu_not_idle << KMO_FBITS;
	x[4] = (s64)!!in->cpu_newly_idle << KMO_FBITS;
	x[5] = (s64)!!in->same_node << KMO_FBITS;
	x[6] = (s64)!!in->prefer_src << KMO_FBITS;
	x[7] = (s64)!!in->prefer_dst << KMO_FBITS;
	x[8] = (kmo_clamp(in->src_len) - 2) * KMO_ONE;
	/* loads are >= 0: division truncates as C's does in kernmlops.lb.features */
	x[9] = div_s64(kmo_clamp(in->src_load) * KMO_ONE, 1000);
	x[10] = div_s64(kmo_clamp(in->dst_load) * KMO_ONE, 1000);
	x[11] = kmo_clamp(in->dst_len) * KMO_ONE;
	/* total 0: MLLB's delta << 11 (a division by 1); C division truncates toward 0 */
	x[12] = div64_s64(delta * KMO_ONE, max_t(s64, total, 1));
	x[13] = (in->nr_balance_failed > in->cache_nice_tries) << KMO_FBITS;
	x[14] = (s64)!!in->buddy_hot << KMO_FBITS;
}

/* The Q20.11 logit: migrate when > 0. Products are 64-bit, >> is arithmetic. */
static s64 kmo_mlp(const s64 *x)
{
	s64 out = b2;
	int j, k;

	for (j = 0; j < KMO_NR_HIDDEN; j++) {
		s64 h = b1[j];

		for (k = 0; k < KMO_NR_FEAT; k++)
			h += (x[k] * (s64)w1[k * KMO_NR_HIDDEN + j]) >> KMO_FBITS;
		if (h > 0)
			out += (h * (s64)w2[j]) >> KMO_FBITS;
	}
	return out;
}

#define FIELD(base, idx, type) (*(type *)((char *)(base) + layout[idx]))

/* throttled_lb_pair(task_group(p), src, dst) */
static bool kmo_throttled(struct task_struct *p, int src, int dst)
{
	void *tg = p->sched_task_group, **per_cpu;

	if (!tg)
		return false;
	per_cpu = FIELD(tg, L_TG_CFS_RQ, void **);
	if (!per_cpu)
		return false;
	return (per_cpu[src] && FIELD(per_cpu[src], L_CFS_RQ_THROTTLE_COUNT, int)) ||
	       (per_cpu[dst] && FIELD(per_cpu[dst], L_CFS_RQ_THROTTLE_COUNT, int));
}

/* kthread_is_per_cpu(p), which modules cannot call */
static bool kmo_pcpu_kthread(struct task_struct *p)
{
	void *kthread;

	if (!(p->flags & PF_KTHREAD))
		return false;
	kthread = p->worker_private;
	return kthread &&
	       test_bit(KMO_KTHREAD_IS_PER_CPU, &FIELD(kthread, L_KTHREAD_FLAGS, unsigned long));
}

/* task_faults(p, nid): NUMA_MEM hinting faults, shared + private */
static s64 kmo_node_faults(struct task_struct *p, int nid)
{
	unsigned long *f = p->numa_faults;

	if (!f || nid < 0 || nid >= nr_node_ids)
		return 0;
	return f[2 * nid] + f[2 * nid + 1];
}

/* Everything the features need, as the kernel saw it. */
static void kmo_read_inputs(struct task_struct *p, void *env, struct kmo_inputs *in)
{
	struct sched_domain *sd = FIELD(env, L_ENV_SD, struct sched_domain *);
	void *src_rq = FIELD(env, L_ENV_SRC_RQ, void *);
	void *dst_rq = FIELD(env, L_ENV_DST_RQ, void *);
	int src_cpu = FIELD(env, L_ENV_SRC_CPU, int), dst_cpu = FIELD(env, L_ENV_DST_CPU, int);
	int idle = FIELD(env, L_ENV_IDLE, int);
	int src_nid = cpu_to_node(src_cpu), dst_nid = cpu_to_node(dst_cpu);
	int pref = p->numa_preferred_nid;
	void *src_cfs = (char *)src_rq + layout[L_RQ_CFS];
	void *cfs = p->se.cfs_rq ? (void *)p->se.cfs_rq : src_cfs;
	struct sched_entity *se = &p->se;

	in->delta_ns = (s64)(FIELD(src_rq, L_RQ_CLOCK_TASK, u64) - p->se.exec_start);
	in->src_load = ((struct sched_avg *)((char *)src_cfs + layout[L_CFS_RQ_AVG]))->load_avg;
	in->dst_load = ((struct sched_avg *)((char *)dst_rq + layout[L_RQ_CFS] +
					     layout[L_CFS_RQ_AVG]))->load_avg;
	in->total_faults = p->total_numa_faults;
	in->delta_faults = kmo_node_faults(p, dst_nid) - kmo_node_faults(p, src_nid);
	in->src_len = FIELD(src_rq, L_RQ_NR_RUNNING, unsigned int);
	in->src_preferred_len = FIELD(src_rq, L_RQ_NR_PREFERRED_RUNNING, unsigned int);
	in->dst_len = FIELD(dst_rq, L_RQ_NR_RUNNING, unsigned int);
	in->nr_balance_failed = sd->nr_balance_failed;
	in->cache_nice_tries = sd->cache_nice_tries;
	in->cpu_idle = idle == CPU_IDLE;
	in->cpu_newly_idle = idle == CPU_NEWLY_IDLE;
	in->cpu_not_idle = !in->cpu_idle && !in->cpu_newly_idle;
	in->same_node = src_nid == dst_nid;
	in->prefer_src = pref == src_nid;
	in->prefer_dst = pref == dst_nid;
	/* task_hot's buddy test: dst busy and p is its cfs_rq's next or last */
	in->buddy_hot = in->dst_len &&
			(FIELD(cfs, L_CFS_RQ_NEXT, struct sched_entity *) == se ||
			 FIELD(cfs, L_CFS_RQ_LAST, struct sched_entity *) == se);
}

/* True when can_migrate_task answered from a hard constraint (or an active
 * balance, always 1): the model must not touch those answers. */
static bool kmo_hard(struct task_struct *p, void *env)
{
	int src_cpu = FIELD(env, L_ENV_SRC_CPU, int), dst_cpu = FIELD(env, L_ENV_DST_CPU, int);

	return kmo_throttled(p, src_cpu, dst_cpu) || kmo_pcpu_kthread(p) ||
	       !cpumask_test_cpu(dst_cpu, p->cpus_ptr) || p->migration_disabled ||
	       READ_ONCE(p->on_cpu) || (FIELD(env, L_ENV_FLAGS, unsigned int) & KMO_LBF_ACTIVE_LB);
}

struct kmo_call {
	struct task_struct *p;
	void *env;
};

static int kmo_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct kmo_call *c = (void *)ri->data;

	if (READ_ONCE(kmo_mode) == KMO_OFF)
		return 1; /* no return handler for this call */
	c->p = (struct task_struct *)regs->di;
	c->env = (void *)regs->si;
	return 0;
}

static int kmo_return(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct kmo_call *c = (void *)ri->data;
	struct kmo_stats *s = this_cpu_ptr(&kmo_stats);
	int mode = READ_ONCE(kmo_mode), kernel = regs_return_value(regs) != 0, model;
	struct kmo_inputs in;
	s64 x[KMO_NR_FEAT];
	u64 t0, ns;

	/* Runs with the source runqueue locked and interrupts off. */
	s->v[S_CALLS]++;
	if (kmo_hard(c->p, c->env)) {
		s->v[S_HARD]++;
		return 0;
	}
	/* local_clock (sched_clock: the TSC on x86), as the scheduler times itself:
	 * interrupts are off, so both reads are on this CPU. ktime_get_ns would
	 * read the clocksource, a device (the HPET) where the TSC is judged
	 * unstable, as under QEMU without KVM. */
	t0 = local_clock();
	kmo_read_inputs(c->p, c->env, &in);
	kmo_features(&in, x);
	model = kmo_mlp(x) > 0;
	ns = local_clock() - t0;
	s->v[S_DECISIONS]++;
	s->v[S_NS_SUM] += ns;
	if (ns > s->v[S_NS_MAX])
		s->v[S_NS_MAX] = ns;
	if (model == kernel) {
		s->v[S_AGREE]++;
		return 0;
	}
	s->v[model ? S_MODEL_YES_KERNEL_NO : S_MODEL_NO_KERNEL_YES]++;
	if (mode == KMO_REPLACE) {
		/* the kernel marks a forced hot migration for detach_task's statistics */
		if (!model)
			c->p->sched_task_hot = 0;
		regs_set_return_value(regs, model);
		s->v[S_OVERRIDDEN]++;
	}
	return 0;
}

static struct kretprobe kmo_rp = {
	.kp.symbol_name = "can_migrate_task",
	.entry_handler = kmo_entry,
	.handler = kmo_return,
	.data_size = sizeof(struct kmo_call),
};

/* eval: the arithmetic alone, on inputs written from user space. */
static DEFINE_MUTEX(kmo_eval_lock);
static s64 kmo_eval_out;
static s64 kmo_eval_x[KMO_NR_FEAT];
static struct kmo_inputs kmo_eval_in;
static s64 kmo_bench_sink;

static int eval_set(const char *val, const struct kernel_param *kp)
{
	s64 raw[KMO_NR_INPUTS];
	struct kmo_inputs in;
	char *copy, *cur, *tok;
	int n = 0, err = 0;

	copy = kstrdup(val, GFP_KERNEL);
	if (!copy)
		return -ENOMEM;
	cur = strim(copy);
	while ((tok = strsep(&cur, " ,")) != NULL) {
		if (!*tok)
			continue;
		if (n == KMO_NR_INPUTS) {
			err = -EINVAL;
			break;
		}
		err = kstrtos64(tok, 10, &raw[n++]);
		if (err)
			break;
	}
	kfree(copy);
	if (!err && n != KMO_NR_INPUTS)
		err = -EINVAL;
	if (err)
		return err;
	BUILD_BUG_ON(sizeof(in) != sizeof(raw));
	memcpy(&in, raw, sizeof(in));
	mutex_lock(&kmo_eval_lock);
	kmo_eval_in = in;
	kmo_features(&in, kmo_eval_x);
	kmo_eval_out = kmo_mlp(kmo_eval_x);
	mutex_unlock(&kmo_eval_lock);
	return 0;
}

static int eval_get(char *buf, const struct kernel_param *kp)
{
	int k, n;

	mutex_lock(&kmo_eval_lock);
	n = sysfs_emit(buf, "%lld", kmo_eval_out);
	for (k = 0; k < KMO_NR_FEAT; k++)
		n += sysfs_emit_at(buf, n, " %lld", kmo_eval_x[k]);
	mutex_unlock(&kmo_eval_lock);
	return n + sysfs_emit_at(buf, n, "\n");
}

static const struct kernel_param_ops eval_ops = { .set = eval_set, .get = eval_get };
module_param_cb(eval, &eval_ops, NULL, 0600);
MODULE_PARM_DESC(eval, "write 17 raw inputs, read back the Q20.11 logit and 15 features");

/* bench: the decision's cost without the probe and clock around it (under
 * QEMU a clock read alone can cost microseconds): N evaluations of the last
 * eval inputs, timed as one. */
static u64 kmo_bench_n, kmo_bench_ns;

static int bench_set(const char *val, const struct kernel_param *kp)
{
	struct kmo_inputs in = {};
	s64 x[KMO_NR_FEAT];
	u64 n, i, t0;
	int err = kstrtou64(strim((char *)val), 10, &n);

	if (err)
		return err;
	if (!n || n > 10000000)
		return -EINVAL;
	mutex_lock(&kmo_eval_lock);
	memcpy(&in, &kmo_eval_in, sizeof(in));
	preempt_disable();
	t0 = ktime_get_ns();
	for (i = 0; i < n; i++) {
		kmo_features(&in, x);
		kmo_bench_sink += kmo_mlp(x);
		barrier(); /* every round reads the inputs and weights again */
	}
	kmo_bench_ns = ktime_get_ns() - t0;
	preempt_enable();
	kmo_bench_n = n;
	mutex_unlock(&kmo_eval_lock);
	return 0;
}

static int bench_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%llu %llu\n", kmo_bench_n, kmo_bench_ns);
}

static const struct kernel_param_ops bench_ops = { .set = bench_set, .get = bench_get };
module_param_cb(bench, &bench_ops, NULL, 0600);
MODULE_PARM_DESC(bench, "write N: N evaluations of the eval inputs; read back \"N ns\"");

static int __init kmo_lb_init(void)
{
	int err, i;

	if (w1_n != ARRAY_SIZE(w1) || b1_n != ARRAY_SIZE(b1) || w2_n != ARRAY_SIZE(w2) ||
	    b2 == LONG_MIN) {
		pr_err("kmo_lb: model must be 15x10 + 10, 10x1 + 1 (got w1 %u, b1 %u, w2 %u, b2 %s)\n",
		       w1_n, b1_n, w2_n, b2 == LONG_MIN ? "missing" : "set");
		return -EINVAL;
	}
	if (layout_n != L_NR) {
		pr_err("kmo_lb: layout has %u offsets, want %d\n", layout_n, L_NR);
		return -EINVAL;
	}
	for (i = 0; i < L_NR; i++) {
		if (layout[i] < 0 || layout[i] > 65536) {
			pr_err("kmo_lb: layout[%d] = %d is not a field offset\n", i, layout[i]);
			return -EINVAL;
		}
	}
	/* every CPU may be inside can_migrate_task at once */
	kmo_rp.maxactive = 2 * num_possible_cpus();
	err = register_kretprobe(&kmo_rp);
	if (err) {
		pr_err("kmo_lb: cannot probe can_migrate_task: %d\n", err);
		return err;
	}
	pr_info("kmo_lb: model loaded, mode %s\n", kmo_mode_names[READ_ONCE(kmo_mode)]);
	return 0;
}

static void __exit kmo_lb_exit(void)
{
	/* waits for running handlers: no call returns through us afterwards */
	unregister_kretprobe(&kmo_rp);
	pr_info("kmo_lb: unloaded, can_migrate_task is the kernel's again\n");
}

module_init(kmo_lb_init);
module_exit(kmo_lb_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kernmlops: MLLB's learned can_migrate_task decision (off/shadow/replace)");
