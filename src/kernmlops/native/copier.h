/* The ring copier's shared structs (ringcopy.c, runway.c); their Python mirror is
 * kernmlops/ebpf/copier.py: a field added here is added there, and KMO_ABI moves. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define KMO_ABI 9

typedef size_t (*zstd_compress_fn)(void *dst, size_t cap, const void *src, size_t len, int level);
typedef size_t (*zstd_bound_fn)(size_t len);
typedef unsigned (*zstd_is_error_fn)(size_t code);
typedef void *(*zstd_create_fn)(void);
typedef size_t (*zstd_free_fn)(void *cctx);
typedef size_t (*zstd_set_fn)(void *cctx, int param, int value);
typedef size_t (*zstd_compress2_fn)(void *cctx, void *dst, size_t cap, const void *src, size_t len);
typedef size_t (*zstd_estimate_fn)(int level);
typedef void *(*zstd_init_static_fn)(void *workspace, size_t size);

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
	/* the runway (runway.c): the file's blocks are allocated up to here; the
	 * runway thread moves it, under the owner ring's lock */
	uint64_t alloc_end;
	int32_t alloc_busy; /* 1: the runway thread is allocating (Python keeps the struct) */
	int32_t alloc_off;  /* 1: never again (its filesystem cannot, or it is done) */
	int32_t alloc_asked; /* 1: the copier wrote past alloc_end and woke the thread */
	int32_t alloc_pad;
	/* frames in the disk queue for it, not written yet (diskqueue.c): record bytes
	 * and file bytes; `written` and `file_bytes` count them once they are written */
	uint64_t queued;
	uint64_t queued_file;
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
	/* the ring whose segments, lock and standby this one writes into (a spool
	 * fed by several rings); NULL: its own */
	struct kmo_ring *owner;
	/* zstd frames: records shuffled at this stride first (0: not), in r->shuffled */
	uint32_t shuffle;
	uint32_t pad;
	uint8_t *shuffled;
	uint64_t shuffled_cap;
	/* an owner's: raw bytes written into its segments by all its rings, and of
	 * them into disk segments, raw and as written (the runway's rate and ratio) */
	uint64_t spooled;
	uint64_t disk_raw;
	uint64_t disk_file;
	/* an owner's: the times the copier found the budget spent and no standby
	 * (it copies nothing until Python hands it one: its rings fill), and the
	 * nanoseconds it waited so, the wait under way since wait_since */
	uint64_t standby_waits;
	uint64_t standby_wait_ns;
	uint64_t wait_since;
	/* an owner's: held by a disk writer across its write of a frame into one of
	 * the owner's segments (the rings of a spool may have writers of their own) */
	int32_t wlock;
	int32_t wpad;
};

static inline struct kmo_ring *owner_of(struct kmo_ring *r)
{
	return r->owner ? r->owner : r;
}

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
	/* the runway (runway.c): disk allocated ahead of the copier's writes, by a
	 * thread of its own, for this many ms of the spool's recent write rate,
	 * between runway_min and runway_max bytes (0: none); never below keep_free
	 * bytes free on the filesystem */
	int64_t runway_ms;
	uint64_t runway_min;
	uint64_t runway_max;
	uint64_t keep_free;
	/* set by the runway thread */
	int32_t runway_started;
	int32_t runway_errno;   /* the first fallocate error that is not ENOSPC */
	uint64_t runway_calls;  /* fallocates that allocated */
	uint64_t runway_bytes;  /* bytes they allocated */
	uint64_t runway_ns_max; /* the longest */
	uint64_t runway_short;  /* allocations skipped or cut for keep_free, or ENOSPC */
	/* set by the copier: bytes it wrote to disk past a segment's runway */
	uint64_t runway_outside;
	int32_t runway_wake;    /* an eventfd Python writes when it hands over a segment */
	int32_t runway_pad;
	void *runway;           /* the runway thread's own state */
	/* set by the copier, where a stall shows: its longest write of one frame into
	 * a segment, the writes that took SLOW_WRITE_NS or more, and the longest time
	 * from the end of one pass over the rings to the end of the next */
	uint64_t write_ns_max;
	uint64_t slow_writes;
	uint64_t pass_gap_ns_max;
	/* the disk queue (diskqueue.c): bytes it may hold (0: the copier writes to disk
	 * itself), its state, the most it held, and the frames it had no room for */
	uint64_t queue_cap;
	void *queue;
	uint64_t queue_peak;
	uint64_t queue_full;
	/* where libzstd has them: a compression context in memory the copier holds
	 * from its start (ZSTD_initStaticCCtx), so no frame allocates (ringcopy.c,
	 * prepare); `wksp` is that memory; `prepared`: 1 once the buffers were
	 * made, 2 with such a context */
	zstd_estimate_fn estimate;
	zstd_init_static_fn init_static;
	void *wksp;
	int32_t prepared;
	int32_t prepared_pad;
};

/* A disk frame is in its segment's file: the runway's figures and the writeback
 * (ringcopy.c), under the owner's lock. */
void kmo_disk_wrote(struct kmo_copier *c, struct kmo_ring *o, struct kmo_segment *s,
		    uint64_t raw, uint64_t file);

#define SLOW_WRITE_NS 10000000ULL
