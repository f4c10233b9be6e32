/* The disk queue (diskqueue.c): the copier's frames for disk segments, written by
 * a thread of its own. */
#pragma once
#include "copier.h"

/* Start the writer beside the copier (where queue_cap asks for one); it inherits
 * the copier's priority. 0, or an errno (the copier then writes itself). */
int diskq_start(struct kmo_copier *c);
/* Whether frames for disk go through the queue now. */
int diskq_on(struct kmo_copier *c);
/* Queue a frame of `len` bytes (a header of `hlen` bytes, then `len - hlen` at
 * `body`) for segment `s` of ring `r`, `raw` record bytes: 1 once queued, 0 where
 * the queue has no room (nothing taken). Called by the copier, the owner's lock
 * held: the segment's queued counts move here. */
int diskq_put(struct kmo_copier *c, struct kmo_ring *r, struct kmo_segment *s, const void *head,
	      uint64_t hlen, const void *body, uint64_t len, uint64_t raw);
/* Write what is queued and stop the writer: nothing is written after this returns. */
void diskq_join(struct kmo_copier *c);
