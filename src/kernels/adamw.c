#include "kernels/adamw.h"

#include <immintrin.h>
#include <math.h>

int64_t adamw_norm_partials(int64_t n) { return (n + ADAMW_NORM_BLOCK - 1) / ADAMW_NORM_BLOCK; }

double adamw_sum_squares(const float *g, int64_t n, double *partials) {
    int64_t blocks = adamw_norm_partials(n);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i0 = b * ADAMW_NORM_BLOCK;
        int64_t i1 = i0 + ADAMW_NORM_BLOCK < n ? i0 + ADAMW_NORM_BLOCK : n;
        float acc = 0.0f;
        double total = 0.0;
        for (int64_t j0 = i0; j0 < i1; j0 += 1024) { /* float partials of 1024 keep it exact enough */
            int64_t j1 = j0 + 1024 < i1 ? j0 + 1024 : i1;
            acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = j0; j < j1; j++) acc += g[j] * g[j];
            total += acc;
        }
        partials[b] = total;
    }
    double sum = 0.0;
    for (int64_t b = 0; b < blocks; b++) sum += partials[b];
    return sum;
}

float adamw_clip_scale(double raw_norm, double clip) {
    if (clip <= 0.0) return 1.0f;
    double coef = clip / (raw_norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

/* One pass over n parameters with m in fp32 (m16 NULL) or bf16 (m NULL): each wrapper below
 * passes one of them as a constant NULL, so each inlines to its own loop. */
static inline __attribute__((always_inline)) void update(float *p, float *m, bf16_t *m16, float *v, const float *g,
                                                         int64_t n, int64_t step, float grad_scale,
                                                         const adamw_hparams_t *h, bf16_t *p_bf16) {
    const float b1 = h->b1, b2 = h->b2, eps = h->eps;
    const float bc1 = (float)(1.0 - pow(h->b1, (double)step));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(h->b2, (double)step));
    const float step_size = h->lr / bc1;
    const float decay = 1.0f - h->lr * h->weight_decay;
    /* Blocks small enough that the bf16 copies read p and m back from L1, not memory. */
    enum { BLOCK = 2048 };
    int64_t nblocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel
    {
        float m_block[BLOCK]; /* with m16: this block's new m, before its rounding */
#pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t i0 = b * BLOCK, i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
#pragma omp simd
            for (int64_t i = i0; i < i1; i++) {
                float gi = g[i] * grad_scale;
                float mi = b1 * (m16 ? bf16_to_f32(m16[i]) : m[i]) + (1.0f - b1) * gi;
                float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
                if (m16) m_block[i - i0] = mi;
                else m[i] = mi;
                v[i] = vi;
                float denom = sqrtf(vi) / bc2_sqrt + eps;
                p[i] = p[i] * decay - step_size * mi / denom;
            }
            if (m16) bf16_from_f32_block(m16 + i0, m_block, i1 - i0);
            /* Streamed: the copy is read next by the forward's GEMMs, from memory (1.2 GB for
             * qwen3-0.6b), so its lines need not be read for ownership first. The update ran 1.056x
             * (qwen3-0.6b's 596M parameters, old and new alternated, Zen 5, 2026-12-04). */
            if (p_bf16) bf16_from_f32_block_streamed(p_bf16 + i0, p + i0, i1 - i0);
        }
        _mm_sfence(); /* each thread's streaming stores, before the region's closing barrier */
    }
}

void adamw_update(float *p, float *m, float *v, const float *g, int64_t n, int64_t step,
                  float grad_scale, const adamw_hparams_t *h, bf16_t *p_bf16) {
    update(p, m, NULL, v, g, n, step, grad_scale, h, p_bf16);
}

void adamw_update_m16(float *p, bf16_t *m, float *v, const float *g, int64_t n, int64_t step,
                      float grad_scale, const adamw_hparams_t *h, bf16_t *p_bf16) {
    update(p, NULL, m, v, g, n, step, grad_scale, h, p_bf16);
}
