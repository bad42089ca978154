#include "kernels/attention.h"

#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_internal.h"
#include "kernels/microgemm.h"
#include "kernels/vecmath.h"

/* Scratch, per (batch, kv head), three [S·HD] panels: Kᵀ as [HD, S] (the score GEMM's B),
 * V (forward: the P·V GEMM's B) or Vᵀ (backward: dP = dO·Vᵀ), and K (backward: dQ = dS·K),
 * each packed contiguous. In q/k/v themselves a head's rows sit a whole fused row apart
 * (16 KiB for qwen3-0.6b), so every row of a panel would land in the same L1 set and evict
 * the others; packed, they stream. Then per thread two [ATTN_QBLOCK, S] strips
 * (probabilities and their gradient) and, for the same reason, the query block and its
 * output gradient packed as [ATTN_QBLOCK, HD] (backward). */
static int64_t per_thread_floats(const attn_shape_t *a) { return 2 * ATTN_QBLOCK * a->S + 2 * ATTN_QBLOCK * a->HD; }

int64_t attention_scratch_floats(const attn_shape_t *a, int num_threads) {
    return 3 * a->B * a->KV * a->HD * a->S + (int64_t)num_threads * per_thread_floats(a);
}

static float *panel_of(float *scratch, const attn_shape_t *a, int which, int64_t b, int64_t kvh) {
    return scratch + ((int64_t)which * a->B * a->KV + b * a->KV + kvh) * a->HD * a->S;
}
static float *kt_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) { return panel_of(scratch, a, 0, b, kvh); }
/* V (forward) or Vᵀ (backward) */
static float *v_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) { return panel_of(scratch, a, 1, b, kvh); }
static float *kc_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) { return panel_of(scratch, a, 2, b, kvh); }
static float *strips_of(float *scratch, const attn_shape_t *a) {
    return scratch + 3 * a->B * a->KV * a->HD * a->S + (int64_t)omp_get_thread_num() * per_thread_floats(a);
}

/* dst[HD, S] = src rows [S, HD] (row stride ld) transposed. */
static void transpose_head(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD) {
    for (int64_t s0 = 0; s0 < S; s0 += 16)
        for (int64_t d = 0; d < HD; d++)
            for (int64_t s = s0; s < s0 + 16 && s < S; s++) dst[d * S + s] = src[s * ld + d];
}

void attention_copy_rows(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD) {
    for (int64_t s = 0; s < S; s++) memcpy(dst + s * HD, src + s * ld, (size_t)HD * sizeof(float));
}

/* Forward packs Kᵀ and V; backward Kᵀ, Vᵀ and K. */
static void pack_kv(float *scratch, const attn_shape_t *a, const float *k, int64_t ld_k,
                    const float *v, int64_t ld_v, bool backward) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t kvh = 0; kvh < a->KV; kvh++) {
            const float *kh = k + b * a->S * ld_k + kvh * a->HD, *vh = v + b * a->S * ld_v + kvh * a->HD;
            transpose_head(kt_of(scratch, a, b, kvh), kh, ld_k, a->S, a->HD);
            if (backward) {
                transpose_head(v_of(scratch, a, b, kvh), vh, ld_v, a->S, a->HD);
                attention_copy_rows(kc_of(scratch, a, b, kvh), kh, ld_k, a->S, a->HD);
            } else {
                attention_copy_rows(v_of(scratch, a, b, kvh), vh, ld_v, a->S, a->HD);
            }
        }
}

void attention_softmax_rows(float *strip, int64_t ld, int64_t i0, int64_t nq, int64_t kend, float scale,
                            float *lse_out, const float *lse_in) {
    for (int64_t r = 0; r < nq; r++) {
        float *row = strip + r * ld;
        int64_t visible = i0 + r + 1;
        float shift;
        if (lse_out) {
            float m = -FLT_MAX;
            for (int64_t j = 0; j < visible; j++) m = row[j] > m ? row[j] : m;
            shift = m * scale;
        } else {
            shift = lse_in[i0 + r];
        }
        double sum = 0.0;
        int64_t j = 0;
#if defined(__AVX512F__)
        const __m512 sh = _mm512_set1_ps(shift), sc = _mm512_set1_ps(scale);
        __m512 acc = _mm512_setzero_ps();
        for (; j + 16 <= visible; j += 16) {
            __m512 e = exp512_ps(_mm512_fmsub_ps(_mm512_loadu_ps(row + j), sc, sh));
            _mm512_storeu_ps(row + j, e);
            acc = _mm512_add_ps(acc, e);
        }
        sum = _mm512_reduce_add_ps(acc);
#endif
        for (; j < visible; j++) {
            row[j] = expf(row[j] * scale - shift);
            sum += row[j];
        }
        if (visible < kend) memset(row + visible, 0, (size_t)(kend - visible) * sizeof(float));
        if (lse_out) {
            lse_out[i0 + r] = shift + (float)log(sum);
            float inv = (float)(1.0 / sum);
            for (j = 0; j < visible; j++) row[j] *= inv;
        }
    }
}

void attention_forward(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                       const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                       const attn_shape_t *a, float *scratch) {
    const int64_t B = a->B, S = a->S, H = a->H, HD = a->HD, group = a->H / a->KV;
    const int64_t qblocks = (S + ATTN_QBLOCK - 1) / ATTN_QBLOCK;
    const float scale = 1.0f / sqrtf((float)HD);
    pack_kv(scratch, a, k, ld_k, v, ld_v, false);
    /* Later query blocks see more keys: hand them out dynamically, longest first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * qblocks; task++) {
        int64_t qb = qblocks - 1 - task % qblocks, bh = task / qblocks;
        int64_t b = bh / H, h = bh % H, kvh = h / group;
        int64_t i0 = qb * ATTN_QBLOCK, nq = S - i0 < ATTN_QBLOCK ? S - i0 : ATTN_QBLOCK;
        int64_t kend = i0 + nq;
        float *strip = strips_of(scratch, a);
        const float *qp = q + (b * S + i0) * ld_q + h * HD;
        microgemm(nq, kend, HD, scale, qp, ld_q, 1, kt_of(scratch, a, b, kvh), S, strip, S, false);
        attention_softmax_rows(strip, S, i0, nq, kend, 1.0f, lse + (b * H + h) * S, NULL);
        microgemm(nq, HD, kend, 1.0f, strip, S, 1, v_of(scratch, a, b, kvh), HD,
                  out + (b * S + i0) * ld_out + h * HD, ld_out, false);
    }
}

void attention_backward(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                        const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                        const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                        const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch) {
    const int64_t B = a->B, S = a->S, H = a->H, KV = a->KV, HD = a->HD, group = a->H / a->KV;
    const int64_t qblocks = (S + ATTN_QBLOCK - 1) / ATTN_QBLOCK;
    const float scale = 1.0f / sqrtf((float)HD);
    pack_kv(scratch, a, k, ld_k, v, ld_v, true);
    /* One task per (batch, kv head): it alone writes that head's dk and dv, summing over its
     * query heads and blocks in a fixed order, so no atomics and the same bits for any
     * thread count. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KV; task++) {
        int64_t b = task / KV, kvh = task % KV;
        float *p = strips_of(scratch, a), *dp = p + ATTN_QBLOCK * S;
        float *q_pack = dp + ATTN_QBLOCK * S, *dout_pack = q_pack + ATTN_QBLOCK * HD;
        float *dkp = dk + b * S * ld_dk + kvh * HD, *dvp = dv + b * S * ld_dv + kvh * HD;
        for (int64_t s = 0; s < S; s++) {
            memset(dkp + s * ld_dk, 0, (size_t)HD * sizeof(float));
            memset(dvp + s * ld_dv, 0, (size_t)HD * sizeof(float));
        }
        const float *kp = kc_of(scratch, a, b, kvh);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *row_lse = lse + (b * H + h) * S;
            for (int64_t qb = 0; qb < qblocks; qb++) {
                int64_t i0 = qb * ATTN_QBLOCK, nq = S - i0 < ATTN_QBLOCK ? S - i0 : ATTN_QBLOCK;
                int64_t kend = i0 + nq;
                const float *op = out + (b * S + i0) * ld_out + h * HD;
                attention_copy_rows(q_pack, q + (b * S + i0) * ld_q + h * HD, ld_q, nq, HD);
                attention_copy_rows(dout_pack, dout + (b * S + i0) * ld_dout + h * HD, ld_dout, nq, HD);
                const float *qp = q_pack, *dop = dout_pack;
                microgemm(nq, kend, HD, scale, qp, HD, 1, kt_of(scratch, a, b, kvh), S, p, S, false);
                attention_softmax_rows(p, S, i0, nq, kend, 1.0f, NULL, row_lse);
                microgemm(nq, kend, HD, 1.0f, dop, HD, 1, v_of(scratch, a, b, kvh), S, dp, S, false);
                for (int64_t r = 0; r < nq; r++) {
                    float di = 0.0f; /* Σ dO·O = Σ_j P·dP for this row */
                    for (int64_t d = 0; d < HD; d++) di += dop[r * HD + d] * op[r * ld_out + d];
                    float *prow = p + r * S, *dprow = dp + r * S;
#pragma omp simd
                    for (int64_t j = 0; j < kend; j++) dprow[j] = prow[j] * (dprow[j] - di);
                }
                microgemm(nq, HD, kend, scale, dp, S, 1, kp, HD, dq + (b * S + i0) * ld_dq + h * HD, ld_dq, false);
                microgemm(kend, HD, nq, scale, dp, 1, S, qp, HD, dkp, ld_dk, true);
                microgemm(kend, HD, nq, 1.0f, p, 1, S, dop, HD, dvp, ld_dv, true);
            }
        }
    }
}

void attention_forward_naive(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                             const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                             const attn_shape_t *a) {
    const int64_t S = a->S, HD = a->HD, group = a->H / a->KV;
    double *w = malloc((size_t)S * sizeof(double));
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t i = 0; i < S; i++) {
                const float *qi = q + (b * S + i) * ld_q + h * HD;
                double m = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    const float *kj = k + (b * S + j) * ld_k + (h / group) * HD;
                    double s = 0.0;
                    for (int64_t d = 0; d < HD; d++) s += (double)qi[d] * kj[d];
                    w[j] = s / sqrt((double)HD);
                    m = w[j] > m ? w[j] : m;
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(w[j] - m);
                lse[(b * a->H + h) * S + i] = (float)(m + log(sum));
                float *o = out + (b * S + i) * ld_out + h * HD;
                for (int64_t d = 0; d < HD; d++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j <= i; j++)
                        acc += exp(w[j] - m) / sum * v[(b * S + j) * ld_v + (h / group) * HD + d];
                    o[d] = (float)acc;
                }
            }
    free(w);
}
