/* attention: causal grouped-query attention, flash-style. Scores are computed a block of
 * ATTN_QBLOCK queries at a time against the keys they may see, softmaxed and used at once;
 * forward saves only the row log-sum-exp (O(S) per head) and backward recomputes the scores
 * block by block, so no [B, H, S, S] tensor ever exists. Query head h reads kv head
 * h / (H/KV); scores are scaled by 1/sqrt(HD).
 *
 * Layouts (T = B·S, row t = batch t/S, position t%S; each with its own row stride):
 *   q[T, H·HD], k[T, KV·HD], v[T, KV·HD], out[T, H·HD], lse[B, H, S]. */
#ifndef STEPSCOPE_ATTENTION_H
#define STEPSCOPE_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/gemm.h"

/* The fp32 kernels' default blocking (see attn_shape_t): query blocks of 64, the backward's
 * keys 128 at a time. On the AVX2 Zen 3, interleaved call by call against 128 × 128 at
 * qwen3-0.6b's heads (bench/attention_blocks.c), this ran the forward 1.06× and the backward
 * 1.08× at S = 1024, 1.04× and 1.11× at 4096, 1.10× and 1.15× at 256 (smaller diagonal blocks,
 * and a strip working set nearer the 512 KiB L2). Within a block, the products skip the key
 * panels of 32 a row cannot see (attention.c, "The causal mask inside a query block"). */
enum { ATTN_QBLOCK = 64, ATTN_QBLOCK_BF16 = 128 };
enum { ATTN_KCHUNK = 128 };

/* qblock, kchunk: the fp32 kernels' queries per block and the backward's keys per pass (a
 * multiple of 32); 0, as an initialiser naming only B .. HD leaves them, takes ATTN_QBLOCK
 * and ATTN_KCHUNK. The scratch size depends on them, so size it with the same shape. Other values
 * are for benchmarks that compare blockings; the bf16 kernels ignore them. */
typedef struct attn_shape {
    int64_t B, S, H, KV, HD;
    int64_t qblock, kchunk;
} attn_shape_t;

/* Floats of scratch the kernels need with num_threads threads. */
int64_t attention_scratch_floats(const attn_shape_t *a, int num_threads);

/* The fp32 kernels run their block products either in our micro-GEMM (AVX-512 or AVX2;
 * thread_gemm NULL) or through the gemm library with one context per OpenMP thread of the calling team
 * (thread_gemm[t]); the model passes contexts where the library is faster on these blocks
 * (gemm_suits_attention_blocks). */
void attention_forward(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                       const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                       const attn_shape_t *a, float *scratch, gemm_ctx_t *const *thread_gemm);

/* dq, dk, dv are written (not accumulated). dout, out: [T, H·HD]. */
void attention_backward(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                        const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                        const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                        const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                        gemm_ctx_t *const *thread_gemm);

/* bf16 variants (dtype=bfloat16): the same contract and blocking, but q, k, v, dO and the
 * probability and dS blocks are rounded to bf16 for the block matmuls (fp32 accumulation);
 * softmax, lse, dS and all outputs stay fp32. With thread_gemm (one gemm context per OpenMP
 * thread of the calling team) the block products run through the gemm library; with
 * thread_gemm NULL they run in our packed kernel, on AMX tiles (kernels/amx.h) or else
 * AVX512-BF16 dot products (kernels/dpbf16.h), for callers that checked
 * attention_bf16_packed_available(). The scratch size covers both. */
int64_t attention_bf16_scratch_floats(const attn_shape_t *a, int num_threads);

/* Whether this CPU and build run the packed bf16 kernel (AMX or AVX512-BF16), and which unit,
 * for the console. */
bool attention_bf16_packed_available(void);
const char *attention_bf16_packed_kind(void);

void attention_forward_bf16(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                            const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                            const attn_shape_t *a, float *scratch, gemm_ctx_t *const *thread_gemm);

void attention_backward_bf16(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                             const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                             const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                             const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                             gemm_ctx_t *const *thread_gemm);

/* Reference with the full score matrix, double accumulation: for tests only. */
void attention_forward_naive(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                             const float *k, int64_t ld_k, const float *v, int64_t ld_v,
                             const attn_shape_t *a);

#endif
