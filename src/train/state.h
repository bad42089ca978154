/* state: the buffers and objects of one training run, built from the plan: the arena's
 * parameters, gradients, AdamW moments, activations and scratch, the GEMM context and the
 * model bound to them, plus the step that runs forward, backward and the optimizer. */
#ifndef STEPSCOPE_STATE_H
#define STEPSCOPE_STATE_H

#include <stdint.h>

#include "config/config.h"
#include "dist/comm.h"
#include "dist/zero.h"
#include "kernels/adamw.h"
#include "kernels/gemm.h"
#include "model/qwen3.h"
#include "plan/plan.h"
#include "profile/trace.h"

/* The groups of a multi-rank run (see dist/zero.h); NULL to train_state_create = one process. */
typedef struct train_parallel {
    comm_t *world, *shard, *replica;
    uint32_t comm_lane, compute_lane; /* trace lanes of the communication and step threads */
} train_parallel_t;

typedef struct train_state {
    plan_t plan;
    float *params, *grads;
    void *adam_state;      /* the optimizer allocation (plan_optimizer_layout): v, m, norm partials */
    float *adam_v, *adam_m; /* adam_m NULL where m is held in bf16 (mu_dtype=bfloat16), adam_v with v16 */
    bf16_t *adam_m16;       /* mu_dtype=bfloat16: m; NULL otherwise */
    bf16_t *adam_v16;       /* weight_dtype=bfloat16: v; NULL otherwise */
    /* bf16_weight_copy: bf16(params) for the matmuls; with weight_dtype=bfloat16 the parameters
     * themselves (params is NULL, and vectors32 holds the norm weights widened for their
     * kernels); NULL otherwise (fp32 runs, and bf16 ones whose matmuls round the fp32 weights). */
    bf16_t *params_bf16;
    float *vectors32;
    /* This rank's optimizer shard: parameters [shard_lo, shard_lo + shard_n), their reduced
     * gradients in grad_shard (== grads + shard_lo with one rank), moments in adam_m (or
     * adam_m16) and adam_v. */
    int64_t shard_lo, shard_n;
    float *grad_shard;
    zero_t *zero;                  /* NULL with one rank */
    double *norm_partials;
    float *acts, *scratch;
    gemm_ctx_t *gemm;
    qwen3_model_t *model;
    adamw_hparams_t adam;
    adamw_rounding_t rounding; /* weight_dtype=bfloat16: how the update rounds this rank's weights */
    double clip;
    int64_t updates_done;
    int64_t resumed_step; /* load_full_state_path: the step its checkpoint holds; -1 otherwise */
    trace_t *trace;
    uint32_t span_optimizer, span_grad_norm, span_adamw;
    /* Called (when set) by train_step on its thread once the gradients and their norm are done
     * and before the update writes the parameters and moments: async_checkpointing's write of
     * the previous step's state reads them until then (train/loop.c). */
    void (*before_update)(void *arg);
    void *before_update_arg;
    /* Where set-up's time went, for the console: the arena's buffers (mapped and every page
     * touched: on a VM that has handed freed memory back to its host this is most of a
     * start-up) and the parameters (initialised or loaded, and their bf16 copy). */
    uint64_t setup_touched_bytes;
    double setup_touch_s, setup_params_s;
} train_state_t;

typedef struct step_result {
    double loss;
    double raw_grad_norm; /* before clipping */
    double grad_norm;     /* after clipping */
} step_result_t;

/* Allocate from the plan, then resume (load_full_state_path: parameters, this rank's shard of
 * AdamW's moments, the update count), load parameters (load_parameters_path) or initialise them
 * from init_weights_seed (every rank the same). par: the rank groups, NULL for one process.
 * Non-zero with one line in err on failure (nothing left allocated). */
int train_state_create(train_state_t *s, const config_t *cfg, const plan_t *plan, trace_t *trace,
                       const train_parallel_t *par, char *err, size_t errlen);
void train_state_destroy(train_state_t *s);

/* One training step on tokens [micro_batches · B, S+1] (micro-batch g: rows g·B ..): forward,
 * loss and backward of each micro-batch, their gradients summed, global-norm clipping and
 * AdamW on their mean. Runs on the calling thread's OpenMP team. With several ranks: gradients reduced
 * over the ranks while backward runs, the loss and the norm are those of the global batch,
 * AdamW updates this rank's shard, and the parameters are all-gathered. */
void train_step(train_state_t *s, const int32_t *tokens, step_result_t *out);

/* The loss of the current parameters on tokens [B, S+1], forward only (evaluation): no
 * gradient, no update. With several ranks, the mean over the ranks' rows, so the global batch's
 * loss on every rank (a collective: every rank calls it together). */
double train_eval_loss(train_state_t *s, const int32_t *tokens);

#endif
