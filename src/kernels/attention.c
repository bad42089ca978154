#include "kernels/attention.h"

#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_internal.h"
#include "kernels/microgemm.h"
#include "kernels/transpose.h"
#include "kernels/vecmath.h"

/* Scratch, per (batch, kv head), three panels holding Kᵀ (the score GEMM's B), V (forward:
 * the P·V GEMM's B) or Vᵀ (backward: dP = dO·Vᵀ), and K (backward: dQ = dS·K). Each is stored
 * as a GEMM's packed B: column panels of 32, [N/32][K][32], so the micro-kernel's walk down k
 * reads 128 contiguous bytes per step. Read in place, a head's rows sit a fused row apart
 * (16 KiB for qwen3-0.6b) and Kᵀ's rows S floats apart: every step of the walk landed on
 * another page and in the same L1 set, and the kernel ran at half its rate.
 * Then per thread: the query heads of one kv head (GQA's group) are stacked, so each block
 * product has group·qblock rows against that kv head's K or V (twice the rows per call
 * for qwen3's group of 2, the same keys read once): two [group·qblock, S] strips
 * (probabilities and their gradient), and the stacked query block, output gradient and
 * output [group·qblock, HD]; in backward also the stacked query block and output gradient
 * transposed, [HD, group·qblock], and the kv head's dK and dV accumulators, [HD, ld_s] each
 * (micro-GEMM; block_tn_acc) or [S, HD] (library). The strips' row stride ld_s is S rounded up
 * to 16, plus 16 floats: the library's dK and dV products walk the strips down a column, and
 * at a stride of exactly 4 KiB every row maps to one L1 set; 64 bytes more puts consecutive
 * rows in consecutive sets (and the transposed accumulators' rows likewise). */
enum { PANEL = 32 };
static int64_t strided_s(int64_t S) { return (S + 15) / 16 * 16 + 16; }
static int64_t panel_floats(const attn_shape_t *a) {
    return (a->HD + PANEL - 1) / PANEL * PANEL * ((a->S + PANEL - 1) / PANEL * PANEL);
}
static int64_t qblock_of(const attn_shape_t *a) { return a->qblock > 0 ? a->qblock : ATTN_QBLOCK; }
static int64_t kchunk_of(const attn_shape_t *a) { return a->kchunk > 0 ? a->kchunk : ATTN_KCHUNK; }
static int64_t stack_rows(const attn_shape_t *a) { return a->H / a->KV * qblock_of(a); }
static int64_t per_thread_floats(const attn_shape_t *a) {
    return 2 * stack_rows(a) * strided_s(a->S) + 5 * stack_rows(a) * a->HD + 2 * strided_s(a->S) * a->HD +
           stack_rows(a);
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
        int64_t d0 = 0;
#if VF_LANES
        /* Lane-square blocks through registers: element by element, every read was a column
         * step, a fused row (16 KiB) on, and the packing took 3-4% of the kernels' time. */
        for (; d0 + VF_LANES <= HD; d0 += VF_LANES)
            for (int64_t sb = 0; sb < PANEL; sb += VF_LANES) {
                vf r[VF_LANES];
                for (int i = 0; i < VF_LANES; i++)
                    r[i] = s0 + sb + i < S ? vf_load(src + (s0 + sb + i) * ld + d0) : vf_zero();
                vf_transpose(r);
                for (int j = 0; j < VF_LANES; j++) vf_store(panel + (d0 + j) * PANEL + sb, r[j]);
            }
#endif
        for (int64_t d = d0; d < HD; d++)
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

/* The forward's softmax of one row, raw scores for keys [0, kend) of which the first `visible`
 * are seen: exp(scale·s − max) left unnormalised, the masked rest zeroed; returns 1/Σ through
 * *inv_sum and the lse (in scaled units) through *lse_out. With dst16 the probabilities go to
 * dst16 in bf16 instead of back into the row, which is then only read: the P of a bf16 P·V
 * product, without a pass that rereads an fp32 strip. */
static void softmax_row(float *row, bf16_t *dst16, int64_t visible, int64_t kend, float scale, float *lse_out,
                        float *inv_sum) {
    int64_t j = 0;
    float m = -FLT_MAX;
#if VF_LANES
    vf vm = vf_set1(-FLT_MAX);
    for (; j + VF_LANES <= visible; j += VF_LANES) vm = vf_max(vm, vf_load(row + j));
    m = vf_reduce_max(vm);
#endif
    for (; j < visible; j++) m = row[j] > m ? row[j] : m;
    const float shift = m * scale;
    double sum = 0.0;
    j = 0;
#if VF_LANES
    const vf sh = vf_set1(shift), sc = vf_set1(scale);
    vf acc = vf_zero();
    for (; j + VF_LANES <= visible; j += VF_LANES) {
        vf e = vf_exp(vf_fmsub(vf_load(row + j), sc, sh));
        if (dst16) vf_store_bf16_normal(dst16 + j, e);
        else vf_store(row + j, e);
        acc = vf_add(acc, e);
    }
    if (j < visible) { /* the row's last keys in one vector: a scalar tail of expf was a sixth of it */
        const int64_t n = visible - j;
        vf e = vf_exp_affine_n(row + j, n, sc, sh);
        if (dst16) {
            bf16_t last[VF_LANES];
            vf_store_bf16_normal(last, e);
            memcpy(dst16 + j, last, (size_t)n * sizeof *dst16);
        } else {
            vf_store_n(row + j, e, n);
        }
        acc = vf_add(acc, e);
        j = visible;
    }
    sum = vf_reduce_add(acc);
#endif
    for (; j < visible; j++) {
        float e = expf(row[j] * scale - shift);
        if (dst16) dst16[j] = bf16_from_f32(e);
        else row[j] = e;
        sum += e;
    }
    if (visible < kend) {
        if (dst16) memset(dst16 + visible, 0, (size_t)(kend - visible) * sizeof(bf16_t));
        else memset(row + visible, 0, (size_t)(kend - visible) * sizeof(float));
    }
    *lse_out = shift + (float)log(sum);
    *inv_sum = (float)(1.0 / sum);
}

void attention_softmax_rows_to_bf16(bf16_t *dst, int64_t ld_dst, const float *strip, int64_t ld, int64_t i0,
                                    int64_t nq, int64_t kend, float scale, float *lse_out, float *row_inv_sum) {
    for (int64_t r = 0; r < nq; r++)
        softmax_row((float *)(strip + r * ld), dst + r * ld_dst, i0 + r + 1, kend, scale, lse_out + i0 + r,
                    row_inv_sum + r);
}

void attention_p_ds_chunk(float *p, float *ds, const float *scores, const float *dp, int64_t j0, int64_t n,
                          int64_t visible, float score_scale, float lse, float ds_scale, float di) {
    const int64_t j1 = j0 + n, vis = visible < j1 ? visible : j1;
    int64_t j = j0;
#if VF_LANES
    const vf sh = vf_set1(lse), sc = vf_set1(score_scale);
    for (; j + VF_LANES <= vis; j += VF_LANES) vf_store(p + j - j0, vf_exp(vf_fmsub(vf_load(scores + j), sc, sh)));
    if (j < vis) { /* the last keys in one vector, as the forward's softmax takes them */
        vf_store_n(p + j - j0, vf_exp_affine_n(scores + j, vis - j, sc, sh), vis - j);
        j = vis;
    }
#endif
    for (; j < vis; j++) p[j - j0] = expf(scores[j] * score_scale - lse);
    const int64_t seen = vis > j0 ? vis - j0 : 0;
#pragma omp simd
    for (int64_t i = 0; i < seen; i++) ds[i] = ds_scale * p[i] * (dp[j0 + i] - di);
    /* Masked keys' dP may never have been computed (the fp32 kernel skips them): written as
     * zeros, not as 0·(dP − Di). */
    for (int64_t i = seen; i < n; i++) p[i] = ds[i] = 0.0f;
}

float attention_row_dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if VF_LANES
    /* In lanes, then the lanes summed: in order, one dependent add per element was 4 cycles
     * each, 8% of the bf16 backward. */
    vf acc = vf_zero();
    for (; i + VF_LANES <= n; i += VF_LANES) acc = vf_fmadd(vf_load(a + i), vf_load(b + i), acc);
    sum = vf_reduce_add(acc);
#endif
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

void attention_scale_rows(float *rows, int64_t ld, int64_t nq, int64_t HD, const float *row_scale) {
    for (int64_t r = 0; r < nq; r++)
#pragma omp simd
        for (int64_t d = 0; d < HD; d++) rows[r * ld + d] *= row_scale[r];
}

/* The causal mask inside a query block [i0, i0 + nq): key panel [j, j + DIAG) (j a multiple
 * of DIAG past i0) is seen only by the block's rows at positions ≥ j. The block's rows are
 * stacked in sub-blocks that end where a panel begins (absolute positions a multiple of DIAG),
 * each sub-block head after head: [h0 rows of sub-block 0 | h1 rows of sub-block 0 | h0 rows
 * of sub-block 1 | ...]. So the rows that see panel j are one contiguous tail of the stack,
 * from stacked row group·(j − i0) on, and every product skips the rest: at the default
 * 64-query blocks the masked area computed per block falls from half the 64 × 64 diagonal to
 * two 32 × 32 triangles (the products' work at S = 1024 from 1.061× the causal half to 1.030×;
 * at S = 256 from 1.24× to 1.12×). */
enum { DIAG = PANEL };
typedef struct qblock_rows {
    int64_t i0, nq, group;
} qblock_rows_t;

/* The first panel start past i0: keys below it are seen by every row of the block. */
static int64_t first_masked_panel(const qblock_rows_t *qb) { return qb->i0 / DIAG * DIAG + DIAG; }

/* Keys [j, end) are one segment: up to the first masked panel, or one panel past it. */
static int64_t segment_end(const qblock_rows_t *qb, int64_t j, int64_t kb) {
    int64_t p0 = first_masked_panel(qb), e = j < p0 ? p0 : j + DIAG;
    return e < kb ? e : kb;
}

/* The first stacked row that sees keys from segment start j on. */
static int64_t segment_first_row(const qblock_rows_t *qb, int64_t j) {
    return j < first_masked_panel(qb) ? 0 : qb->group * (j - qb->i0);
}

/* Stacked row r's head within the group (*g) and position within the block (*ri). */
static void stacked_row(const qblock_rows_t *qb, int64_t r, int64_t *g, int64_t *ri) {
    int64_t w0 = first_masked_panel(qb) - qb->i0;
    if (w0 > qb->nq) w0 = qb->nq;
    if (r < qb->group * w0) {
        *g = r / w0, *ri = r % w0;
        return;
    }
    r -= qb->group * w0;
    int64_t ra = w0 + r / (qb->group * DIAG) * DIAG, w = qb->nq - ra < DIAG ? qb->nq - ra : DIAG;
    int64_t within = r - (ra - w0) * qb->group;
    *g = within / w, *ri = ra + within % w;
}

/* Rows [i0, i0 + nq) of query heads h0 .. h0 + group − 1 (src row row0 + r is position i0 + r),
 * stacked as above into dst [group·nq, HD]. */
static void stack_heads(float *dst, const float *src, int64_t ld, int64_t row0, int64_t h0, const qblock_rows_t *qb,
                        int64_t HD) {
    for (int64_t r = 0; r < qb->group * qb->nq; r++) {
        int64_t g, ri;
        stacked_row(qb, r, &g, &ri);
        memcpy(dst + r * HD, src + (row0 + ri) * ld + (h0 + g) * HD, (size_t)HD * sizeof(float));
    }
}

/* The inverse: stacked src [group·nq, HD] back to each head's rows of dst. */
static void unstack_heads(float *dst, int64_t ld, const float *src, int64_t row0, int64_t h0, const qblock_rows_t *qb,
                          int64_t HD) {
    for (int64_t r = 0; r < qb->group * qb->nq; r++) {
        int64_t g, ri;
        stacked_row(qb, r, &g, &ri);
        memcpy(dst + (row0 + ri) * ld + (h0 + g) * HD, src + r * HD, (size_t)HD * sizeof(float));
    }
}

/* C[M, N] = A[M, K]·Bᵀ against keys [k0, k0 + N) (k0 a multiple of PANEL), where B is [S, K]:
 * through the library (B as K or V rows, [S, HD]) or the micro-GEMM (B as its packed Kᵀ or Vᵀ
 * panels). alpha applies to the micro-GEMM only: the library path folds the scale into the
 * softmax. */
static void block_nt(gemm_ctx_t *g, int64_t M, int64_t k0, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *rows, const float *panels, float *C, int64_t ldc) {
    if (g) gemm_f32(g, false, true, M, N, K, A, lda, rows + k0 * K, K, C, ldc, false);
    else microgemm_packed_b(M, N, K, alpha, A, lda, 1, panels + k0 * K, K * PANEL, C, ldc, false);
}

/* C[M, HD] (+)= A[M, K]·B[K, HD] over keys [k0, k0 + K) of the K or V rows [S, HD] (library)
 * or their packed panels (micro-GEMM, S·PANEL per panel). */
static void block_nn(gemm_ctx_t *g, int64_t M, int64_t HD, int64_t k0, int64_t K, int64_t S, const float *A,
                     int64_t lda, const float *rows_or_panels, float *C, int64_t ldc, bool accumulate) {
    if (g) gemm_f32(g, false, false, M, HD, K, A, lda, rows_or_panels + k0 * HD, HD, C, ldc, accumulate);
    else microgemm_packed_b(M, HD, K, 1.0f, A, lda, 1, rows_or_panels + k0 * PANEL, S * PANEL, C, ldc, accumulate);
}

/* dK and dV of a key chunk: C[kw, HD] += Aᵀ·B with A [M, kw] (the dS or P strip, row stride
 * lda) and B [M, HD] (the stacked Q or dO). The library runs it in that form. The micro-GEMM
 * runs its transpose in the plain form instead, Cᵀ[HD, kw] += Bᵀ·A with Bᵀ the block's
 * transposed stack [HD, M] (row stride ldbt) and C held transposed (row stride ldc): read as Aᵀ,
 * each step of the walk down M broadcasts from another strip row, and the two products ran
 * 1.32× slower than the score products of the same size. */
static void block_tn_acc(gemm_ctx_t *g, int64_t kw, int64_t HD, int64_t M, const float *A, int64_t lda,
                         const float *B, const float *B_transposed, int64_t ldbt, float *C, int64_t ldc) {
    if (g) gemm_f32(g, true, false, kw, HD, M, A, lda, B, HD, C, ldc, true);
    else microgemm(HD, kw, M, 1.0f, B_transposed, ldbt, 1, A, lda, C, ldc, true);
}

void attention_forward(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                       const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                       const attn_shape_t *a, float *scratch, gemm_ctx_t *const *thread_gemm) {
    const int64_t B = a->B, S = a->S, H = a->H, KV = a->KV, HD = a->HD, group = a->H / a->KV;
    const int64_t QB = qblock_of(a), qblocks = (S + QB - 1) / QB;
    const float scale = 1.0f / sqrtf((float)HD);
    const int64_t ls = strided_s(S);
    pack_kv(scratch, a, k, ld_k, v, ld_v, false, thread_gemm != NULL);
    /* One task per (batch, kv head, query block), the group's heads stacked. Later query
     * blocks see more keys: hand them out dynamically, longest first. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KV * qblocks; task++) {
        int64_t qb = qblocks - 1 - task % qblocks, bk = task / qblocks;
        int64_t b = bk / KV, kvh = bk % KV, h0 = kvh * group;
        int64_t i0 = qb * QB, nq = S - i0 < QB ? S - i0 : QB;
        int64_t kend = i0 + nq, rows = group * nq;
        gemm_ctx_t *g = thread_gemm ? thread_gemm[omp_get_thread_num()] : NULL;
        float *strip = strips_of(scratch, a), *q_stack = strip + 2 * stack_rows(a) * ls;
        float *o_stack = q_stack + 2 * stack_rows(a) * HD;
        const qblock_rows_t qr = {i0, nq, group};
        stack_heads(q_stack, q, ld_q, b * S + i0, h0, &qr, HD);
        for (int64_t j = 0, e; j < kend; j = e) {
            e = segment_end(&qr, j, kend);
            int64_t r0 = segment_first_row(&qr, j);
            block_nt(g, rows - r0, j, e - j, HD, scale, q_stack + r0 * HD, HD, kc_of(scratch, a, b, kvh),
                     kt_of(scratch, a, b, kvh), strip + r0 * ls + j, ls);
        }
        float *inv_sum = strip + stack_rows(a) * ls; /* the second strip is free in forward */
        for (int64_t r = 0; r < rows; r++) { /* per row: its head's lse, its position's causal mask */
            int64_t gi, ri;
            stacked_row(&qr, r, &gi, &ri);
            softmax_row(strip + r * ls, NULL, i0 + ri + 1, kend, g ? scale : 1.0f, lse + (b * H + h0 + gi) * S + i0 + ri,
                        inv_sum + r);
        }
        for (int64_t j = 0, e; j < kend; j = e) {
            e = segment_end(&qr, j, kend);
            int64_t r0 = segment_first_row(&qr, j);
            block_nn(g, rows - r0, HD, j, e - j, S, strip + r0 * ls + j, ls, v_of(scratch, a, b, kvh), o_stack + r0 * HD,
                     HD, j > 0);
        }
        attention_scale_rows(o_stack, HD, rows, HD, inv_sum);
        unstack_heads(out, ld_out, o_stack, b * S + i0, h0, &qr, HD);
    }
}

void attention_backward(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                        const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                        const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                        const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                        gemm_ctx_t *const *thread_gemm) {
    const int64_t B = a->B, S = a->S, H = a->H, KV = a->KV, HD = a->HD, group = a->H / a->KV;
    const int64_t QB = qblock_of(a), qblocks = (S + QB - 1) / QB, KC = kchunk_of(a);
    const float scale = 1.0f / sqrtf((float)HD);
    const int64_t ls = strided_s(S), lc = strided_s(S < KC ? S : KC);
    pack_kv(scratch, a, k, ld_k, v, ld_v, true, thread_gemm != NULL);
    /* One task per (batch, kv head): it alone writes that head's dk and dv, summing over its
     * query blocks in a fixed order, so no atomics and the same bits for any thread count. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KV; task++) {
        int64_t b = task / KV, kvh = task % KV, h0 = kvh * group;
        gemm_ctx_t *g = thread_gemm ? thread_gemm[omp_get_thread_num()] : NULL;
        int64_t max_rows = stack_rows(a);
        float *p = strips_of(scratch, a), *dp = p + max_rows * ls;
        float *q_stack = dp + max_rows * ls, *do_stack = q_stack + max_rows * HD, *dq_stack = do_stack + max_rows * HD;
        /* dK and dV accumulate in contiguous [S, HD] rows (library) or [HD, ls] columns
         * (micro-GEMM, block_tn_acc), copied out at the end: in place their rows sit a fused row
         * apart (16 KiB), and every block product read and wrote C there. */
        float *dkp = dq_stack + max_rows * HD, *dvp = dkp + ls * HD;
        memset(dkp, 0, (size_t)(2 * ls * HD) * sizeof(float));
        /* key k's dK and dV: row k of the [S, HD] rows, or column k of the [HD, ls] columns */
        const int64_t ld_dkv = g ? HD : ls, key_step = g ? HD : 1;
        float *di = dvp + ls * HD; /* the query block's Σ dO·O, one per stacked row */
        float *q_stack_t = di + max_rows, *do_stack_t = q_stack_t + max_rows * HD; /* [HD, rows] */
        const float *kp = kc_of(scratch, a, b, kvh), *vp = v_of(scratch, a, b, kvh), *ktp = kt_of(scratch, a, b, kvh);
        for (int64_t qb = 0; qb < qblocks; qb++) {
            int64_t i0 = qb * QB, nq = S - i0 < QB ? S - i0 : QB;
            int64_t kend = i0 + nq, rows = group * nq;
            const qblock_rows_t qr = {i0, nq, group};
            stack_heads(q_stack, q, ld_q, b * S + i0, h0, &qr, HD);
            stack_heads(do_stack, dout, ld_dout, b * S + i0, h0, &qr, HD);
            if (!g) {
                transpose_f32_serial(q_stack_t, rows, q_stack, HD, rows, HD);
                transpose_f32_serial(do_stack_t, rows, do_stack, HD, rows, HD);
            }
            for (int64_t r = 0; r < rows; r++) {
                int64_t gi, ri;
                stacked_row(&qr, r, &gi, &ri);
                di[r] = attention_row_dot(do_stack + r * HD, out + (b * S + i0 + ri) * ld_out + (h0 + gi) * HD, HD);
            }
            /* Keys KC at a time, so the strips a chunk's five products read and write are
             * [rows × KC] (72 KiB each for qwen3's 128 stacked rows at 128 keys) where whole
             * rows of keys were [rows × S] (512 KiB at S = 1024): dK and dV walk them down a
             * column. Per chunk: scores and dP = dO·Vᵀ, then row by row, in place, P (recomputed
             * from the lse) and dS = P∘(dP − Σ dO·O), times the score scale here so the products
             * below need no alpha (the micro-GEMM's scores already carry it); then dQ += dS·K,
             * summed over the chunks in order, and the chunk's dK += dSᵀ·Q, dV += Pᵀ·dO. Each
             * product runs segment by segment, on the rows that see the segment's keys: the
             * strips' other entries are never written by a product, and P and dS are zero there. */
            for (int64_t k0 = 0; k0 < kend; k0 += KC) {
                int64_t kw = kend - k0 < KC ? kend - k0 : KC;
                for (int64_t j = k0, e; j < k0 + kw; j = e) {
                    e = segment_end(&qr, j, k0 + kw);
                    int64_t r0 = segment_first_row(&qr, j), col = r0 * lc + j - k0;
                    block_nt(g, rows - r0, j, e - j, HD, scale, q_stack + r0 * HD, HD, kp, ktp, p + col, lc);
                    block_nt(g, rows - r0, j, e - j, HD, 1.0f, do_stack + r0 * HD, HD, vp, vp, dp + col, lc); /* V rows or Vᵀ panels */
                }
                for (int64_t r = 0; r < rows; r++) {
                    int64_t gi, ri;
                    stacked_row(&qr, r, &gi, &ri);
                    /* scores and dP are indexed by key, from k0 on: the chunk's column 0 */
                    attention_p_ds_chunk(p + r * lc, dp + r * lc, p + r * lc - k0, dp + r * lc - k0, k0, kw,
                                         i0 + ri + 1, g ? scale : 1.0f, lse[(b * H + h0 + gi) * S + i0 + ri], scale,
                                         di[r]);
                }
                for (int64_t j = k0, e; j < k0 + kw; j = e) {
                    e = segment_end(&qr, j, k0 + kw);
                    int64_t r0 = segment_first_row(&qr, j), col = r0 * lc + j - k0, m = rows - r0;
                    block_nn(g, m, HD, j, e - j, S, dp + col, lc, kp, dq_stack + r0 * HD, HD, j > 0);
                    block_tn_acc(g, e - j, HD, m, dp + col, lc, q_stack + r0 * HD, q_stack_t + r0, rows,
                                 dkp + j * key_step, ld_dkv);
                    block_tn_acc(g, e - j, HD, m, p + col, lc, do_stack + r0 * HD, do_stack_t + r0, rows,
                                 dvp + j * key_step, ld_dkv);
                }
            }
            unstack_heads(dq, ld_dq, dq_stack, b * S + i0, h0, &qr, HD);
        }
        float *dk_head = dk + b * S * ld_dk + kvh * HD, *dv_head = dv + b * S * ld_dv + kvh * HD;
        if (!g) {
            transpose_f32_serial(dk_head, ld_dk, dkp, ls, HD, S);
            transpose_f32_serial(dv_head, ld_dv, dvp, ls, HD, S);
            continue;
        }
        for (int64_t s = 0; s < S; s++) {
            memcpy(dk_head + s * ld_dk, dkp + s * HD, (size_t)HD * sizeof(float));
            memcpy(dv_head + s * ld_dv, dvp + s * HD, (size_t)HD * sizeof(float));
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
