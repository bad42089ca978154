#include "kernels/rmsnorm.h"

#include <math.h>
#include <string.h>

static inline float row_rstd(const float *x, int64_t N, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < N; i++) ss += x[i] * x[i];
    return 1.0f / sqrtf(ss / (float)N + eps);
}

enum { BF16_PIECE = 512 };

/* The forward into fp32 out, or (out NULL) rounded to bf16 into out16. */
static void forward_rows(float *out, bf16_t *out16, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                         const float *weight, int64_t T, int64_t G, int64_t N, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < T * G; r++) {
        int64_t t = r / G, g = r % G;
        const float *x = inp + t * ld_in + g * N;
        float s = rstd[r] = row_rstd(x, N, eps);
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
    forward_rows(out, NULL, ld_out, rstd, inp, ld_in, weight, T, G, N, eps);
}

void rmsnorm_forward_bf16(bf16_t *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                          const float *weight, int64_t T, int64_t G, int64_t N, float eps) {
    forward_rows(NULL, out, ld_out, rstd, inp, ld_in, weight, T, G, N, eps);
}

/* Rows per chunk of the backward: a function of the row count only, so that dweight's sums
 * run in the same order for any thread count (at most 64 chunks). */
static int64_t chunk_rows(int64_t rows) {
    int64_t c = (rows + 63) / 64;
    return c < 16 ? 16 : c;
}

void rmsnorm_backward(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight,
                      const float *dout, int64_t ld_dout, const float *inp, int64_t ld_in,
                      const float *weight, const float *rstd, int64_t T, int64_t G, int64_t N) {
    /* One pass: each row's dweight terms and Σ w·dy·x are taken while dy and x are in L1, then
     * its dx is written (so dinp may alias dout). dweight adds up per chunk of rows, and the
     * chunks' sums are added in chunk order (ordered): a column-wise pass over all rows
     * first, 256 bytes of every 4 KiB row at a time, cost twice the rest of the backward. */
    const int64_t rows = T * G, per = chunk_rows(rows), chunks = (rows + per - 1) / per;
#pragma omp parallel
    {
        float acc[RMSNORM_MAX_N]; /* this chunk's dweight sums */
#pragma omp for ordered schedule(static, 1)
        for (int64_t chunk = 0; chunk < chunks; chunk++) {
            memset(acc, 0, (size_t)N * sizeof(float));
            int64_t r1 = (chunk + 1) * per < rows ? (chunk + 1) * per : rows;
            for (int64_t r = chunk * per; r < r1; r++) {
                int64_t t = r / G, g = r % G;
                const float *dy = dout + t * ld_dout + g * N;
                const float *x = inp + t * ld_in + g * N;
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
#pragma omp ordered
            {
#pragma omp simd
                for (int64_t i = 0; i < N; i++) dweight[i] += acc[i];
            }
        }
    }
}
