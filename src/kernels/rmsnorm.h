/* rmsnorm: y = x / sqrt(mean(x²) + eps) · w over vectors of N numbers. One kernel serves the
 * layer norms (G = 1, N = D) and Qwen3's per-head q/k norms (G heads of N = HD per row), so
 * rows are addressed as row t, group g at base + t·ld + g·N. */
#ifndef STEPSCOPE_RMSNORM_H
#define STEPSCOPE_RMSNORM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/bf16.h"

/* The largest N: the backward keeps one row of dweight sums on each thread's stack (64 KiB).
 * The config caps base_emb_dim and head_dim at it. */
enum { RMSNORM_MAX_N = 16384 };

/* out[T, G·N] (row stride ld_out), rstd[T·G], inp[T, G·N] (ld_in), weight[N].
 * out may equal inp (same ld). */
void rmsnorm_forward(float *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                     const float *weight, int64_t T, int64_t G, int64_t N, float eps);

/* The same with the output rounded to bf16 (as bf16_from_f32 rounds it), for a bf16 matmul's
 * input: the fp32 output is never written and read back. out[T, G·N] bf16 (row stride ld_out). */
void rmsnorm_forward_bf16(bf16_t *out, int64_t ld_out, float *rstd, const float *inp, int64_t ld_in,
                          const float *weight, int64_t T, int64_t G, int64_t N, float eps);

/* dinp[T, G·N] (ld_dinp): written, or added to when accumulate_dinp (the residual stream);
 * dweight[N] += Σ over rows; dout[T, G·N] (ld_dout); inp, weight, rstd as in forward.
 * dinp may equal dout (same ld): each row's terms are taken before its dinp is written. The
 * sums run in an order that does not depend on the thread count. N ≤ RMSNORM_MAX_N. */
void rmsnorm_backward(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight,
                      const float *dout, int64_t ld_dout, const float *inp, int64_t ld_in,
                      const float *weight, const float *rstd, int64_t T, int64_t G, int64_t N);

#endif
