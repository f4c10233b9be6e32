/* ringcopy: the collector's ring-to-spool copy, without Python.
 *
 * One thread (a Python thread that called kmo_copier_run through ctypes, which
 * lets go of the GIL for the call) sleeps in epoll on the rings' map fds and
 * moves each ring's committed records, as they lie (headers included), into
 * the ring's active spool segment: raw into a tmpfs segment while the
 * collection's memory budget lasts, then zstd frames into a disk segment (the
 * standby that user space keeps ready), through the disk queue: a thread of its
 * own writes those (diskqueue.c says why). The consumer position moves once the
 * bytes are in the file, or in the queue (which a kill loses, as it loses the
 * ring: both are the collector's memory).
 *
 * Why: under a storm with more runnable tasks than CPUs, every Python thread of
 * the collector waits for the GIL behind whichever of them the storm keeps off
 * the CPU (an import, a Parquet write), and the rings overflow while the copy
 * itself would take a few percent of a core. This thread never takes the GIL.
 *
 * The file formats are kernmlops.spool.frames': a raw segment is frames of
 * <magic u32><raw u32><CRC32C of the records u32><CRC32C of these 12 bytes u32>
 * and the records as they lay in the ring; a compressed one is frames of
 * <compressed u32><raw u32> and a zstd frame of whole records (with zstd's
 * checksum), byte-shuffled first at the ring's record size where it has one
 * (SHUFFLED in the raw word). Either way a flipped byte costs its frame, never
 * a wrong value.
 * zstd comes in as function pointers from user space (ctypes loads
 * libzstd.so.1), so this library needs only the C library and loads wherever
 * the wheel goes. Shared structs: kernmlops/ebpf/copier.py.
 *
 * Ring groups (hooks/bpf.py, ring_groups): a table's records may come from
 * several rings, one per group of CPUs, each moved by a copier thread of its
 * own into the table's one spool. The rings of a spool share its segments: the
 * first ring (the owner) holds them, its lock and its standby, and the others
 * point at it (kmo_ring_share). A frame (CRC or zstd) is made outside that
 * lock, so the copiers of one spool compress side by side; only the write of a
 * whole frame and the segment's counts are made under it. Frames of one ring
 * keep their order; records of one CPU are in one ring, so a CPU's order is
 * kept too. One spool, however many rings: the row accounting, the workers at
 * stop and `kernmlops recover` read it as they read a spool of one ring.
 */
#define _GNU_SOURCE
#include <endian.h>
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

#include "ceiling.h"
#include "copier.h"
#include "diskqueue.h"
#include "runway.h"
#include "spin.h"

#define BUSY_BIT (1U << 31)
#define DISCARD_BIT (1U << 30)
#define LEN_MASK (DISCARD_BIT - 1)
#define HDR 8


/* A raw frame's header (kernmlops.spool.frames.RAW_FRAME): the magic's top bit is
 * set, so it never reads as a zstd frame's compressed size (always < 2 GiB). */
#define RAW_MAGIC 0x8d4f4d4bU /* "KMO\x8d" */
#define RAW_HEAD 16

/* A compressed frame's raw word when its records were shuffled (frames.SHUFFLED):
 * this bit, the stride in 8-byte units in bits 24-30, the raw bytes below. */
#define SHUFFLED (1U << 31)
#define SHUFFLED_RAW_MAX ((1U << 24) - 1)

/* ZSTD_cParameter values (zstd.h, stable since 1.4) */
#define ZSTD_C_LEVEL 100
#define ZSTD_C_CHECKSUM 201
#define ZSTD_C_WORKERS 400
#define ZSTD_C_JOB_SIZE 401
#define ZSTD_JOB_MIN (512 * 1024)

int kmo_abi(void)
{
	return KMO_ABI;
}

/* CRC32C (Castagnoli, reflected, as iSCSI and ext4 use it) of the raw frames.
 * Where the CPU has SSE4.2 its crc32 instruction computes it; it takes 3 cycles
 * and can start one per cycle, so three lanes of a block run side by side and
 * are joined after (shift_lane): ~3x one lane's speed (10-15 GB/s on the 2-vCPU
 * EPYC VM, against ~2 GB/s for the write into the tmpfs: the CRC adds about a
 * tenth to the copy's CPU). Elsewhere (another CPU, an x86 without it) a table,
 * 8 bytes at a step (~0.8 GB/s). Chosen once, at load. */
#define CRC_POLY 0x82f63b78U
#define CRC_LANE 4096

static uint32_t crc_tab[8][256];
/* crc_lane[i][b]: the register b << 8i after CRC_LANE zero bytes */
static uint32_t crc_lane[4][256];
static uint32_t (*crc_update)(uint32_t reg, const uint8_t *p, size_t len);

static uint32_t crc_sw(uint32_t reg, const uint8_t *p, size_t len)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	while (len >= 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		w ^= reg;
		reg = crc_tab[7][w & 0xff] ^ crc_tab[6][(w >> 8) & 0xff] ^
		      crc_tab[5][(w >> 16) & 0xff] ^ crc_tab[4][(w >> 24) & 0xff] ^
		      crc_tab[3][(w >> 32) & 0xff] ^ crc_tab[2][(w >> 40) & 0xff] ^
		      crc_tab[1][(w >> 48) & 0xff] ^ crc_tab[0][w >> 56];
		p += 8;
		len -= 8;
	}
#endif
	while (len--)
		reg = crc_tab[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
	return reg;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>

static inline uint32_t shift_lane(uint32_t reg)
{
	return crc_lane[0][reg & 0xff] ^ crc_lane[1][(reg >> 8) & 0xff] ^
	       crc_lane[2][(reg >> 16) & 0xff] ^ crc_lane[3][reg >> 24];
}

static inline uint64_t load64(const uint8_t *p)
{
	uint64_t w;

	memcpy(&w, p, 8);
	return w;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t reg, const uint8_t *p,
							  size_t len)
{
	uint64_t a = reg;

	while (len >= 3 * CRC_LANE) {
		const uint8_t *end = p + CRC_LANE;
		uint64_t b = 0, c = 0;

		do {
			a = _mm_crc32_u64(a, load64(p));
			b = _mm_crc32_u64(b, load64(p + CRC_LANE));
			c = _mm_crc32_u64(c, load64(p + 2 * CRC_LANE));
			p += 8;
		} while (p < end);
		/* the register is linear: lane a moves past b's bytes, then both past c's */
		a = shift_lane(shift_lane((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
		p += 2 * CRC_LANE;
		len -= 3 * CRC_LANE;
	}
	for (; len >= 8; p += 8, len -= 8)
		a = _mm_crc32_u64(a, load64(p));
	while (len--)
		a = _mm_crc32_u8((uint32_t)a, *p++);
	return (uint32_t)a;
}

static int cpu_has_crc32c(void)
{
	unsigned int eax, ebx, ecx, edx;

	return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2);
}
#endif

__attribute__((constructor)) static void crc_init(void)
{
	uint32_t basis[32];

	for (uint32_t n = 0; n < 256; n++) {
		uint32_t c = n;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ CRC_POLY : c >> 1;
		crc_tab[0][n] = c;
	}
	for (int k = 1; k < 8; k++)
		for (int n = 0; n < 256; n++)
			crc_tab[k][n] = (crc_tab[k - 1][n] >> 8) ^ crc_tab[0][crc_tab[k - 1][n] & 0xff];
	/* each bit of the register after a lane of zeros, then every byte value of it */
	for (int j = 0; j < 32; j++) {
		uint32_t reg = 1U << j;

		for (int i = 0; i < CRC_LANE; i++)
			reg = crc_tab[0][reg & 0xff] ^ (reg >> 8);
		basis[j] = reg;
	}
	for (int i = 0; i < 4; i++)
		for (int b = 0; b < 256; b++) {
			uint32_t v = 0;

			for (int j = 0; j < 8; j++)
				if (b & (1 << j))
					v ^= basis[8 * i + j];
			crc_lane[i][b] = v;
		}
	crc_update = crc_sw;
#if defined(__x86_64__)
	if (cpu_has_crc32c())
		crc_update = crc_hw;
#endif
}

/* CRC32C of `len` bytes at `p`, going on from `crc` (0 to start): the same as
 * kernmlops.ebpf.crc32c.crc32c, which the Python side uses where this library is
 * missing. */
uint32_t kmo_crc32c(uint32_t crc, const void *p, size_t len)
{
	return ~crc_update(~crc, p, len);
}

/* The table's CRC32C, whatever the CPU has (for the tests: both ways agree). */
uint32_t kmo_crc32c_table(uint32_t crc, const void *p, size_t len)
{
	return ~crc_sw(~crc, p, len);
}

/* 1 where the CPU's instruction computes the CRC, 0 where the table does. */
int kmo_crc32c_hw(void)
{
#if defined(__x86_64__)
	return crc_update == crc_hw;
#else
	return 0;
#endif
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
	free(r->shuffled);
	r->cons = NULL;
	r->prod = NULL;
	r->packed = NULL;
	r->line = NULL;
	r->shuffled = NULL;
}

/* The memory budget: bytes of tmpfs segments, shared by a collection's copiers
 * and by Python (kernmlops.spool.memory.SpoolMemory). */
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

/* A raw frame's header for `len` bytes of records at `src` (their CRC). */
static void raw_head(uint32_t head[4], const uint8_t *src, uint64_t len)
{
	head[0] = htole32(RAW_MAGIC);
	head[1] = htole32((uint32_t)len);
	head[2] = htole32(kmo_crc32c(0, src, len));
	head[3] = htole32(kmo_crc32c(0, head, 12));
}

/* One raw frame: its header (raw_head) and the records, in one writev (a kill cuts
 * at most the frame being written: the last, which recover tells from damage). */
static int put_raw(struct kmo_segment *s, uint32_t head[4], const uint8_t *src, uint64_t len)
{
	struct iovec iov[2] = { { head, RAW_HEAD }, { (void *)src, len } };
	uint64_t left = RAW_HEAD + len;

	while (left) {
		ssize_t n = writev(s->fd, iov, 2);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		left -= (uint64_t)n;
		for (int i = 0; i < 2; i++) { /* a short write: on from where it stopped */
			size_t take = (size_t)n < iov[i].iov_len ? (size_t)n : iov[i].iov_len;

			iov[i].iov_base = (uint8_t *)iov[i].iov_base + take;
			iov[i].iov_len -= take;
			n -= (ssize_t)take;
		}
	}
	__atomic_store_n(&s->file_bytes, s->file_bytes + RAW_HEAD + len, __ATOMIC_RELEASE);
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

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* (Under the ring's lock) the copier waited for a segment and has one now. */
static void end_wait(struct kmo_ring *r)
{
	if (r->waiting)
		r->standby_wait_ns += now_ns() - r->wait_since;
	r->waiting = 0;
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

/* `n` records of `stride` bytes at `src` byte-shuffled into `dst`: byte b of
 * record i at dst[b * n + i] (kernmlops.spool.frames.shuffle). Sixteen records
 * at a time: each of their 16-byte columns is a 16x16 byte transpose, whose
 * rows are stored whole, one to each plane. */
#if defined(__SSE2__)
#include <emmintrin.h>

static void transpose16(__m128i r[16])
{
	__m128i a[16], b[16];

	for (int k = 0; k < 8; k++) {
		a[2 * k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
		a[2 * k + 1] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
	}
	for (int k = 0; k < 4; k++)
		for (int j = 0; j < 2; j++) {
			b[4 * k + 2 * j] = _mm_unpacklo_epi16(a[4 * k + j], a[4 * k + 2 + j]);
			b[4 * k + 2 * j + 1] = _mm_unpackhi_epi16(a[4 * k + j], a[4 * k + 2 + j]);
		}
	for (int k = 0; k < 2; k++)
		for (int j = 0; j < 4; j++) {
			a[8 * k + 2 * j] = _mm_unpacklo_epi32(b[8 * k + j], b[8 * k + 4 + j]);
			a[8 * k + 2 * j + 1] = _mm_unpackhi_epi32(b[8 * k + j], b[8 * k + 4 + j]);
		}
	for (int j = 0; j < 8; j++) {
		r[2 * j] = _mm_unpacklo_epi64(a[j], a[8 + j]);
		r[2 * j + 1] = _mm_unpackhi_epi64(a[j], a[8 + j]);
	}
}
#endif

static void shuffle_records(uint8_t *restrict dst, const uint8_t *restrict src, size_t n,
			    size_t stride)
{
	size_t i = 0;

#if defined(__SSE2__)
	if (stride % 16 == 0)
		for (; i + 16 <= n; i += 16)
			for (size_t h = 0; h < stride; h += 16) {
				__m128i r[16];

				for (int k = 0; k < 16; k++)
					r[k] = _mm_loadu_si128((const __m128i *)(src + (i + k) * stride + h));
				transpose16(r);
				for (int b = 0; b < 16; b++)
					_mm_storeu_si128((__m128i *)(dst + (h + b) * n + i), r[b]);
			}
#endif
	for (; i + 16 <= n; i += 16)
		for (size_t b = 0; b < stride; b++) {
			uint8_t t[16];

			for (int k = 0; k < 16; k++)
				t[k] = src[(i + k) * stride + b];
			memcpy(dst + b * n + i, t, 16);
		}
	for (; i < n; i++)
		for (size_t b = 0; b < stride; b++)
			dst[b * n + i] = src[i * stride + b];
}

/* Exported for the tests: the same shuffle as the copier's frames. */
void kmo_shuffle(uint8_t *dst, const uint8_t *src, uint64_t len, uint32_t stride)
{
	uint64_t whole = len / stride * stride;

	shuffle_records(dst, src, whole / stride, stride);
	memcpy(dst + whole, src + whole, len - whole);
}

/* The stride a frame of `len` bytes is shuffled at (0: not): the ring's, where a
 * header can say it and the frame holds a record or more. The same rule as
 * kernmlops.spool.frames.shuffle_stride (the tests hold them equal). */
uint32_t kmo_shuffle_stride(uint64_t len, uint32_t stride)
{
	if (stride && stride % 8 == 0 && stride < 128 * 8 && stride <= len &&
	    len <= SHUFFLED_RAW_MAX)
		return stride;
	return 0;
}

/* A zstd frame (its header and the compressed bytes) of `len` bytes of records,
 * in r->packed; *size its bytes. The records are shuffled first where the ring
 * says so and the header can say it (frames.shuffle_stride). */
static int pack_zstd(struct kmo_copier *c, struct kmo_ring *r, const uint8_t *src, uint64_t len,
		     size_t *size)
{
	size_t need = c->bound(len) + 8, n;
	uint32_t head[2], word = (uint32_t)len;
	uint32_t stride = kmo_shuffle_stride(len, r->shuffle);

	if (stride) {
		if (r->shuffled_cap < len) {
			uint8_t *p = realloc(r->shuffled, len);

			if (!p)
				return ENOMEM;
			r->shuffled = p;
			r->shuffled_cap = len;
		}
		kmo_shuffle(r->shuffled, src, len, stride);
		src = r->shuffled;
		word = SHUFFLED | (stride / 8) << 24 | (uint32_t)len;
	}

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
	head[0] = htole32((uint32_t)n);
	head[1] = htole32(word);
	memcpy(r->packed, head, 8);
	*size = n + 8;
	return 0;
}

static int put_zstd(struct kmo_ring *r, struct kmo_segment *s, size_t size)
{
	int err = write_all(s->fd, r->packed, size);

	if (err)
		return err;
	__atomic_store_n(&s->file_bytes, s->file_bytes + size, __ATOMIC_RELEASE);
	return 0;
}

/* Whether a frame of `bytes` goes past the blocks the runway allocated in disk
 * segment `s` (where it can allocate ahead at all). */
static int runway_used(struct kmo_copier *c, struct kmo_segment *s, uint64_t bytes)
{
	return c->runway_started && !s->memory && !s->alloc_off &&
	       s->file_bytes + s->queued_file + bytes > s->alloc_end;
}

/* (Under the owner's lock) whether the standby can take a frame of `bytes` made for
 * `s` in blocks the runway allocated, and the runway thread is not allocating in it:
 * the copier then goes on there rather than write past its segment's runway. The
 * runway thread allocates only in the standby (runway.c says why). */
static int standby_ready(struct kmo_ring *o, struct kmo_segment *s, uint64_t bytes)
{
	struct kmo_segment *n = o->standby;

	return n && n->zstd == s->zstd && !n->memory && !n->alloc_off &&
	       !__atomic_load_n(&n->alloc_busy, __ATOMIC_ACQUIRE) && n->alloc_end >= bytes;
}

/* A disk write's share in the runway's figures (runway.c), under the owner's lock:
 * the spool's ratio of file to raw bytes, and what went past the allocated blocks
 * (where the filesystem can allocate ahead at all). */
void kmo_disk_wrote(struct kmo_copier *c, struct kmo_ring *o, struct kmo_segment *s,
		    uint64_t raw, uint64_t file)
{
	__atomic_store_n(&o->disk_raw, o->disk_raw + raw, __ATOMIC_RELAXED);
	__atomic_store_n(&o->disk_file, o->disk_file + file, __ATOMIC_RELAXED);
	if (c->runway_max && !s->alloc_off && s->file_bytes > s->alloc_end) {
		uint64_t past = s->file_bytes - s->alloc_end, one = 1;

		c->runway_outside += past < file ? past : file;
		if (!s->alloc_asked && c->runway_wake > 0) {
			/* outran it (a burst from cold): the runway thread goes now, not
			 * at its next tick; once, until it allocated again */
			s->alloc_asked = 1;
			(void)!write(c->runway_wake, &one, sizeof(one));
		}
	}
	/* (with a runway thread, that thread starts the writeback: runway.c) */
	if (!c->runway_started && s->file_bytes - s->synced >= c->sync_bytes) {
		/* Start writeback without waiting for it: dirty pages of a storm's
		 * spool would otherwise make every fsync wait (the manifest's). */
		sync_file_range(s->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
		s->synced = s->file_bytes;
	}
}

/* Copy what the ring holds; the bytes copied. Takes the owner's lock around each
 * write (the frame is made before, outside it). */
static uint64_t copy_ring(struct kmo_copier *c, struct kmo_ring *r)
{
	struct kmo_ring *o = owner_of(r);
	uint64_t cons = *r->cons, prod, total = 0;
	uint64_t mask = r->size - 1;

	if (r->error)
		return 0;
	prod = __atomic_load_n(r->prod, __ATOMIC_ACQUIRE);
	while (cons < prod) {
		struct kmo_segment *s;
		uint32_t head[4];
		size_t packed = 0;
		uint64_t max, run, t0, took;
		const uint8_t *src;
		int wraps, err;

		spin_lock(&o->lock);
		s = o->active;
		spin_unlock(&o->lock);
		if (!s)
			break;
		/* a frame at most: what one damaged byte costs, and one step of reading back */
		max = s->zstd || c->frame_raw < r->size / 4 ? c->frame_raw : r->size / 4;
		run = committed(r, cons, prod, max, &wraps);
		src = r->data + (cons & mask);
		if (!run)
			break;
		if (wraps && !(src = join_wrapped(r, cons, run))) {
			r->error = ENOMEM;
			break;
		}
		err = s->zstd ? pack_zstd(c, r, src, run, &packed) : (raw_head(head, src, run), 0);
		if (err) {
			r->error = err;
			break;
		}
		spin_lock(&o->lock);
		if (o->active != s) { /* rotated meanwhile: made again for the new one */
			spin_unlock(&o->lock);
			continue;
		}
		if (runway_used(c, s, s->zstd ? packed : RAW_HEAD + run) &&
		    standby_ready(o, s, s->zstd ? packed : RAW_HEAD + run))
			s = switch_to_standby(o); /* of the same format: the frame fits it */
		if (!s->memory && diskq_on(c)) {
			/* the writer puts it in the file (diskqueue.c says why); the ring's
			 * consumer moves on once it is in the queue */
			int queued = s->zstd ? diskq_put(c, r, s, r->packed, packed, NULL, packed, run)
					     : diskq_put(c, r, s, head, RAW_HEAD, src, RAW_HEAD + run,
							 run);

			if (queued)
				__atomic_store_n(&o->spooled, o->spooled + run, __ATOMIC_RELAXED);
			spin_unlock(&o->lock);
			if (!queued)
				break; /* full: the ring keeps them for the next pass */
			cons += run;
			__atomic_store_n(r->cons, cons, __ATOMIC_RELEASE);
			total += run;
			prod = __atomic_load_n(r->prod, __ATOMIC_ACQUIRE);
			continue;
		}
		if (s->memory) { /* memory segments are raw: the budget counts their headers */
			if (!kmo_budget_reserve(c->memory_used, c->memory_limit, run + RAW_HEAD)) {
				s = switch_to_standby(o);
				if (!s && !o->waiting) {
					o->standby_waits++;
					o->wait_since = now_ns();
				}
				o->waiting = s == NULL;
				spin_unlock(&o->lock);
				if (!s)
					break; /* Python opens a standby at its next poll */
				continue;
			}
		}
		t0 = now_ns();
		err = s->zstd ? put_zstd(r, s, packed) : put_raw(s, head, src, run);
		took = now_ns() - t0;
		if (took > c->write_ns_max)
			c->write_ns_max = took;
		c->slow_writes += took >= SLOW_WRITE_NS;
		if (err) {
			spin_unlock(&o->lock);
			if (s->memory)
				kmo_budget_release(c->memory_used, run + RAW_HEAD);
			r->error = err;
			break;
		}
		__atomic_store_n(&s->written, s->written + run, __ATOMIC_RELEASE);
		__atomic_store_n(&o->spooled, o->spooled + run, __ATOMIC_RELAXED);
		if (!s->memory)
			kmo_disk_wrote(c, o, s, run, s->zstd ? packed : RAW_HEAD + run);
		spin_unlock(&o->lock);
		/* the consumer moves only once the bytes are in the file */
		cons += run;
		__atomic_store_n(r->cons, cons, __ATOMIC_RELEASE);
		total += run;
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

	for (int i = 0; i < c->nrings; i++)
		total += copy_ring(c, c->rings[i]); /* it takes the owner's lock itself */
	return total;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* zstd's context away: a static one is only its memory. */
static void free_cctx(struct kmo_copier *c)
{
	if (c->wksp) {
		free(c->wksp);
		c->wksp = NULL;
	} else if (c->cctx) {
		c->free_cctx(c->cctx);
	}
	c->cctx = NULL;
}

/* Grow `*buf` to `cap` bytes and touch every page of it. */
static int reserve(uint8_t **buf, uint64_t *have, uint64_t cap)
{
	uint8_t *p;

	if (*have >= cap)
		return 0;
	p = realloc(*buf, cap);
	if (!p)
		return ENOMEM;
	memset(p, 0, cap);
	*buf = p;
	*have = cap;
	return 0;
}

/* Before the first copy (the benchmark has not started): every buffer a frame
 * needs at its largest, its pages touched, and zstd's context in memory of its
 * own where libzstd allows (a static context never allocates). Why: an
 * allocation past glibc's mmap threshold, or one that grows a thread's arena,
 * takes the process's mmap lock for writing, and a Python thread of the
 * collector that holds it (an import, a thread's stack) while a storm keeps it
 * off the CPU would stop the copier for as long (a 10-s stall at a storm's start
 * with no slow write, the sampler's ticks lost with it, was seen before this). */
static void prepare(struct kmo_copier *c)
{
	uint64_t packed = c->bound ? c->bound(c->frame_raw) + 8 : 0;

	for (int i = 0; i < c->nrings; i++) {
		struct kmo_ring *r = c->rings[i];

		if (packed)
			reserve(&r->packed, &r->packed_cap, packed);
		if (r->shuffle)
			reserve(&r->shuffled, &r->shuffled_cap, c->frame_raw);
		reserve(&r->line, &r->line_cap, 64 * 1024);
	}
	if (c->estimate && c->init_static && c->workers <= 0 && c->create && c->set &&
	    c->compress2 && c->free_cctx) {
		size_t size = c->estimate(c->level);
		void *ws = size ? malloc(size) : NULL;

		if (ws) {
			memset(ws, 0, size);
			c->cctx = c->init_static(ws, size);
			if (c->cctx)
				c->wksp = ws;
			else
				free(ws);
		}
	}
	c->prepared = c->wksp ? 2 : 1;
}

/* The copier's loop: returns once `stop` is set, after a last copy. */
int kmo_copier_run(struct kmo_copier *c)
{
	struct epoll_event ev[16];
	uint64_t last;

	if (c->abi != KMO_ABI)
		return -EINVAL;
	prepare(c);
	if (c->create && c->set && c->compress2 && c->free_cctx) {
		/* Every frame carries zstd's checksum of its content: recover tells a
		 * damaged frame from a good one, and reads on at the next. */
		if (!c->cctx)
			c->cctx = c->create();
		if (c->cctx && (c->is_error(c->set(c->cctx, ZSTD_C_LEVEL, c->level)) ||
				c->is_error(c->set(c->cctx, ZSTD_C_CHECKSUM, 1)))) {
			free_cctx(c);
		}
		if (c->cctx && c->workers > 0 &&
		    !c->is_error(c->set(c->cctx, ZSTD_C_WORKERS, c->workers)) &&
		    !c->is_error(c->set(c->cctx, ZSTD_C_JOB_SIZE, ZSTD_JOB_MIN)))
			c->workers_ok = 1; /* else a libzstd without threads: alone */
	}
	runway_start(c);
	diskq_start(c); /* (else the copier writes to disk itself) */
	last = now_ns();
	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		int n = epoll_wait(c->epfd, ev, 16, (int)c->interval_ms);
		uint64_t now;

		if (n < 0 && errno != EINTR) {
			int err = errno;

			runway_join(c);
			diskq_join(c);
			return -err;
		}
		c->wakeups++;
		kmo_copier_pass(c);
		c->cpu_ns = thread_cpu_ns();
		now = now_ns();
		if (now - last > c->pass_gap_ns_max)
			c->pass_gap_ns_max = now - last;
		last = now;
	}
	runway_join(c); /* before the last copy: nothing allocates after it */
	kmo_copier_pass(c);
	diskq_join(c); /* its frames written: Python copies on (directly) from here */
	c->cpu_ns = thread_cpu_ns();
	free_cctx(c);
	return 0;
}

/* Make `seg` the ring's active segment (the old one is done) and `standby` its
 * standby, in one step: between a rotation and the next standby the copier of a
 * spent budget would have nowhere to go and would wait for Python, whose next look
 * a storm delays by seconds (its rings overflow meanwhile). With `check`, only if
 * the active segment still holds `written` raw bytes and the standby is still
 * `was` (the copier neither wrote on nor went on in the standby since Python
 * looked): else nothing changes and it returns 0; 1 once done. */
int kmo_ring_rotate(struct kmo_ring *r, struct kmo_segment *seg, struct kmo_segment *standby,
		    int check, struct kmo_segment *was, uint64_t written)
{
	struct kmo_ceiling ceiling;
	int done = 0;

	kmo_ceiling_raise(&ceiling); /* the copier waits for this lock: ceiling.h */
	spin_lock(&r->lock);
	if (!check || (r->standby == was && (r->active ? r->active->written : 0) == written &&
		       !(r->active && r->active->queued))) {
		if (r->active)
			__atomic_store_n(&r->active->state, 2, __ATOMIC_RELEASE);
		__atomic_store_n(&seg->state, 1, __ATOMIC_RELEASE);
		r->active = seg;
		r->standby = standby;
		end_wait(r);
		done = 1;
	}
	spin_unlock(&r->lock);
	kmo_ceiling_drop(&ceiling);
	return done;
}

/* Have ring `r` write into `owner`'s segments (a spool fed by several rings), or
 * into its own (NULL); before the copiers start. */
void kmo_ring_share(struct kmo_ring *r, struct kmo_ring *owner)
{
	r->owner = owner == r ? NULL : owner;
}

/* Give the ring a standby segment (where it goes once the budget is spent). */
void kmo_ring_set_standby(struct kmo_ring *r, struct kmo_segment *seg)
{
	struct kmo_ceiling ceiling;

	kmo_ceiling_raise(&ceiling);
	spin_lock(&r->lock);
	r->standby = seg;
	if (seg)
		end_wait(r);
	spin_unlock(&r->lock);
	kmo_ceiling_drop(&ceiling);
}
