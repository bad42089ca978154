/* xent: cross-entropy over one chunk of LM-head logits, forward and backward at once, so the
 * caller never holds more than [C, V] logits. Loss per row = logsumexp(l) − l[target]
 * (+ z·logsumexp² when z_loss > 0, as MaxText's z-loss). */
#ifndef STEPSCOPE_XENT_H
#define STEPSCOPE_XENT_H

#include <stdint.h>

#include "kernels/bf16.h"

/* logits[C, V]: read, then overwritten in place with dloss/dlogits · grad_scale
 * (grad_scale = 1 / number of tokens in the mean). row_loss[C], row_lse[C]: per-row loss and
 * logsumexp. targets[C]. */
void xent_forward_backward(float *logits, float *row_loss, float *row_lse, const int32_t *targets,
                           int64_t C, int64_t V, float grad_scale, float z_loss);

/* The same for a bf16 run's LM head: the gradient rounded to bf16 into dlogits[C, V] (rows
 * ld_dlogits apart), the bits that rounding xent_forward_backward's would give. dlogits may
 * alias the logits at ld_dlogits = 2V (row r's gradient over the first half of row r's fp32
 * logits, which the row has read in full by then; threads take whole rows), so that a bf16
 * chunk needs no buffer of its own; other rows' logits are left as they are. Each row's
 * exponentials go through row_scratch[threads, V] (a row for each thread of the parallel region) instead
 * of the logits, so the fp32 rows are read once and neither written back nor read again:
 * against xent_forward_backward followed by a bf16 conversion, one pass over [C, V] fp32
 * fewer and no fp32 write. Where dlogits' rows lie on 64-byte lines (V a multiple of 32 and
 * dlogits aligned) the gradient goes out with streaming stores: the GEMMs read it back from
 * memory anyway (a chunk is ~155 MB), and the lines are not read for ownership first. */
void xent_forward_backward_bf16(const float *logits, bf16_t *dlogits, int64_t ld_dlogits, float *row_scratch,
                                float *row_loss, float *row_lse, const int32_t *targets, int64_t C, int64_t V,
                                float grad_scale, float z_loss);

#endif
