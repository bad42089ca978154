/* plan: everything decided before a run allocates: the model's shapes, parameter count,
 * FLOPs per step (MaxText's accounting) and the memory plan, one line per buffer. --dry-run
 * prints it; a run whose plan does not fit the machine is refused before it starts. */
#ifndef STEPSCOPE_PLAN_H
#define STEPSCOPE_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "model/qwen3.h"

typedef struct plan {
    qwen3_dims_t dims;      /* this device's batch */
    int num_threads;
    int num_ranks;             /* MPI ranks in the job; the global batch is num_ranks·B */
    int shard_ranks;           /* ici_fsdp_parallelism resolved: ranks that split the optimizer state */
    int replica_groups;        /* dcn_data_parallelism resolved: copies of the optimizer state */
    int64_t shard_params;      /* parameters whose AdamW state this rank keeps (the largest shard) */
    int ranks_per_host;        /* ranks sharing this machine's memory (1 unless the caller sets it) */
    qwen3_remat_t remat;
    qwen3_rows_t rows;         /* row_padding */
    bool bf16;                 /* dtype=bfloat16: bf16 matmul inputs, fp32 everything else */
    int64_t xent_chunk;
    int64_t num_params;
    int64_t micro_batches;     /* gradient_accumulation_steps: forward-backward passes per step */
    int64_t tokens_per_device; /* B·S·micro_batches per step */
    double tflops_per_device;  /* per step: MaxText's calculate_tflops_training_per_device (of the
                                  B·S of one pass) × micro_batches */
    /* memory plan, bytes per rank. grads: the full local gradients, plus this rank's reduced
     * shard when the state is sharded; optimizer: AdamW m and v of the shard (ZeRO-1), laid out
     * as plan_optimizer_layout says. */
    uint64_t params_bytes, grads_bytes, optimizer_bytes, activations_bytes, scratch_bytes, total_bytes;
    uint64_t params_bf16_bytes; /* the matmuls' bf16 copy of the weights; 0 in fp32 runs */
    bool mu_bf16;               /* mu_dtype: AdamW's m held in bf16 (optimizer_bytes counts it so) */
    /* weight_dtype=bfloat16: the parameters in bf16 only (params_bytes: the bf16 values, then on
     * a 64-byte line the norm weights widened to fp32, qwen3_vector_floats; no bf16 copy) and
     * AdamW's v in bf16; the gradients stay fp32. */
    bool weights_bf16;
    bool stochastic_rounding; /* weights_bf16: the updated weights rounded stochastically */
    uint64_t params_vectors_offset; /* weights_bf16: where in the parameters' bytes the fp32 norm weights start */
    /* The data threads' rings (data/data.h), outside the arena: prefetch_depth batches of token
     * ids, B·micro_batches rows of S + 1, and B rows for evaluation where it runs. */
    uint64_t data_bytes;
    uint64_t arena_bytes; /* total_bytes less data_bytes: what the set-up allocates and touches */
} plan_t;

/* The optimizer allocation, in bytes from its start: v (floats, or bf16 with v_bf16), then m
 * (floats, or bf16 with mu_bf16), then the norm's partial sums (doubles), each on a 64-byte
 * line, for a shard of shard_params. */
typedef struct plan_optimizer_layout {
    uint64_t m_offset, partials_offset, bytes;
} plan_optimizer_layout_t;
plan_optimizer_layout_t plan_optimizer_layout(int64_t shard_params, bool mu_bf16, bool v_bf16);

/* The dims a config describes (per-device batch). */
qwen3_dims_t plan_dims(const config_t *cfg);

/* MaxText's TFLOP count for one training step on one device:
 * per layer FFN 6·B·S·D·F, QKV 2·B·S·D·(H+2KV)·HD, output projection 2·B·S·D·H·HD, plus the
 * unembedding 2·B·S·D·V once, all ×3 (forward + backward); causal attention 4·B·S²·H·HD/2
 * per layer, also ×3. */
double plan_tflops_training_per_device(const qwen3_dims_t *d);

/* One forward pass (an evaluation batch) of the plan's batch of B sequences: a third of one
 * pass's training count, whose every term is 3 × the forward's. */
double plan_forward_tflops_per_device(const plan_t *p);
/* The tokens of one pass (a micro-batch, an evaluation batch): B·S. */
int64_t plan_batch_tokens_per_device(const plan_t *p);

/* num_ranks: the ranks of the job; ici_fsdp_parallelism × dcn_data_parallelism must come to
 * it (-1 fills in). A mismatch is a config error naming both keys. */
int plan_build(plan_t *p, const config_t *cfg, int num_threads, int num_ranks, char *err, size_t errlen);

/* Bytes of memory this rank can have: memory_limit_gib when set, else physical memory less
 * what the system keeps, split between the ranks on this host. */
uint64_t plan_memory_available(const plan_t *p, const config_t *cfg);

/* Non-zero (and one line in err naming what would help) when the plan does not fit. */
int plan_check_memory(const plan_t *p, const config_t *cfg, char *err, size_t errlen);

/* "key: value" lines: shapes, num_parameters, per_device_tflops (4 decimals), memory plan. */
void plan_print(const plan_t *p, FILE *out);

#endif
