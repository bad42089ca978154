/* The whole Qwen3 step against Hugging Face transformers: fixtures made by
 * tools/make_fixtures.py (float64 reference from random weights) hold the loss, every
 * gradient and the parameters after 3 AdamW steps with clipping and weight decay. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "io/safetensors.h"
#include "kernels/adamw.h"
#include "kernels/bf16_blocked.h"
#include "model/grad_sumsq.h"
#include "plan/plan.h"
#include "train/state.h"
#include "util/rng.h"

typedef struct fixture {
    config_t cfg;
    plan_t plan;
    train_state_t state;
    safetensors_t ref;
    int32_t *tokens;
    qwen3_tensor_info_t *table;
    int64_t num_tensors;
} fixture_t;

static const char *meta(const safetensors_t *st, const char *key) {
    const char *v = safetensors_meta(st, key);
    assert_non_null(v);
    return v;
}

/* rows: row_padding's value ("dense" or "padded"), so that each check runs both layouts on
 * every CPU, not only the one auto picks there. */
static void load_fixture(fixture_t *f, const char *name, const char *rows) {
    char path[256], err[512];
    snprintf(path, sizeof path, "tests/fixtures/%s/reference.safetensors", name);
    assert_int_equal(safetensors_open(&f->ref, path, err, sizeof err), 0);
    const safetensors_t *r = &f->ref;
    char ov[32][160];
    int n = 0;
#define OV(fmt, ...) snprintf(ov[n++], sizeof ov[0], fmt, __VA_ARGS__)
    OV("vocab_size=%s", meta(r, "vocab_size"));
    OV("base_emb_dim=%s", meta(r, "hidden_size"));
    OV("base_mlp_dim=%s", meta(r, "intermediate_size"));
    OV("base_num_decoder_layers=%s", meta(r, "num_hidden_layers"));
    OV("base_num_query_heads=%s", meta(r, "num_attention_heads"));
    OV("base_num_kv_heads=%s", meta(r, "num_key_value_heads"));
    OV("head_dim=%s", meta(r, "head_dim"));
    OV("rope_max_timescale=%s", meta(r, "rope_theta"));
    OV("normalization_layer_epsilon=%s", meta(r, "rms_norm_eps"));
    OV("logits_via_embedding=%s", meta(r, "tie_word_embeddings"));
    OV("per_device_batch_size=%s", meta(r, "batch"));
    OV("max_target_length=%s", meta(r, "seq"));
    OV("learning_rate=%s", meta(r, "lr"));
    OV("adam_b1=%s", meta(r, "beta1"));
    OV("adam_b2=%s", meta(r, "beta2"));
    OV("adam_eps=%s", meta(r, "eps"));
    OV("adam_weight_decay=%s", meta(r, "weight_decay"));
    OV("gradient_clipping_threshold=%s", meta(r, "clip"));
    OV("load_parameters_path=tests/fixtures/%s/weights.safetensors", name);
    OV("%s", "profiler=");
    OV("row_padding=%s", rows);
#undef OV
    char *argv[32];
    for (int i = 0; i < n; i++) argv[i] = ov[i];
    int rc = config_load(&f->cfg, NULL, n, argv, err, sizeof err);
    if (rc) fprintf(stderr, "config: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(plan_build(&f->plan, &f->cfg, 2, 1, err, sizeof err), 0);
    rc = train_state_create(&f->state, &f->cfg, &f->plan, NULL, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "state: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(qwen3_rows_padded(f->state.model), !strcmp(rows, "padded"));
    const st_tensor_t *tok = safetensors_find(r, "tokens");
    assert_non_null(tok);
    assert_int_equal(tok->dtype, ST_I32);
    assert_int_equal(tok->numel, f->plan.dims.B * (f->plan.dims.S + 1));
    f->tokens = malloc(tok->nbytes);
    memcpy(f->tokens, tok->data, tok->nbytes);
    f->num_tensors = qwen3_tensor_table(&f->plan.dims, NULL);
    f->table = malloc((size_t)f->num_tensors * sizeof *f->table);
    qwen3_tensor_table(&f->plan.dims, f->table);
}

static void free_fixture(fixture_t *f) {
    train_state_destroy(&f->state);
    safetensors_close(&f->ref);
    free(f->tokens);
    free(f->table);
}

static float *ref_tensor(const fixture_t *f, const char *prefix, const char *name, int64_t numel) {
    char key[160];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    const st_tensor_t *t = safetensors_find(&f->ref, key);
    if (!t) fprintf(stderr, "missing reference tensor %s\n", key);
    assert_non_null(t);
    assert_int_equal(t->numel, numel);
    float *out = malloc((size_t)numel * sizeof(float));
    assert_int_equal(safetensors_to_f32(t, out), 0);
    return out;
}

/* ‖a − b‖ / ‖b‖ in double. */
static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static double ref_scalar(const fixture_t *f, const char *name, int64_t index) {
    const st_tensor_t *t = safetensors_find(&f->ref, name);
    assert_non_null(t);
    float *v = malloc((size_t)t->numel * sizeof(float));
    assert_int_equal(safetensors_to_f32(t, v), 0);
    double x = v[index];
    free(v);
    return x;
}

static int64_t numel_of(const qwen3_tensor_info_t *t) { return t->rows * (t->cols ? t->cols : 1); }

/* The worst relative error of any tensor in `values` (laid out as the parameters) against the
 * reference tensors "<prefix><hf name>"; tensors at or past `bound` are named on stderr. */
static double worst_tensor_error(const fixture_t *f, const char *prefix, const float *values, double bound,
                                 const char **worst_name) {
    double worst = 0;
    for (int64_t i = 0; i < f->num_tensors; i++) {
        int64_t n = numel_of(&f->table[i]);
        float *ref = ref_tensor(f, prefix, f->table[i].hf_name, n);
        double e = rel_err(values + f->table[i].offset, ref, n);
        if (e >= bound) fprintf(stderr, "%s%s: relative error %.3e\n", prefix, f->table[i].hf_name, e);
        if (e > worst) {
            worst = e;
            if (worst_name) *worst_name = f->table[i].hf_name;
        }
        free(ref);
    }
    return worst;
}

static void check_loss_and_grads(const char *name, const char *rows) {
    fixture_t f;
    load_fixture(&f, name, rows);
    double loss = qwen3_forward_backward(f.state.model, f.tokens);
    double ref_loss = ref_scalar(&f, "loss", 0);
    double loss_rel = fabs(loss - ref_loss) / fabs(ref_loss);
    printf("# %s, %s rows: loss %.8f reference %.8f relative error %.2e\n", name, rows, loss, ref_loss, loss_rel);
    /* fp32 through a few small layers: ~1e-7 relative; 1e-5 is the bar. */
    assert_true(loss_rel < 1e-5);
    const char *worst_name = "";
    double worst = worst_tensor_error(&f, "grad.", f.state.grads, 1e-4, &worst_name);
    assert_true(worst < 1e-4);
    printf("# %s, %s rows: %lld gradient tensors, worst relative error %.2e (%s)\n", name, rows, (long long)f.num_tensors,
           worst, worst_name);
    free_fixture(&f);
}

static void check_three_steps(const char *name, const char *rows) {
    fixture_t f;
    load_fixture(&f, name, rows);
    for (int step = 0; step < 3; step++) {
        step_result_t r;
        train_step(&f.state, f.tokens, &r);
        double ref_loss = ref_scalar(&f, "losses", step), ref_norm = ref_scalar(&f, "grad_norm", step);
        printf("# %s, %s rows, step %d: loss %.7f (ref %.7f) raw grad norm %.6f (ref %.6f) clipped %.6f\n", name, rows, step,
               r.loss, ref_loss, r.raw_grad_norm, ref_norm, r.grad_norm);
        assert_true(fabs(r.loss - ref_loss) / ref_loss < 1e-5);
        assert_true(fabs(r.raw_grad_norm - ref_norm) / ref_norm < 1e-4);
    }
    double worst = worst_tensor_error(&f, "step3.", f.state.params, 1e-5, NULL);
    assert_true(worst < 1e-5);
    printf("# %s, %s rows: parameters after 3 AdamW steps, worst relative error %.2e\n", name, rows, worst);
    free_fixture(&f);
}

/* padded_rows: q/k/v and gate/up 512 wide, the widths (2 KiB multiples) where the matmuls on
 * oneDNN's gemm driver (AVX2) run faster at padded strides; the other fixtures' widths are off
 * them. Each check runs each fixture at dense and at padded rows (qwen3_padded_width: every
 * activation and its gradient), whatever auto picks on this CPU. */
static void note_padding(void) {
    char err[256];
    gemm_ctx_t *g = gemm_create(GEMM_LIB_AUTO, err, sizeof err);
    assert_non_null(g);
    int64_t from = gemm_pad_rows_from(g);
    if (from == INT64_MAX) printf("# row_padding=auto runs dense rows on this CPU\n");
    else printf("# row_padding=auto pads the activations %lld floats wide or wider on this CPU\n", (long long)from);
    gemm_destroy(g);
}
#define FIXTURE_TESTS(fixture, rows)                                                                         \
    static void test_##fixture##_##rows##_loss_and_grads(void **st) { (void)st; check_loss_and_grads(#fixture, #rows); } \
    static void test_##fixture##_##rows##_three_steps(void **st) { (void)st; check_three_steps(#fixture, #rows); }
FIXTURE_TESTS(tied_gqa, dense)
FIXTURE_TESTS(tied_gqa, padded)
FIXTURE_TESTS(untied_wide, dense)
FIXTURE_TESTS(untied_wide, padded)
FIXTURE_TESTS(padded_rows, dense)
FIXTURE_TESTS(padded_rows, padded)
static void test_row_padding_auto(void **st) { (void)st; note_padding(); }

/* The gradient buffer's contract: backward writes every matmul weight's gradient and adds into
 * the rest, which qwen3_zero_accumulated_grads zeroes. So with the buffer full of NaN and only
 * those entries zeroed, a backward gives the gradients of one from an all-zero buffer bit for
 * bit: an entry it read without writing first, or one the zeroing missed, would be NaN. The
 * saved activations are NaN too: each is written before it is read, and the padding columns of
 * padded rows are never read (the residual copies carry them along). */
static void check_grads_over_stale_buffer(const char *name, const char *rows) {
    fixture_t f;
    load_fixture(&f, name, rows);
    int64_t n = f.plan.num_params;
    memset(f.state.grads, 0, (size_t)n * sizeof(float));
    double loss = qwen3_forward_backward(f.state.model, f.tokens);
    float *g = malloc((size_t)n * sizeof(float));
    memcpy(g, f.state.grads, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f.state.grads[i] = NAN;
    int64_t nacts = (int64_t)(f.plan.activations_bytes / sizeof(float));
    for (int64_t i = 0; i < nacts; i++) f.state.acts[i] = NAN;
    qwen3_zero_accumulated_grads(f.state.model);
    assert_true(loss == qwen3_forward_backward(f.state.model, f.tokens));
    assert_memory_equal(g, f.state.grads, (size_t)n * sizeof(float));
    free(g);
    free_fixture(&f);
}

#define STALE_BUFFER_TEST(fixture, rows)                                                                     \
    static void test_##fixture##_##rows##_grads_over_stale_buffer(void **st) {                                \
        (void)st;                                                                                           \
        check_grads_over_stale_buffer(#fixture, #rows);                                                     \
    }
STALE_BUFFER_TEST(tied_gqa, dense)
STALE_BUFFER_TEST(tied_gqa, padded)
STALE_BUFFER_TEST(untied_wide, dense)
STALE_BUFFER_TEST(untied_wide, padded)
STALE_BUFFER_TEST(padded_rows, dense)
STALE_BUFFER_TEST(padded_rows, padded)

/* Rematerialisation recomputes what it did not keep with the same kernels on the same inputs:
 * the gradients equal remat none's bit for bit, and the plan keeps less (full < minimal < none),
 * at either row layout (full reruns a layer's forward into the norm-gradient buffer). */
static void check_remat_matches_none(const char *rows) {
    fixture_t f;
    load_fixture(&f, "tied_gqa", rows);
    double loss = qwen3_forward_backward(f.state.model, f.tokens);
    int64_t n = f.plan.num_params;
    float *g = malloc((size_t)n * sizeof(float));
    memcpy(g, f.state.grads, (size_t)n * sizeof(float));
    uint64_t kept = f.plan.activations_bytes;
    static const char *policies[] = {"minimal", "full"};
    for (int i = 0; i < 2; i++) {
        char err[256];
        snprintf(f.cfg.remat_policy, sizeof f.cfg.remat_policy, "%s", policies[i]);
        plan_t plan;
        assert_int_equal(plan_build(&plan, &f.cfg, 2, 1, err, sizeof err), 0);
        printf("# remat %s, %s rows, keeps %llu bytes of activations (the one before: %llu)\n", policies[i], rows,
               (unsigned long long)plan.activations_bytes, (unsigned long long)kept);
        assert_true(plan.activations_bytes < kept);
        kept = plan.activations_bytes;
        train_state_t s2;
        assert_int_equal(train_state_create(&s2, &f.cfg, &plan, NULL, NULL, err, sizeof err), 0);
        double loss2 = qwen3_forward_backward(s2.model, f.tokens);
        assert_true(loss == loss2);
        assert_memory_equal(g, s2.grads, (size_t)n * sizeof(float));
        train_state_destroy(&s2);
    }
    free(g);
    free_fixture(&f);
}

static void test_remat_matches_none(void **st) {
    (void)st;
    check_remat_matches_none("dense");
    check_remat_matches_none("padded");
}

/* A state from overrides on the built-in defaults, on 2 threads. */
static void new_state(train_state_t *s, plan_t *plan, int n, char **overrides) {
    char err[512];
    config_t cfg;
    assert_int_equal(config_load(&cfg, NULL, n, overrides, err, sizeof err), 0);
    assert_int_equal(plan_build(plan, &cfg, 2, 1, err, sizeof err), 0);
    assert_int_equal(train_state_create(s, &cfg, plan, NULL, NULL, err, sizeof err), 0);
}

/* dtype=bfloat16 rounds every matmul input to bf16 (relative error up to 2^-9 ≈ 2e-3 per
 * value, ≈ 1e-3 on average). Through two layers, the head and the backward those errors add
 * up to a few 1e-3 on the gradients; the bars below (loss 2e-3, each gradient tensor 3e-2)
 * sit above that and far below what a wrong bf16 path gives (order 1: a wrong operand, a
 * stale weight copy or a missing accumulate). */
static void check_bf16_against_reference(const char *rows) {
    fixture_t f;
    load_fixture(&f, "tied_gqa", rows);
    train_state_destroy(&f.state);
    f.cfg.dtype = DTYPE_BFLOAT16;
    char err[256];
    assert_int_equal(plan_build(&f.plan, &f.cfg, 2, 1, err, sizeof err), 0);
    assert_true(f.plan.bf16);
    assert_int_equal(f.plan.params_bf16_bytes, 0); /* the matmuls round the fp32 weights as they pack them */
    assert_int_equal(train_state_create(&f.state, &f.cfg, &f.plan, NULL, NULL, err, sizeof err), 0);
    assert_null(f.state.params_bf16);
    double loss = qwen3_forward_backward(f.state.model, f.tokens);
    double ref_loss = ref_scalar(&f, "loss", 0), loss_rel = fabs(loss - ref_loss) / ref_loss;
    double worst = worst_tensor_error(&f, "grad.", f.state.grads, 3e-2, NULL);
    printf("# tied_gqa in bf16, %s rows: loss relative error %.2e, worst gradient relative error %.2e\n", rows, loss_rel,
           worst);
    assert_true(loss_rel < 2e-3);
    assert_true(worst < 3e-2);
    free_fixture(&f);
}

/* auto keeps bf16 runs dense; padded rows there are a user's choice and must give the same. */
static void test_bf16_against_reference(void **st) {
    (void)st;
    check_bf16_against_reference("dense");
    check_bf16_against_reference("padded");
}

/* weight_dtype=bfloat16 is dtype=bfloat16 on weights that bf16 holds exactly: the matmuls read
 * the same bf16 values, the embedding and the norms their widened values, so with the fp32
 * master weights rounded to bf16 first the loss and every gradient are the same bits. After one
 * step its bf16 weights are bf16 of the master weights' update (the moments start at zero and
 * the update uses their unrounded values). Its plan holds 2 bytes a parameter and the norm
 * weights in fp32 where the master weights take 4, and no bf16 copy. */
static void test_bf16_weights_are_bf16_runs_on_rounded_weights(void **st) {
    (void)st;
    fixture_t f;
    load_fixture(&f, "tied_gqa", "dense");
    train_state_destroy(&f.state);
    char err[256];
    f.cfg.dtype = DTYPE_BFLOAT16;
    assert_int_equal(plan_build(&f.plan, &f.cfg, 2, 1, err, sizeof err), 0);
    assert_int_equal(train_state_create(&f.state, &f.cfg, &f.plan, NULL, NULL, err, sizeof err), 0);
    const int64_t n = f.plan.num_params;
    bf16_t *rounded = malloc((size_t)n * sizeof(bf16_t));
    for (int64_t i = 0; i < n; i++) f.state.params[i] = bf16_to_f32(rounded[i] = bf16_from_f32(f.state.params[i]));
    config_t cfg16 = f.cfg;
    cfg16.weight_dtype = DTYPE_BFLOAT16;
    plan_t plan16;
    assert_int_equal(plan_build(&plan16, &cfg16, 2, 1, err, sizeof err), 0);
    assert_true(plan16.weights_bf16 && plan16.mu_bf16);
    assert_int_equal(plan16.params_bf16_bytes, 0);
    assert_int_equal(plan16.params_bytes, (uint64_t)(n * 2 + 63) / 64 * 64 + (uint64_t)qwen3_vector_floats(&plan16.dims) * 4);
    train_state_t s16;
    assert_int_equal(train_state_create(&s16, &cfg16, &plan16, NULL, NULL, err, sizeof err), 0);
    assert_null(s16.params);
    assert_memory_equal(s16.params_bf16, rounded, (size_t)n * sizeof(bf16_t));
    double loss = qwen3_forward_backward(f.state.model, f.tokens), loss16 = qwen3_forward_backward(s16.model, f.tokens);
    assert_true(loss == loss16);
    assert_memory_equal(f.state.grads, s16.grads, (size_t)n * sizeof(float));
    step_result_t r, r16;
    train_step(&f.state, f.tokens, &r);
    train_step(&s16, f.tokens, &r16);
    assert_true(r.loss == r16.loss && r.raw_grad_norm == r16.raw_grad_norm);
    for (int64_t i = 0; i < n; i++) rounded[i] = bf16_from_f32(f.state.params[i]);
    assert_memory_equal(s16.params_bf16, rounded, (size_t)n * sizeof(bf16_t));
    free(rounded);
    /* The norm weights the kernels read follow the update. */
    float *vec = malloc((size_t)qwen3_vector_floats(&plan16.dims) * sizeof(float));
    qwen3_widen_vectors(vec, &plan16.dims, s16.params_bf16);
    assert_memory_equal(vec, s16.vectors32, (size_t)qwen3_vector_floats(&plan16.dims) * sizeof(float));
    free(vec);
    train_state_destroy(&s16);
    free_fixture(&f);
}

/* dtype=bfloat16 with fp32 weights rounds them as the matmuls pack them (bf16_weight_copy=false,
 * the default) where the copy's run reads the same bf16 values from its copy: the same loss,
 * gradients and updated weights to the bit, over two steps, on our blocked kernel (the tiny
 * model's T = 128 and widths are multiples of 32). On oneDNN, where the rounded weights go in
 * panels of output columns, the bits held too for these shapes (deep narrow panels may be
 * summed in another order: test_gemm_bf16_b32_is_gemm_bf16_of_the_rounded). The copy's plan
 * holds 2 bytes a parameter more, and the update keeps the copy current. */
static void test_bf16_weight_copy_changes_no_bit(void **st) {
    (void)st;
    for (int lib = 0; lib < 2; lib++) {
        train_state_t s[2];
        plan_t plan[2];
        int32_t *tokens = NULL;
        double loss[2];
        for (int copy = 0; copy < 2; copy++) {
            char *ov[] = {"model_name=tiny", "per_device_batch_size=2", "max_target_length=64", "profiler=",
                          "dtype=bfloat16", copy ? "bf16_weight_copy=true" : "bf16_weight_copy=false",
                          lib ? "gemm_library=onednn" : "gemm_library=auto"};
            new_state(&s[copy], &plan[copy], 7, ov);
            if (!tokens) {
                const int64_t nt = plan[0].dims.B * (plan[0].dims.S + 1);
                tokens = malloc((size_t)nt * sizeof(int32_t));
                for (int64_t i = 0; i < nt; i++) tokens[i] = (int32_t)((i * 37 + 11) % plan[0].dims.V);
            }
            loss[copy] = qwen3_forward_backward(s[copy].model, tokens);
        }
        const int64_t n = plan[0].num_params;
        assert_int_equal(plan[0].params_bf16_bytes, 0);
        assert_null(s[0].params_bf16);
        assert_int_equal(plan[1].params_bf16_bytes, (uint64_t)n * 2);
        assert_int_equal(plan[1].total_bytes - plan[0].total_bytes, (uint64_t)n * 2);
        if (!lib) printf("# bf16 products of the tiny model on %s\n", gemm_bf16_detail(s[0].gemm));
        assert_true(loss[0] == loss[1]);
        assert_memory_equal(s[0].grads, s[1].grads, (size_t)n * sizeof(float));
        for (int step = 0; step < 2; step++) {
            step_result_t r[2];
            for (int copy = 0; copy < 2; copy++) train_step(&s[copy], tokens, &r[copy]);
            assert_true(r[0].loss == r[1].loss && r[0].raw_grad_norm == r[1].raw_grad_norm);
            assert_memory_equal(s[0].params, s[1].params, (size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++)
                if (s[1].params_bf16[i] != bf16_from_f32(s[1].params[i])) fail_msg("bf16 copy stale at %lld", (long long)i);
        }
        free(tokens);
        train_state_destroy(&s[0]);
        train_state_destroy(&s[1]);
    }
}

/* grad_sumsq_total: recorded ranges (given out of order, one at the buffer's end) stand for
 * their values, which are then not read (NaN there leaves the total finite); the gaps are read.
 * Against Σ g² in double: float partials of 1024 positive squares (≤ 1024 · 2⁻²⁴ ≈ 6e-5
 * relative, typically far less); bound 6e-5. With no range it is adamw_sum_squares to the bit. */
static void test_grad_sumsq_total(void **st) {
    (void)st;
    const int64_t n = 2 * ADAMW_NORM_BLOCK + 777;
    const int64_t ranges[][2] = {{ADAMW_NORM_BLOCK, 3000}, {n - 64, 64}, {100, 5000}};
    float *g = malloc((size_t)n * sizeof(float));
    double *partials = malloc((size_t)adamw_norm_partials(n) * sizeof(double)), want = 0.0;
    uint32_t u = 7;
    for (int64_t i = 0; i < n; i++) {
        u = u * 1664525u + 1013904223u;
        g[i] = (float)((u >> 8) / 16777216.0 - 0.5);
        want += (double)g[i] * g[i];
    }
    grad_sumsq_t r;
    assert_true(grad_sumsq_init(&r, 4));
    assert_true(grad_sumsq_total(&r, g, n, partials) == adamw_sum_squares(g, n, partials));
    for (int i = 0; i < 3; i++) {
        double sq = 0.0;
        for (int64_t j = ranges[i][0]; j < ranges[i][0] + ranges[i][1]; j++) {
            sq += (double)g[j] * g[j];
            g[j] = NAN;
        }
        grad_sumsq_add(&r, ranges[i][0], ranges[i][1], sq);
    }
    double got = grad_sumsq_total(&r, g, n, partials);
    printf("# grad_sumsq_total with 3 ranges: relative error %.2e\n", fabs(got - want) / want);
    assert_true(fabs(got - want) / want < 6e-5);
    grad_sumsq_clear(&r);
    assert_true(isnan(grad_sumsq_total(&r, g, n, partials))); /* cleared: all read again */
    grad_sumsq_free(&r);
    free(g), free(partials);
}

/* A bf16 step's gradient norm from the weight gradients' products (opt.grad_sumsq, on one rank):
 * against Σ g² over the gradient buffer in double, to float summation (tiles of 256 squares,
 * partials of 1024: ≤ 6e-5 relative; bound 6e-5). Where the products take the sums
 * (AVX512-BF16 dot products), the layers' matrices are not read again: doubling one of them
 * after the backward leaves the norm's sum as it was; elsewhere the buffer is read whole and the
 * sum follows the change. */
static void test_bf16_grad_norm_from_products(void **st) {
    (void)st;
    fixture_t f;
    load_fixture(&f, "tied_gqa", "dense");
    train_state_destroy(&f.state);
    f.cfg.dtype = DTYPE_BFLOAT16;
    char err[256];
    assert_int_equal(plan_build(&f.plan, &f.cfg, 2, 1, err, sizeof err), 0);
    assert_int_equal(train_state_create(&f.state, &f.cfg, &f.plan, NULL, NULL, err, sizeof err), 0);
    qwen3_forward_backward(f.state.model, f.tokens);
    const int64_t n = f.plan.num_params;
    double want = 0.0;
    for (int64_t i = 0; i < n; i++) want += (double)f.state.grads[i] * f.state.grads[i];
    double got = qwen3_grad_sum_squares(f.state.model, f.state.norm_partials);
    printf("# tied_gqa bf16 gradient sum of squares from the products: relative error %.2e\n", fabs(got - want) / want);
    assert_true(fabs(got - want) / want < 6e-5);
    const qwen3_tensor_info_t *q = NULL;
    for (int64_t i = 0; i < f.num_tensors; i++)
        if (!strcmp(f.table[i].hf_name, "model.layers.0.self_attn.q_proj.weight")) q = &f.table[i];
    assert_non_null(q);
    double q_sq = 0.0;
    for (int64_t i = q->offset; i < q->offset + q->rows * q->cols; i++) {
        q_sq += (double)f.state.grads[i] * f.state.grads[i];
        f.state.grads[i] *= 2.0f;
    }
    assert_true(q_sq > 0.0);
    double after = qwen3_grad_sum_squares(f.state.model, f.state.norm_partials);
    if (bf16_blocked_sums_squares()) {
        assert_true(after == got);
    } else {
        printf("# the products' sums of squares not tested: no AVX512-BF16 dot products here (or AMX)\n");
        assert_true(fabs(after - (got + 3.0 * q_sq)) / after < 6e-5);
    }
    free_fixture(&f);
}

/* The bar for bf16: the loss curve over 30 steps within 2% of fp32's. A tiny model on
 * a fresh batch each step (so the curve is not just memorisation). */
static void test_bf16_loss_curve_tracks_fp32(void **st) {
    (void)st;
    double losses[2][30];
    for (int pass = 0; pass < 2; pass++) {
        char *ov[] = {"model_name=tiny", "per_device_batch_size=2", "max_target_length=64", "learning_rate=0.003",
                      "profiler=", pass ? "dtype=bfloat16" : "dtype=float32"};
        plan_t plan;
        train_state_t s;
        new_state(&s, &plan, 6, ov);
        int64_t B = plan.dims.B, S = plan.dims.S;
        int32_t *tokens = malloc((size_t)(B * (S + 1)) * sizeof(int32_t));
        for (int step = 0; step < 30; step++) {
            /* Bigram-ish data: each token follows from the previous, so there is a curve to learn. */
            for (int64_t b = 0; b < B; b++) {
                int32_t t = (int32_t)((step * 31 + b * 17) % plan.dims.V);
                for (int64_t i = 0; i <= S; i++) {
                    tokens[b * (S + 1) + i] = t;
                    t = (int32_t)((t * 5 + 3) % plan.dims.V);
                }
            }
            step_result_t r;
            train_step(&s, tokens, &r);
            losses[pass][step] = r.loss;
        }
        free(tokens);
        train_state_destroy(&s);
    }
    double worst = 0;
    for (int step = 0; step < 30; step++) {
        double e = fabs(losses[1][step] - losses[0][step]) / losses[0][step];
        worst = e > worst ? e : worst;
    }
    printf("# tiny model, 30 steps: fp32 loss %.4f -> %.4f, bf16 %.4f -> %.4f, worst step difference %.2f%%\n",
           losses[0][0], losses[0][29], losses[1][0], losses[1][29], 100 * worst);
    assert_true(losses[0][29] < 0.5 * losses[0][0]); /* it learned something */
    assert_true(worst < 0.02);
}

/* One draw, kept out of line so that the loop calling it is never vectorised: the init's
 * vectorised lanes must give what this gives alone. */
static __attribute__((noinline)) void scalar_normal_pair(uint64_t seed, uint64_t stream, uint64_t pair, float *z0,
                                                         float *z1) {
    rng_normal_pair(seed, stream, pair, z0, z1);
}

/* The init's normals are arithmetic of its own (util/rng.h: Cephes' logf, sinf and cosf
 * polynomials, no libm call), so they are checked against Box-Muller in double on the same
 * uniforms and the same angle (quadrant·π/2 + x). The log is within an ulp (Cephes' bound;
 * 0.82 measured over this sweep of every exponent u1 takes). A draw is r·cos θ with |r| ≤ 5.9:
 * an ulp or so in the log, sqrt, polynomial and product each is about 1e-6 at most at |z| ~ 4-6
 * (an ulp there is 4.8e-7; 5.9e-7 measured over 4 M pairs), where a wrong coefficient or
 * quadrant costs 1e-3 or more. */
static void test_normal_draws_match_double(void **st) {
    (void)st;
    double worst_log_ulp = 0.0, worst_abs = 0.0;
    for (uint32_t m = 0; m < (1u << 24); m += 61) {
        float u = ((float)m + 0.5f) * (1.0f / 16777216.0f);
        float ref = (float)log((double)u);
        double ulp = (double)(nextafterf(fabsf(ref), INFINITY) - fabsf(ref));
        double e = fabs((double)rng_logf_(u) - log((double)u)) / ulp;
        if (e > worst_log_ulp) worst_log_ulp = e;
    }
    for (uint64_t k = 0; k < 500000; k++) {
        float z0, z1;
        scalar_normal_pair(7, 3, k, &z0, &z1);
        uint64_t h = rng_u64(7, 3, k);
        float u1 = ((float)(uint32_t)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
        uint32_t v = (uint32_t)(h >> 8) & 0xffffffu;
        double x = ((double)(v & 0x3fffffu) + 0.5) * (M_PI / 2 / 4194304.0) - M_PI / 4;
        double theta = (double)(v >> 22) * (M_PI / 2) + x, r = sqrt(-2.0 * log((double)u1));
        double e = fmax(fabs(z0 - r * cos(theta)), fabs(z1 - r * sin(theta)));
        if (e > worst_abs) worst_abs = e;
    }
    printf("# normal draws: log within %.3f ulp, draws within %.2e of double Box-Muller\n", worst_log_ulp, worst_abs);
    assert_true(worst_log_ulp <= 1.0);
    assert_true(worst_abs <= 1e-6);
}

/* The seeded init: N(0, 0.02) matrices and ones for the norms; the same seed gives the same
 * bits on 1 and 2 threads, another seed other values. Over n ≈ 90k draws the sample mean has
 * a standard error of 0.02/√n ≈ 7e-5 and the sample std one of ≈ 0.02/√(2n) ≈ 5e-5, so
 * bounds of 4e-4 and 2% (8σ) only fail on a wrong generator. */
static void test_init_statistics_and_determinism(void **st) {
    (void)st;
    char err[512];
    config_t cfg;
    char *ov[] = {"model_name=tiny"};
    assert_int_equal(config_load(&cfg, NULL, 1, ov, err, sizeof err), 0);
    qwen3_dims_t d = plan_dims(&cfg);
    int64_t n = qwen3_num_params(&d), nt = qwen3_tensor_table(&d, NULL);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    qwen3_tensor_info_t *t = malloc((size_t)nt * sizeof *t);
    qwen3_tensor_table(&d, t);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    qwen3_init_params(a, &d, 7);
    omp_set_num_threads(2);
    qwen3_init_params(b, &d, 7);
    omp_set_num_threads(threads);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    /* The vectorised loop's lanes, its peeled and remainder iterations, and a tensor's odd last
     * element all give what a draw alone gives. */
    for (int64_t i = 0; i < nt; i++) {
        if (t[i].init == QWEN3_INIT_ONES) continue;
        int64_t numel = numel_of(&t[i]);
        for (int64_t j = 0; j < numel; j += 2) {
            float z0, z1;
            scalar_normal_pair(7, (uint64_t)i, (uint64_t)(j / 2), &z0, &z1);
            assert_true(a[t[i].offset + j] == 0.02f * z0);
            if (j + 1 < numel) assert_true(a[t[i].offset + j + 1] == 0.02f * z1);
        }
    }
    double sum = 0, sq = 0, count = 0, beyond = 0;
    for (int64_t i = 0; i < nt; i++) {
        int64_t numel = numel_of(&t[i]);
        for (int64_t j = 0; j < numel; j++) {
            float v = a[t[i].offset + j];
            if (t[i].init == QWEN3_INIT_ONES) {
                assert_true(v == 1.0f);
                continue;
            }
            sum += v, sq += (double)v * v, count++;
            beyond += fabs(v) > 3 * 0.02;
        }
    }
    double mean = sum / count, std = sqrt(sq / count - mean * mean);
    printf("# init: %.0f normal draws, mean %.2e, std %.5f, beyond 3 sigma %.3f%% (normal: 0.27%%)\n", count, mean,
           std, 100 * beyond / count);
    assert_true(fabs(mean) < 4e-4);
    assert_true(fabs(std - 0.02) < 0.02 * 0.02);
    assert_true(beyond / count > 0.0017 && beyond / count < 0.0037);
    qwen3_init_params(b, &d, 8);
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += a[i] == b[i];
    assert_true(same < n / 10); /* only the norms' ones coincide */
    free(a), free(b), free(t);
}

/* qwen3_save_safetensors writes every tensor under its Hugging Face name, and
 * qwen3_load_safetensors reads the same bits back (F32 both ways); the file is whole, with no
 * temporary left beside it. */
static void test_save_load_round_trip(void **st) {
    (void)st;
    char err[512], dir[] = "/tmp/test_model_st.XXXXXX", path[64];
    config_t cfg;
    char *ov[] = {"model_name=tiny"};
    assert_int_equal(config_load(&cfg, NULL, 1, ov, err, sizeof err), 0);
    qwen3_dims_t d = plan_dims(&cfg);
    int64_t n = qwen3_num_params(&d);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    qwen3_init_params(a, &d, 11);
    for (int64_t i = 0; i < n; i++) b[i] = -1.0f;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(qwen3_save_safetensors(a, &d, path, err, sizeof err), 0);
    assert_int_equal(qwen3_load_safetensors(b, &d, path, err, sizeof err), 0);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    /* the file's size: the header, then 4 bytes a parameter and nothing more */
    safetensors_t f;
    assert_int_equal(safetensors_open(&f, path, err, sizeof err), 0);
    size_t data = 0;
    for (size_t i = 0; i < f.num_tensors; i++) data += f.tensors[i].nbytes;
    assert_int_equal(data, (size_t)n * sizeof(float));
    assert_int_equal(f.num_tensors, qwen3_tensor_table(&d, NULL));
    assert_non_null(safetensors_find(&f, "model.embed_tokens.weight"));
    safetensors_close(&f);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0); /* empty: no temporary file was left */
    free(a), free(b);
}

/* A tiny model trained on one repeated batch must memorise it. */
static void test_tiny_model_learns(void **st) {
    (void)st;
    char *ov[] = {"model_name=tiny", "per_device_batch_size=2", "max_target_length=32", "learning_rate=0.01",
                  "profiler=", "adam_weight_decay=0"};
    plan_t plan;
    train_state_t s;
    new_state(&s, &plan, 6, ov);
    int64_t B = plan.dims.B, S = plan.dims.S;
    int32_t *tokens = malloc((size_t)(B * (S + 1)) * sizeof(int32_t));
    for (int64_t i = 0; i < B * (S + 1); i++) tokens[i] = (int32_t)((i * 7919 + 13) % plan.dims.V);
    step_result_t r;
    train_step(&s, tokens, &r);
    double first = r.loss;
    for (int step = 1; step < 50; step++) train_step(&s, tokens, &r);
    printf("# tiny model, one repeated batch: loss %.4f -> %.4f after 50 steps (%.1f%%)\n", first, r.loss, 100 * r.loss / first);
    assert_true(r.loss < 0.1 * first);
    free(tokens);
    train_state_destroy(&s);
}

/* The plan for vocab 151936 and 8192 tokens holds no logits-sized buffer: all of activations
 * and scratch together are smaller than one [T, V] fp32 tensor. And attention memory grows
 * linearly with S: doubling S at most doubles activations + scratch. */
static void test_memory_never_logits_sized(void **st) {
    (void)st;
    char err[512];
    config_t cfg;
    char *ov[] = {"model_name=qwen3-0.6b", "per_device_batch_size=4", "max_target_length=2048", "profiler="};
    assert_int_equal(config_load(&cfg, NULL, 4, ov, err, sizeof err), 0);
    plan_t plan;
    assert_int_equal(plan_build(&plan, &cfg, 2, 1, err, sizeof err), 0);
    uint64_t logits_bytes = (uint64_t)8192 * 151936 * sizeof(float);
    printf("# qwen3-0.6b 4x2048: scratch %.2f GiB, one [T,V] logits tensor would be %.2f GiB\n",
           plan.scratch_bytes / 1073741824.0, logits_bytes / 1073741824.0);
    /* The one logits buffer is a chunk of at most 768 tokens (445 MiB); all scratch together
     * (norm outputs, MLP intermediates, attention strips, that chunk) is under a third of one
     * [T, V] tensor. */
    assert_true(plan.xent_chunk <= 768);
    assert_true(plan.scratch_bytes < logits_bytes / 3);
    /* The per-layer attention activations: S² would quadruple; ours doubles. */
    config_t c2 = cfg;
    c2.max_target_length = 4096;
    plan_t p2;
    assert_int_equal(plan_build(&p2, &c2, 2, 1, err, sizeof err), 0);
    double ratio = (double)(p2.activations_bytes + p2.scratch_bytes) / (double)(plan.activations_bytes + plan.scratch_bytes);
    printf("# activations+scratch S=4096 / S=2048 = %.3f\n", ratio);
    assert_true(ratio <= 2.0);
}

/* The default LM-head chunk: one chunk when the tokens fit under the cap (~256 MiB of logits,
 * or 768 tokens where that is more); else equal chunks of a multiple of 32 tokens (whole AMX /
 * AVX-512 row blocks), never over the cap, as few as the cap allows, and so over 384 tokens
 * each (under ~354, oneDNN's AVX2 driver ran the input gradient on its slow no-copy kernels). */
static void test_default_xent_chunk(void **state) {
    (void)state;
    static const int64_t vocab[] = {151936, 4096};
    static const int64_t tokens[] = {16, 441, 768, 769, 870, 1024, 2048, 8192, 100003};
    for (size_t v = 0; v < sizeof vocab / sizeof vocab[0]; v++)
        for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
            int64_t V = vocab[v], cap = (256LL << 20) / 4 / V; /* 441 at V = 151936, 16384 at 4096 */
            if (cap < 768) cap = 768;
            qwen3_dims_t d = {.B = 1, .S = tokens[i], .V = V};
            int64_t T = tokens[i], c = qwen3_default_xent_chunk(&d);
            if (T <= cap) {
                assert_int_equal(c, T);
                continue;
            }
            assert_true(c % 32 == 0 && c <= cap && c > 384);
            int64_t n = (T + c - 1) / c, cap32 = cap / 32 * 32;
            assert_int_equal(n, (T + cap32 - 1) / cap32); /* the fewest chunks of a multiple of 32 */
        }
    qwen3_dims_t d = {.B = 1, .S = 1024, .V = 151936};
    assert_int_equal(qwen3_default_xent_chunk(&d), 512); /* 512 + 512 */
    d.S = 2048;
    assert_int_equal(qwen3_default_xent_chunk(&d), 704); /* 704 + 704 + 640 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_padding_auto),
#define FIXTURE_ENTRIES(fixture, rows)                                                                       \
    cmocka_unit_test(test_##fixture##_##rows##_loss_and_grads), cmocka_unit_test(test_##fixture##_##rows##_three_steps), \
        cmocka_unit_test(test_##fixture##_##rows##_grads_over_stale_buffer)
        FIXTURE_ENTRIES(tied_gqa, dense),
        FIXTURE_ENTRIES(tied_gqa, padded),
        FIXTURE_ENTRIES(untied_wide, dense),
        FIXTURE_ENTRIES(untied_wide, padded),
        FIXTURE_ENTRIES(padded_rows, dense),
        FIXTURE_ENTRIES(padded_rows, padded),
        cmocka_unit_test(test_remat_matches_none),
        cmocka_unit_test(test_tiny_model_learns),
        cmocka_unit_test(test_normal_draws_match_double),
        cmocka_unit_test(test_init_statistics_and_determinism),
        cmocka_unit_test(test_save_load_round_trip),
        cmocka_unit_test(test_bf16_against_reference),
        cmocka_unit_test(test_bf16_weights_are_bf16_runs_on_rounded_weights),
        cmocka_unit_test(test_bf16_weight_copy_changes_no_bit),
        cmocka_unit_test(test_grad_sumsq_total),
        cmocka_unit_test(test_bf16_grad_norm_from_products),
        cmocka_unit_test(test_bf16_loss_curve_tracks_fp32),
        cmocka_unit_test(test_memory_never_logits_sized),
        cmocka_unit_test(test_default_xent_chunk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
