#include "plan/plan.h"

#include <string.h>

#include "data/data.h"
#include "dist/zero.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "util/memstat.h"

qwen3_dims_t plan_dims(const config_t *cfg) {
    return (qwen3_dims_t){
        .B = cfg->per_device_batch_size, .S = cfg->max_target_length, .D = cfg->base_emb_dim,
        .F = cfg->base_mlp_dim, .L = cfg->base_num_decoder_layers, .H = cfg->base_num_query_heads,
        .KV = cfg->base_num_kv_heads, .HD = cfg->head_dim, .V = cfg->vocab_size,
        .tied = cfg->logits_via_embedding, .qk_norm = cfg->use_qk_norm,
        .rope_theta = cfg->rope_max_timescale, .eps = cfg->normalization_layer_epsilon,
    };
}

double plan_forward_tflops_per_device(const plan_t *p) {
    return p->tflops_per_device / (3.0 * (double)p->micro_batches);
}

int64_t plan_batch_tokens_per_device(const plan_t *p) { return p->dims.B * p->dims.S; }

double plan_tflops_training_per_device(const qwen3_dims_t *d) {
    double B = (double)d->B, S = (double)d->S, D = (double)d->D, F = (double)d->F;
    double H = (double)d->H, KV = (double)d->KV, HD = (double)d->HD, V = (double)d->V, L = (double)d->L;
    double ffn = 6.0 * B * S * D * F;
    double qkv = 2.0 * B * S * D * (H + 2.0 * KV) * HD;
    double proj = 2.0 * B * S * D * H * HD;
    double attention = 4.0 * B * S * S * H * HD / 2.0;
    double embedding = 2.0 * B * S * D * V;
    double weights = ((ffn + qkv + proj) * L + embedding) * 3.0;
    return (weights + attention * L * 3.0) / 1e12;
}

/* ici_fsdp × dcn_data = ranks, with -1 standing for what is left. */
static int resolve_mesh(plan_t *p, const config_t *cfg, int num_ranks, char *err, size_t errlen) {
    int64_t fsdp = cfg->ici_fsdp_parallelism, dcn = cfg->dcn_data_parallelism;
    if (fsdp == -1 && num_ranks % dcn == 0) fsdp = num_ranks / dcn;
    if (dcn == -1 && num_ranks % fsdp == 0) dcn = num_ranks / fsdp;
    if (fsdp < 1 || dcn < 1 || fsdp * dcn != num_ranks) {
        snprintf(err, errlen,
                 "ici_fsdp_parallelism=%lld x dcn_data_parallelism=%lld does not make the %d rank%s this job "
                 "has; set them so the product is %d, or one of them to -1",
                 (long long)cfg->ici_fsdp_parallelism, (long long)cfg->dcn_data_parallelism, num_ranks,
                 num_ranks == 1 ? "" : "s", num_ranks);
        return CONFIG_EXIT_CODE;
    }
    p->num_ranks = num_ranks;
    p->shard_ranks = (int)fsdp;
    p->replica_groups = (int)dcn;
    return 0;
}

/* Floats of every buffer the plan sizes, over-estimated in double: int64 products of keys that
 * are each in range can still overflow (max_target_length=2^62 once wrapped to a small plan),
 * so a shape is refused while its sizes are still doubles. */
static double plan_floats_upper_bound(const qwen3_dims_t *d, int num_threads) {
    double B = (double)d->B, S = (double)d->S, D = (double)d->D, F = (double)d->F, L = (double)d->L;
    double H = (double)d->H, KV = (double)d->KV, HD = (double)d->HD, V = (double)d->V, T = B * S;
    double params = 2.0 * V * D + L * (2.0 * D + 2.0 * (H + KV) * HD * D + 3.0 * D * F + 2.0 * HD) + D;
    /* + 16 floats a row for each activation's padded stride (qwen3_padded_width): 128 covers them. */
    double layer = T * (4.0 * D + 3.0 * F + 4.0 * (H + KV) * HD + H + KV + 2.0 + 128.0) + B * H * S;
    double scratch = T * (5.0 * D + 3.0 * F + 3.0 * (H + KV) * HD + V + 4.0 + 128.0) + S * HD + 3.0 * B * KV * HD * S +
                     (double)num_threads * 4.0 * ATTN_QBLOCK_BF16 * (S + HD);
    return 5.0 * params + (L + 1.0) * (layer + T * D) + scratch;
}

int plan_build(plan_t *p, const config_t *cfg, int num_threads, int num_ranks, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->dims = plan_dims(cfg);
    const qwen3_dims_t *d = &p->dims;
    double floats = plan_floats_upper_bound(d, num_threads);
    if (!(floats < 0x1p50)) { /* 4 PiB: no machine has it, and every int64 size below stays exact */
        snprintf(err, errlen, "the model is too large to plan (about %.3g bytes per device); lower vocab_size, the "
                 "base_* keys, per_device_batch_size or max_target_length", 4.0 * floats);
        return CONFIG_EXIT_CODE;
    }
    if (d->HD % 2 != 0) {
        snprintf(err, errlen, "head_dim=%lld must be even for rotary embeddings", (long long)d->HD);
        return CONFIG_EXIT_CODE;
    }
    p->num_threads = num_threads;
    p->ranks_per_host = 1;
    if (resolve_mesh(p, cfg, num_ranks, err, errlen) != 0) return CONFIG_EXIT_CODE;
    p->remat = !strcmp(cfg->remat_policy, "full")      ? QWEN3_REMAT_FULL
               : !strcmp(cfg->remat_policy, "minimal") ? QWEN3_REMAT_MINIMAL
                                                       : QWEN3_REMAT_NONE;
    p->rows = !strcmp(cfg->row_padding, "dense")    ? QWEN3_ROWS_DENSE
              : !strcmp(cfg->row_padding, "padded") ? QWEN3_ROWS_PADDED
                                                    : QWEN3_ROWS_AUTO;
    p->bf16 = cfg->dtype == DTYPE_BFLOAT16;
    p->xent_chunk = cfg->xent_chunk_tokens > 0 ? cfg->xent_chunk_tokens : qwen3_default_xent_chunk(d);
    if (p->xent_chunk > d->B * d->S) p->xent_chunk = d->B * d->S;
    p->num_params = qwen3_num_params(d);
    p->micro_batches = cfg->gradient_accumulation_steps;
    p->tokens_per_device = d->B * d->S * p->micro_batches;
    p->tflops_per_device = plan_tflops_training_per_device(d) * (double)p->micro_batches;
    uint64_t n = (uint64_t)p->num_params, f = sizeof(float);
    p->weights_bf16 = cfg->weight_dtype == DTYPE_BFLOAT16;
    p->stochastic_rounding = p->weights_bf16 && cfg->stochastic_rounding;
    p->params_vectors_offset = p->weights_bf16 ? (n * sizeof(bf16_t) + 63) / 64 * 64 : 0;
    p->params_bytes = p->weights_bf16 ? p->params_vectors_offset + (uint64_t)qwen3_vector_floats(d) * f : n * f;
    p->shard_params = zero_shard_floats(p->num_params, p->shard_ranks);
    uint64_t shard = (uint64_t)p->shard_params;
    p->grads_bytes = n * f + (p->shard_ranks > 1 ? shard * f : 0);
    p->mu_bf16 = config_mu_dtype(cfg) == DTYPE_BFLOAT16;
    p->optimizer_bytes = plan_optimizer_layout(p->shard_params, p->mu_bf16, p->weights_bf16).bytes;
    p->activations_bytes = (uint64_t)qwen3_saved_activation_floats(d, p->remat) * f;
    p->scratch_bytes = (uint64_t)qwen3_scratch_floats(d, num_threads, p->xent_chunk, p->bf16, p->remat) * f;
    p->params_bf16_bytes = p->bf16 && !p->weights_bf16 && cfg->bf16_weight_copy ? n * sizeof(bf16_t) : 0;
    p->arena_bytes = p->params_bytes + p->params_bf16_bytes + p->grads_bytes + p->optimizer_bytes +
                     p->activations_bytes + p->scratch_bytes;
    p->data_bytes = data_ring_bytes(cfg->prefetch_depth, d->B * p->micro_batches, d->S) +
                    (cfg->eval_interval > 0 ? data_ring_bytes(cfg->prefetch_depth, d->B, d->S) : 0);
    p->total_bytes = p->arena_bytes + p->data_bytes;
    return 0;
}

plan_optimizer_layout_t plan_optimizer_layout(int64_t shard_params, bool mu_bf16, bool v_bf16) {
    const uint64_t n = (uint64_t)shard_params, line = 64;
    plan_optimizer_layout_t o;
    o.m_offset = (n * (v_bf16 ? sizeof(bf16_t) : sizeof(float)) + line - 1) / line * line;
    o.partials_offset = o.m_offset + ((n * (mu_bf16 ? sizeof(bf16_t) : sizeof(float)) + line - 1) / line * line);
    o.bytes = o.partials_offset + (uint64_t)adamw_norm_partials(shard_params) * sizeof(double);
    return o;
}

uint64_t plan_memory_available(const plan_t *p, const config_t *cfg) {
    if (cfg->memory_limit_gib > 0) return (uint64_t)(cfg->memory_limit_gib * 1073741824.0);
    /* Leave room for the system and the libraries: 90% of physical memory. */
    return memstat_physical_bytes() / 10 * 9 / (uint64_t)(p->ranks_per_host > 1 ? p->ranks_per_host : 1);
}

int plan_check_memory(const plan_t *p, const config_t *cfg, char *err, size_t errlen) {
    uint64_t avail = plan_memory_available(p, cfg);
    if (p->total_bytes <= avail) return 0;
    const double gib = 1073741824.0;
    const char *share = p->ranks_per_host > 1 && cfg->memory_limit_gib <= 0 ? " (this host's share per rank)" : "";
    /* What no batch size, sequence length or remat policy changes: the hint must name a fix that
     * can work (qwen3-8b here needs 126 GiB, of which 3 GiB are activations). ZeRO-1 shards only
     * the AdamW state, so every rank keeps the whole parameters and gradients. */
    uint64_t whole = p->params_bytes + p->params_bf16_bytes + (uint64_t)p->num_params * sizeof(float);
    uint64_t state = p->params_bytes + p->params_bf16_bytes + p->grads_bytes + p->optimizer_bytes;
    /* mu_dtype=bfloat16 is named where it alone would make the plan fit. */
    uint64_t mu_saving =
        p->mu_bf16 ? 0 : p->optimizer_bytes - plan_optimizer_layout(p->shard_params, true, p->weights_bf16).bytes;
    char mu_hint[480] = "";
    if (mu_saving > 0 && p->total_bytes - mu_saving <= avail)
        snprintf(mu_hint, sizeof mu_hint, ", or set mu_dtype=bfloat16 (AdamW's first moment in bf16: %.2f GiB less)",
                 (double)mu_saving / gib);
    if (p->params_bf16_bytes > 0 && p->total_bytes - p->params_bf16_bytes <= avail) {
        size_t used = strlen(mu_hint);
        snprintf(mu_hint + used, sizeof mu_hint - used,
                 ", or set bf16_weight_copy=false (the matmuls round the fp32 weights as they pack them: %.2f GiB less)",
                 (double)p->params_bf16_bytes / gib);
    }
    /* weight_dtype=bfloat16 (with dtype=bfloat16) likewise, where it alone would fit: the plan of
     * the same config so. */
    plan_t w16;
    config_t cfg16 = *cfg;
    cfg16.weight_dtype = cfg16.dtype = DTYPE_BFLOAT16;
    char w16_err[8];
    if (!p->weights_bf16 && plan_build(&w16, &cfg16, p->num_threads, p->num_ranks, w16_err, sizeof w16_err) == 0 &&
        w16.total_bytes <= avail) {
        size_t used = strlen(mu_hint);
        snprintf(mu_hint + used, sizeof mu_hint - used,
                 ", or set weight_dtype=bfloat16%s (bf16 parameters and AdamW state: a plan of %.2f GiB)",
                 p->bf16 ? "" : " dtype=bfloat16", (double)w16.total_bytes / gib);
    }
    if (whole > avail)
        snprintf(err, errlen,
                 "the memory plan needs %.2f GiB per device but %.2f GiB is available%s, and the parameters and "
                 "gradients alone take %.2f GiB on every rank, whatever the batch or the number of ranks (ranks shard "
                 "only the AdamW state); use a smaller model_name, or a machine with more memory%s",
                 (double)p->total_bytes / gib, (double)avail / gib, share, (double)whole / gib, mu_hint);
    else if (state > avail)
        snprintf(err, errlen,
                 "the memory plan needs %.2f GiB per device but %.2f GiB is available%s, and the parameters, gradients "
                 "and AdamW state alone take %.2f GiB whatever the batch; use more ranks (ici_fsdp_parallelism shards "
                 "the AdamW state's %.2f GiB across them) or a smaller model_name%s",
                 (double)p->total_bytes / gib, (double)avail / gib, share, (double)state / gib,
                 (double)p->optimizer_bytes / gib, mu_hint);
    else
        snprintf(err, errlen,
                 "the memory plan needs %.2f GiB per device (activations %.2f GiB) but %.2f GiB is available%s; "
                 "lower per_device_batch_size (raising gradient_accumulation_steps keeps the global batch) or "
                 "max_target_length%s, or use more ranks%s",
                 (double)p->total_bytes / gib, (double)p->activations_bytes / gib, (double)avail / gib, share,
                 p->remat == QWEN3_REMAT_FULL ? "" : ", or set remat_policy=full", mu_hint);
    return CONFIG_EXIT_CODE;
}

void plan_print(const plan_t *p, FILE *out) {
    const qwen3_dims_t *d = &p->dims;
    fprintf(out, "num_parameters: %lld\n", (long long)p->num_params);
    fprintf(out, "per_device_tflops: %.4f\n", p->tflops_per_device);
    fprintf(out, "tokens_per_device_per_step: %lld\n", (long long)p->tokens_per_device);
    fprintf(out, "shape: B=%lld S=%lld D=%lld F=%lld L=%lld H=%lld KV=%lld HD=%lld V=%lld tied=%s qk_norm=%s\n",
            (long long)d->B, (long long)d->S, (long long)d->D, (long long)d->F, (long long)d->L, (long long)d->H,
            (long long)d->KV, (long long)d->HD, (long long)d->V, d->tied ? "true" : "false", d->qk_norm ? "true" : "false");
    fprintf(out, "num_ranks: %d\n", p->num_ranks);
    fprintf(out, "global_batch_size: %lld (sequences per step: per_device_batch_size x ranks x "
                 "gradient_accumulation_steps)\n", (long long)(d->B * p->num_ranks * p->micro_batches));
    fprintf(out, "optimizer_shard_ranks: %d (ici_fsdp_parallelism: ranks sharing one copy of the AdamW state)\n", p->shard_ranks);
    fprintf(out, "optimizer_replicas: %d (dcn_data_parallelism: copies of the AdamW state)\n", p->replica_groups);
    fprintf(out, "optimizer_shard_parameters: %lld (AdamW state kept by each rank)\n", (long long)p->shard_params);
    fprintf(out, "compute_threads: %d\n", p->num_threads);
    static const char *const remat_names[] = {"none", "minimal", "full"};
    fprintf(out, "remat_policy: %s\n", remat_names[p->remat]);
    fprintf(out, "dtype: %s\n", !p->bf16           ? "float32"
                                : p->weights_bf16 ? "bfloat16 (matmul inputs; bf16 weights (weight_dtype), fp32 gradients)"
                                : p->mu_bf16      ? "bfloat16 (matmul inputs; fp32 master weights, gradients, AdamW's v)"
                                                  : "bfloat16 (matmul inputs; fp32 master weights, gradients, optimizer)");
    fprintf(out, "weight_dtype: %s\n", !p->weights_bf16 ? "float32 (master weights and AdamW's v)"
                                        : p->stochastic_rounding
                                            ? "bfloat16 (the parameters and AdamW's v, updated in fp32; the parameters "
                                              "stored rounded stochastically (stochastic_rounding), v to nearest; no "
                                              "fp32 master copy)"
                                            : "bfloat16 (the parameters and AdamW's v, updated in fp32 and stored rounded "
                                              "to nearest; no fp32 master copy)");
    fprintf(out, "mu_dtype: %s\n", p->mu_bf16 ? "bfloat16 (AdamW's first moment, updated in fp32 and stored rounded)"
                                                : "float32 (AdamW's first moment)");
    fprintf(out, "xent_chunk_tokens: %lld\n", (long long)p->xent_chunk);
    fprintf(out, "memory_parameters_bytes: %llu\n", (unsigned long long)p->params_bytes);
    fprintf(out, "memory_bf16_weights_bytes: %llu\n", (unsigned long long)p->params_bf16_bytes);
    fprintf(out, "memory_gradients_bytes: %llu\n", (unsigned long long)p->grads_bytes);
    fprintf(out, "memory_optimizer_state_bytes: %llu\n", (unsigned long long)p->optimizer_bytes);
    fprintf(out, "memory_saved_activations_bytes: %llu\n", (unsigned long long)p->activations_bytes);
    fprintf(out, "memory_scratch_bytes: %llu\n", (unsigned long long)p->scratch_bytes);
    fprintf(out, "memory_data_ring_bytes: %llu\n", (unsigned long long)p->data_bytes);
    fprintf(out, "memory_total_bytes: %llu\n", (unsigned long long)p->total_bytes);
    fprintf(out, "memory_total_gib: %.3f\n", (double)p->total_bytes / 1073741824.0);
}
