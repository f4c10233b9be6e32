/* The run-queue wait that ends when a task is switched in, from the scheduler's
 * own account: shared by the collector (quanta_runtime's quanta_queued_time) and
 * the exporter (runqlat), so both measure the same wait.
 *
 * rq->clock minus the task's sched_info.last_queued: the run-queue clock was
 * updated at the top of __schedule, and last_queued is stamped by the kernel
 * when the task is enqueued (a wake-up) or preempted while still runnable, and
 * cleared when it arrives, just after the sched_switch tracepoint. It is what
 * the kernel adds to the task's run_delay (/proc/<pid>/schedstat) for this
 * arrival. Kernels without CONFIG_SCHED_INFO have no sched_info. A switch in
 * that reaches no program (on some VMs, every switch out of the guest agent's
 * threads: kmo_quantum_of) ends a wait the kernel counts in run_delay and pcount
 * and no program sees: last_queued is cleared at that arrival.
 *
 * Everything is __always_inline on the hot path: including this header adds
 * no instruction to the programs that use it. Needs common.h (KMO_READ). */
#ifndef KMO_SCHED_WAIT_H
#define KMO_SCHED_WAIT_H

/* The queue wait needs the kernel's sched_info and a way to this CPU's run
 * queue: next->se.cfs_rq->rq, which the kernel points at the run queue of the
 * CPU the task is on (set_task_rq) for every class. (The per-CPU `runqueues`
 * itself is out of reach without CONFIG_KALLSYMS_ALL.) */
static __always_inline bool kmo_has_sched_info(struct task_struct *t)
{
	return bpf_core_field_exists(t->sched_info) && bpf_core_field_exists(t->se.cfs_rq);
}

/* Whether a task's run queue (and its clock) can be reached: next->se.cfs_rq
 * (CONFIG_FAIR_GROUP_SCHED; a constant once loaded). */
static __always_inline bool kmo_has_rq_clock(struct task_struct *t)
{
	return bpf_core_field_exists(t->se.cfs_rq);
}

static __always_inline u64 kmo_rq_clock(bool btf, struct task_struct *t)
{
	if (btf)
		return t->se.cfs_rq->rq->clock;
	return BPF_CORE_READ(t, se.cfs_rq, rq, clock);
}

static __always_inline bool kmo_wait_ns(u64 queued_at, u64 clock, u64 *ns)
{
	if (!queued_at || clock < queued_at)
		return false;
	*ns = clock - queued_at;
	return true;
}

/* The wait (ns) that ends as `next` is switched in, with its run queue's clock
 * already read (kmo_rq_clock); see kmo_queued_ns. */
static __always_inline bool kmo_queued_ns_at(bool btf, struct task_struct *next, u64 clock,
					     u64 *ns)
{
	return kmo_wait_ns(KMO_READ(btf, next, sched_info.last_queued), clock, ns);
}

/* The wait (ns) that ends as `next` is switched in; false (and *ns untouched)
 * when it was not queued (a task that never left the CPU) or the clocks
 * disagree. Call only where kmo_has_sched_info(next). `btf`: next is a tp_btf
 * argument. The clock is read only for a task that was queued. */
static __always_inline bool kmo_queued_ns(bool btf, struct task_struct *next, u64 *ns)
{
	u64 queued_at = KMO_READ(btf, next, sched_info.last_queued);

	if (!queued_at)
		return false;
	return kmo_wait_ns(queued_at, kmo_rq_clock(btf, next), ns);
}

/* The time of a switch on bpf_ktime_get_ns()'s clock (CLOCK_MONOTONIC), taken
 * from the run queue's clock instead of reading the time at every switch (32 ns
 * of a ~110-ns program on a VM's tsc; `python -m bench hotpath`).
 *
 * rq->clock is sched_clock as the scheduler last set it: at the top of
 * __schedule, or at the wake-up that asked for this switch (the kernel then
 * skips the update). It is the instant up to which the kernel charged prev's
 * CPU time and from which it charges next's, and what the queue wait ends at.
 * A per-CPU offset puts it on the monotonic clock. A reading of the offset
 * (ktime - rq->clock) is late by however long the scheduler ran since it set
 * its clock, never early: a switch to idle can run the idle balance first, µs
 * late. The offset is the least reading of the last window (KMO_CLOCK_WINDOW_NS)
 * and of this one so far, so it follows the two clocks' drift (NTP's, ppm)
 * within a window. A reading is taken once the run queue's clock moved
 * KMO_CLOCK_SYNC_NS, and only where __schedule set the clock (`fresh`,
 * kmo_clock_fresh).
 *
 * The offset is trusted once it is the least of KMO_CLOCK_SURE readings. Until
 * then (a CPU's first switches, after a window without a reading, or after a
 * window of fewer readings: a quiet CPU, where the time costs little), every
 * switch reads the time: each fresh one is a reading, and no switch is dated
 * after its tracepoint. A CPU's times never go back: a new least reading does
 * not date a switch before the one before it. */
#define KMO_CLOCK_SYNC_NS (1000ULL * 1000)
#define KMO_CLOCK_WINDOW_NS (16ULL * 1000 * 1000)
#define KMO_CLOCK_SURE 4

/* Whether __schedule set the run queue's clock for this switch (a reading of
 * the offset there is late by the switch alone): a switch out of a task (the
 * idle task's clock is the wake-up's, older by the idle exit: ~11 us in this
 * VM) to a task that waited (when the wake-up of `next` asked for the switch,
 * the kernel skips the update and the clock is that wake-up's: a wait of 0) or
 * to the idle task. */
static __always_inline bool kmo_clock_fresh(u32 prev_pid, u32 next_pid, bool has_queued,
					    u64 queued_ns)
{
	return prev_pid && (has_queued ? queued_ns > 0 : !next_pid);
}

struct kmo_switch_clock {
	s64 offset; /* ktime - rq->clock in use */
	s64 least;  /* the least reading in this window */
	u64 synced; /* rq->clock at the last reading; 0: none yet */
	u64 window; /* rq->clock when this window began */
	u64 last;   /* the last time given on this CPU */
	u32 count;  /* readings in this window */
	u32 sure;   /* the offset is the least of KMO_CLOCK_SURE readings at least */
};

static __always_inline void kmo_clock_reading(struct kmo_switch_clock *c, u64 rq_clock, s64 seen)
{
	if (seen < c->least)
		c->least = seen;
	if (seen < c->offset)
		c->offset = seen;
	if (rq_clock - c->window >= KMO_CLOCK_WINDOW_NS) {
		c->offset = c->least; /* may rise: the clocks drift */
		c->sure = c->count >= KMO_CLOCK_SURE;
		c->least = seen;
		c->window = rq_clock;
		c->count = 1;
	} else if (++c->count >= KMO_CLOCK_SURE) {
		c->sure = 1;
	}
	c->synced = rq_clock;
}

static __always_inline u64 kmo_switch_time(struct kmo_switch_clock *c, u64 rq_clock, bool fresh)
{
	s64 since = (s64)(rq_clock - c->synced);
	u64 now, t;

	if (c->synced && since >= 0 && since < (s64)KMO_CLOCK_WINDOW_NS) {
		if (c->sure) {
			if (fresh && since >= (s64)KMO_CLOCK_SYNC_NS)
				kmo_clock_reading(c, rq_clock, (s64)(bpf_ktime_get_ns() - rq_clock));
			t = rq_clock + c->offset;
		} else {
			now = bpf_ktime_get_ns();
			if (fresh)
				kmo_clock_reading(c, rq_clock, (s64)(now - rq_clock));
			t = rq_clock + c->offset;
			if (t > now)
				t = now;
		}
	} else {
		/* No reading yet, or none for a window. */
		s64 seen;

		t = bpf_ktime_get_ns();
		seen = (s64)(t - rq_clock);
		if (fresh) {
			c->offset = c->least = seen;
			c->synced = c->window = rq_clock;
			c->count = 1;
			c->sure = 0;
		} else if (c->synced && seen > c->offset) {
			t = rq_clock + c->offset;
		}
	}
	if (t < c->last)
		t = c->last;
	c->last = t;
	return t;
}

/* A task's quantum from its own account, whether its switch in was seen or not.
 * Some switches never reach tracepoint programs: on some VMs no switch out of
 * the guest agent's threads does (perf sees none either), so the task that
 * comes in after one comes in unseen, and a per-CPU "who came in" no longer
 * names it. se.prev_sum_exec_runtime is no stand-in: the kernel resets
 * it whenever it re-sets a running task (do_exit's autogroup move, a nice,
 * affinity or cgroup change), so an exiting task's last quantum read ~0.
 *
 * Each followed task keeps its CPU time at its last switch out (a record).
 * Its next quantum is the growth since then, where it arrived on a CPU exactly
 * once since (sched_info's pcount: a task not followed at some switch out
 * arrived more often). No record is a new task's state (no CPU time, no
 * arrival), so a task's first quantum is known too. Every switch out must
 * write the record: the switch in that needs it cannot be known in advance.
 *
 * Where the record is kept: task storage costs a helper call a switch (+26 ns
 * a switch in a switch storm on the 2-vCPU VM, `python -m bench hotpath`), so
 * it is kept in a slot of an array instead (a lookup the verifier inlines),
 * picked by the hash of the task's kernel stack address (the task's for its
 * life: a pid changes where a thread execs, de_thread). A slot is owned by one
 * task at a time (its task_struct's address, compared as it is: asking for it
 * as a number, bpf_get_current_task(), is a helper call that costs as much as
 * the storage): taken, when free, at a switch out of the task, and freed at
 * its last switch out (TASK_DEAD: do_task_dead), followed or not. Two CPUs may
 * reach for one free slot at once: the one whose insert of the slot's number
 * into <name>_owners succeeds takes it (an insert refused where the key is, a
 * compare-and-swap that kernels before 5.12 also run: their BPF has no cmpxchg
 * instruction, and a program that holds one does not load there, dead or not).
 * Only a task holding the key writes the slot's owner; once per task's life. A task whose
 * slot another owns keeps its record in task storage. So a task's latest
 * record is in its slot while it owns it, else in its storage, where the
 * switch out that takes the slot finds it: exact either way. A slot never
 * freed (its owner's last switch out unseen) and its addresses reused would
 * hold a record the new task's pcount (from 0) cannot follow: not known then. */
struct kmo_task_cpu {
	u64 sum_at_out; /* se.sum_exec_runtime at its last switch out seen */
	u64 arrivals;   /* sched_info.pcount then (0 without sched_info) */
};

struct kmo_task_slot {
	u64 task;	/* its owner's task_struct address; 0: free */
	u64 sum_at_out; /* as kmo_task_cpu */
	u32 arrivals;	/* pcount's low bits: only the step of 1 is compared */
	u32 pid;	/* its owner's at the record (for a reader of the map) */
	u64 spare;	/* 32 bytes: two slots a cache line */
};

/* 1 MiB a map: ~7% of 5,000 tasks find their slot taken (and use the storage). */
#define KMO_TASK_SLOT_BITS 15
#define KMO_TASK_SLOTS (1U << KMO_TASK_SLOT_BITS)
/* A smaller mask puts more tasks on one slot (tests: 0, one slot for all). */
const volatile u32 kmo_task_slot_mask = KMO_TASK_SLOTS - 1;
/* Whether the kernel has task storage (Linux 5.11). Where it has none, user space
 * clears this and makes the storage map an unused hash (kernmlops.ebpf.objects): a
 * task whose slot another holds then has no record, and its quantum is the
 * caller's per-CPU account of its switch in (exact where that was seen). The
 * verifier drops the storage's calls as dead code. */
const volatile bool kmo_task_storage = true;

#define KMO_TASK_DEAD 0x80 /* __state at a task's last switch out */

#define KMO_TASK_CPU_MAP(name)                                                 \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_TASK_STORAGE);                       \
		__uint(map_flags, BPF_F_NO_PREALLOC);                          \
		__type(key, int);                                              \
		__type(value, struct kmo_task_cpu);                            \
	} name SEC(".maps");                                                   \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_ARRAY);                              \
		__uint(max_entries, KMO_TASK_SLOTS);                           \
		__type(key, u32);                                              \
		__type(value, struct kmo_task_slot);                           \
	} name##_slots SEC(".maps");                                           \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, KMO_TASK_SLOTS);                           \
		__type(key, u32);                                              \
		__type(value, u64);                                            \
	} name##_owners SEC(".maps")

/* At sched_switch: prev's slot, its number (*at) and its owner's mark for prev (*me). */
static __always_inline struct kmo_task_slot *kmo_task_slot(bool btf, struct task_struct *prev,
							   void *slots, u32 *at, u64 *me)
{
	u64 stack = (u64)KMO_READ(btf, prev, stack);

	*at = (u32)((stack * 0x9E3779B97F4A7C15ULL) >> (64 - KMO_TASK_SLOT_BITS));
	*me = (u64)prev;
	*at &= kmo_task_slot_mask;
	return bpf_map_lookup_elem(slots, at);
}

/* Its owner gives slot `at` up: the mark first, then the key (see above). */
static __always_inline void kmo_task_slot_release(struct kmo_task_slot *s, void *owners, u32 at)
{
	s->task = 0;
	bpf_map_delete_elem(owners, &at);
}

/* Kernels before 5.14 call the task's state `state`. */
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

/* A task's state: __state, or `state` before 5.14 (CO-RE: the other read is dead). */
static __always_inline long kmo_task_state(bool btf, struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return KMO_READ(btf, t, __state);
	return BPF_CORE_READ((struct task_struct___pre514 *)t, state);
}

/* Whether this is prev's last switch out. */
static __always_inline bool kmo_task_dead(bool btf, struct task_struct *prev)
{
	return kmo_task_state(btf, prev) & KMO_TASK_DEAD;
}

/* At sched_switch, for a `prev` whose switch out is not recorded (not
 * followed): frees its slot at its last switch out, if it owns one. */
static __always_inline void kmo_task_slot_free(bool btf, void *slots, void *owners,
					       struct task_struct *prev)
{
	struct kmo_task_slot *s;
	u64 me;
	u32 at;

	if (!kmo_task_dead(btf, prev))
		return;
	s = kmo_task_slot(btf, prev, slots, &at, &me);
	if (s && s->task == me)
		kmo_task_slot_release(s, owners, at);
}

/* Whether a record of CPU time `sum_then` makes `sum` the next quantum's end:
 * where the task arrived exactly once since (`once`; without sched_info, where
 * a switch out of it was seen: a CPU time). *ns the quantum then. */
static __always_inline bool kmo_quantum_since(bool info, bool once, u64 sum, u64 sum_then, u64 *ns)
{
	if (!(info ? once : sum_then != 0) || sum < sum_then)
		return false;
	*ns = sum - sum_then;
	return true;
}

/* At sched_switch, for `prev` (pid `pid`) with se.sum_exec_runtime `sum`: true
 * and *ns its quantum when its own account knows it (see above); this switch
 * out is recorded either way. False where no record can be had (then the
 * caller's own estimate). `btf`: prev is a tp_btf argument, which the storage
 * takes; a raw_tp's is a number, so there the storage is the current task's,
 * which prev still is. Use with KMO_TASK_CPU_MAP's three maps. */
static __always_inline bool kmo_quantum_of(bool btf, void *storage, void *slots, void *owners,
					   struct task_struct *prev, u32 pid, u64 sum, u64 *ns)
{
	bool info = bpf_core_field_exists(prev->sched_info), dead, take, known;
	u64 me, arrivals = 0, arrivals_then = 0, sum_then = 0;
	struct kmo_task_slot *s;
	struct kmo_task_cpu *t;
	u32 at;

	s = kmo_task_slot(btf, prev, slots, &at, &me);
	if (!s)
		return false;
	if (info)
		arrivals = KMO_READ(btf, prev, sched_info.pcount);
	dead = kmo_task_dead(btf, prev);
	if (s->task == me) {
		/* Its own slot: its latest record. */
		known = kmo_quantum_since(info, (u32)arrivals - s->arrivals == 1, sum,
					  s->sum_at_out, ns);
		s->sum_at_out = sum;
		s->arrivals = arrivals;
		s->pid = pid;
		if (dead)
			kmo_task_slot_release(s, owners, at);
		return known;
	}
	/* Another's, or free (taken here, but not at the last switch out): the
	 * latest record is in the storage, and none there is a new task's. The
	 * storage is made only where it is to hold this switch out. */
	take = !dead && !s->task && bpf_map_update_elem(owners, &at, &me, BPF_NOEXIST) == 0;
	if (take)
		s->task = me;
	t = NULL;
	if (kmo_task_storage)
		t = bpf_task_storage_get(storage, btf ? prev : bpf_get_current_task_btf(), 0,
					 take || dead ? 0 : BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (t) {
		sum_then = t->sum_at_out;
		arrivals_then = t->arrivals;
	} else if (!take && !dead) {
		return false;
	}
	known = kmo_quantum_since(info, arrivals == arrivals_then + 1, sum, sum_then, ns);
	if (take) {
		s->sum_at_out = sum;
		s->arrivals = arrivals;
		s->pid = pid;
	} else if (t) {
		t->sum_at_out = sum;
		t->arrivals = arrivals;
	}
	return known;
}

#endif /* KMO_SCHED_WAIT_H */
