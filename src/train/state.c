#include "train/state.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train/checkpoint.h"
#include "train/resume.h"
#include "util/arena.h"

static float *alloc_floats(uint64_t bytes, const char *what, char *err, size_t errlen) {
    return arena_alloc((size_t)bytes, what, err, errlen);
}

int train_state_create(train_state_t *s, const config_t *cfg, const plan_t *plan, trace_t *trace,
                       const train_parallel_t *par, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->plan = *plan;
    s->trace = trace;
    const qwen3_dims_t *d = &plan->dims;
    int64_t n = plan->num_params;
    const int64_t t_alloc = trace_now_ns();
    void *params = arena_alloc((size_t)plan->params_bytes, "parameters", err, errlen);
    if (plan->weights_bf16 && params) {
        s->params_bf16 = params;
        s->vectors32 = (float *)((char *)params + plan->params_vectors_offset);
    } else {
        s->params = params;
    }
    if (!params || !(s->grads = alloc_floats(plan->grads_bytes, "gradients", err, errlen)) ||
        !(s->adam_state = arena_alloc((size_t)plan->optimizer_bytes, "optimizer state", err, errlen)) ||
        !(s->acts = alloc_floats(plan->activations_bytes, "saved activations", err, errlen)) ||
        !(s->scratch = alloc_floats(plan->scratch_bytes, "scratch", err, errlen)) ||
        (plan->params_bf16_bytes && !(s->params_bf16 = arena_alloc((size_t)plan->params_bf16_bytes, "bf16 weight copy", err, errlen)))) {
        train_state_destroy(s);
        return 1;
    }
    const int64_t t_params = trace_now_ns();
    s->setup_touch_s = (double)(t_params - t_alloc) * 1e-9;
    s->setup_touched_bytes = plan->arena_bytes; /* the buffers above are the plan's parts */
    int64_t shard_index = par ? comm_rank(par->shard) : 0;
    zero_shard_range(n, plan->shard_ranks, shard_index, &s->shard_lo, &s->shard_n);
    const plan_optimizer_layout_t ol = plan_optimizer_layout(plan->shard_params, plan->mu_bf16, plan->weights_bf16);
    char *state = s->adam_state;
    if (plan->weights_bf16) s->adam_v16 = (bf16_t *)state;
    else s->adam_v = (float *)state;
    if (plan->mu_bf16) s->adam_m16 = (bf16_t *)(state + ol.m_offset);
    else s->adam_m = (float *)(state + ol.m_offset);
    s->norm_partials = (double *)(state + ol.partials_offset);
    /* The reduced shard sits after the full local gradients; with one shard they are one. */
    s->grad_shard = plan->shard_ranks > 1 ? s->grads + n : s->grads + s->shard_lo;
    gemm_library_t lib = (gemm_library_t)gemm_library_parse(cfg->gemm_library);
    if (!(s->gemm = gemm_create(lib, err, errlen))) {
        train_state_destroy(s);
        return 1;
    }
    char params_file[4096];
    /* With weight_dtype=bfloat16 the parameters are initialised or read in fp32 into the gradient
     * buffer (as large, and unused until the first backward), then rounded into place. */
    float *params32 = plan->weights_bf16 ? s->grads : s->params;
    s->resumed_step = -1;
    if (cfg->load_full_state_path[0]) {
        full_state_t fs;
        int rc = full_state_open(&fs, cfg->load_full_state_path, d, err, errlen);
        if (rc == 0) {
            rc = qwen3_load_safetensors(params32, d, fs.model_file, err, errlen) != 0 ||
                 full_state_read_moments(&fs, s->shard_lo, s->shard_n, s->adam_m, s->adam_m16, s->adam_v,
                                         s->adam_v16, err, errlen) != 0;
            s->updates_done = fs.updates_done;
            s->resumed_step = fs.step;
            full_state_close(&fs);
        }
        if (rc != 0) {
            train_state_destroy(s);
            return 1;
        }
    } else if (cfg->load_parameters_path[0]) {
        if (checkpoint_parameters_file(cfg->load_parameters_path, params_file, sizeof params_file, err, errlen) != 0 ||
            qwen3_load_safetensors(params32, d, params_file, err, errlen) != 0) {
            train_state_destroy(s);
            return 1;
        }
    } else {
        qwen3_init_params(params32, d, (uint64_t)cfg->init_weights_seed);
    }
    if (s->params_bf16) bf16_from_f32_array(s->params_bf16, params32, n);
    s->setup_params_s = (double)(trace_now_ns() - t_params) * 1e-9;
    qwen3_options_t opt = {.num_threads = plan->num_threads, .remat = plan->remat, .rows = plan->rows,
                           .xent_chunk = plan->xent_chunk, .z_loss = (float)cfg->z_loss_multiplier,
                           .bf16 = plan->bf16, .weights_bf16 = plan->weights_bf16, .gemm_library = lib,
                           .trace = trace};
    const bool data_parallel = par && comm_size(par->world) > 1;
    /* One rank: the gradient buffer is the one the norm is taken over, and the weight gradients'
     * products of the step's last pass store its final values, so they may take their squares
     * as they store them (with micro-batches, after adding onto the earlier passes'). */
    opt.grad_sumsq = !data_parallel;
    if (data_parallel) {
        zero_options_t zo = {.world = par->world, .shard = par->shard, .replica = par->replica, .num_params = n,
                             .params = s->params, .params16 = s->params ? NULL : (uint16_t *)s->params_bf16,
                             .grads = s->grads, .grad_shard = s->grad_shard, .trace = trace,
                             .comm_lane = par->comm_lane, .compute_lane = par->compute_lane};
        if (!(s->zero = zero_create(&zo, err, errlen))) {
            train_state_destroy(s);
            return 1;
        }
        opt.grads_ready = zero_grads_ready;
        opt.grads_ready_arg = s->zero;
    }
    if (!(s->model = qwen3_create(d, &opt, plan->weights_bf16 ? s->vectors32 : s->params, s->params_bf16, s->grads,
                                  s->acts, s->scratch, s->gemm, err, errlen))) {
        train_state_destroy(s);
        return 1;
    }
    /* The fp32 parameters left there: the gradients the first backward adds into start at zero. */
    if (plan->weights_bf16) qwen3_zero_accumulated_grads(s->model);
    qwen3_widen_norm_weights(s->model);
    s->adam = (adamw_hparams_t){.lr = (float)cfg->learning_rate, .b1 = (float)cfg->adam_b1,
                                .b2 = (float)cfg->adam_b2, .eps = (float)cfg->adam_eps,
                                .weight_decay = (float)cfg->adam_weight_decay};
    s->clip = cfg->gradient_clipping_threshold;
    /* Keyed by the init seed: runs of one seed draw alike, whatever their ranks or threads. */
    s->rounding = (adamw_rounding_t){.stochastic = plan->stochastic_rounding,
                                     .seed = bf16_hash32((uint32_t)cfg->init_weights_seed ^
                                                         (uint32_t)((uint64_t)cfg->init_weights_seed >> 32)),
                                     .index0 = s->shard_lo};
    if (trace) {
        s->span_optimizer = trace_intern(trace, "optimizer", TRACE_CAT_PHASE, NULL);
        /* Parts of their own, so the op summary gives each its GB/s: the norm reads 4 bytes a
         * gradient it has not summed yet, the update moves 16-30 bytes a parameter. */
        s->span_grad_norm = trace_intern(trace, "grad_norm", TRACE_CAT_OPTIMIZER, "gradient norm");
        s->span_adamw = trace_intern(trace, "adamw_update", TRACE_CAT_OPTIMIZER, "adamw update");
    }
    return 0;
}

void train_state_destroy(train_state_t *s) {
    zero_destroy(s->zero);
    qwen3_destroy(s->model);
    gemm_destroy(s->gemm);
    if (s->plan.weights_bf16) {
        arena_free(s->params_bf16, s->plan.params_bytes);
    } else {
        arena_free(s->params, s->plan.params_bytes);
        arena_free(s->params_bf16, s->plan.params_bf16_bytes);
    }
    arena_free(s->grads, s->plan.grads_bytes);
    arena_free(s->adam_state, s->plan.optimizer_bytes);
    arena_free(s->acts, s->plan.activations_bytes);
    arena_free(s->scratch, s->plan.scratch_bytes);
    memset(s, 0, sizeof *s);
}

/* The bytes the update must move for n parameters: the weights and both moments read and
 * written in the dtypes they are held in, the gradient read, and the bf16 copy of fp32 master
 * weights written (bf16_weight_copy): 30 bytes a parameter with it and fp32 state, else 28. */
static double update_bytes(const train_state_t *s, int64_t n) {
    double p = s->plan.weights_bf16 ? 2 : 4, m = (s->adam_m16 ? 2 : 4), v = s->plan.weights_bf16 ? 2 : 4;
    double copy = !s->plan.weights_bf16 && s->params_bf16 ? 2 : 0;
    return (double)n * (2 * (p + m + v) + sizeof(float) + copy);
}

void train_step(train_state_t *s, const int32_t *tokens, step_result_t *out) {
    int64_t n = s->shard_n;
    const qwen3_dims_t *d = &s->plan.dims;
    const int64_t micros = s->plan.micro_batches, stride = d->B * (d->S + 1);
    double loss = 0.0;
    for (int64_t g = 0; g < micros; g++) loss += qwen3_forward_backward_micro(s->model, tokens + g * stride, g, micros);
    loss /= (double)micros;
    if (s->zero) zero_finish_grads(s->zero);
    int64_t opt_span = trace_begin(s->trace);
    int64_t t0 = trace_begin(s->trace);
    const int64_t norm_reads = !t0 ? 0 : s->zero ? n : qwen3_grad_sum_squares_reads(s->model); /* for the span */
    double sums[2] = {s->zero ? adamw_sum_squares(s->grad_shard, n, s->norm_partials)
                              : qwen3_grad_sum_squares(s->model, s->norm_partials),
                      loss};
    trace_end(s->trace, 0, s->span_grad_norm, t0, 2.0 * (double)norm_reads, (double)norm_reads * sizeof(float));
    /* Ranks' gradients were summed, and each rank's micro-batches': the global batch's mean
     * gradient is 1/(ranks · micro-batches) of it (equal token counts everywhere). */
    double inv_ranks = 1.0 / (double)s->plan.num_ranks, inv_sum = inv_ranks / (double)micros;
    if (s->zero) {
        /* Squares of every shard, counted once per replica group; the loss of every rank. */
        zero_allreduce(s->zero, ZERO_WORLD, sums, 2);
        sums[0] /= (double)s->plan.replica_groups;
        loss = sums[1] * inv_ranks;
    }
    out->loss = loss;
    out->raw_grad_norm = sqrt(sums[0]) * inv_sum;
    float scale = adamw_clip_scale(out->raw_grad_norm, s->clip);
    out->grad_norm = out->raw_grad_norm * scale;
    if (s->before_update) s->before_update(s->before_update_arg);
    s->updates_done++;
    t0 = trace_begin(s->trace);
    bf16_t *p16 = s->params_bf16 ? s->params_bf16 + s->shard_lo : NULL;
    if (s->plan.weights_bf16)
        adamw_update_w16(p16, s->adam_m, s->adam_m16, s->adam_v16, s->grad_shard, n, s->updates_done,
                         (float)(scale * inv_sum), &s->adam, &s->rounding);
    else if (s->adam_m16)
        adamw_update_m16(s->params + s->shard_lo, s->adam_m16, s->adam_v, s->grad_shard, n, s->updates_done,
                         (float)(scale * inv_sum), &s->adam, p16);
    else
        adamw_update(s->params + s->shard_lo, s->adam_m, s->adam_v, s->grad_shard, n, s->updates_done,
                     (float)(scale * inv_sum), &s->adam, p16);
    trace_end(s->trace, 0, s->span_adamw, t0, 0, update_bytes(s, n));
    /* The next backward writes most gradients afresh; the ones it adds into go back to zero here,
     * for one shard and several alike (with several, the reduce-scatter rewrites the shard each
     * step and the local copy is only read by it, all of it done by zero_finish_grads above). */
    qwen3_zero_accumulated_grads(s->model);
    if (s->zero) {
        zero_gather_params(s->zero);
        /* bf16_weight_copy: the update wrote the copy of this rank's shard only; the rest came
         * in fp32. (Without the copy the matmuls round the gathered fp32 weights as they pack.) */
        if (s->params && s->params_bf16) {
            int64_t total = s->plan.num_params, hi = s->shard_lo + n;
            bf16_from_f32_array(s->params_bf16, s->params, s->shard_lo);
            bf16_from_f32_array(s->params_bf16 + hi, s->params + hi, total - hi);
        }
    }
    qwen3_widen_norm_weights(s->model);
    trace_end(s->trace, 0, s->span_optimizer, opt_span, 0, 0);
}

double train_eval_loss(train_state_t *s, const int32_t *tokens) {
    double loss = qwen3_forward_loss(s->model, tokens);
    if (s->zero) {
        zero_allreduce(s->zero, ZERO_WORLD, &loss, 1);
        loss /= (double)s->plan.num_ranks;
    }
    return loss;
}
