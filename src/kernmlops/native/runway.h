/* The runway (runway.c): disk blocks allocated ahead of the copier's writes. */
#pragma once
#include "copier.h"

/* Start the runway thread beside the copier (where runway_max asks for one);
 * it inherits the copier's priority. */
void runway_start(struct kmo_copier *c);
/* Stop it and wait for it: no allocation is made after this returns. */
void runway_join(struct kmo_copier *c);
