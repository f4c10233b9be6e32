/* runway: the spool's disk segments allocated ahead of their writes.
 *
 * Why: once the memory budget is spent, the copier writes zstd frames into a
 * disk segment, and on ext4 each write into a hole allocates (delayed
 * allocation reserves blocks, takes the journal's handles). Under a storm of
 * more runnable tasks than CPUs the kernel's journal and writeback threads
 * (normal priority) are kept off the CPU for seconds, and the copier, waiting
 * for them in write(2), let its rings overflow: 0.7-2.6% of a 10-min 2-vCPU
 * storm's records were lost so. Writes into blocks already allocated (unwritten
 * extents, fallocate's KEEP_SIZE) wait for none of that.
 *
 * So a thread of its own (at the copier's priority: it inherits it) allocates,
 * for every spool the copier owns, its standby: the segment the disk frames go on
 * in next. While they go to disk, the standby gets `runway_ms` of the spool's
 * recent write rate (between runway_min and runway_max bytes), in the bytes its
 * frames really take (the ratio seen so far, else today's frames' guess); once
 * the active segment's blocks are used, the frames go on in the standby (ringcopy.c,
 * standby_ready) and Python hands over the next. While the spool is in memory the
 * standby gets runway_min, or LEAD_MS of the spool's disk writes once the budget,
 * at the rate it fills, would end within LEAD_MS, so that the switch finds blocks
 * ready. So at most about runway_max a spool is allocated and not written, plus
 * the lead just before the switch (a spool that stays in memory reserves 1 MiB of
 * disk, not a minute of writes). It looks every 100 ms, at once when Python hands
 * the copier a segment, and when a frame goes past the runway (a burst from cold
 * outruns a rate not yet measured).
 *
 * Never in the segment being written: on ext4 fallocate holds the inode's lock,
 * which a write(2) to the same file takes too, and it may wait seconds in the
 * block allocator for a bitmap page (seen: 1.28 s and 448k records lost in a
 * 3-min 2-vCPU storm; 0.45 and 9.8 s in 10-s storms, 0.5M and 16.7M lost). The
 * disk writer (diskqueue.c) now takes such waits off the copier, but a writer
 * that waits fills the queue. So it allocates in pieces of RUNWAY_PIECE, each
 * only while the segment is still the standby; the copier takes a standby the
 * thread is allocating in only when it has nowhere else to go (the memory budget
 * is spent). The file's size stays what was written (KEEP_SIZE), so readers and
 * `recover` see only records; Python gives back what a finished segment did not
 * use (ftruncate to its size).
 *
 * The same thread starts the writeback of what was written (every sync_bytes,
 * sync_file_range), which the copier did itself before.
 *
 * Best effort: a filesystem that cannot allocate ahead (EOPNOTSUPP) ends the
 * runway and the copier writes as before; the thread never allocates below
 * keep_free bytes free (the space guard stops the collection at
 * collector.min_free_mb, and a runway must not be what brings it there); ENOSPC
 * is retried at the next tick. The copier counts what it wrote outside the
 * runway (runway_outside): a storm that outruns it shows there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "copier.h"
#include "runway.h"
#include "spin.h"

#define MIB (1ULL << 20)
/* the most one fallocate call allocates: the inode lock it holds is held that long */
#define RUNWAY_PIECE (64 * MIB)
#define TICK_MS 100
/* the spool's write rate: over windows of at least a tick, the largest seen,
 * falling by 0.2% a window (a half-life of about 35 s) once the storm ends; the
 * memory budget's fill rate the same way */
#define RATE_WINDOW_NS 100000000ULL
#define RATE_DECAY 0.998
/* disk bytes per raw byte before the spool wrote RATIO_SEEN to disk: today's
 * frames (quanta records shuffled, batches padded, switch times as gaps) are
 * 11.8-12.8x smaller than their records (bench capacity), a 20-s storm's spool
 * 14x; 1/10 leaves a margin for records that compress less */
#define RATIO_GUESS 0.1
/* raw bytes on disk past which the spool's own ratio is used (a few frames) */
#define RATIO_SEEN (256 * 1024)
/* the standby's lead before the switch: the seconds of the spool's disk writes
 * it holds, once the memory budget would be spent within them at the rate it
 * fills (the thread extends the new active segment at its next look, a tick) */
#define LEAD_MS 5000

struct rate {
	uint64_t at_ns;
	uint64_t spooled;
	double bps; /* raw bytes a second */
};

struct runway {
	pthread_t thread;
	struct rate fill;    /* the memory budget's (all its copiers' writes, less what
			      * Python gave back) */
	struct rate rates[]; /* one per ring of the copier */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Move `rt` on to `count` (a running total, or a level that may fall): its rate
 * is the largest seen over windows of at least RATE_WINDOW_NS, decaying. */
static double rate_at(struct rate *rt, uint64_t count, uint64_t now)
{
	if (!rt->at_ns) {
		rt->at_ns = now;
		rt->spooled = count;
	} else if (now - rt->at_ns >= RATE_WINDOW_NS) {
		double seen = count > rt->spooled ? (double)(count - rt->spooled) * 1e9 /
							 (double)(now - rt->at_ns)
						   : 0.0;

		rt->bps = seen > rt->bps * RATE_DECAY ? seen : rt->bps * RATE_DECAY;
		rt->at_ns = now;
		rt->spooled = count;
	}
	return rt->bps;
}

static uint64_t clamp_mib(struct kmo_copier *c, double want, uint64_t most)
{
	uint64_t bytes = want > (double)most ? most : (uint64_t)want;

	if (bytes < c->runway_min)
		bytes = c->runway_min;
	return (bytes + MIB - 1) & ~(MIB - 1);
}

/* The bytes a spool's frames take on disk a second, at its recent write rate. */
static double disk_rate(struct kmo_ring *o, struct rate *rt, uint64_t now)
{
	uint64_t spooled = __atomic_load_n(&o->spooled, __ATOMIC_RELAXED);
	uint64_t raw = __atomic_load_n(&o->disk_raw, __ATOMIC_RELAXED);
	uint64_t file = __atomic_load_n(&o->disk_file, __ATOMIC_RELAXED);
	double ratio = raw >= RATIO_SEEN ? (double)file / (double)raw : RATIO_GUESS;

	return rate_at(rt, spooled, now) * ratio;
}

/* Whether the memory budget, at the rate it fills, is spent within LEAD_MS. */
static int budget_ends_soon(struct kmo_copier *c, struct runway *w, uint64_t now)
{
	uint64_t used, bps;

	if (!c->memory_limit || !c->memory_used)
		return 1; /* no budget: every segment is on disk */
	used = __atomic_load_n(c->memory_used, __ATOMIC_RELAXED);
	bps = (uint64_t)rate_at(&w->fill, used, now);
	return used >= c->memory_limit ||
	       (double)(c->memory_limit - used) <= (double)bps * LEAD_MS / 1000.0;
}

/* Allocate ahead in the owner's standby, up to `want` bytes, once less than half of
 * that is allocated. Never in the segment the copier writes: on ext4 fallocate holds
 * the inode's lock, which the copier's write(2) to that file takes too, and it may
 * wait seconds in the block allocator (for a bitmap page that a normal-priority
 * writeback holds, under a storm: seen 0.45 and 9.8 s, 0.5 and 16.7M records lost).
 * So a piece at a time, each only while the segment is still the standby, with
 * alloc_busy set meanwhile: the copier takes a busy standby only when it has no
 * other place to go (the memory budget is spent). */
static void extend(struct kmo_copier *c, struct kmo_ring *o, uint64_t want)
{
	struct kmo_segment *s;
	struct statvfs fs;
	uint64_t from, len, took, done = 0;
	int fd, err = 0;

	spin_lock(&o->lock);
	s = o->standby;
	if (!s || s->memory || s->alloc_off || s->alloc_busy || s->state != 0 ||
	    s->alloc_end >= s->file_bytes + want / 2) {
		spin_unlock(&o->lock);
		return;
	}
	from = s->alloc_end > s->file_bytes ? s->alloc_end : s->file_bytes;
	len = s->file_bytes + want - from;
	/* a file of our own: Python may close its fd once the segment is done */
	fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0) {
		spin_unlock(&o->lock);
		return;
	}
	__atomic_store_n(&s->alloc_busy, 1, __ATOMIC_RELEASE);
	spin_unlock(&o->lock);

	if (!fstatvfs(fd, &fs)) {
		uint64_t free = (uint64_t)fs.f_bavail * fs.f_frsize;

		if (free < c->keep_free + len) {
			len = free > c->keep_free ? free - c->keep_free : 0;
			c->runway_short++;
		}
	}
	len &= ~(MIB - 1);
	/* in pieces, the copier free to take the standby between two */
	while (done < len && !err) {
		uint64_t piece = len - done < RUNWAY_PIECE ? len - done : RUNWAY_PIECE;
		uint64_t t0;

		if (done) {
			spin_lock(&o->lock);
			if (o->standby != s) { /* taken up: the copier writes in it now */
				spin_unlock(&o->lock);
				break;
			}
			__atomic_store_n(&s->alloc_busy, 1, __ATOMIC_RELEASE);
			spin_unlock(&o->lock);
		}
		t0 = now_ns();
		if (fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)(from + done), (off_t)piece)) {
			err = errno;
		} else {
			done += piece;
		}
		took = now_ns() - t0;
		spin_lock(&o->lock);
		if (!err) {
			s->alloc_end = from + done;
			c->runway_calls++;
			c->runway_bytes += piece;
		}
		if (took > c->runway_ns_max)
			c->runway_ns_max = took;
		__atomic_store_n(&s->alloc_busy, 0, __ATOMIC_RELEASE);
		spin_unlock(&o->lock);
	}
	close(fd);

	spin_lock(&o->lock);
	if (done)
		s->alloc_asked = 0;
	if (err == ENOSPC) {
		c->runway_short++;
	} else if (err && err != EINTR) {
		s->alloc_off = 1;
		if (!c->runway_errno)
			c->runway_errno = err;
	}
	spin_unlock(&o->lock);
}

/* Start the writeback of the owner's active disk segment every sync_bytes (the
 * copier did it itself before: writeback's submission takes the journal's handles
 * and page locks, waits the copier must not share). Not the last MiB: the copier
 * appends to its pages, and a page being written back is locked meanwhile. */
static void write_back(struct kmo_copier *c, struct kmo_ring *o)
{
	struct kmo_segment *s;
	uint64_t upto;
	int fd;

	spin_lock(&o->lock);
	s = o->active;
	if (!s || s->memory || s->file_bytes - s->synced < c->sync_bytes ||
	    s->file_bytes < 2 * MIB) {
		spin_unlock(&o->lock);
		return;
	}
	upto = (s->file_bytes - MIB) & ~(MIB - 1);
	fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
	if (fd >= 0)
		s->synced = upto;
	spin_unlock(&o->lock);
	if (fd < 0)
		return;
	sync_file_range(fd, 0, (off_t)upto, SYNC_FILE_RANGE_WRITE);
	close(fd);
}

static int writes_on_disk(struct kmo_ring *o)
{
	int disk;

	spin_lock(&o->lock);
	disk = o->active && !o->active->memory;
	spin_unlock(&o->lock);
	return disk;
}

static void *runway_main(void *arg)
{
	struct kmo_copier *c = arg;
	struct runway *w = c->runway;
	struct pollfd fds[2] = { { .fd = c->stop_fd, .events = POLLIN },
				 { .fd = c->runway_wake, .events = POLLIN } };
	uint64_t n;

	pthread_setname_np(pthread_self(), "kmo-runway");
	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		/* a filesystem that cannot allocate ahead: the copier writes as before,
		 * and this thread only starts the writeback */
		int can = c->runway_errno != EOPNOTSUPP;
		uint64_t now = now_ns();
		int soon = budget_ends_soon(c, w, now);

		for (int i = 0; i < c->nrings; i++) {
			struct kmo_ring *r = c->rings[i];
			uint64_t want, lead;
			double bps;

			if (r->owner)
				continue; /* its owner's copier allocates for its segments */
			bps = disk_rate(r, &w->rates[i], now);
			want = clamp_mib(c, bps * (double)c->runway_ms / 1000.0, c->runway_max);
			if (can) {
				/* while the copier writes on disk, the standby is its next
				 * segment: the whole runway, taken up once the active one's
				 * is used; else a token while the budget lasts, a lead once
				 * it is about to end */
				lead = writes_on_disk(r) ? want
				       : soon		 ? clamp_mib(c, bps * LEAD_MS / 1000.0, want)
							 : c->runway_min;
				extend(c, r, lead);
			}
			write_back(c, r);
		}
		/* the stop eventfd stays readable once written; a new segment wakes it
		 * at once (its first frames would be written outside a runway) */
		if (poll(fds, c->runway_wake > 0 ? 2 : 1, TICK_MS) > 0 && fds[1].revents & POLLIN)
			(void)!read(c->runway_wake, &n, sizeof(n));
	}
	return NULL;
}

void runway_start(struct kmo_copier *c)
{
	struct runway *w;

	int owns = 0;

	c->runway = NULL;
	for (int i = 0; i < c->nrings; i++)
		owns |= !c->rings[i]->owner;
	if (!c->runway_max || !owns)
		return; /* (a ring group's other copiers: the first allocates for them) */
	w = calloc(1, sizeof(*w) + (size_t)c->nrings * sizeof(struct rate));
	if (!w)
		return;
	c->runway = w;
	if (pthread_create(&w->thread, NULL, runway_main, c)) {
		free(w);
		c->runway = NULL;
		return;
	}
	c->runway_started = 1;
}

void runway_join(struct kmo_copier *c)
{
	struct runway *w = c->runway;

	if (!w)
		return;
	__atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
	pthread_join(w->thread, NULL);
	free(w);
	c->runway = NULL;
}
