/* test_util: small helpers shared by the cmocka tests: a seeded generator, buffer fills,
 * norm-wise error measures and a central finite-difference driver. Header-only (static
 * inline) so each test binary stays one translation unit. Include after <cmocka.h>. */
#ifndef STEPSCOPE_TEST_UTIL_H
#define STEPSCOPE_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: fixed seeds give the same numbers on every machine and thread count. */
typedef struct test_rng {
    uint64_t s;
} test_rng_t;

static inline uint64_t rng_next(test_rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_unit(test_rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static inline float rng_uniform(test_rng_t *r, float lo, float hi) {
    return lo + (hi - lo) * (float)rng_unit(r);
}

static inline int64_t rng_below(test_rng_t *r, int64_t n) { return (int64_t)(rng_next(r) % (uint64_t)n); }

static inline void fill_uniform(float *x, size_t n, test_rng_t *r, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(r, lo, hi);
}

static inline void fill_const(float *x, size_t n, float c) {
    for (size_t i = 0; i < n; i++) x[i] = c;
}

/* Aborting allocators: a test that cannot allocate has nothing to say. */
static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}
static inline float *falloc(size_t n) { return xmalloc(n * sizeof(float)); }
static inline double *dalloc(size_t n) { return xmalloc(n * sizeof(double)); }
static inline float *fdup(const float *x, size_t n) {
    float *y = falloc(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* ‖got − want‖ / ‖want‖ over a rows × cols block with row strides (Frobenius). */
static inline double rel_err_2d(const float *got, int64_t ld_got, const float *want, int64_t ld_want,
                                int64_t rows, int64_t cols) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double g = got[i * ld_got + j], w = want[i * ld_want + j];
            num += (g - w) * (g - w);
            den += w * w;
        }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static inline double rel_err(const float *got, const float *want, size_t n) {
    return rel_err_2d(got, (int64_t)n, want, (int64_t)n, 1, (int64_t)n);
}

/* ‖got − want‖ / ‖want‖ for a float result against a double reference. */
static inline double rel_err_fd(const float *got, const double *want, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static inline double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m;
    }
    return m;
}

/* Σ out ⊙ R over a rows × cols block with row strides, in double. */
static inline double dot_2d(const float *out, int64_t ld_out, const float *R, int64_t ld_r,
                            int64_t rows, int64_t cols) {
    double s = 0.0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) s += (double)out[i * ld_out + j] * R[i * ld_r + j];
    return s;
}

/* Central finite differences of a scalar loss with respect to chosen elements of x.
 * loss(ctx) evaluates L from the current contents of x. For each index idx[i] the element
 * is moved to the floats nearest x0 ± h and the slope is taken over the step actually made,
 * so rounding of x0 ± h to float does not bias the estimate. Returns
 * ‖grad[idx] − fd‖ / ‖fd‖, the norm-wise relative error over the chosen elements. */
typedef double (*test_loss_fn)(void *ctx);

static inline double fd_check(float *x, const size_t *idx, size_t nidx, const float *grad, double h,
                              test_loss_fn loss, void *ctx) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < nidx; i++) {
        size_t j = idx[i];
        float x0 = x[j];
        float xp = (float)((double)x0 + h), xm = (float)((double)x0 - h);
        x[j] = xp;
        double lp = loss(ctx);
        x[j] = xm;
        double lm = loss(ctx);
        x[j] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double d = (double)grad[j] - fd;
        num += d * d;
        den += fd * fd;
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Indices of every element of a rows × cols block with row stride ld (skipping padding).
 * Caller frees. */
static inline size_t *block_indices(int64_t rows, int64_t cols, int64_t ld, size_t *n) {
    size_t *idx = xmalloc((size_t)(rows * cols) * sizeof(size_t));
    size_t k = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) idx[k++] = (size_t)(i * ld + j);
    *n = k;
    return idx;
}

/* True when every element of x[0, n) still holds the sentinel's exact bits. */
static inline int all_equal(const float *x, size_t n, float sentinel) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &sentinel, sizeof(float)) != 0) return 0;
    return 1;
}

/* Padding columns [cols, ld) of each row still hold the sentinel. */
static inline int padding_intact(const float *x, int64_t rows, int64_t cols, int64_t ld, float sentinel) {
    for (int64_t i = 0; i < rows; i++)
        if (!all_equal(x + i * ld + cols, (size_t)(ld - cols), sentinel)) return 0;
    return 1;
}

/* Measured errors are printed when TEST_VERBOSE is set, to see the margin under each bound. */
static inline void report(const char *what, double value, double bound) {
    if (getenv("TEST_VERBOSE")) printf("    %-52s %.3e (bound %.1e)\n", what, value, bound);
}

#endif
