/* config: the resolved run configuration, read MaxText-style from configs/base.yml,
 * the model preset configs/models/<model_name>.yml and key=value overrides, in that
 * order of precedence. One table of keys (config_keys.def) drives parsing, validation,
 * --help, the printed resolved config and "did you mean" suggestions. */
#ifndef STEPSCOPE_CONFIG_H
#define STEPSCOPE_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { CONFIG_STR_MAX = 512 };

/* Exit code for every configuration error, as the issue tracker asks (MaxText uses 2 too). */
enum { CONFIG_EXIT_CODE = 2 };

typedef enum { DTYPE_FLOAT32 = 0, DTYPE_BFLOAT16 = 1 } dtype_t;

typedef struct config {
    /* run */
    char model_name[CONFIG_STR_MAX];
    bool override_model_config;
    char run_name[CONFIG_STR_MAX];
    char base_output_directory[CONFIG_STR_MAX];
    int64_t steps;
    int64_t per_device_batch_size;
    int64_t max_target_length;
    int64_t gradient_accumulation_steps; /* micro-batches per update (MaxText) */
    /* model shape */
    int64_t vocab_size;
    int64_t base_emb_dim;
    int64_t base_mlp_dim;
    int64_t base_num_decoder_layers;
    int64_t base_num_query_heads;
    int64_t base_num_kv_heads;
    int64_t head_dim;
    double rope_max_timescale;
    double normalization_layer_epsilon;
    bool use_qk_norm;
    bool logits_via_embedding; /* true: LM head tied to the token embedding */
    dtype_t dtype;             /* compute dtype of the matmuls */
    dtype_t weight_dtype;      /* master weights and optimizer state */
    char mu_dtype[CONFIG_STR_MAX]; /* AdamW's m: "" (weight_dtype's), "float32"/"fp32", "bfloat16"/"bf16" */
    bool stochastic_rounding;  /* weight_dtype=bfloat16: the updated weights rounded stochastically */
    bool bf16_weight_copy;     /* dtype=bfloat16 with fp32 weights: a bf16 copy for the matmuls (else rounded as packed) */
    int64_t init_weights_seed;
    /* optimizer */
    double learning_rate;
    double adam_b1, adam_b2, adam_eps, adam_weight_decay;
    double gradient_clipping_threshold; /* 0 disables */
    double z_loss_multiplier;
    /* data */
    char dataset_type[CONFIG_STR_MAX]; /* "synthetic" or "tokens" */
    char dataset_path[CONFIG_STR_MAX];
    int64_t eval_interval;
    int64_t eval_steps;
    char eval_dataset_path[CONFIG_STR_MAX];
    int64_t data_seed;        /* ours: seed of the synthetic batch */
    int64_t prefetch_depth;   /* ours: batches the data thread may run ahead */
    int64_t data_delay_ms;    /* ours, for tests: the data thread sleeps this long per batch */
    /* outputs */
    bool enable_checkpointing;
    int64_t checkpoint_period;
    bool async_checkpointing; /* the checkpoint after step k written beside step k+1 (train/loop.c) */
    char load_parameters_path[CONFIG_STR_MAX];
    char load_full_state_path[CONFIG_STR_MAX];
    char metrics_file[CONFIG_STR_MAX]; /* "" = <base_output_directory>/<run_name>/metrics.jsonl */
    bool enable_tensorboard;
    bool abort_on_nan_loss;
    bool abort_on_inf_loss;
    /* profiler */
    char profiler[CONFIG_STR_MAX]; /* "" or "xplane" */
    int64_t skip_first_n_steps_for_profiler;
    int64_t profiler_steps;
    bool upload_all_profiler_results; /* every rank writes its profile, not only rank 0 */
    /* parallelism: the product is the number of ranks; -1 = whatever makes it so */
    int64_t ici_fsdp_parallelism; /* ranks sharing one copy of the optimizer state */
    int64_t dcn_data_parallelism; /* copies of the optimizer state */
    /* machine (ours) */
    int64_t num_threads;        /* compute threads; 0 = all online CPUs */
    double device_peak_tflops;  /* 0 = measure with a start-up probe */
    double device_peak_gb_per_s; /* memory bandwidth for the op summary; 0 = probe it when profiling */
    bool machine_probe;         /* probe before the first step and after the last: did the pace hold? */
    double memory_limit_gib;    /* 0 = this machine's physical memory */
    int64_t xent_chunk_tokens;  /* tokens per LM-head/cross-entropy chunk; 0 = choose */
    char gemm_library[CONFIG_STR_MAX]; /* "auto" | "onednn" | "mkl" */
    char row_padding[CONFIG_STR_MAX];  /* "auto" | "dense" | "padded" */
    char remat_policy[CONFIG_STR_MAX]; /* MaxText values: "none" | "minimal" | "full" */
} config_t;

/* Fill *cfg from the base YAML file, the preset it (or an override) names, and the
 * overrides ("key=value" strings). On a user error, writes one line naming the file,
 * key or value and what would fix it into err and returns CONFIG_EXIT_CODE; 0 on success.
 * configs_dir: the folder holding models/ (normally the base file's folder).
 * base_path may be NULL: built-in defaults only, presets read from configs/models/. */
int config_load(config_t *cfg, const char *base_path, int n_overrides, char *const overrides[],
                char *err, size_t errlen);

/* Print every key with its resolved value, one "key: value" per line, in table order. */
void config_print(const config_t *cfg, FILE *out);

/* Print the usage text and one line per key: name, type, default, allowed values, help. */
void config_print_help(FILE *out);

const char *dtype_name(dtype_t d);

/* The dtype AdamW's first moment is held in: mu_dtype, or weight_dtype where it is empty. */
dtype_t config_mu_dtype(const config_t *cfg);

#endif
