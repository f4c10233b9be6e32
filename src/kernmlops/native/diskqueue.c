/* diskqueue: the copier's disk writes, on a thread of their own.
 *
 * Why: a write(2) to an ext4 file can wait seconds under a storm of more runnable
 * tasks than CPUs, however the file was prepared: for the inode's lock (held by a
 * fallocate waiting for a block bitmap: 0.45 and 9.8 s seen), for i_data_sem
 * (held by writeback or the conversion of unwritten extents at I/O end, kernel
 * threads of normal priority: 1.2 s seen), or for the journal (every write moves
 * the file's mtime). Each such wait stopped the copier, and with it the copy of
 * every ring: 0.5-16.7M records lost in 10-s storms on the 2-vCPU VM, 3.6M of
 * 3.8M once in CI. So the copier puts each frame for a disk segment (made and
 * checksummed as before) in this queue, in the collector's memory, and moves the
 * ring's consumer on; this thread writes the frames in order and then counts them
 * in the segment (written, file_bytes), so Python reads only what is in the file.
 * A stall now costs queue memory, not records; the copier stops copying only where
 * the queue is full (QUEUE_CAP; the manifest gives its peak and the times it was
 * full). A kill loses what the queue holds, as it loses what the ring holds.
 *
 * Memory segments (tmpfs: no journal, no allocation on disk) are still written by
 * the copier itself, and so is everything once the writer has stopped (Python's
 * last copies).
 *
 * The queue is one buffer used as a circle of entries (a header, then the frame),
 * each whole in the buffer (a skip entry fills the end where the next one does not
 * fit). It starts over at its beginning whenever it is empty, so a writer that
 * keeps up touches only its first pages; once a stall has filled more than KEEP,
 * the writer gives those pages back when the queue is next empty.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "copier.h"
#include "diskqueue.h"
#include "spin.h"

#define ALIGN 64
/* what stays mapped once a stall's pages are given back */
#define KEEP (16ULL << 20)

struct entry {
	uint64_t size; /* the entry's bytes, header included, a multiple of ALIGN */
	struct kmo_segment *seg; /* NULL: a skip entry */
	struct kmo_ring *ring;
	uint64_t len; /* the frame's bytes */
	uint64_t raw; /* its record bytes */
	uint64_t pad[3];
};

struct diskq {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
	int trimming; /* the writer gives pages back: entries go below KEEP only */
	uint8_t *buf;
	uint64_t cap;
	uint64_t head, tail; /* offsets in buf */
	uint64_t used;       /* bytes of entries (skip entries too) */
	uint64_t high;       /* the furthest byte used since the pages were last given back */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int write_all(int fd, const uint8_t *p, uint64_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		p += n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* One entry into its segment's file; its counts move once it is there. The owner's
 * write lock keeps the frames of a spool's several rings whole and apart; the
 * owner's own lock (the copier's) is held only for the counts. */
static void write_entry(struct kmo_copier *c, struct entry *e)
{
	struct kmo_ring *o = owner_of(e->ring);
	struct kmo_segment *s = e->seg;
	uint64_t t0, took;
	int err = 0;

	spin_lock(&o->wlock);
	t0 = now_ns();
	if (!__atomic_load_n(&e->ring->error, __ATOMIC_ACQUIRE))
		err = write_all(s->fd, (const uint8_t *)(e + 1), e->len);
	took = now_ns() - t0;
	spin_lock(&o->lock);
	if (!err) {
		__atomic_store_n(&s->file_bytes, s->file_bytes + e->len, __ATOMIC_RELEASE);
		__atomic_store_n(&s->written, s->written + e->raw, __ATOMIC_RELEASE);
		kmo_disk_wrote(c, o, s, e->raw, e->len);
	} else if (!e->ring->error) {
		e->ring->error = err;
	}
	s->queued_file -= e->len;
	__atomic_store_n(&s->queued, s->queued - e->raw, __ATOMIC_RELEASE);
	if (took > c->write_ns_max)
		c->write_ns_max = took;
	c->slow_writes += took >= SLOW_WRITE_NS;
	spin_unlock(&o->lock);
	spin_unlock(&o->wlock);
}

static void *writer_main(void *arg)
{
	struct kmo_copier *c = arg;
	struct diskq *q = c->queue;

	pthread_mutex_lock(&q->mu);
	for (;;) {
		struct entry *e;

		if (!q->used) {
			if (q->high > KEEP && !q->trimming) {
				/* a stall's pages back: below KEEP only, meanwhile */
				uint64_t high = q->high;

				q->trimming = 1;
				pthread_mutex_unlock(&q->mu);
				madvise(q->buf + KEEP, high - KEEP, MADV_DONTNEED);
				pthread_mutex_lock(&q->mu);
				q->trimming = 0;
				q->high = q->tail;
				continue;
			}
			if (q->stop)
				break;
			pthread_cond_wait(&q->cv, &q->mu);
			continue;
		}
		e = (struct entry *)(q->buf + q->head);
		pthread_mutex_unlock(&q->mu);
		if (e->seg)
			write_entry(c, e);
		pthread_mutex_lock(&q->mu);
		q->head += e->size;
		q->used -= e->size;
		if (q->head >= q->cap)
			q->head = 0;
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

int diskq_start(struct kmo_copier *c)
{
	struct diskq *q;
	int err;

	c->queue = NULL;
	if (!c->queue_cap)
		return 0;
	q = calloc(1, sizeof(*q));
	if (!q)
		return ENOMEM;
	q->cap = c->queue_cap & ~(uint64_t)(ALIGN - 1);
	/* address space only: pages are the kernel's once touched (MAP_NORESERVE) */
	q->buf = mmap(NULL, q->cap, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (q->buf == MAP_FAILED) {
		err = errno;
		free(q);
		return err;
	}
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	c->queue = q;
	err = pthread_create(&q->thread, NULL, writer_main, c);
	if (err) {
		c->queue = NULL;
		munmap(q->buf, q->cap);
		free(q);
		return err;
	}
	pthread_setname_np(q->thread, "kmo-writer"); /* named once this returns */
	return 0;
}

int diskq_on(struct kmo_copier *c)
{
	return c->queue != NULL;
}

int diskq_put(struct kmo_copier *c, struct kmo_ring *r, struct kmo_segment *s, const void *head,
	      uint64_t hlen, const void *body, uint64_t len, uint64_t raw)
{
	struct diskq *q = c->queue;
	uint64_t size = (sizeof(struct entry) + len + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
	uint64_t skip = 0, at, lim;
	struct entry *e;

	pthread_mutex_lock(&q->mu);
	if (!q->used) /* the next entries from the first pages (the writer reads none) */
		q->head = q->tail = 0;
	lim = q->trimming ? KEEP : q->cap;
	at = q->tail;
	if (q->used && at == q->head) {
		at = UINT64_MAX; /* full */
	} else if (at >= q->head) { /* the free room: past the tail, then before the head */
		if (at + size > lim) {
			if (!q->trimming && size <= q->head) {
				skip = q->cap - at;
				at = 0;
			} else {
				at = UINT64_MAX;
			}
		}
	} else if (at + size > q->head) {
		at = UINT64_MAX;
	}
	if (at == UINT64_MAX) {
		c->queue_full++;
		pthread_mutex_unlock(&q->mu);
		return 0;
	}
	pthread_mutex_unlock(&q->mu);

	/* only this thread adds: the room found stays ours while the frame is copied in */
	if (skip) {
		struct entry *k = (struct entry *)(q->buf + q->tail);

		memset(k, 0, sizeof(*k));
		k->size = skip;
	}
	e = (struct entry *)(q->buf + at);
	memset(e, 0, sizeof(*e));
	e->size = size;
	e->seg = s;
	e->ring = r;
	e->len = len;
	e->raw = raw;
	memcpy(e + 1, head, hlen);
	if (len > hlen)
		memcpy((uint8_t *)(e + 1) + hlen, body, len - hlen);
	s->queued_file += len;
	__atomic_store_n(&s->queued, s->queued + raw, __ATOMIC_RELEASE);

	pthread_mutex_lock(&q->mu);
	q->tail = at + size;
	q->used += skip + size;
	if (q->tail > q->high)
		q->high = q->tail;
	if (q->used > c->queue_peak)
		c->queue_peak = q->used;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	return 1;
}

void diskq_join(struct kmo_copier *c)
{
	struct diskq *q = c->queue;

	if (!q)
		return;
	pthread_mutex_lock(&q->mu);
	q->stop = 1;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
	pthread_join(q->thread, NULL);
	c->queue = NULL;
	munmap(q->buf, q->cap);
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
	free(q);
}
