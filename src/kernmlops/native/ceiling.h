/* The priority ceiling: a thread of normal priority that takes a lock a real-time
 * thread waits for (the ring copier, the sampler) runs at real-time priority
 * while it holds it. Without it, a storm of more runnable tasks than CPUs that
 * preempts the holder keeps it off the CPU for seconds (tens of seconds on the
 * 2-vCPU VM), and the copier with it: its rings overflow. Where SCHED_FIFO is
 * refused (no CAP_SYS_NICE, a cgroup without a real-time budget) the holder
 * takes nice -20 instead, as the copier does. Two system calls each way: only
 * for the rare calls from Python (a segment's rotation, a standby, a take). */
#pragma once
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

struct kmo_ceiling {
	int policy;
	struct sched_param param;
	int nice;
	int how; /* 0: left as it was, 1: made SCHED_FIFO, 2: given nice -20 */
};

static inline void kmo_ceiling_raise(struct kmo_ceiling *c)
{
	struct sched_param fifo = { .sched_priority = 1 };
	id_t tid = (id_t)syscall(SYS_gettid);

	c->how = 0;
	c->policy = sched_getscheduler(0);
	if (c->policy < 0 || (c->policy & ~SCHED_RESET_ON_FORK) == SCHED_FIFO ||
	    (c->policy & ~SCHED_RESET_ON_FORK) == SCHED_RR || sched_getparam(0, &c->param))
		return; /* real-time already (the copier itself), or unknown */
	if (!sched_setscheduler(0, SCHED_FIFO, &fifo)) {
		c->how = 1;
		return;
	}
	errno = 0;
	c->nice = getpriority(PRIO_PROCESS, tid);
	if (!errno && c->nice > -20 && !setpriority(PRIO_PROCESS, tid, -20))
		c->how = 2;
}

static inline void kmo_ceiling_drop(struct kmo_ceiling *c)
{
	if (c->how == 1)
		sched_setscheduler(0, c->policy, &c->param);
	else if (c->how == 2)
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), c->nice);
	c->how = 0;
}
