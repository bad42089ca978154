#include "model/grad_sumsq.h"

#include <stdlib.h>

#include "kernels/adamw.h"

bool grad_sumsq_init(grad_sumsq_t *r, int cap) {
    r->n = 0;
    r->cap = cap;
    r->ranges = calloc((size_t)(cap > 0 ? cap : 1), sizeof *r->ranges);
    return r->ranges != NULL;
}

void grad_sumsq_free(grad_sumsq_t *r) {
    free(r->ranges);
    r->ranges = NULL;
    r->n = r->cap = 0;
}

void grad_sumsq_clear(grad_sumsq_t *r) { r->n = 0; }

void grad_sumsq_add(grad_sumsq_t *r, int64_t offset, int64_t count, double sumsq) {
    if (r->n < r->cap) r->ranges[r->n++] = (grad_sumsq_range_t){offset, count, sumsq};
}

/* The backward records its ranges from the last layer back: sorted by offset here (a few hundred
 * at most; insertion sort), so that the total adds them in the buffer's order whatever the order
 * they came in. */
static void sort_by_offset(grad_sumsq_t *r) {
    for (int i = 1; i < r->n; i++) {
        grad_sumsq_range_t x = r->ranges[i];
        int j = i - 1;
        for (; j >= 0 && r->ranges[j].offset > x.offset; j--) r->ranges[j + 1] = r->ranges[j];
        r->ranges[j + 1] = x;
    }
}

double grad_sumsq_total(grad_sumsq_t *r, const float *g, int64_t n, double *partials) {
    sort_by_offset(r);
    double sum = 0.0;
    int64_t read_from = 0;
    for (int i = 0; i < r->n; i++) {
        const grad_sumsq_range_t *x = &r->ranges[i];
        if (x->offset > read_from) sum += adamw_sum_squares(g + read_from, x->offset - read_from, partials);
        sum += x->sumsq;
        read_from = x->offset + x->count;
    }
    if (n > read_from) sum += adamw_sum_squares(g + read_from, n - read_from, partials);
    return sum;
}

int64_t grad_sumsq_gap_floats(const grad_sumsq_t *r, int64_t n) {
    int64_t covered = 0;
    for (int i = 0; i < r->n; i++) covered += r->ranges[i].count;
    return n - covered;
}
