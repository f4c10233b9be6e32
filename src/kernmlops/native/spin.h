/* The spin lock shared by a real-time thread (the ring copier, the sampler) and
 * the Python threads that hand it work: held across a few instructions, a
 * memcpy or a write. A waiter yields a while, then sleeps between tries, so a
 * holder on the waiter's CPU gets it (a SCHED_FIFO thread spinning on
 * sched_yield alone never lets a normal one run there); a Python holder runs at
 * the waiter's priority meanwhile (ceiling.h). */
#pragma once
#include <sched.h>
#include <stdint.h>
#include <time.h>

static inline void spin_lock(int32_t *l)
{
	unsigned spins = 0;

	while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) {
		if (++spins < 64) {
			sched_yield();
		} else {
			struct timespec nap = { 0, 20000 };

			nanosleep(&nap, NULL);
		}
	}
}

static inline void spin_unlock(int32_t *l)
{
	__atomic_store_n(l, 0, __ATOMIC_RELEASE);
}
