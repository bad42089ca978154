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

/* Scratch, per (batch, kv head), three panels holding Kᵀ (the score GEMM's B), V (forward:
 * the P·V GEMM's B) or Vᵀ (backward: dP = dO·Vᵀ), and K (backward: dQ = dS·K). Each is stored
 * as a GEMM's packed B: column panels of 32, [N/32][K][32], so the micro-kernel's walk down k
 * reads 128 contiguous bytes per step. Read in place, a head's rows sit a fused row apart
 * (16 KiB for qwen3-0.6b) and Kᵀ's rows S floats apart: every step of the walk landed on
 * another page and in the same L1 set, and the kernel ran at half its rate.
 * Then per thread two [ATTN_QBLOCK, S] strips (probabilities and their gradient) and, for
 * the same reason, the query block and its output gradient packed as [ATTN_QBLOCK, HD]
 * (backward). The strips' row stride ld_s is S rounded up to 16, plus 16 floats: dK and dV
 * walk the strips down a column, and at a stride of exactly 4 KiB every row maps to one L1
 * set; 64 bytes more puts consecutive rows in consecutive sets. */
enum { PANEL = 32 };
static int64_t strided_s(int64_t S) { return (S + 15) / 16 * 16 + 16; }
static int64_t panel_floats(const attn_shape_t *a) {
    return (a->HD + PANEL - 1) / PANEL * PANEL * ((a->S + PANEL - 1) / PANEL * PANEL);
}
static int64_t per_thread_floats(const attn_shape_t *a) {
    return 2 * ATTN_QBLOCK * strided_s(a->S) + 2 * ATTN_QBLOCK * a->HD;
}

int64_t attention_scratch_floats(const attn_shape_t *a, int num_threads) {
    return 3 * a->B * a->KV * panel_floats(a) + (int64_t)num_threads * per_thread_floats(a);
}

static float *panel_of(float *scratch, const attn_shape_t *a, int which, int64_t b, int64_t kvh) {
    return scratch + ((int64_t)which * a->B * a->KV + b * a->KV + kvh) * panel_floats(a);
}
static float *kt_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) { return panel_of(scratch, a, 0, b, kvh); }
/* V (forward) or Vᵀ (backward) */
static float *v_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) { return panel_of(scratch, a, 1, b, kvh); }
static float *kc_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) { return panel_of(scratch, a, 2, b, kvh); }
static float *strips_of(float *scratch, const attn_shape_t *a) {
    return scratch + 3 * a->B * a->KV * panel_floats(a) + (int64_t)omp_get_thread_num() * per_thread_floats(a);
}

/* src rows [S, HD] (row stride ld) as a packed B of shape [HD, S] (its transpose):
 * dst[s/32][d][s%32]; columns past S are zero. */
static void pack_transposed(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD) {
    for (int64_t s0 = 0; s0 < S; s0 += PANEL) {
        float *panel = dst + s0 * HD;
        for (int64_t d = 0; d < HD; d++)
            for (int64_t s = s0; s < s0 + PANEL; s++) panel[d * PANEL + s - s0] = s < S ? src[s * ld + d] : 0.0f;
    }
}

/* src rows [S, HD] (row stride ld) as a packed B of shape [S, HD]: dst[d/32][s][d%32]. */
static void pack_rows(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD) {
    for (int64_t d0 = 0; d0 < HD; d0 += PANEL) {
        float *panel = dst + d0 * S;
        int64_t w = HD - d0 < PANEL ? HD - d0 : PANEL;
        for (int64_t s = 0; s < S; s++) {
            memcpy(panel + s * PANEL, src + s * ld + d0, (size_t)w * sizeof(float));
            if (w < PANEL) memset(panel + s * PANEL + w, 0, (size_t)(PANEL - w) * sizeof(float));
        }
    }
}

/* microgemm with B packed in column panels [N/32][K_total][32], panel_stride = K_total·32. */
static void microgemm_packed_b(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
                               int64_t csa, const float *Bp, int64_t panel_stride, float *C, int64_t ldc,
                               bool accumulate) {
    for (int64_t j0 = 0; j0 < N; j0 += PANEL)
        microgemm(M, N - j0 < PANEL ? N - j0 : PANEL, K, alpha, A, rsa, csa, Bp + j0 / PANEL * panel_stride,
                  PANEL, C + j0, ldc, accumulate);
}

void attention_copy_rows(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD) {
    for (int64_t s = 0; s < S; s++) memcpy(dst + s * HD, src + s * ld, (size_t)HD * sizeof(float));
}

/* For the micro-GEMM: forward packs Kᵀ and V, backward Kᵀ, Vᵀ and K. For a library GEMM
 * (which packs its own operands) K and V are copied as contiguous rows [S, HD] into the K and
 * V panels. */
static void pack_kv(float *scratch, const attn_shape_t *a, const float *k, int64_t ld_k,
                    const float *v, int64_t ld_v, bool backward, bool library) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t kvh = 0; kvh < a->KV; kvh++) {
            const float *kh = k + b * a->S * ld_k + kvh * a->HD, *vh = v + b * a->S * ld_v + kvh * a->HD;
            if (library) {
                attention_copy_rows(kc_of(scratch, a, b, kvh), kh, ld_k, a->S, a->HD);
                attention_copy_rows(v_of(scratch, a, b, kvh), vh, ld_v, a->S, a->HD);
                continue;
            }
            pack_transposed(kt_of(scratch, a, b, kvh), kh, ld_k, a->S, a->HD);
            if (backward) {
                pack_transposed(v_of(scratch, a, b, kvh), vh, ld_v, a->S, a->HD);
                pack_rows(kc_of(scratch, a, b, kvh), kh, ld_k, a->S, a->HD);
            } else {
                pack_rows(v_of(scratch, a, b, kvh), vh, ld_v, a->S, a->HD);
            }
        }
}

void attention_softmax_rows(float *strip, int64_t ld, int64_t i0, int64_t nq, int64_t kend, float scale,
                            float *lse_out, const float *lse_in, float *row_inv_sum) {
    for (int64_t r = 0; r < nq; r++) {
        float *row = strip + r * ld;
        int64_t visible = i0 + r + 1;
        float shift;
        int64_t j = 0;
        if (lse_out) {
            float m = -FLT_MAX;
#if defined(__AVX512F__)
            __m512 vm = _mm512_set1_ps(-FLT_MAX);
            for (; j + 16 <= visible; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(row + j));
            m = _mm512_reduce_max_ps(vm);
#endif
            for (; j < visible; j++) m = row[j] > m ? row[j] : m;
            shift = m * scale;
        } else {
            shift = lse_in[i0 + r];
        }
        double sum = 0.0;
        j = 0;
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
            row_inv_sum[r] = (float)(1.0 / sum);
        }
    }
}

void attention_scale_rows(float *rows, int64_t ld, int64_t nq, int64_t HD, const float *row_scale) {
    for (int64_t r = 0; r < nq; r++)
#pragma omp simd
        for (int64_t d = 0; d < HD; d++) rows[r * ld + d] *= row_scale[r];
}

void attention_forward(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                       const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                       const attn_shape_t *a, float *scratch, gemm_ctx_t *const *thread_gemm) {
    const int64_t B = a->B, S = a->S, H = a->H, HD = a->HD, group = a->H / a->KV;
    const int64_t qblocks = (S + ATTN_QBLOCK - 1) / ATTN_QBLOCK;
    const float scale = 1.0f / sqrtf((float)HD);
    const int64_t ls = strided_s(S);
    pack_kv(scratch, a, k, ld_k, v, ld_v, false, thread_gemm != NULL);
    /* Later query blocks see more keys: hand them out dynamically, longest first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * qblocks; task++) {
        int64_t qb = qblocks - 1 - task % qblocks, bh = task / qblocks;
        int64_t b = bh / H, h = bh % H, kvh = h / group;
        int64_t i0 = qb * ATTN_QBLOCK, nq = S - i0 < ATTN_QBLOCK ? S - i0 : ATTN_QBLOCK;
        int64_t kend = i0 + nq;
        float *strip = strips_of(scratch, a);
        const float *qp = q + (b * S + i0) * ld_q + h * HD;
        float *op = out + (b * S + i0) * ld_out + h * HD;
        float inv_sum[ATTN_QBLOCK];
        if (thread_gemm) {
            gemm_ctx_t *g = thread_gemm[omp_get_thread_num()];
            gemm_f32(g, false, true, nq, kend, HD, qp, ld_q, kc_of(scratch, a, b, kvh), HD, strip, ls, false);
            attention_softmax_rows(strip, ls, i0, nq, kend, scale, lse + (b * H + h) * S, NULL, inv_sum);
            gemm_f32(g, false, false, nq, HD, kend, strip, ls, v_of(scratch, a, b, kvh), HD, op, ld_out, false);
        } else {
            microgemm_packed_b(nq, kend, HD, scale, qp, ld_q, 1, kt_of(scratch, a, b, kvh), HD * PANEL, strip, ls,
                               false);
            attention_softmax_rows(strip, ls, i0, nq, kend, 1.0f, lse + (b * H + h) * S, NULL, inv_sum);
            microgemm_packed_b(nq, HD, kend, 1.0f, strip, ls, 1, v_of(scratch, a, b, kvh), S * PANEL, op, ld_out,
                               false);
        }
        attention_scale_rows(op, ld_out, nq, HD, inv_sum);
    }
}

void attention_backward(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                        const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                        const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                        const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                        gemm_ctx_t *const *thread_gemm) {
    const int64_t B = a->B, S = a->S, H = a->H, KV = a->KV, HD = a->HD, group = a->H / a->KV;
    const int64_t qblocks = (S + ATTN_QBLOCK - 1) / ATTN_QBLOCK;
    const float scale = 1.0f / sqrtf((float)HD);
    const int64_t ls = strided_s(S);
    pack_kv(scratch, a, k, ld_k, v, ld_v, true, thread_gemm != NULL);
    /* One task per (batch, kv head): it alone writes that head's dk and dv, summing over its
     * query heads and blocks in a fixed order, so no atomics and the same bits for any
     * thread count. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KV; task++) {
        int64_t b = task / KV, kvh = task % KV;
        gemm_ctx_t *g = thread_gemm ? thread_gemm[omp_get_thread_num()] : NULL;
        float *p = strips_of(scratch, a), *dp = p + ATTN_QBLOCK * ls;
        float *q_pack = dp + ATTN_QBLOCK * ls, *dout_pack = q_pack + ATTN_QBLOCK * HD;
        float *dkp = dk + b * S * ld_dk + kvh * HD, *dvp = dv + b * S * ld_dv + kvh * HD;
        for (int64_t s = 0; s < S; s++) {
            memset(dkp + s * ld_dk, 0, (size_t)HD * sizeof(float));
            memset(dvp + s * ld_dv, 0, (size_t)HD * sizeof(float));
        }
        const float *kp = kc_of(scratch, a, b, kvh), *vp = v_of(scratch, a, b, kvh), *ktp = kt_of(scratch, a, b, kvh);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *row_lse = lse + (b * H + h) * S;
            for (int64_t qb = 0; qb < qblocks; qb++) {
                int64_t i0 = qb * ATTN_QBLOCK, nq = S - i0 < ATTN_QBLOCK ? S - i0 : ATTN_QBLOCK;
                int64_t kend = i0 + nq;
                const float *op = out + (b * S + i0) * ld_out + h * HD;
                float *dqp = dq + (b * S + i0) * ld_dq + h * HD;
                attention_copy_rows(q_pack, q + (b * S + i0) * ld_q + h * HD, ld_q, nq, HD);
                attention_copy_rows(dout_pack, dout + (b * S + i0) * ld_dout + h * HD, ld_dout, nq, HD);
                const float *qp = q_pack, *dop = dout_pack;
                /* P (recomputed) and dP = dO·Vᵀ */
                if (g) {
                    gemm_f32(g, false, true, nq, kend, HD, qp, HD, kp, HD, p, ls, false);
                    attention_softmax_rows(p, ls, i0, nq, kend, scale, NULL, row_lse, NULL);
                    gemm_f32(g, false, true, nq, kend, HD, dop, HD, vp, HD, dp, ls, false);
                } else {
                    microgemm_packed_b(nq, kend, HD, scale, qp, HD, 1, ktp, HD * PANEL, p, ls, false);
                    attention_softmax_rows(p, ls, i0, nq, kend, 1.0f, NULL, row_lse, NULL);
                    microgemm_packed_b(nq, kend, HD, 1.0f, dop, HD, 1, vp, HD * PANEL, dp, ls, false);
                }
                /* dS = P∘(dP − Σ dO·O), times the score scale here so the products below need
                 * no alpha. */
                for (int64_t r = 0; r < nq; r++) {
                    float di = 0.0f;
                    for (int64_t d = 0; d < HD; d++) di += dop[r * HD + d] * op[r * ld_out + d];
                    float *prow = p + r * ls, *dprow = dp + r * ls;
#pragma omp simd
                    for (int64_t j = 0; j < kend; j++) dprow[j] = scale * prow[j] * (dprow[j] - di);
                }
                /* dQ = dS·K, dK += dSᵀ·Q, dV += Pᵀ·dO */
                if (g) {
                    gemm_f32(g, false, false, nq, HD, kend, dp, ls, kp, HD, dqp, ld_dq, false);
                    gemm_f32(g, true, false, kend, HD, nq, dp, ls, qp, HD, dkp, ld_dk, true);
                    gemm_f32(g, true, false, kend, HD, nq, p, ls, dop, HD, dvp, ld_dv, true);
                } else {
                    microgemm_packed_b(nq, HD, kend, 1.0f, dp, ls, 1, kp, S * PANEL, dqp, ld_dq, false);
                    microgemm(kend, HD, nq, 1.0f, dp, 1, ls, qp, HD, dkp, ld_dk, true);
                    microgemm(kend, HD, nq, 1.0f, p, 1, ls, dop, HD, dvp, ld_dv, true);
                }
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
