/* membw: what the memory bus delivers right now, for the op summary's % of bandwidth. Two
 * patterns over arrays far past the last-level cache, on every compute thread, alternated round
 * by round and each the best of its rounds:
 *  - a STREAM triad, a = b + s·c, its stores streaming (as STREAM's published builds do), counted
 *    as STREAM counts it: 12 bytes an element;
 *  - an in-place update, a += s·b (the pattern of the optimizer's state and of residual adds):
 *    12 bytes an element, a read and written, b read.
 * On this shared VM neither bounds the other: the update has read 1.3-1.6x the triad, and the
 * step's AdamW update (30 bytes a parameter, p, m and v read and written) reads near the update's
 * figure. The bandwidth is the better of the two. Bytes are counted as the trace counts a
 * kernel's (trace_event_t.bytes): what must move, a store's read-for-ownership not counted. */
#ifndef STEPSCOPE_MEMBW_H
#define STEPSCOPE_MEMBW_H

#include <stddef.h>

typedef struct membw {
    double triad_gbs, update_gbs; /* each pattern's best round, GB/s (1e9 bytes) */
    double best_gbs;              /* the better of the two; 0 when the arrays could not be mapped */
} membw_t;

/* At least 3 rounds of each pattern and about `seconds` in all, on `threads` threads, over
 * arrays of array_bytes each (mapped for the probe, touched once untimed, unmapped after). */
membw_t membw_probe(int threads, size_t array_bytes, double seconds);
/* The same over three arrays the caller owns (array_bytes each, 64-byte aligned, contents
 * overwritten): a run's buffers that are resident already and dead, so that the probe maps
 * nothing and the process's peak RSS does not move. best_gbs 0 where an array is NULL. */
membw_t membw_probe_in(int threads, float *a, float *b, float *c, size_t array_bytes, double seconds);

#endif
