/* The whole Qwen3 step against Hugging Face transformers: fixtures made by
 * tools/make_fixtures.py (float64 reference from random weights) hold the loss, every
 * gradient and the parameters after 3 AdamW steps with clipping and weight decay. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "io/safetensors.h"
#include "plan/plan.h"
#include "train/state.h"

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

static void load_fixture(fixture_t *f, const char *name) {
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

static void check_loss_and_grads(const char *name) {
    fixture_t f;
    load_fixture(&f, name);
    double loss = qwen3_forward_backward(f.state.model, f.tokens);
    double ref_loss = ref_scalar(&f, "loss", 0);
    double loss_rel = fabs(loss - ref_loss) / fabs(ref_loss);
    printf("# %s: loss %.8f reference %.8f relative error %.2e\n", name, loss, ref_loss, loss_rel);
    /* fp32 through a few small layers: ~1e-7 relative; 1e-5 is the bar. */
    assert_true(loss_rel < 1e-5);
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < f.num_tensors; i++) {
        int64_t n = numel_of(&f.table[i]);
        float *ref = ref_tensor(&f, "grad.", f.table[i].hf_name, n);
        double e = rel_err(f.state.grads + f.table[i].offset, ref, n);
        if (e > worst) {
            worst = e;
            worst_name = f.table[i].hf_name;
        }
        if (e >= 1e-4) fprintf(stderr, "gradient %s: relative error %.3e\n", f.table[i].hf_name, e);
        assert_true(e < 1e-4);
        free(ref);
    }
    printf("# %s: %lld gradient tensors, worst relative error %.2e (%s)\n", name, (long long)f.num_tensors, worst, worst_name);
    free_fixture(&f);
}

static void check_three_steps(const char *name) {
    fixture_t f;
    load_fixture(&f, name);
    for (int step = 0; step < 3; step++) {
        step_result_t r;
        train_step(&f.state, f.tokens, &r);
        double ref_loss = ref_scalar(&f, "losses", step), ref_norm = ref_scalar(&f, "grad_norm", step);
        printf("# %s step %d: loss %.7f (ref %.7f) raw grad norm %.6f (ref %.6f) clipped %.6f\n", name, step,
               r.loss, ref_loss, r.raw_grad_norm, ref_norm, r.grad_norm);
        assert_true(fabs(r.loss - ref_loss) / ref_loss < 1e-5);
        assert_true(fabs(r.raw_grad_norm - ref_norm) / ref_norm < 1e-4);
    }
    double worst = 0;
    for (int64_t i = 0; i < f.num_tensors; i++) {
        int64_t n = numel_of(&f.table[i]);
        float *ref = ref_tensor(&f, "step3.", f.table[i].hf_name, n);
        double e = rel_err(f.state.params + f.table[i].offset, ref, n);
        if (e >= 1e-5) fprintf(stderr, "params after 3 steps %s: relative error %.3e\n", f.table[i].hf_name, e);
        worst = e > worst ? e : worst;
        assert_true(e < 1e-5);
        free(ref);
    }
    printf("# %s: parameters after 3 AdamW steps, worst relative error %.2e\n", name, worst);
    free_fixture(&f);
}

static void test_tied_gqa_loss_and_grads(void **st) { (void)st; check_loss_and_grads("tied_gqa"); }
static void test_untied_wide_loss_and_grads(void **st) { (void)st; check_loss_and_grads("untied_wide"); }
static void test_tied_gqa_three_steps(void **st) { (void)st; check_three_steps("tied_gqa"); }
static void test_untied_wide_three_steps(void **st) { (void)st; check_three_steps("untied_wide"); }

/* Full rematerialisation recomputes each layer before its backward: same gradients, bit for bit. */
static void test_remat_full_matches_none(void **st) {
    (void)st;
    fixture_t f;
    load_fixture(&f, "tied_gqa");
    double loss = qwen3_forward_backward(f.state.model, f.tokens);
    int64_t n = f.plan.num_params;
    float *g = malloc((size_t)n * sizeof(float));
    memcpy(g, f.state.grads, (size_t)n * sizeof(float));
    char err[256];
    snprintf(f.cfg.remat_policy, sizeof f.cfg.remat_policy, "full");
    plan_t plan;
    assert_int_equal(plan_build(&plan, &f.cfg, 2, 1, err, sizeof err), 0);
    assert_true(plan.activations_bytes < f.plan.activations_bytes);
    train_state_t s2;
    assert_int_equal(train_state_create(&s2, &f.cfg, &plan, NULL, NULL, err, sizeof err), 0);
    double loss2 = qwen3_forward_backward(s2.model, f.tokens);
    assert_true(loss == loss2);
    assert_memory_equal(g, s2.grads, (size_t)n * sizeof(float));
    train_state_destroy(&s2);
    free(g);
    free_fixture(&f);
}

/* A tiny model trained on one repeated batch must memorise it. */
static void test_tiny_model_learns(void **st) {
    (void)st;
    char err[512];
    config_t cfg;
    char *ov[] = {"model_name=tiny", "per_device_batch_size=2", "max_target_length=32", "learning_rate=0.01",
                  "profiler=", "adam_weight_decay=0"};
    assert_int_equal(config_load(&cfg, NULL, 6, ov, err, sizeof err), 0);
    plan_t plan;
    assert_int_equal(plan_build(&plan, &cfg, 2, 1, err, sizeof err), 0);
    train_state_t s;
    assert_int_equal(train_state_create(&s, &cfg, &plan, NULL, NULL, err, sizeof err), 0);
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
    /* The one logits buffer is a chunk of ~64 MiB; all scratch together (norm outputs, MLP
     * intermediates, attention strips, that chunk) is under a quarter of one [T, V] tensor. */
    assert_true((uint64_t)plan.xent_chunk * 151936 * sizeof(float) <= (64u << 20));
    assert_true(plan.scratch_bytes < logits_bytes / 4);
    /* The per-layer attention activations: S² would quadruple; ours doubles. */
    config_t c2 = cfg;
    c2.max_target_length = 4096;
    plan_t p2;
    assert_int_equal(plan_build(&p2, &c2, 2, 1, err, sizeof err), 0);
    double ratio = (double)(p2.activations_bytes + p2.scratch_bytes) / (double)(plan.activations_bytes + plan.scratch_bytes);
    printf("# activations+scratch S=4096 / S=2048 = %.3f\n", ratio);
    assert_true(ratio <= 2.0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tied_gqa_loss_and_grads),
        cmocka_unit_test(test_untied_wide_loss_and_grads),
        cmocka_unit_test(test_tied_gqa_three_steps),
        cmocka_unit_test(test_untied_wide_three_steps),
        cmocka_unit_test(test_remat_full_matches_none),
        cmocka_unit_test(test_tiny_model_learns),
        cmocka_unit_test(test_memory_never_logits_sized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
