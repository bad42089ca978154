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

/* The update's constants for one step. */
typedef struct adamw_step {
    float b1, b2, eps, bc2_sqrt, step_size, decay, grad_scale;
} adamw_step_t;

static adamw_step_t step_constants(const adamw_hparams_t *h, int64_t step, float grad_scale) {
    return (adamw_step_t){.b1 = h->b1, .b2 = h->b2, .eps = h->eps,
                          .bc2_sqrt = (float)sqrt(1.0 - pow(h->b2, (double)step)),
                          .step_size = h->lr / (float)(1.0 - pow(h->b1, (double)step)),
                          .decay = 1.0f - h->lr * h->weight_decay, .grad_scale = grad_scale};
}

/* One block [i0, i1) of each form, a loop of its own so that each vectorises. A bf16 operand
 * is widened, updated in fp32 and stored rounded to nearest even once its block is done (from
 * *_new, this block's fp32 values); this step's update uses the unrounded values. */
static inline void block_f32(float *p, float *m, float *v, const float *g, int64_t i0, int64_t i1,
                             const adamw_step_t *c) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float gi = g[i] * c->grad_scale;
        float mi = c->b1 * m[i] + (1.0f - c->b1) * gi, vi = c->b2 * v[i] + (1.0f - c->b2) * gi * gi;
        m[i] = mi, v[i] = vi;
        p[i] = p[i] * c->decay - c->step_size * mi / (sqrtf(vi) / c->bc2_sqrt + c->eps);
    }
}

static inline void block_m16(float *p, bf16_t *m16, float *m_new, float *v, const float *g, int64_t i0, int64_t i1,
                             const adamw_step_t *c) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float gi = g[i] * c->grad_scale;
        float mi = c->b1 * bf16_to_f32(m16[i]) + (1.0f - c->b1) * gi, vi = c->b2 * v[i] + (1.0f - c->b2) * gi * gi;
        m_new[i - i0] = mi, v[i] = vi;
        p[i] = p[i] * c->decay - c->step_size * mi / (sqrtf(vi) / c->bc2_sqrt + c->eps);
    }
    bf16_from_f32_block(m16 + i0, m_new, i1 - i0);
}

/* p16[i0, i1) = stochastic bf16 of p_new (stochastic rounding's draws: 16 bits of the hash of
 * the value's global index index0 + i, keyed by the run's seed and the step). */
static inline void store_stochastic(bf16_t *p16, const float *p_new, int64_t i0, int64_t i1, uint32_t key,
                                    int64_t index0) {
    uint64_t first = (uint64_t)(index0 + i0);
    /* The high half of the index keys the hash once a block (it changes at most once in one). */
    uint32_t key_hi = bf16_hash32(key ^ (uint32_t)(first >> 32)), lo0 = (uint32_t)first;
    if ((uint64_t)lo0 + (uint64_t)(i1 - i0) > 0x100000000ull) { /* the low half wraps here: split */
        int64_t split = i0 + (int64_t)(0x100000000ull - lo0);
        store_stochastic(p16, p_new, i0, split, key, index0);
        store_stochastic(p16, p_new, split, i1, key, index0);
        return;
    }
#pragma omp simd
    for (int64_t i = i0; i < i1; i++)
        p16[i] = bf16_from_f32_stochastic(p_new[i - i0], bf16_hash32((lo0 + (uint32_t)(i - i0)) ^ key_hi));
}

/* One weight of the bf16-weight update: m, v and p in fp32 from the widened values. */
static inline void w16_element(float gi, float m_old, bf16_t v_old, bf16_t p_old, const adamw_step_t *c, float *mi,
                               float *vi, float *pi) {
    *mi = c->b1 * m_old + (1.0f - c->b1) * gi;
    *vi = c->b2 * bf16_to_f32(v_old) + (1.0f - c->b2) * gi * gi;
    *pi = bf16_to_f32(p_old) * c->decay - c->step_size * *mi / (sqrtf(*vi) / c->bc2_sqrt + c->eps);
}

/* weight_dtype=bfloat16: p and v in bf16, m in fp32 (m) or bf16 (m16; the other NULL). Each
 * value is rounded to nearest as the loop stores it: with separate rounding passes over the
 * block (read back from L1) build/bench/adamw_mu read the update at 1.78x and 1.70x the
 * fp32-master update's speed, this way at 1.91x and 1.75x, in runs alternated old, new, old, new
 * (Zen 5, 2026-12-07; the bytes alone would give 1.875x). With key != 0, p is rounded
 * stochastically from p_new (store_stochastic). */
static inline void block_w16(bf16_t *p16, float *m, bf16_t *m16, bf16_t *v16, float *p_new, const float *g,
                             int64_t i0, int64_t i1, const adamw_step_t *c, uint32_t key, int64_t index0) {
    float mi, vi, pi;
    if (m16 && !key) {
#pragma omp simd private(mi, vi, pi)
        for (int64_t i = i0; i < i1; i++) {
            w16_element(g[i] * c->grad_scale, bf16_to_f32(m16[i]), v16[i], p16[i], c, &mi, &vi, &pi);
            m16[i] = bf16_from_f32(mi), v16[i] = bf16_from_f32(vi), p16[i] = bf16_from_f32(pi);
        }
    } else if (!key) {
#pragma omp simd private(mi, vi, pi)
        for (int64_t i = i0; i < i1; i++) {
            w16_element(g[i] * c->grad_scale, m[i], v16[i], p16[i], c, &mi, &vi, &pi);
            m[i] = mi, v16[i] = bf16_from_f32(vi), p16[i] = bf16_from_f32(pi);
        }
    } else if (m16) {
#pragma omp simd private(mi, vi, pi)
        for (int64_t i = i0; i < i1; i++) {
            w16_element(g[i] * c->grad_scale, bf16_to_f32(m16[i]), v16[i], p16[i], c, &mi, &vi, &pi);
            m16[i] = bf16_from_f32(mi), v16[i] = bf16_from_f32(vi), p_new[i - i0] = pi;
        }
    } else {
#pragma omp simd private(mi, vi, pi)
        for (int64_t i = i0; i < i1; i++) {
            w16_element(g[i] * c->grad_scale, m[i], v16[i], p16[i], c, &mi, &vi, &pi);
            m[i] = mi, v16[i] = bf16_from_f32(vi), p_new[i - i0] = pi;
        }
    }
    if (key) store_stochastic(p16, p_new, i0, i1, key, index0);
}

/* One pass over n parameters: p and v in fp32 or bf16 (p16, v16; the fp32 pointer NULL), m in
 * fp32 or bf16 (m16), in blocks small enough that the bf16 stores read their fp32 values back
 * from L1, not memory. */
static void update(float *p, bf16_t *p16, float *m, bf16_t *m16, float *v, bf16_t *v16, const float *g, int64_t n,
                   int64_t step, float grad_scale, const adamw_hparams_t *h, bf16_t *p_bf16,
                   const adamw_rounding_t *rounding) {
    const adamw_step_t c = step_constants(h, step, grad_scale);
    /* Stochastic rounding's key for this step (never 0, which means to nearest). */
    uint32_t key = 0;
    int64_t index0 = 0;
    if (rounding && rounding->stochastic) {
        key = bf16_hash32(rounding->seed ^ bf16_hash32((uint32_t)step ^ 0x9e3779b9u)) | 1u;
        index0 = rounding->index0;
    }
    enum { BLOCK = 2048 };
    int64_t nblocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel
    {
        float p_new[BLOCK], m_new[BLOCK]; /* a block's new p (stochastic rounding) or m (bf16 m) */
#pragma omp for schedule(static) nowait
        for (int64_t b = 0; b < nblocks; b++) {
            int64_t i0 = b * BLOCK, i1 = i0 + BLOCK < n ? i0 + BLOCK : n;
            if (p16) block_w16(p16, m, m16, v16, p_new, g, i0, i1, &c, key, index0);
            else if (m16) block_m16(p, m16, m_new, v, g, i0, i1, &c);
            else block_f32(p, m, v, g, i0, i1, &c);
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
    update(p, NULL, m, NULL, v, NULL, g, n, step, grad_scale, h, p_bf16, NULL);
}

void adamw_update_m16(float *p, bf16_t *m, float *v, const float *g, int64_t n, int64_t step,
                      float grad_scale, const adamw_hparams_t *h, bf16_t *p_bf16) {
    update(p, NULL, NULL, m, v, NULL, g, n, step, grad_scale, h, p_bf16, NULL);
}

void adamw_update_w16(bf16_t *p, float *m, bf16_t *m16, bf16_t *v, const float *g, int64_t n, int64_t step,
                      float grad_scale, const adamw_hparams_t *h, const adamw_rounding_t *rounding) {
    update(NULL, p, m, m16, NULL, v, g, n, step, grad_scale, h, NULL, rounding);
}
