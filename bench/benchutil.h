/* benchutil: what the C benchmarks share: a monotonic clock, sorting timings for medians and
 * quartiles, and deterministic inputs (the kernels' speed does not depend on the values, only on them being
 * ordinary finite floats). */
#ifndef STEPSCOPE_BENCHUTIL_H
#define STEPSCOPE_BENCHUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/arena.h"
#include "util/clock.h"

/* Seconds on the monotonic clock, for intervals: the probes' clock. */
static inline double bench_now(void) { return clock_seconds(); }

/* qsort's comparison for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts x[n] and returns its median; q1 and q3 (when not NULL) get the quartiles. */
static inline double bench_sorted_median(double *x, int n, double *q1, double *q3) {
    qsort(x, (size_t)n, sizeof(double), bench_cmp_double);
    if (q1) *q1 = x[n / 4];
    if (q3) *q3 = x[(3 * n) / 4];
    return x[n / 2];
}

static inline float *bench_fill_(float *p, int64_t n, unsigned seed) {
    if (p)
        for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u + seed) % 2001) * 1e-3f - 1.0f;
    return p;
}

/* n floats in [-1, 1], a pattern of the seed; the caller frees them. */
static inline float *bench_filled(int64_t n, unsigned seed) {
    return bench_fill_(malloc((size_t)n * sizeof(float)), n, seed);
}

/* The same on a 64-byte boundary, as the model's arena places its buffers; NULL when out of memory. */
static inline float *bench_filled_aligned(int64_t n, unsigned seed) {
    return bench_fill_(aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64)), n, seed);
}

/* bytes from the arena (huge pages, as the step allocates its buffers), or exit with its message. */
static inline void *bench_arena_alloc(size_t bytes, const char *what) {
    char err[256];
    void *p = arena_alloc(bytes, what, err, sizeof err);
    if (!p) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return p;
}

#endif
