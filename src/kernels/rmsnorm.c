#include "kernels/rmsnorm.h"

#include "kernels/rope.h"

#include <math.h>
#include <string.h>

static inline float row_rstd(const float *x, int64_t N, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < N; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)N + eps);
}

enum { BF16_PIECE = 512 };

/* The forward into fp32 out, or (out NULL) rounded to bf16 into out16; with rope (cos_table
 * not NULL, row t at position t mod S) each normed vector is rotated before it is stored. */
static void forward_rows(float *out, bf16_t *out16, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                         const float *weight, int64_t T, int64_t G, int64_t N, float eps, const float *cos_table,
                         const float *sin_table, int64_t S) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < T * G; r++) {
        int64_t t = r / G, g = r % G;
        const float *x = inp + t * ld_in + g * N;
        float s = rstd[r] = row_rstd(x, N, eps);
        if (cos_table) {
            float y[ROPE_FUSED_MAX_N];
#pragma omp simd
            for (int64_t i = 0; i < N; i++) y[i] = x[i] * s * weight[i];
            const int64_t at = (t % S) * (N / 2);
            rope_rotate_head(out + t * ld_out + g * N, y, cos_table + at, sin_table + at, N, 1.0f);
            continue;
        }
        if (out) {
            float *y = out + t * ld_out + g * N;
#pragma omp simd
            for (int64_t i = 0; i < N; i++) y[i] = x[i] * s * weight[i];
            continue;
        }
        for (int64_t i0 = 0; i0 < N; i0 += BF16_PIECE) { /* through L1, a piece at a time */
            int64_t n = N - i0 < BF16_PIECE ? N - i0 : BF16_PIECE;
            float y[BF16_PIECE];
#pragma omp simd
            for (int64_t i = 0; i < n; i++) y[i] = x[i0 + i] * s * weight[i0 + i];
            bf16_from_f32_block(out16 + t * ld_out + g * N + i0, y, n);
        }
    }
}

void rmsnorm_forward(float *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                     const float *weight, int64_t T, int64_t G, int64_t N, float eps) {
    forward_rows(out, NULL, ld_out, rstd, inp, ld_in, weight, T, G, N, eps, NULL, NULL, 1);
}

void rmsnorm_forward_bf16(bf16_t *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                          const float *weight, int64_t T, int64_t G, int64_t N, float eps) {
    forward_rows(NULL, out, ld_out, rstd, inp, ld_in, weight, T, G, N, eps, NULL, NULL, 1);
}

void rmsnorm_rope_forward(float *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                          const float *weight, const float *cos_table, const float *sin_table, int64_t T, int64_t S,
                          int64_t G, int64_t N, float eps) {
    forward_rows(out, NULL, ld_out, rstd, inp, ld_in, weight, T, G, N, eps, cos_table, sin_table, S);
}

/* Rows per chunk of the backward: a function of the row count only, so that dweight's sums
 * run in the same order for any thread count (at most 64 chunks). */
static int64_t chunk_rows(int64_t rows) {
    int64_t c = (rows + 63) / 64;
    return c < 16 ? 16 : c;
}

static int64_t chunk_count(int64_t rows) { return (rows + chunk_rows(rows) - 1) / chunk_rows(rows); }

int64_t rmsnorm_backward_partials(int64_t T, int64_t G, int64_t N) { return chunk_count(T * G) * N; }

/* rmsnorm_backward, with rope's backward first where cos_table is not NULL: each row's dy is
 * rotated back (rope_backward's arithmetic) into L1 before the norm's terms are taken. */
static void backward_rows(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight, const float *dout,
                          int64_t ld_dout, const float *inp, int64_t ld_in, const float *weight, const float *rstd,
                          int64_t T, int64_t G, int64_t N, const float *cos_table, const float *sin_table, int64_t S,
                          float *partials) {
    /* One pass: each row's dweight terms and Σ w·dy·x are taken while dy and x are in L1, then
     * its dx is written (so dinp may alias dout). dweight adds up per chunk of rows into
     * partials, and the chunks' sums are added in chunk order afterwards: a column-wise pass over
     * all rows first, 256 bytes of every 4 KiB row at a time, cost twice the rest of the
     * backward. The chunks' sums had been added in an OpenMP `ordered` section instead, the same
     * bits, but each of its 64 hand-overs between threads waits on a futex once the threads have
     * gone to sleep, which they do between a step's kernels: on the Zen 5 VM a backward of
     * 512 × 256 then took 1.0-2.4 ms instead of 15-40 µs (a probe with a 1-3 ms serial gap before
     * each call), and the tiny default model's `norm` row was 22-35% of its step. */
    const int64_t rows = T * G, per = chunk_rows(rows), chunks = chunk_count(rows);
#pragma omp parallel for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
        float *acc = partials + chunk * N; /* this chunk's dweight sums */
        memset(acc, 0, (size_t)N * sizeof(float));
        int64_t r1 = (chunk + 1) * per < rows ? (chunk + 1) * per : rows;
        for (int64_t r = chunk * per; r < r1; r++) {
            int64_t t = r / G, g = r % G;
            const float *dy = dout + t * ld_dout + g * N;
            const float *x = inp + t * ld_in + g * N;
            float unrotated[ROPE_FUSED_MAX_N];
            if (cos_table) {
                const int64_t at = (t % S) * (N / 2);
                rope_rotate_head(unrotated, dy, cos_table + at, sin_table + at, N, -1.0f);
                dy = unrotated;
            }
            float *dx = dinp + t * ld_dinp + g * N;
            float s = rstd[r];
            float dot = 0.0f; /* Σ w·dy·x */
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < N; i++) {
                float dyx = dy[i] * x[i];
                acc[i] += dyx * s;
                dot += weight[i] * dyx;
            }
            float k = s * s * s * dot / (float)N;
            if (accumulate_dinp) {
#pragma omp simd
                for (int64_t i = 0; i < N; i++) dx[i] += s * weight[i] * dy[i] - k * x[i];
            } else {
#pragma omp simd
                for (int64_t i = 0; i < N; i++) dx[i] = s * weight[i] * dy[i] - k * x[i];
            }
        }
    }
    /* At most 64 × N adds: on the calling thread, without another hand-over. */
    for (int64_t chunk = 0; chunk < chunks; chunk++) {
        const float *acc = partials + chunk * N;
#pragma omp simd
        for (int64_t i = 0; i < N; i++) dweight[i] += acc[i];
    }
}

void rmsnorm_backward(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight,
                      const float *dout, int64_t ld_dout, const float *inp, int64_t ld_in,
                      const float *weight, const float *rstd, int64_t T, int64_t G, int64_t N, float *partials) {
    backward_rows(dinp, ld_dinp, accumulate_dinp, dweight, dout, ld_dout, inp, ld_in, weight, rstd, T, G, N, NULL, NULL,
                  1, partials);
}

void rmsnorm_rope_backward(float *dinp, int64_t ld_dinp, float *dweight, const float *dout, int64_t ld_dout,
                           const float *inp, int64_t ld_in, const float *weight, const float *rstd,
                           const float *cos_table, const float *sin_table, int64_t T, int64_t S, int64_t G, int64_t N,
                           float *partials) {
    backward_rows(dinp, ld_dinp, false, dweight, dout, ld_dout, inp, ld_in, weight, rstd, T, G, N, cos_table, sin_table,
                  S, partials);
}
