/* test_config: loading, precedence, presets and every class of user error of src/config.
 * Runs from the repository root (reads configs/base.yml and configs/models/). Temporary
 * YAML files go into a mkdtemp folder that the group teardown removes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"

static char g_dir[256]; /* mkdtemp folder: base.yml files at top, presets in models/ */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/test_config_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    char models[300];
    snprintf(models, sizeof models, "%s/models", g_dir);
    return mkdir(models, 0700);
}

static int teardown(void **state) {
    (void)state;
    return nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Writes text to <g_dir>/<name>; returns the path (static buffer, one at a time). */
static const char *write_file(const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* config_load that must fail with exit code 2 and a one-line err containing every
 * NULL-terminated substring. */
static void expect_error(const char *base, int n, char *const *ov, ...) {
    config_t cfg;
    char err[1024] = "";
    int rc = config_load(&cfg, base, n, ov, err, sizeof err);
    if (rc != CONFIG_EXIT_CODE) print_error("expected failure, got rc=%d err='%s'\n", rc, err);
    assert_int_equal(rc, CONFIG_EXIT_CODE);
    assert_null(strchr(err, '\n'));
    va_list ap;
    va_start(ap, ov);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;) {
        if (!strstr(err, s)) print_error("err '%s' lacks '%s'\n", err, s);
        assert_non_null(strstr(err, s));
    }
    va_end(ap);
}

static void expect_ok(config_t *cfg, const char *base, int n, char *const *ov) {
    char err[1024] = "";
    int rc = config_load(cfg, base, n, ov, err, sizeof err);
    if (rc != 0) print_error("unexpected failure: %s\n", err);
    assert_int_equal(rc, 0);
}

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---------------------------------------------------------------- loading */

static void test_defaults(void **state) {
    (void)state;
    config_t c;
    expect_ok(&c, NULL, 0, NULL);
    assert_string_equal(c.model_name, "default");
    assert_false(c.override_model_config);
    assert_string_equal(c.base_output_directory, "out");
    assert_int_equal(c.steps, 10);
    assert_int_equal(c.per_device_batch_size, 2);
    assert_int_equal(c.max_target_length, 256);
    assert_int_equal(c.vocab_size, 4096);
    assert_int_equal(c.base_emb_dim, 256);
    assert_int_equal(c.base_mlp_dim, 768);
    assert_int_equal(c.base_num_decoder_layers, 4);
    assert_int_equal(c.base_num_query_heads, 8);
    assert_int_equal(c.base_num_kv_heads, 4);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.rope_max_timescale == 1e6);
    assert_true(c.normalization_layer_epsilon == 1e-6);
    assert_true(c.use_qk_norm && c.logits_via_embedding);
    assert_int_equal(c.dtype, DTYPE_FLOAT32);
    assert_int_equal(c.weight_dtype, DTYPE_FLOAT32);
    assert_true(c.learning_rate == 3e-4);
    assert_true(c.adam_b1 == 0.9 && c.adam_b2 == 0.95 && c.adam_eps == 1e-8);
    assert_true(c.adam_weight_decay == 0.1 && c.gradient_clipping_threshold == 1.0);
    assert_true(c.z_loss_multiplier == 0.0);
    assert_string_equal(c.dataset_type, "synthetic");
    assert_string_equal(c.dataset_path, "");
    assert_int_equal(c.prefetch_depth, 2);
    assert_false(c.enable_checkpointing);
    assert_int_equal(c.checkpoint_period, 10000);
    assert_int_equal(c.eval_interval, -1);
    assert_int_equal(c.eval_steps, 1);
    assert_string_equal(c.eval_dataset_path, "");
    assert_true(c.enable_tensorboard && c.abort_on_nan_loss && c.abort_on_inf_loss);
    assert_string_equal(c.profiler, "");
    assert_int_equal(c.skip_first_n_steps_for_profiler, 1);
    assert_int_equal(c.profiler_steps, 5);
    assert_int_equal(c.num_threads, 0);
    assert_string_equal(c.remat_policy, "none");
    assert_string_equal(c.row_padding, "auto");

    /* An empty file and a comments-only file are the defaults too. */
    config_t e;
    expect_ok(&e, write_file("empty.yml", ""), 0, NULL);
    assert_int_equal(e.steps, 10);
    expect_ok(&e, write_file("comments.yml", "# nothing\n\n"), 0, NULL);
    assert_true(e.learning_rate == 3e-4);
}

static void test_repo_base_yml(void **state) {
    (void)state;
    config_t c;
    expect_ok(&c, "configs/base.yml", 0, NULL);
    assert_string_equal(c.model_name, "default");
    assert_true(c.learning_rate == 1e-3);
    assert_string_equal(c.profiler, "xplane");
    assert_int_equal(c.base_emb_dim, 256);
    assert_int_equal(c.steps, 10);
}

static void test_preset_by_override(void **state) {
    (void)state;
    config_t c;
    char *ov[] = {"model_name=qwen3-0.6b"};
    expect_ok(&c, "configs/base.yml", N(ov), ov);
    assert_string_equal(c.model_name, "qwen3-0.6b");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.base_emb_dim, 1024);
    assert_int_equal(c.base_mlp_dim, 3072);
    assert_int_equal(c.base_num_decoder_layers, 28);
    assert_int_equal(c.base_num_query_heads, 16);
    assert_int_equal(c.base_num_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_true(c.logits_via_embedding);
    assert_true(c.learning_rate == 1e-3); /* base.yml keys the preset leaves alone survive */

    static const struct { const char *name; int64_t d, f, l, h, kv; bool tied; } P[] = {
        {"qwen3-1.7b", 2048, 6144, 28, 16, 8, true},  {"qwen3-4b", 2560, 9728, 36, 32, 8, true},
        {"qwen3-8b", 4096, 12288, 36, 32, 8, false},  {"qwen3-14b", 5120, 17408, 40, 40, 8, false},
        {"qwen3-32b", 5120, 25600, 64, 64, 8, false},
    };
    for (size_t i = 0; i < sizeof P / sizeof P[0]; i++) {
        char arg[64];
        snprintf(arg, sizeof arg, "model_name=%s", P[i].name);
        char *o[] = {arg};
        expect_ok(&c, "configs/base.yml", 1, o);
        assert_int_equal(c.base_emb_dim, P[i].d);
        assert_int_equal(c.base_mlp_dim, P[i].f);
        assert_int_equal(c.base_num_decoder_layers, P[i].l);
        assert_int_equal(c.base_num_query_heads, P[i].h);
        assert_int_equal(c.base_num_kv_heads, P[i].kv);
        assert_int_equal(c.logits_via_embedding, P[i].tied);
        assert_int_equal(c.vocab_size, 151936);
    }
    char *t[] = {"model_name=tiny"};
    expect_ok(&c, "configs/base.yml", 1, t);
    assert_int_equal(c.vocab_size, 256);
    assert_int_equal(c.base_emb_dim, 64);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.rope_max_timescale == 10000);
}

static void test_precedence(void **state) {
    (void)state;
    write_file("models/toy.yml", "base_emb_dim: 32\nbase_mlp_dim: 96\n");
    const char *base = write_file("prec.yml", "model_name: toy\nbase_emb_dim: 999\nsteps: 7\n"
                                              "learning_rate: 0.5\nprofiler: \"\"\n");
    config_t c;
    char *ov[] = {"steps=3"};
    expect_ok(&c, base, N(ov), ov);
    assert_int_equal(c.base_emb_dim, 32); /* preset beats base */
    assert_int_equal(c.base_mlp_dim, 96);
    assert_int_equal(c.steps, 3);         /* command line beats base */
    assert_true(c.learning_rate == 0.5);  /* base beats built-in default */
    assert_int_equal(c.per_device_batch_size, 2);

    /* Later overrides win; quotes around a value are dropped. */
    char *ov2[] = {"steps=4", "steps=5", "run_name='r1'"};
    expect_ok(&c, base, N(ov2), ov2);
    assert_int_equal(c.steps, 5);
    assert_string_equal(c.run_name, "r1");

    /* model_name=default on the command line drops the preset the base file names. */
    char *ov3[] = {"model_name=default"};
    expect_ok(&c, base, N(ov3), ov3);
    assert_int_equal(c.base_emb_dim, 999);
}

static void test_override_model_config(void **state) {
    (void)state;
    config_t c;
    char *ov[] = {"model_name=qwen3-0.6b", "base_emb_dim=512"};
    expect_error("configs/base.yml", N(ov), ov,
                 "base_emb_dim is set by model qwen3-0.6b (configs/models/qwen3-0.6b.yml); "
                 "pass override_model_config=true to change it",
                 NULL);
    /* Accepted with the flag, wherever it appears on the command line. */
    char *ok[] = {"model_name=qwen3-0.6b", "base_emb_dim=512", "override_model_config=true"};
    expect_ok(&c, "configs/base.yml", N(ok), ok);
    assert_int_equal(c.base_emb_dim, 512);
    assert_int_equal(c.base_mlp_dim, 3072);
    /* Keys the preset does not set need no flag. */
    char *free_key[] = {"model_name=qwen3-0.6b", "steps=2"};
    expect_ok(&c, "configs/base.yml", N(free_key), free_key);
    /* A preset may not set model_name. */
    write_file("models/selfish.yml", "model_name: other\n");
    char *sel[] = {"model_name=selfish"};
    expect_error(write_file("b_self.yml", "steps: 2\n"), N(sel), sel, "cannot set model_name",
                 NULL);
}

/* ---------------------------------------------------------------- errors */

static void test_unknown_key(void **state) {
    (void)state;
    const char *base = write_file("typo.yml", "steps: 3\nlearning_rat: 0.1\n");
    expect_error(base, 0, NULL, "unknown config key 'learning_rat'", "typo.yml:2",
                 "did you mean: learning_rate?", NULL);
    char *ov[] = {"adam_b3=0.9"};
    expect_error("configs/base.yml", N(ov), ov, "unknown config key 'adam_b3' (command line)",
                 "adam_b1", "adam_b2", NULL);
    char *far[] = {"zzzzzzzzzzzzzzzz=1"};
    expect_error("configs/base.yml", N(far), far, "'zzzzzzzzzzzzzzzz'", "--help", NULL);
    char *sub[] = {"emb_dim=5"};
    expect_error("configs/base.yml", N(sub), sub, "did you mean: base_emb_dim", NULL);
}

static void test_malformed_override(void **state) {
    (void)state;
    char *ov[] = {"steps"};
    expect_error("configs/base.yml", N(ov), ov, "malformed override 'steps'", "key=value", NULL);
    char *ov2[] = {"=3"};
    expect_error("configs/base.yml", N(ov2), ov2, "malformed override", NULL);
}

static void test_bad_values(void **state) {
    (void)state;
    static const struct { const char *arg, *s1, *s2; } C[] = {
        {"steps=abc", "'abc' for steps", "not an integer"},
        {"steps=1.5", "'1.5' for steps", "an integer >= 1"},
        {"steps=", "for steps", "not an integer"},
        {"steps=99999999999999999999", "steps", "int64 range"},
        {"learning_rate=fast", "'fast' for learning_rate", "a number >= 0"},
        {"learning_rate=nan", "'nan' for learning_rate", "not a finite number"},
        {"learning_rate=inf", "'inf' for learning_rate", "not a finite number"},
        {"adam_b1=1e999", "adam_b1", "not a finite number"},
        {"use_qk_norm=yes", "'yes' for use_qk_norm", "true or false"},
        {"dtype=float16", "'float16' for dtype", "float32 or bfloat16"},
        {"dataset_type=web", "dataset_type=web", "synthetic, tokens"},
        {"profiler=tensorboard", "profiler=tensorboard", "\"\", xplane"},
        {"remat_policy=some", "remat_policy=some", "none, full, minimal"},
        {"row_padding=wide", "row_padding=wide", "auto, dense, padded"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        char *ov[] = {(char *)C[i].arg};
        expect_error("configs/base.yml", 1, ov, C[i].s1, C[i].s2, NULL);
    }
    /* Bad values in YAML name the file and line. */
    expect_error(write_file("badint.yml", "# c\nsteps: ten\n"), 0, NULL, "'ten' for steps",
                 "badint.yml:2", NULL);
    /* Accepted spellings. */
    config_t c;
    char *ok[] = {"use_qk_norm=False", "logits_via_embedding=0", "enable_tensorboard=1",
                  "abort_on_nan_loss=True", "learning_rate=2e-3", "dtype=fp32", "steps=+4"};
    expect_ok(&c, "configs/base.yml", N(ok), ok);
    assert_false(c.use_qk_norm);
    assert_false(c.logits_via_embedding);
    assert_true(c.enable_tensorboard && c.abort_on_nan_loss);
    assert_true(c.learning_rate == 2e-3);
    assert_int_equal(c.steps, 4);
}

static void test_out_of_range(void **state) {
    (void)state;
    static const struct { const char *arg, *s1, *s2; } C[] = {
        {"steps=0", "steps=0 (command line)", "an integer >= 1"},
        {"per_device_batch_size=-1", "per_device_batch_size=-1", ">= 1"},
        {"vocab_size=1", "vocab_size=1", ">= 2"},
        {"base_emb_dim=0", "base_emb_dim=0", "[1, 16384]"},
        {"base_emb_dim=16385", "base_emb_dim=16385", "[1, 16384]"},
        {"head_dim=20000", "head_dim=20000", "[1, 16384]"},
        {"adam_b1=1", "adam_b1=1", "[0, 1)"},
        {"adam_b2=-0.1", "adam_b2=-0.1", "[0, 1)"},
        {"adam_eps=0", "adam_eps=0", "> 0"},
        {"learning_rate=-1", "learning_rate=-1", ">= 0"},
        {"prefetch_depth=0", "prefetch_depth=0", ">= 1"},
        {"num_threads=-2", "num_threads=-2", "[0, 1025)"},
        {"num_threads=1025", "num_threads=1025", "[0, 1025)"},
        {"memory_limit_gib=-1", "memory_limit_gib=-1", ">= 0"},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        char *ov[] = {(char *)C[i].arg};
        expect_error("configs/base.yml", 1, ov, C[i].s1, C[i].s2, NULL);
    }
    /* A bad base value fixed on the command line is fine (ranges are checked after merge). */
    config_t c;
    char *fix[] = {"steps=2"};
    expect_ok(&c, write_file("steps0.yml", "steps: 0\n"), N(fix), fix);
    expect_error(write_file("steps0.yml", "steps: 0\n"), 0, NULL, "steps=0", "steps0.yml:1", NULL);
}

static void test_heads_divisible(void **state) {
    (void)state;
    char *ov[] = {"base_num_query_heads=6", "base_num_kv_heads=4"};
    expect_error("configs/base.yml", N(ov), ov, "base_num_query_heads=6",
                 "multiple of base_num_kv_heads=4", NULL);
}

static void test_profiler_window(void **state) {
    (void)state;
    char *ov[] = {"profiler=xplane", "steps=3", "skip_first_n_steps_for_profiler=3"};
    expect_error("configs/base.yml", N(ov), ov, "skip_first_n_steps_for_profiler=3",
                 "past the last step", NULL);
    char *ov2[] = {"profiler=xplane", "profiler_steps=0"};
    expect_error("configs/base.yml", N(ov2), ov2, "profiler_steps=0", ">= 1", NULL);
    /* Without the profiler, the window keys are not checked against steps. */
    config_t c;
    char *off[] = {"profiler=", "steps=1", "skip_first_n_steps_for_profiler=3"};
    expect_ok(&c, "configs/base.yml", N(off), off);
    assert_string_equal(c.profiler, "");
}

static void test_yaml_errors(void **state) {
    (void)state;
    expect_error(write_file("syntax.yml", "steps: 3\nlearning_rate: 0.1: 2\n"), 0, NULL,
                 "YAML syntax error in ", "syntax.yml line 2", NULL);
    expect_error(write_file("quote.yml", "steps: 3\n\nprofiler: \"abc\n"), 0, NULL,
                 "YAML syntax error", "quote.yml line 4", "quoted scalar", NULL);
    expect_error(write_file("nested.yml", "steps: 3\nmodel_name:\n  a: 1\n"), 0, NULL,
                 "nested structures are not supported", "model_name", NULL);
    expect_error(write_file("list.yml", "steps: [1, 2]\n"), 0, NULL, "nested", "steps", NULL);
    expect_error(write_file("top.yml", "- steps\n"), 0, NULL, "flat mapping", NULL);
    expect_error(write_file("dup.yml", "steps: 3\nsteps: 4\n"), 0, NULL,
                 "duplicate config key 'steps'", "line 2", NULL);
    expect_error(write_file("null.yml", "steps:\n"), 0, NULL, "missing value for steps", NULL);
}

static void test_missing_files(void **state) {
    (void)state;
    expect_error("configs/no_such_base.yml", 0, NULL, "configs/no_such_base.yml",
                 "No such file", NULL);
    char *ov[] = {"model_name=qwen3-999b"};
    expect_error("configs/base.yml", N(ov), ov, "model preset 'qwen3-999b' not found",
                 "configs/models/qwen3-999b.yml", "available presets: ",
                 "qwen3-0.6b, qwen3-1.7b, qwen3-14b, qwen3-32b, qwen3-4b, qwen3-8b, tiny", NULL);
    char *bad[] = {"model_name=../base"};
    expect_error("configs/base.yml", N(bad), bad, "invalid model_name '../base'", "qwen3-0.6b",
                 NULL);
}

static void test_dataset_path(void **state) {
    (void)state;
    char *ov[] = {"dataset_type=tokens"};
    expect_error("configs/base.yml", N(ov), ov, "dataset_type=tokens", "requires dataset_path",
                 NULL);
    char *ov2[] = {"dataset_path=/data/x.bin"};
    expect_error("configs/base.yml", N(ov2), ov2, "dataset_path=/data/x.bin",
                 "dataset_type=synthetic", NULL);
    config_t c;
    char *ok[] = {"dataset_type=tokens", "dataset_path=/data/x.bin"};
    expect_ok(&c, "configs/base.yml", N(ok), ok);
    assert_string_equal(c.dataset_path, "/data/x.bin");
}

static void test_unsupported(void **state) {
    (void)state;
    char *a[] = {"checkpoint_period=0"};
    expect_error("configs/base.yml", 1, a, "checkpoint_period", NULL);
    config_t ck;
    char *ck_on[] = {"enable_checkpointing=true", "checkpoint_period=3"};
    expect_ok(&ck, "configs/base.yml", 2, ck_on);
    assert_true(ck.enable_checkpointing);
    assert_int_equal(ck.checkpoint_period, 3);
    char *b[] = {"weight_dtype=bfloat16"};
    expect_error("configs/base.yml", 1, b, "weight_dtype=bfloat16 (command line) needs dtype=bfloat16",
                 "set dtype=bfloat16, or weight_dtype=float32", NULL);
    config_t w16;
    char *w16_ok[] = {"weight_dtype=bf16", "dtype=bfloat16"};
    expect_ok(&w16, "configs/base.yml", 2, w16_ok);
    assert_int_equal(w16.weight_dtype, DTYPE_BFLOAT16);
    assert_int_equal(config_mu_dtype(&w16), DTYPE_BFLOAT16); /* mu_dtype "" follows it */
    config_t async;
    char *as[] = {"async_checkpointing=true"};
    expect_ok(&async, "configs/base.yml", 1, as);
    assert_true(async.async_checkpointing);
    config_t c;
    char *ok[] = {"remat_policy=full"};
    expect_ok(&c, "configs/base.yml", 1, ok);
    config_t cb;
    char *bf[] = {"dtype=bf16"};
    expect_ok(&cb, "configs/base.yml", 1, bf);
    assert_int_equal(cb.dtype, DTYPE_BFLOAT16);
    assert_string_equal(c.remat_policy, "full");
}

static void test_run_name(void **state) {
    (void)state;
    config_t c;
    expect_ok(&c, "configs/base.yml", 0, NULL);
    /* stepscope_YYYYMMDD_HHMMSS */
    assert_int_equal(strlen(c.run_name), strlen("stepscope_20250101_000000"));
    assert_memory_equal(c.run_name, "stepscope_", 10);
    for (int i = 10; i < 25; i++)
        assert_true(i == 18 ? c.run_name[i] == '_' : (c.run_name[i] >= '0' && c.run_name[i] <= '9'));
    char *ov[] = {"run_name=mine"};
    expect_ok(&c, "configs/base.yml", 1, ov);
    assert_string_equal(c.run_name, "mine");
}

static void test_print_and_help(void **state) {
    (void)state;
    config_t c;
    char *ov[] = {"run_name=r", "learning_rate=0.00025"};
    expect_ok(&c, "configs/base.yml", N(ov), ov);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print(&c, f);
    fclose(f);
    assert_true(strncmp(buf, "model_name: default\n", 20) == 0);
    assert_non_null(strstr(buf, "\nrun_name: r\n"));
    assert_non_null(strstr(buf, "\nsteps: 10\n"));
    assert_non_null(strstr(buf, "\nlearning_rate: 0.00025\n"));
    assert_non_null(strstr(buf, "\nuse_qk_norm: true\n"));
    assert_non_null(strstr(buf, "\ndtype: float32\n"));
    assert_non_null(strstr(buf, "\nprofiler: xplane\n"));
    assert_non_null(strstr(buf, "\nremat_policy: none\n"));
    free(buf);

    f = open_memstream(&buf, &len);
    config_print_help(f);
    fclose(f);
    assert_non_null(strstr(buf, "usage: stepscope CONFIG.yml [key=value ...] [--dry-run] [--help] "
                                "[--version]\n"));
    assert_non_null(strstr(buf, "override_model_config"));
    assert_non_null(strstr(buf, "[0, 1)"));
    assert_non_null(strstr(buf, "or bfloat16 (with dtype=bfloat16; no fp32 copy"));
    free(buf);

    assert_string_equal(dtype_name(DTYPE_FLOAT32), "float32");
    assert_string_equal(dtype_name(DTYPE_BFLOAT16), "bfloat16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_repo_base_yml),
        cmocka_unit_test(test_preset_by_override),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_override_model_config),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_malformed_override),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_heads_divisible),
        cmocka_unit_test(test_profiler_window),
        cmocka_unit_test(test_yaml_errors),
        cmocka_unit_test(test_missing_files),
        cmocka_unit_test(test_dataset_path),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_run_name),
        cmocka_unit_test(test_print_and_help),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
