/* attention_internal: pieces the fp32 (attention.c) and bf16 (attention_bf16.c) kernels share.
 * Not part of the kernels' public interface. */
#ifndef STEPSCOPE_ATTENTION_INTERNAL_H
#define STEPSCOPE_ATTENTION_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/amx.h"
#include "kernels/attention.h"
#include "kernels/bf16.h"

/* The forward's softmax with the probabilities written to dst in bf16 (row stride ld_dst) as
 * they are computed. Row r of strip [nq, ld] holds raw scores for query i = i0 + r against keys
 * [0, kend), and is left as it is; dst's masked rest (keys past i) is zeroed. lse (in scaled
 * units) is computed and the probabilities are left unnormalised, exp(scale·s − max), with 1/Σ
 * in row_inv_sum[r]: the caller scales the [nq, HD] output rows instead of the [nq, kend]
 * probabilities (attention_scale_rows). This is the P of a bf16 P·V product, without writing an
 * fp32 strip and reading it again; the same bits as rounding the fp32 kernel's. */
void attention_softmax_rows_to_bf16(bf16_t *dst, int64_t ld_dst, const float *strip, int64_t ld, int64_t i0,
                                    int64_t nq, int64_t kend, float scale, float *lse_out, float *row_inv_sum);

/* The backward's P and dS, for every kernel, for keys [j0, j0 + n) of one query row (j0 a
 * multiple of 16), into p[n] and ds[n]: p = exp(score_scale·scores − lse) and ds =
 * ds_scale·p·(dp − di) below visible (the softmax's 1/sqrt(HD) folded in for the dQ and dK
 * products), both 0 from it on; scores and dp are read below visible only. In place is
 * allowed (p = scores + j0, ds = dp + j0): the fp32 kernel passes whole rows of its strips;
 * the bf16 kernels take PD_CHUNK keys at a time through L1 and round and pack P and dS from
 * there, without writing fp32 strips and reading them again. */
enum { PD_CHUNK = 256 }; /* keys per attention_p_ds_chunk call in the bf16 kernels: 4 KiB of P and dS */
void attention_p_ds_chunk(float *p, float *ds, const float *scores, const float *dp, int64_t j0, int64_t n,
                          int64_t visible, float score_scale, float lse, float ds_scale, float di);

/* rows[r, 0..HD) *= row_scale[r] for r < nq (row stride ld). */
void attention_scale_rows(float *rows, int64_t ld, int64_t nq, int64_t HD, const float *row_scale);

/* Σ a[d]·b[d] over n terms (16 partial sums, then summed; the order depends on n only): the
 * backward's Di = Σ dO·O for one query row. */
float attention_row_dot(const float *a, const float *b, int64_t n);

/* Asks for the n floats from row into cache ahead of their use (no fault, no wait). */
static inline void attention_prefetch_row(const float *row, int64_t n) {
    for (int64_t i = 0; i < n; i += 64 / (int64_t)sizeof(float)) __builtin_prefetch(row + i, 0, 3);
}

/* dst[rows_pad, HDp] = bf16(src rows [rows, HD], row stride ld), zero-padded to rows_pad rows
 * and HDp columns (the AMX kernel's tile multiples; the library path passes rows and HD). */
void attention_rows_to_bf16(bf16_t *dst, int64_t HDp, const float *src, int64_t ld, int64_t rows, int64_t rows_pad,
                            int64_t HD);

/* dst[S, HD] = src rows [S, HD] (row stride ld), packed. */
void attention_copy_rows(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD);

/* bf16 attention with our own block products on pre-packed operands (attention_bf16_packed.c):
 * the contract of attention_forward_bf16 and attention_backward_bf16, for CPUs where
 * amx_available() (product amx_gemm_configured, amx_tiles set: each task configures the tiles
 * once for its run of products) or dpbf16_available() (dpbf16_gemm). */
typedef struct {
    bf16_block_product_fn product;
    bool amx_tiles;
} bf16_block_unit_t;
int64_t attention_packed_scratch_floats(const attn_shape_t *a, int num_threads);
void attention_forward_bf16_packed(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                                   const float *k, int64_t ld_k, const float *v, int64_t ld_v, const attn_shape_t *a,
                                   float *scratch, bf16_block_unit_t unit);
void attention_backward_bf16_packed(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                                    const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                                    const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                                    const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                                    bf16_block_unit_t unit);

#endif
