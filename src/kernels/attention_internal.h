/* attention_internal: pieces the fp32 (attention.c) and bf16 (attention_bf16.c) kernels share.
 * Not part of the kernels' public interface. */
#ifndef STEPSCOPE_ATTENTION_INTERNAL_H
#define STEPSCOPE_ATTENTION_INTERNAL_H

#include <stdint.h>

/* Row r of strip [nq, ld] holds raw scores for query i = i0 + r against keys [0, kend). Turn
 * the visible part (keys 0..i) into probabilities exp(scale·s − lse) and zero the masked rest.
 * With lse_out, lse (in scaled units) is computed here (forward); else read from lse_in. */
void attention_softmax_rows(float *strip, int64_t ld, int64_t i0, int64_t nq, int64_t kend, float scale,
                            float *lse_out, const float *lse_in);

/* dst[S, HD] = src rows [S, HD] (row stride ld), packed. */
void attention_copy_rows(float *dst, const float *src, int64_t ld, int64_t S, int64_t HD);

#endif
