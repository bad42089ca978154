/* embed: token embedding lookup and its gradient. */
#ifndef STEPSCOPE_EMBED_H
#define STEPSCOPE_EMBED_H

#include <stdint.h>

#include "kernels/bf16.h"

/* out[T, D] (rows ld_out ≥ D apart) = table[tokens[t], :]; tokens[T] index rows of
 * table[V, D]. Token t of row b is tokens[b·ld_tokens + s] with T = B·S (the batch rows carry
 * S+1 ids). Columns [D, ld_out) are not written. */
void embed_forward(float *out, int64_t ld_out, const int32_t *tokens, int64_t ld_tokens, const float *table,
                   int64_t B, int64_t S, int64_t D);
/* The same from a bf16 table (weight_dtype=bfloat16), widened exactly into fp32 rows. */
void embed_forward_bf16(float *out, int64_t ld_out, const int32_t *tokens, int64_t ld_tokens, const bf16_t *table,
                        int64_t B, int64_t S, int64_t D);
/* dtable[V, D] += scatter of dout[T, D] (rows ld_dout ≥ D apart) by token id. Columns are split
 * across threads and tokens summed in order, so repeated ids add up the same way for any thread
 * count. */
void embed_backward(float *dtable, const float *dout, int64_t ld_dout, const int32_t *tokens, int64_t ld_tokens,
                    int64_t B, int64_t S, int64_t D);

#endif
