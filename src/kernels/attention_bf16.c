/* attention with bf16 block matmuls: the same flash-style blocking as attention.c, but every
 * block product runs through the gemm library with bf16 inputs and fp32 accumulation, so the
 * library picks the fastest bf16 unit of the CPU (AMX tiles where present, else AVX512-BF16
 * dot products). Softmax, lse, dS and every output stay fp32. Each OpenMP thread uses its own
 * gemm context: contexts cache primitives and are not thread-safe; inside a parallel region
 * the library runs a call on the calling thread only. Called without contexts, it hands over
 * to our packed kernel (attention_bf16_packed.c) on AMX tiles or AVX512-BF16 dot products. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/amx.h"
#include "kernels/attention.h"
#include "kernels/attention_internal.h"
#include "kernels/bf16.h"
#include "kernels/dpbf16.h"

/* Query rows per block. Larger than the fp32 kernel's: each block product reorders its B
 * operand (K or V, kend × HD) into the bf16 unit's layout, so the rows sharing that reorder
 * decide how much of the time is the product itself. The cost is the masked half of the
 * diagonal block, computed and thrown away. */
enum { QB = ATTN_QBLOCK_BF16 };

/* Scratch: K and V in bf16 as [S, HD] per (batch, kv head); then per thread the fp32 strips P
 * and dP [QB, S], their bf16 copies, and the bf16 query and output-gradient blocks
 * [QB, HD]. Counted in floats; bf16 regions take half a float an element. */
static int64_t kv_floats(const attn_shape_t *a) { return a->B * a->KV * a->S * a->HD; } /* K16 + V16 */
static int64_t per_thread_floats(const attn_shape_t *a) {
    return 2 * QB * a->S + QB * a->S + QB * a->HD;
}

int64_t attention_bf16_scratch_floats(const attn_shape_t *a, int num_threads) {
    int64_t library = kv_floats(a) + (int64_t)num_threads * per_thread_floats(a);
    int64_t packed = attention_packed_scratch_floats(a, num_threads);
    return library > packed ? library : packed;
}

typedef struct thread_bufs {
    float *p, *dp;          /* [QB, S] fp32 */
    bf16_t *p16, *ds16;     /* [QB, S] */
    bf16_t *q16, *do16;     /* [QB, HD] */
} thread_bufs_t;

static thread_bufs_t thread_bufs(float *scratch, const attn_shape_t *a) {
    float *base = scratch + kv_floats(a) + (int64_t)omp_get_thread_num() * per_thread_floats(a);
    int64_t strip = QB * a->S;
    thread_bufs_t t = {.p = base, .dp = base + strip};
    t.p16 = (bf16_t *)(base + 2 * strip);
    t.ds16 = t.p16 + strip;
    t.q16 = t.ds16 + strip;
    t.do16 = t.q16 + QB * a->HD;
    return t;
}

static bf16_t *k16_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) {
    return (bf16_t *)scratch + (b * a->KV + kvh) * a->S * a->HD;
}
static bf16_t *v16_of(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) {
    return (bf16_t *)scratch + a->B * a->KV * a->S * a->HD + (b * a->KV + kvh) * a->S * a->HD;
}

void attention_rows_to_bf16(bf16_t *dst, int64_t HDp, const float *src, int64_t ld, int64_t rows, int64_t rows_pad,
                            int64_t HD) {
    /* A head's rows sit a whole activation row apart (16 KiB for qwen3-0.6b's q): each its own
     * page, where the hardware prefetcher starts over, so one row at a time waited on memory
     * (perf: the loads were 70% of the rounding, 9% of the AMX forward). Asking for the rows
     * ahead keeps several in flight. */
    enum { AHEAD = 8 };
    for (int64_t r = 0; r < rows_pad; r++) {
        if (r + AHEAD < rows) attention_prefetch_row(src + (r + AHEAD) * ld, HD);
        if (r < rows) {
            bf16_from_f32_block(dst + r * HDp, src + r * ld, HD);
            memset(dst + r * HDp + HD, 0, (size_t)(HDp - HD) * sizeof(bf16_t));
        } else {
            memset(dst + r * HDp, 0, (size_t)HDp * sizeof(bf16_t));
        }
    }
}

static void pack_kv16(float *scratch, const attn_shape_t *a, const float *k, int64_t ld_k, const float *v,
                      int64_t ld_v) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t kvh = 0; kvh < a->KV; kvh++) {
            const float *kh = k + b * a->S * ld_k + kvh * a->HD, *vh = v + b * a->S * ld_v + kvh * a->HD;
            attention_rows_to_bf16(k16_of(scratch, a, b, kvh), a->HD, kh, ld_k, a->S, a->S, a->HD);
            attention_rows_to_bf16(v16_of(scratch, a, b, kvh), a->HD, vh, ld_v, a->S, a->S, a->HD);
        }
}

bool attention_bf16_packed_available(void) { return amx_available() || dpbf16_available(); }

const char *attention_bf16_packed_kind(void) {
    if (amx_available()) return "AMX tiles (stepscope's packed bf16 kernel)";
    if (dpbf16_available()) return "AVX512-BF16 dot products (stepscope's packed bf16 kernel, 8 x 32 register tiles)";
    return "none on this CPU or build";
}

/* thread_gemm NULL selects the packed kernel, which callers choose only where
 * attention_bf16_packed_available(); anywhere else its instructions would fault, so fail with a
 * message instead. */
static bf16_block_unit_t packed_product(void) {
    if (amx_available()) return (bf16_block_unit_t){amx_gemm_configured, true};
    if (dpbf16_available()) return (bf16_block_unit_t){dpbf16_gemm, false};
    fprintf(stderr, "stepscope: internal error: bf16 attention asked for its packed kernel on a CPU or build "
                    "with neither AMX nor AVX512-BF16\n");
    abort();
}

void attention_forward_bf16(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                            const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                            const attn_shape_t *a, float *scratch, gemm_ctx_t *const *thread_gemm) {
    const int64_t B = a->B, S = a->S, H = a->H, HD = a->HD, group = a->H / a->KV;
    const int64_t qblocks = (S + QB - 1) / QB;
    const float scale = 1.0f / sqrtf((float)HD);
    if (!thread_gemm) {
        attention_forward_bf16_packed(out, ld_out, lse, q, ld_q, k, ld_k, v, ld_v, a, scratch, packed_product());
        return;
    }
    pack_kv16(scratch, a, k, ld_k, v, ld_v);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * qblocks; task++) {
        int64_t qb = qblocks - 1 - task % qblocks, bh = task / qblocks;
        int64_t b = bh / H, h = bh % H, kvh = h / group;
        int64_t i0 = qb * QB, nq = S - i0 < QB ? S - i0 : QB, kend = i0 + nq;
        gemm_ctx_t *g = thread_gemm[omp_get_thread_num()];
        thread_bufs_t t = thread_bufs(scratch, a);
        attention_rows_to_bf16(t.q16, HD, q + (b * S + i0) * ld_q + h * HD, ld_q, nq, nq, HD);
        /* scores[nq, kend] = q·kᵀ; the 1/sqrt(HD) is applied in the softmax, in fp32 */
        gemm_bf16(g, false, true, nq, kend, HD, t.q16, HD, k16_of(scratch, a, b, kvh), HD, t.p, S, false);
        float inv_sum[QB];
        attention_softmax_rows_to_bf16(t.p16, S, t.p, S, i0, nq, kend, scale, lse + (b * H + h) * S, inv_sum);
        float *op = out + (b * S + i0) * ld_out + h * HD;
        gemm_bf16(g, false, false, nq, HD, kend, t.p16, S, v16_of(scratch, a, b, kvh), HD, op, ld_out, false);
        attention_scale_rows(op, ld_out, nq, HD, inv_sum);
    }
}

void attention_backward_bf16(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                             const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                             const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                             const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                             gemm_ctx_t *const *thread_gemm) {
    const int64_t B = a->B, S = a->S, H = a->H, KV = a->KV, HD = a->HD, group = a->H / a->KV;
    const int64_t qblocks = (S + QB - 1) / QB;
    const float scale = 1.0f / sqrtf((float)HD);
    if (!thread_gemm) {
        attention_backward_bf16_packed(dq, ld_dq, dk, ld_dk, dv, ld_dv, dout, ld_dout, out, ld_out, lse, q, ld_q, k,
                                       ld_k, v, ld_v, a, scratch, packed_product());
        return;
    }
    pack_kv16(scratch, a, k, ld_k, v, ld_v);
    /* One task per (batch, kv head), as the fp32 kernel: it alone writes that head's dk, dv. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KV; task++) {
        int64_t b = task / KV, kvh = task % KV;
        gemm_ctx_t *g = thread_gemm[omp_get_thread_num()];
        thread_bufs_t t = thread_bufs(scratch, a);
        const bf16_t *k16 = k16_of(scratch, a, b, kvh), *v16 = v16_of(scratch, a, b, kvh);
        float *dkp = dk + b * S * ld_dk + kvh * HD, *dvp = dv + b * S * ld_dv + kvh * HD;
        for (int64_t s = 0; s < S; s++) {
            memset(dkp + s * ld_dk, 0, (size_t)HD * sizeof(float));
            memset(dvp + s * ld_dv, 0, (size_t)HD * sizeof(float));
        }
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *row_lse = lse + (b * H + h) * S;
            for (int64_t qb = 0; qb < qblocks; qb++) {
                int64_t i0 = qb * QB, nq = S - i0 < QB ? S - i0 : QB, kend = i0 + nq;
                const float *dop = dout + (b * S + i0) * ld_dout + h * HD, *op = out + (b * S + i0) * ld_out + h * HD;
                attention_rows_to_bf16(t.q16, HD, q + (b * S + i0) * ld_q + h * HD, ld_q, nq, nq, HD);
                attention_rows_to_bf16(t.do16, HD, dop, ld_dout, nq, nq, HD);
                gemm_bf16(g, false, true, nq, kend, HD, t.q16, HD, k16, HD, t.p, S, false);     /* scores */
                gemm_bf16(g, false, true, nq, kend, HD, t.do16, HD, v16, HD, t.dp, S, false); /* dP = dO·Vᵀ */
                for (int64_t r = 0; r < nq; r++) {
                    /* P and dS through L1, PD_CHUNK keys at a time, straight to bf16 */
                    float di = attention_row_dot(dop + r * ld_dout, op + r * ld_out, HD), p[PD_CHUNK], ds[PD_CHUNK];
                    for (int64_t j0 = 0; j0 < kend; j0 += PD_CHUNK) {
                        int64_t n = kend - j0 < PD_CHUNK ? kend - j0 : PD_CHUNK;
                        attention_p_ds_chunk(p, ds, t.p + r * S, t.dp + r * S, j0, n, i0 + r + 1, scale,
                                             row_lse[i0 + r], scale, di);
                        bf16_from_f32_block(t.p16 + r * S + j0, p, n);
                        bf16_from_f32_block(t.ds16 + r * S + j0, ds, n);
                    }
                }
                gemm_bf16(g, false, false, nq, HD, kend, t.ds16, S, k16, HD, dq + (b * S + i0) * ld_dq + h * HD, ld_dq, false);
                gemm_bf16(g, true, false, kend, HD, nq, t.ds16, S, t.q16, HD, dkp, ld_dk, true);
                gemm_bf16(g, true, false, kend, HD, nq, t.p16, S, t.do16, HD, dvp, ld_dv, true);
            }
        }
    }
}
