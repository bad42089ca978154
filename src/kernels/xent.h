/* xent: cross-entropy over one chunk of LM-head logits, forward and backward at once, so the
 * caller never holds more than [C, V] logits. Loss per row = logsumexp(l) − l[target]
 * (+ z·logsumexp² when z_loss > 0, as MaxText's z-loss). */
#ifndef STEPSCOPE_XENT_H
#define STEPSCOPE_XENT_H

#include <stdint.h>

/* logits[C, V]: read, then overwritten in place with dloss/dlogits · grad_scale
 * (grad_scale = 1 / number of tokens in the mean). row_loss[C], row_lse[C]: per-row loss and
 * logsumexp. targets[C]. */
void xent_forward_backward(float *logits, float *row_loss, float *row_lse, const int32_t *targets,
                           int64_t C, int64_t V, float grad_scale, float z_loss);

#endif
