/* ringcopy: the collector's ring-to-spool copy, without Python.
 *
 * One thread (a Python thread that called kmo_copier_run through ctypes, which
 * lets go of the GIL for the call) sleeps in epoll on the rings' map fds and
 * moves each ring's committed records, as they lie (headers included), into
 * the ring's active spool segment: raw into a tmpfs segment while the
 * collection's memory budget lasts, then zstd frames into a disk segment (the
 * standby that user space keeps ready). The consumer position moves only once
 * the bytes are in the file, so a kill loses nothing the kernel still holds.
 *
 * Why: under a storm with more runnable tasks than CPUs, every Python thread of
 * the collector waits for the GIL behind whichever of them the storm keeps off
 * the CPU (an import, a Parquet write), and the rings overflow while the copy
 * itself would take a few percent of a core. This thread never takes the GIL.
 *
 * The file formats are kernmlops.ebpf.spool's: a raw segment is ring records
 * back to back; a compressed one is frames of <compressed u32><raw u32> and a
 * zstd frame of whole records. zstd comes in as function pointers from user
 * space (ctypes loads libzstd.so.1), so this library needs only the C library
 * and loads wherever the wheel goes. Shared structs: kernmlops/ebpf/copier.py.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define BUSY_BIT (1U << 31)
#define DISCARD_BIT (1U << 30)
#define LEN_MASK (DISCARD_BIT - 1)
#define HDR 8

#define KMO_ABI 4

typedef size_t (*zstd_compress_fn)(void *dst, size_t cap, const void *src, size_t len, int level);
typedef size_t (*zstd_bound_fn)(size_t len);
typedef unsigned (*zstd_is_error_fn)(size_t code);
typedef void *(*zstd_create_fn)(void);
typedef size_t (*zstd_free_fn)(void *cctx);
typedef size_t (*zstd_set_fn)(void *cctx, int param, int value);
typedef size_t (*zstd_compress2_fn)(void *cctx, void *dst, size_t cap, const void *src, size_t len);

/* ZSTD_cParameter values (zstd.h, stable since 1.4) */
#define ZSTD_C_LEVEL 100
#define ZSTD_C_CHECKSUM 201
#define ZSTD_C_WORKERS 400
#define ZSTD_C_JOB_SIZE 401
#define ZSTD_JOB_MIN (512 * 1024)

/* One spool segment file. Python opens it (and writes its json); the copier
 * appends to it while it is the ring's active segment. */
struct kmo_segment {
	int32_t fd;
	int32_t zstd;      /* 1: frames of zstd; 0: raw */
	int32_t memory;    /* on the tmpfs: counts against the memory budget */
	int32_t state;     /* 0: standby, 1: active, 2: done (the copier left it) */
	uint64_t written;  /* raw bytes in the file (whole records, whole frames) */
	uint64_t file_bytes;
	uint64_t synced;   /* file_bytes when writeback was last started */
};

struct kmo_ring {
	/* set by kmo_ring_map */
	volatile uint64_t *cons;
	volatile const uint64_t *prod;
	const uint8_t *data; /* the data area, mapped twice in a row */
	uint64_t size;
	int32_t map_fd;
	int32_t lock;        /* taken by the copier around a copy, by Python to rotate */
	struct kmo_segment *active;
	struct kmo_segment *standby;
	uint64_t copied;     /* raw bytes copied in all */
	uint64_t passes;     /* copies that moved bytes */
	int32_t error;       /* errno of the first failed write: the ring is left alone */
	int32_t waiting;     /* 1: the budget is spent and no standby is ready */
	uint8_t *packed;     /* zstd: a frame's header and compressed bytes */
	uint64_t packed_cap;
	uint8_t *line;       /* a record that wraps past the data area's end, joined */
	uint64_t line_cap;
};

struct kmo_copier {
	int32_t abi;
	int32_t stop;        /* 1: copy what is committed, then return */
	int32_t nrings;
	int32_t stop_fd;     /* an eventfd Python writes to wake the copier */
	int64_t interval_ms; /* longest sleep between copies */
	uint64_t memory_limit;
	uint64_t *memory_used; /* the collection's budget, shared by its copiers (atomic) */
	uint64_t frame_raw;  /* raw bytes per zstd frame at most */
	uint64_t sync_bytes; /* start writeback of a disk segment every this many bytes */
	int32_t level;
	int32_t epfd;
	uint64_t wakeups;
	zstd_compress_fn compress;
	zstd_bound_fn bound;
	zstd_is_error_fn is_error;
	struct kmo_ring **rings;
	uint64_t cpu_ns;     /* the copier thread's CPU time so far (at each wake-up) */
	/* zstd's workers: a frame is cut in jobs of ZSTD_JOB_MIN compressed at once
	 * (libzstd's own threads, created by the copier: they inherit its policy) */
	int32_t workers;     /* 0: the copier compresses alone */
	int32_t workers_ok;  /* set by the copier: libzstd took the workers */
	zstd_create_fn create;
	zstd_free_fn free_cctx;
	zstd_set_fn set;
	zstd_compress2_fn compress2;
	void *cctx;
};

int kmo_abi(void)
{
	return KMO_ABI;
}

static void lock(int32_t *l)
{
	while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
		sched_yield();
}

static void unlock(int32_t *l)
{
	__atomic_store_n(l, 0, __ATOMIC_RELEASE);
}

/* Map a ring the way the kernel allows: the consumer page read-write, the
 * producer page and the data area read-only. The data area once, not the twice
 * in a row the kernel offers: the kernel maps every page of a mapping at once and
 * each counts in the collector's RSS (64 MiB for a 32-MiB ring); the one record
 * in a lap that wraps past the end is joined in `line` instead. */
int kmo_ring_map(struct kmo_ring *r, int map_fd, uint64_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	void *cons, *data;

	memset(r, 0, sizeof(*r));
	cons = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0);
	if (cons == MAP_FAILED)
		return -errno;
	data = mmap(NULL, page + size, PROT_READ, MAP_SHARED, map_fd, page);
	if (data == MAP_FAILED) {
		int err = errno;

		munmap(cons, page);
		return -err;
	}
	r->cons = cons;
	r->prod = data;
	r->data = (const uint8_t *)data + page;
	r->size = size;
	r->map_fd = map_fd;
	return 0;
}

void kmo_ring_unmap(struct kmo_ring *r)
{
	long page = sysconf(_SC_PAGESIZE);

	if (r->cons)
		munmap((void *)r->cons, page);
	if (r->prod)
		munmap((void *)r->prod, page + r->size);
	free(r->packed);
	free(r->line);
	r->cons = NULL;
	r->prod = NULL;
	r->packed = NULL;
	r->line = NULL;
}

/* The memory budget: bytes of tmpfs segments, shared by a collection's copiers
 * and by Python (kernmlops.ebpf.spool.SpoolMemory). */
int kmo_budget_reserve(uint64_t *used, uint64_t limit, uint64_t bytes)
{
	uint64_t now = __atomic_load_n(used, __ATOMIC_ACQUIRE);

	do {
		if (now + bytes > limit)
			return 0;
	} while (!__atomic_compare_exchange_n(used, &now, now + bytes, 0, __ATOMIC_ACQ_REL,
					      __ATOMIC_ACQUIRE));
	return 1;
}

void kmo_budget_release(uint64_t *used, uint64_t bytes)
{
	uint64_t now = __atomic_load_n(used, __ATOMIC_ACQUIRE), next;

	do {
		next = now > bytes ? now - bytes : 0;
	} while (!__atomic_compare_exchange_n(used, &now, next, 0, __ATOMIC_ACQ_REL,
					      __ATOMIC_ACQUIRE));
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Committed bytes from `cons`, whole records, at most `max` (but at least one
 * record when one is committed), ending at the data area's end: a record that
 * wraps past it comes alone, with *wraps set (a header never wraps: records are
 * 8-aligned). */
static uint64_t committed(struct kmo_ring *r, uint64_t cons, uint64_t prod, uint64_t max,
			  int *wraps)
{
	uint64_t mask = r->size - 1, run = 0;

	*wraps = 0;
	while (cons + run < prod) {
		uint64_t at = (cons + run) & mask;
		uint32_t hdr = __atomic_load_n((const uint32_t *)(r->data + at), __ATOMIC_ACQUIRE);
		uint64_t len;

		if (hdr & BUSY_BIT)
			break;
		len = ((hdr & LEN_MASK) + HDR + 7) & ~7ULL;
		if (run && run + len > max)
			break;
		if ((cons & mask) + run + len > r->size) { /* past the data area's end */
			if (!run) {
				*wraps = 1;
				run = len;
			}
			break;
		}
		run += len;
	}
	return run;
}

/* The record at `cons` that wraps past the data area's end, joined in r->line. */
static const uint8_t *join_wrapped(struct kmo_ring *r, uint64_t cons, uint64_t len)
{
	uint64_t at = cons & (r->size - 1), head = r->size - at;

	if (r->line_cap < len) {
		uint8_t *p = realloc(r->line, len);

		if (!p)
			return NULL;
		r->line = p;
		r->line_cap = len;
	}
	memcpy(r->line, r->data + at, head);
	memcpy(r->line + head, r->data, len - head);
	return r->line;
}

static struct kmo_segment *switch_to_standby(struct kmo_ring *r)
{
	struct kmo_segment *next = r->standby;

	if (!next)
		return NULL;
	__atomic_store_n(&r->active->state, 2, __ATOMIC_RELEASE);
	__atomic_store_n(&next->state, 1, __ATOMIC_RELEASE);
	r->active = next;
	r->standby = NULL;
	return next;
}

static int put_zstd(struct kmo_copier *c, struct kmo_ring *r, struct kmo_segment *s,
		    const uint8_t *src, uint64_t len)
{
	size_t need = c->bound(len) + 8, n;
	uint32_t head[2];
	int err;

	if (r->packed_cap < need) {
		uint8_t *p = realloc(r->packed, need);

		if (!p)
			return ENOMEM;
		r->packed = p;
		r->packed_cap = need;
	}
	if (c->cctx)
		n = c->compress2(c->cctx, r->packed + 8, need - 8, src, len);
	else
		n = c->compress(r->packed + 8, need - 8, src, len, c->level);
	if (c->is_error(n))
		return EIO;
	head[0] = (uint32_t)n;
	head[1] = (uint32_t)len;
	memcpy(r->packed, head, 8);
	err = write_all(s->fd, r->packed, n + 8);
	if (err)
		return err;
	__atomic_store_n(&s->file_bytes, s->file_bytes + n + 8, __ATOMIC_RELEASE);
	return 0;
}

/* Copy what the ring holds; the bytes copied. With the ring's lock held. */
static uint64_t copy_ring(struct kmo_copier *c, struct kmo_ring *r)
{
	uint64_t cons = *r->cons, prod, total = 0;
	uint64_t mask = r->size - 1;

	if (r->error || !r->active)
		return 0;
	prod = __atomic_load_n(r->prod, __ATOMIC_ACQUIRE);
	while (cons < prod) {
		struct kmo_segment *s = r->active;
		uint64_t max = s->zstd ? c->frame_raw : r->size / 4;
		int wraps;
		uint64_t run = committed(r, cons, prod, max, &wraps);
		const uint8_t *src = r->data + (cons & mask);
		int err;

		if (!run)
			break;
		if (wraps && !(src = join_wrapped(r, cons, run))) {
			r->error = ENOMEM;
			break;
		}
		if (s->memory) {
			if (!kmo_budget_reserve(c->memory_used, c->memory_limit, run)) {
				s = switch_to_standby(r);
				r->waiting = s == NULL;
				if (!s)
					break; /* Python opens a standby at its next poll */
				continue;
			}
		}
		err = s->zstd ? put_zstd(c, r, s, src, run) : write_all(s->fd, src, run);
		if (err) {
			if (s->memory)
				kmo_budget_release(c->memory_used, run);
			r->error = err;
			break;
		}
		if (!s->zstd)
			__atomic_store_n(&s->file_bytes, s->file_bytes + run, __ATOMIC_RELEASE);
		__atomic_store_n(&s->written, s->written + run, __ATOMIC_RELEASE);
		cons += run;
		__atomic_store_n(r->cons, cons, __ATOMIC_RELEASE);
		total += run;
		if (!s->memory && s->file_bytes - s->synced >= c->sync_bytes) {
			/* Start writeback without waiting for it: dirty pages of a storm's
			 * spool would otherwise make every fsync wait (the manifest's). */
			sync_file_range(s->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
			s->synced = s->file_bytes;
		}
		prod = __atomic_load_n(r->prod, __ATOMIC_ACQUIRE);
	}
	if (total) {
		__atomic_store_n(&r->copied, r->copied + total, __ATOMIC_RELEASE);
		r->passes++;
	}
	return total;
}

/* One copy of every ring (Python calls it too, once the thread has returned). */
uint64_t kmo_copier_pass(struct kmo_copier *c)
{
	uint64_t total = 0;

	for (int i = 0; i < c->nrings; i++) {
		struct kmo_ring *r = c->rings[i];

		lock(&r->lock);
		total += copy_ring(c, r);
		unlock(&r->lock);
	}
	return total;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The copier's loop: returns once `stop` is set, after a last copy. */
int kmo_copier_run(struct kmo_copier *c)
{
	struct epoll_event ev[16];

	if (c->abi != KMO_ABI)
		return -EINVAL;
	if (c->create && c->set && c->compress2 && c->free_cctx) {
		/* Every frame carries zstd's checksum of its content: recover tells a
		 * damaged frame from a good one, and reads on at the next. */
		c->cctx = c->create();
		if (c->cctx && (c->is_error(c->set(c->cctx, ZSTD_C_LEVEL, c->level)) ||
				c->is_error(c->set(c->cctx, ZSTD_C_CHECKSUM, 1)))) {
			c->free_cctx(c->cctx);
			c->cctx = NULL;
		}
		if (c->cctx && c->workers > 0 &&
		    !c->is_error(c->set(c->cctx, ZSTD_C_WORKERS, c->workers)) &&
		    !c->is_error(c->set(c->cctx, ZSTD_C_JOB_SIZE, ZSTD_JOB_MIN)))
			c->workers_ok = 1; /* else a libzstd without threads: alone */
	}
	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		int n = epoll_wait(c->epfd, ev, 16, (int)c->interval_ms);

		if (n < 0 && errno != EINTR)
			return -errno;
		c->wakeups++;
		kmo_copier_pass(c);
		c->cpu_ns = thread_cpu_ns();
	}
	kmo_copier_pass(c);
	c->cpu_ns = thread_cpu_ns();
	if (c->cctx) {
		c->free_cctx(c->cctx);
		c->cctx = NULL;
	}
	return 0;
}

/* Make `seg` the ring's active segment now (the old one is done); returns the
 * old one's raw bytes, final. */
uint64_t kmo_ring_rotate(struct kmo_ring *r, struct kmo_segment *seg)
{
	uint64_t written;

	lock(&r->lock);
	written = r->active ? r->active->written : 0;
	if (r->active)
		__atomic_store_n(&r->active->state, 2, __ATOMIC_RELEASE);
	__atomic_store_n(&seg->state, 1, __ATOMIC_RELEASE);
	r->active = seg;
	unlock(&r->lock);
	return written;
}

/* Give the ring a standby segment (where it goes once the budget is spent). */
void kmo_ring_set_standby(struct kmo_ring *r, struct kmo_segment *seg)
{
	lock(&r->lock);
	r->standby = seg;
	r->waiting = 0;
	unlock(&r->lock);
}
