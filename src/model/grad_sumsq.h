/* grad_sumsq: the sum of squares of a flat gradient buffer (the gradient norm's), from sums the
 * backward took as it wrote some of its ranges (a bf16 weight gradient's products sum their
 * tiles' squares from registers: gemm_bf16_sumsq) and one read of the rest. At qwen3-0.6b's
 * shapes the layers' matrices are three quarters of the buffer, so the norm's pass over 2.4 GB
 * of fp32 gradients shrinks to the embedding's and the norms' quarter. */
#ifndef STEPSCOPE_GRAD_SUMSQ_H
#define STEPSCOPE_GRAD_SUMSQ_H

#include <stdbool.h>
#include <stdint.h>

typedef struct grad_sumsq_range {
    int64_t offset, count; /* floats of the buffer */
    double sumsq;
} grad_sumsq_range_t;

typedef struct grad_sumsq {
    grad_sumsq_range_t *ranges;
    int n, cap;
} grad_sumsq_t;

/* Room for cap ranges; false when out of memory. */
bool grad_sumsq_init(grad_sumsq_t *r, int cap);
void grad_sumsq_free(grad_sumsq_t *r);

/* Forgets the ranges (at the start of each backward). */
void grad_sumsq_clear(grad_sumsq_t *r);

/* Σ g² over [offset, offset + count), taken as it was written; ranges must not overlap. Past cap
 * the range is dropped, and read again by grad_sumsq_total instead. */
void grad_sumsq_add(grad_sumsq_t *r, int64_t offset, int64_t count, double sumsq);

/* Σ g² over g[0, n): the ranges' sums and adamw_sum_squares over the gaps between them (partials:
 * adamw_norm_partials(n) doubles), added in the buffer's order. With no range it is
 * adamw_sum_squares(g, n) to the bit; with the same ranges the same bits at any thread count. */
double grad_sumsq_total(grad_sumsq_t *r, const float *g, int64_t n, double *partials);

/* How many of g[0, n)'s floats grad_sumsq_total reads: those no range covers. */
int64_t grad_sumsq_gap_floats(const grad_sumsq_t *r, int64_t n);

#endif
