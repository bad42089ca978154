#include "kernels/rmsnorm.h"

#include <math.h>

void rmsnorm_forward(float *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                     const float *weight, int64_t T, int64_t G, int64_t N, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < T * G; r++) {
        int64_t t = r / G, g = r % G;
        const float *x = inp + t * ld_in + g * N;
        float *y = out + t * ld_out + g * N;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < N; i++) ss += x[i] * x[i];
        float s = 1.0f / sqrtf(ss / (float)N + eps);
        rstd[r] = s;
#pragma omp simd
        for (int64_t i = 0; i < N; i++) y[i] = x[i] * s * weight[i];
    }
}

enum { DWEIGHT_COLUMNS = 64 };

void rmsnorm_backward(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight,
                      const float *dout, int64_t ld_dout, const float *inp, int64_t ld_in,
                      const float *weight, const float *rstd, int64_t T, int64_t G, int64_t N) {
    /* dweight first, split by columns: each column's sum runs over the rows in order, so the
     * result is the same for any thread count, and dout is read before dinp may overwrite it. */
    int64_t col_blocks = (N + DWEIGHT_COLUMNS - 1) / DWEIGHT_COLUMNS;
#pragma omp parallel for schedule(static)
    for (int64_t cb = 0; cb < col_blocks; cb++) {
        int64_t c0 = cb * DWEIGHT_COLUMNS;
        int64_t c1 = c0 + DWEIGHT_COLUMNS < N ? c0 + DWEIGHT_COLUMNS : N;
        float acc[DWEIGHT_COLUMNS] = {0};
        for (int64_t r = 0; r < T * G; r++) {
            int64_t t = r / G, g = r % G;
            const float *dy = dout + t * ld_dout + g * N;
            const float *x = inp + t * ld_in + g * N;
            float s = rstd[r];
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) acc[c - c0] += dy[c] * x[c] * s;
        }
        for (int64_t c = c0; c < c1; c++) dweight[c] += acc[c - c0];
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < T * G; r++) {
        int64_t t = r / G, g = r % G;
        const float *dy = dout + t * ld_dout + g * N;
        const float *x = inp + t * ld_in + g * N;
        float *dx = dinp + t * ld_dinp + g * N;
        float s = rstd[r];
        float dot = 0.0f; /* Σ w·dy·x */
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < N; i++) dot += weight[i] * dy[i] * x[i];
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
