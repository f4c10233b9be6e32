/* sampler: files read whole at a fixed rate on a thread that never takes the GIL.
 *
 * A sampled hook (kernmlops.hooks.base.SampledHook) whose sample is "read these
 * open files" (/proc/meminfo) hands their fds to this thread. At each tick of
 * its grid it preads every file from offset 0 and appends the bytes, with the
 * time they were read, to a buffer that Python takes (kmo_sampler_take) when it
 * makes rows. Python's own sampler thread needs the GIL: under a switch storm
 * with more runnable tasks than CPUs, whichever collector thread holds it waits
 * on the run queue, and the sampler missed 44-98 of ~100 samples in 10 s of
 * `stress-ng --switch` on 2 vCPUs. This thread, at SCHED_FIFO like the ring
 * copier, wakes on time and costs a pread per file per tick.
 *
 * A sample in the buffer: <time ns u64><file index u32><bytes u32> and the
 * bytes, padded to 8. The buffer grows as samples wait (a storm keeps the
 * collector's Python off the CPU for tens of seconds on 2 vCPUs), up to
 * `max_cap`. A tick whose sample could not be taken (the thread woke a whole
 * period late, or the buffer was at its most: Python fell that far behind) is
 * counted in `missed`, never silently left out. Built into the same library as
 * ringcopy.c; shared struct: kernmlops/ebpf/sampler.py.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ceiling.h"
#include "spin.h"

#define KMO_SAMPLER_ABI 3
#define SAMPLE_HEAD 16
/* a file read whole is at most this large (meminfo is ~1.5 KiB) */
#define READ_MAX (1U << 20)

struct kmo_sampler {
	int32_t abi;
	int32_t stop;       /* 1: return at the next wake-up */
	int32_t nfiles;
	int32_t stop_fd;    /* an eventfd Python writes to wake the thread at stop */
	int64_t period_ns;
	const int32_t *fds; /* the files, kept open by Python */
	uint8_t *buf;       /* samples not taken yet (the sampler's: it grows) */
	uint64_t cap;
	uint64_t used;
	uint64_t max_cap;   /* the buffer's most */
	uint64_t taken;     /* samples taken in all */
	uint64_t missed;    /* ticks without a sample */
	int32_t lock;
	int32_t error;      /* errno of the first failed read: the thread returns */
	uint64_t cpu_ns;    /* the thread's CPU time (at each tick) */
	uint8_t *scratch;   /* one file's bytes as read */
	uint64_t scratch_cap;
	int32_t mapped;     /* 1: buf is max_cap of address space from the start */
	int32_t pad;
};

int kmo_sampler_abi(void)
{
	return KMO_SAMPLER_ABI;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Room for `more` bytes after `len` in s->scratch; 0, or ENOMEM. */
static int scratch_room(struct kmo_sampler *s, uint64_t len, uint64_t more)
{
	uint64_t cap = s->scratch_cap ? s->scratch_cap : 8192;
	uint8_t *p;

	while (cap < len + more)
		cap *= 2;
	if (cap == s->scratch_cap)
		return 0;
	p = realloc(s->scratch, cap);
	if (!p)
		return ENOMEM;
	s->scratch = p;
	s->scratch_cap = cap;
	return 0;
}

/* File `i` read whole into s->scratch at `at` (after its sample head); its
 * bytes, or -errno. */
static int64_t read_whole(struct kmo_sampler *s, int i, uint64_t at)
{
	uint64_t want = 8192;

	for (;;) {
		ssize_t n;

		if (scratch_room(s, at, want))
			return -ENOMEM;
		n = pread(s->fds[i], s->scratch + at, want, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if ((uint64_t)n < want || want >= READ_MAX)
			return n;
		want *= 2; /* as large as what we read into: the file may be larger */
	}
}

/* One sample of every file, at `now`, made in s->scratch, then appended to the
 * buffer whole under its lock; 0, or the errno that ends the thread. A sample
 * the buffer cannot hold is a missed tick. */
static int sample(struct kmo_sampler *s, uint64_t now)
{
	uint64_t len = 0;
	int fit;

	for (int i = 0; i < s->nfiles; i++) {
		uint32_t head[2];
		int64_t n;

		if (scratch_room(s, len, SAMPLE_HEAD))
			return ENOMEM;
		n = read_whole(s, i, len + SAMPLE_HEAD);
		if (n < 0)
			return (int)-n;
		head[0] = (uint32_t)i;
		head[1] = (uint32_t)n;
		memcpy(s->scratch + len, &now, 8);
		memcpy(s->scratch + len + 8, head, 8);
		len += SAMPLE_HEAD + (uint64_t)n;
		if (scratch_room(s, len, 8))
			return ENOMEM;
		memset(s->scratch + len, 0, ((uint64_t)n + 7) / 8 * 8 - (uint64_t)n);
		len = (len + 7) & ~7ULL;
	}
	spin_lock(&s->lock);
	if (s->used + len > s->cap && s->used + len <= s->max_cap) {
		uint64_t cap = s->cap ? s->cap : 65536;
		uint8_t *p;

		while (cap < s->used + len)
			cap *= 2;
		if (cap > s->max_cap)
			cap = s->max_cap;
		p = realloc(s->buf, cap);
		if (p) {
			s->buf = p;
			s->cap = cap;
		}
	}
	fit = s->used + len <= s->cap;
	if (fit) {
		memcpy(s->buf + s->used, s->scratch, len);
		s->used += len;
		s->taken++;
	}
	spin_unlock(&s->lock);
	if (!fit)
		__atomic_add_fetch(&s->missed, 1, __ATOMIC_RELAXED);
	return 0;
}

/* Python takes the samples so far into `dst` (at most `cap` bytes, whole
 * samples); the bytes taken. */
uint64_t kmo_sampler_take(struct kmo_sampler *s, uint8_t *dst, uint64_t cap)
{
	struct kmo_ceiling ceiling;
	uint64_t n;

	kmo_ceiling_raise(&ceiling); /* the sampler waits for this lock: ceiling.h */
	spin_lock(&s->lock);
	n = s->used;
	if (n > cap) { /* whole samples only: the rest stays for the next take */
		uint64_t at = 0;

		while (at < n) {
			uint32_t bytes;
			uint64_t len;

			memcpy(&bytes, s->buf + at + 12, 4);
			len = SAMPLE_HEAD + (((uint64_t)bytes + 7) & ~7ULL);
			if (at + len > cap)
				break;
			at += len;
		}
		n = at;
	}
	if (n) {
		memcpy(dst, s->buf, n);
		memmove(s->buf, s->buf + n, s->used - n);
		s->used -= n;
	}
	spin_unlock(&s->lock);
	kmo_ceiling_drop(&ceiling);
	return n;
}

/* A sample now, then one at each tick of the grid until `stop`: returns 0, or
 * the errno of a failed read. The first sample is taken even when `stop` came
 * before the thread ran: a hook stopped at once still has its start's sample. */
int kmo_sampler_run(struct kmo_sampler *s)
{
	struct pollfd pfd = { .fd = s->stop_fd, .events = POLLIN };
	uint64_t due;
	int err, first;

	if (s->abi != KMO_SAMPLER_ABI || s->period_ns <= 0)
		return EINVAL;
	if (!s->buf && s->max_cap) {
		/* The buffer's most as address space now (pages only as samples fill
		 * it): it never grows later, when a storm holds Python back. Growing
		 * takes the process's mmap lock for writing, which a collector thread
		 * the storm keeps off the CPU may hold meanwhile (ringcopy.c, prepare). */
		void *p = mmap(NULL, s->max_cap, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (p != MAP_FAILED) {
			s->buf = p;
			s->cap = s->max_cap;
			s->mapped = 1;
		}
	}
	due = mono_ns();
	for (first = 1; first || !__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE); first = 0) {
		uint64_t now = mono_ns(), late;

		if (now < due) {
			uint64_t left = due - now;
			struct timespec ts = { (time_t)(left / 1000000000ULL),
					       (long)(left % 1000000000ULL) };

			ppoll(&pfd, 1, &ts, NULL);
			continue; /* woke early, or at stop: looked at again */
		}
		err = sample(s, now);
		if (err) {
			s->error = err;
			return err;
		}
		/* whole periods slept through were not sampled */
		late = (now - due) / (uint64_t)s->period_ns;
		if (late)
			__atomic_add_fetch(&s->missed, late, __ATOMIC_RELAXED);
		due += (late + 1) * (uint64_t)s->period_ns;
		s->cpu_ns = thread_ns();
	}
	s->cpu_ns = thread_ns();
	return 0;
}

void kmo_sampler_free(struct kmo_sampler *s)
{
	if (s->mapped)
		munmap(s->buf, s->cap);
	else
		free(s->buf);
	s->mapped = 0;
	s->buf = NULL;
	s->cap = s->used = 0;
	free(s->scratch);
	s->scratch = NULL;
	s->scratch_cap = 0;
}
