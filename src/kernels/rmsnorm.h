/* rmsnorm: y = x / sqrt(mean(x²) + eps) · w over vectors of N numbers. One kernel serves the
 * layer norms (G = 1, N = D) and Qwen3's per-head q/k norms (G heads of N = HD per row), so
 * rows are addressed as row t, group g at base + t·ld + g·N. */
#ifndef STEPSCOPE_RMSNORM_H
#define STEPSCOPE_RMSNORM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/bf16.h"

/* The largest N: the config caps base_emb_dim and head_dim at it. */
enum { RMSNORM_MAX_N = 16384 };

/* out[T, G·N] (row stride ld_out), rstd[T·G], inp[T, G·N] (ld_in), weight[N].
 * out may equal inp (same ld). */
void rmsnorm_forward(float *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                     const float *weight, int64_t T, int64_t G, int64_t N, float eps);

/* The same with the output rounded to bf16 (as bf16_from_f32 rounds it), for a bf16 matmul's
 * input: the fp32 output is never written and read back. out[T, G·N] bf16 (row stride ld_out). */
void rmsnorm_forward_bf16(bf16_t *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                          const float *weight, int64_t T, int64_t G, int64_t N, float eps);

/* The floats of the backward's `partials` for T·G rows of N (at most 64·N): a fixed chunking
 * of the rows, each chunk's dweight sums kept apart and added in chunk order. */
int64_t rmsnorm_backward_partials(int64_t T, int64_t G, int64_t N);

/* dinp[T, G·N] (ld_dinp): written, or added to when accumulate_dinp (the residual stream);
 * dweight[N] += Σ over rows; dout[T, G·N] (ld_dout); inp, weight, rstd as in forward;
 * partials[rmsnorm_backward_partials(T, G, N)] scratch. dinp may equal dout (same ld): each
 * row's terms are taken before its dinp is written. The sums run in an order that does not
 * depend on the thread count. N ≤ RMSNORM_MAX_N. */
void rmsnorm_backward(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight,
                      const float *dout, int64_t ld_dout, const float *inp, int64_t ld_in,
                      const float *weight, const float *rstd, int64_t T, int64_t G, int64_t N, float *partials);

/* Qwen3's per-head q/k norm and rope in one pass (rope.h's rotation, row t at position t mod S,
 * cos_table and sin_table [S, N/2]): out = rope(rmsnorm(inp)), the bits of rmsnorm_forward
 * followed by rope_forward, without writing the normed rows and reading them back to rotate
 * them. N even and ≤ ROPE_FUSED_MAX_N; out may not alias inp. */
enum { ROPE_FUSED_MAX_N = 1024 };
void rmsnorm_rope_forward(float *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                          const float *weight, const float *cos_table, const float *sin_table, int64_t T, int64_t S,
                          int64_t G, int64_t N, float eps);

/* Its backward: dinp (written; may equal dout, same ld) and dweight (+=) from dout, the
 * gradient of the rotated output: the bits of rope_backward on dout followed by
 * rmsnorm_backward, in one pass over the rows. */
void rmsnorm_rope_backward(float *dinp, int64_t ld_dinp, float *dweight, const float *dout, int64_t ld_dout,
                           const float *inp, int64_t ld_in, const float *weight, const float *rstd,
                           const float *cos_table, const float *sin_table, int64_t T, int64_t S, int64_t G, int64_t N,
                           float *partials);

#endif
