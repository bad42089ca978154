/* adamw: global gradient norm, clipping and the AdamW update, as torch.optim.AdamW and
 * torch.nn.utils.clip_grad_norm_ compute them:
 *   scale = min(1, clip / (‖g‖ + 1e-6))  (clip > 0; 1 otherwise)
 *   m = b1·m + (1−b1)·g·scale ;  v = b2·v + (1−b2)·(g·scale)²
 *   p −= lr·( (m/(1−b1^t)) / (sqrt(v/(1−b2^t)) + eps) + wd·p )
 * One fused pass reads g, p, m, v and writes p, m, v, since the update is bound by memory
 * bandwidth. It leaves g as it is: most of the model's gradients are written afresh each step,
 * and the caller zeroes the few that accumulate (qwen3_zero_accumulated_grads), where zeroing
 * the whole of g in this pass wrote 2.4 GB a step for qwen3-0.6b. */
#ifndef STEPSCOPE_ADAMW_H
#define STEPSCOPE_ADAMW_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/bf16.h"

typedef struct adamw_hparams {
    float lr, b1, b2, eps, weight_decay;
} adamw_hparams_t;

/* Σ g² over n numbers, summed in fixed blocks of ADAMW_NORM_BLOCK so the result does not
 * depend on the thread count. partials: scratch of adamw_norm_partials(n) doubles. */
enum { ADAMW_NORM_BLOCK = 1 << 16 };
int64_t adamw_norm_partials(int64_t n);
double adamw_sum_squares(const float *g, int64_t n, double *partials);

/* Clip factor torch's clip_grad_norm_ applies for a raw norm (1 when clip <= 0). */
float adamw_clip_scale(double raw_norm, double clip);

/* p[n], m[n], v[n], g[n]; step is 1-based. g is scaled by grad_scale (and not written). When p_bf16
 * is not NULL it receives bf16(p) in the same pass (the matmul copy of dtype=bfloat16 runs). */
void adamw_update(float *p, float *m, float *v, const float *g, int64_t n, int64_t step,
                  float grad_scale, const adamw_hparams_t *h, bf16_t *p_bf16);

/* The same with m held in bfloat16 (mu_dtype=bfloat16, as optax's adamw(mu_dtype=...)): m is
 * widened, updated in fp32, used in fp32 for this step's update, and stored rounded to nearest
 * even; v stays fp32. It moves 26 bytes a parameter with p_bf16 where adamw_update moves 30. */
void adamw_update_m16(float *p, bf16_t *m, float *v, const float *g, int64_t n, int64_t step,
                      float grad_scale, const adamw_hparams_t *h, bf16_t *p_bf16);

/* weight_dtype=bfloat16 (MaxText's, optax's adamw over bf16 parameters): p and v in bf16, m in
 * fp32 (m, with m16 NULL) or bf16 (m16, with m NULL; mu_dtype), g in fp32. Each bf16 value is
 * widened, updated in fp32 and stored rounded to nearest even, so an update smaller than half
 * of p's last place leaves p as it was, as in MaxText. It moves 16 bytes a parameter with m16 (20
 * with an fp32 m), against adamw_update's 30 with the bf16 copy. */
typedef struct adamw_rounding {
    bool stochastic; /* stochastic_rounding: the updated weights rounded stochastically (unbiased) */
    uint32_t seed;   /* with the step and a weight's index, picks its draw */
    int64_t index0;  /* the index of p[0] in the whole parameter vector (a shard's first) */
} adamw_rounding_t;
/* rounding NULL or not stochastic: p to nearest even, as m and v always are. Stochastic: p
 * rounded up with the probability that makes its expectation the fp32 value (bf16_from_f32_
 * stochastic), each value's 16 bits drawn from (seed, step, index0 + i), so an update smaller
 * than half a bf16 step moves a weight on average instead of never. */
void adamw_update_w16(bf16_t *p, float *m, bf16_t *m16, bf16_t *v, const float *g, int64_t n, int64_t step,
                      float grad_scale, const adamw_hparams_t *h, const adamw_rounding_t *rounding);

#endif
