/* Checkpoints (train/checkpoint.h, train/resume.h): which steps are written (MaxText's rule: the
 * multiples of checkpoint_period and the last step), the space a run needs and the message when
 * it is not there, a written checkpoint (its paths, its size and the same bits read back), and a
 * full state written in shards read back over other shards, or refused when it is incomplete,
 * mixed or of another model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "model/qwen3.h"
#include "plan/plan.h"
#include "dist/zero.h"
#include "train/checkpoint.h"
#include "train/resume.h"

/* Each count is the number of due steps among 0..steps-1, checked one by one. */
static void test_due_steps(void **state) {
    (void)state;
    assert_true(checkpoint_due(0, 5, 2));
    assert_false(checkpoint_due(1, 5, 2));
    assert_true(checkpoint_due(2, 5, 2));
    assert_true(checkpoint_due(4, 5, 2)); /* a multiple and the last */
    assert_false(checkpoint_due(5, 5, 2)); /* past the run */
    assert_true(checkpoint_due(5, 6, 2)); /* the last, not a multiple */
    assert_true(checkpoint_due(9, 10, 10000));
    assert_false(checkpoint_due(-1, 10, 1));
    const int64_t runs[][2] = {{1, 1}, {1, 10000}, {5, 2}, {6, 2}, {10, 10000}, {10, 1}, {21, 10}, {20, 10}, {7, 7}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        int64_t steps = runs[r][0], period = runs[r][1];
        for (int64_t first = 0; first <= steps; first++) { /* a resumed run's steps first..steps-1 */
            int64_t due = 0;
            for (int64_t s = first; s < steps; s++) due += checkpoint_due(s, steps, period);
            assert_int_equal(checkpoint_count(first, steps, period), due);
        }
    }
    assert_int_equal(checkpoint_count(0, 5, 2), 3);  /* 0, 2, 4 */
    assert_int_equal(checkpoint_count(0, 6, 2), 4);  /* 0, 2, 4, 5 */
    assert_int_equal(checkpoint_count(3, 6, 2), 2);  /* 4, 5 */
    assert_int_equal(checkpoint_count(0, 10, 10000), 2); /* 0 and 9 */
    assert_int_equal(checkpoint_count(0, 1, 3), 1);
}

static void tiny(config_t *cfg, qwen3_dims_t *d, const char *base, int64_t steps, int64_t period) {
    char err[512];
    char *ov[] = {"model_name=tiny"};
    assert_int_equal(config_load(cfg, NULL, 1, ov, err, sizeof err), 0);
    snprintf(cfg->base_output_directory, sizeof cfg->base_output_directory, "%s", base);
    snprintf(cfg->run_name, sizeof cfg->run_name, "r");
    cfg->steps = steps;
    cfg->checkpoint_period = period;
    *d = plan_dims(cfg);
}

/* tiny() under a fresh temporary folder: base is a mkdtemp template, filled in. */
static void tiny_in_temp(config_t *cfg, qwen3_dims_t *d, char *base, int64_t steps, int64_t period) {
    assert_non_null(mkdtemp(base));
    tiny(cfg, d, base, steps, period);
}

/* The bound covers the files as written (parameters and two moments), and a run's need is its
 * count times the bound: refused one byte short of it, with the numbers and the knobs in the
 * message; a resumed run counts from its first step. */
static void test_space_needed(void **state) {
    (void)state;
    config_t cfg;
    qwen3_dims_t d;
    tiny(&cfg, &d, "out", 5, 2);
    uint64_t each = checkpoint_bytes(&cfg, &d);
    const uint64_t n = (uint64_t)qwen3_num_params(&d);
    assert_true(each >= n * 12);
    /* in the dtypes the files hold: bf16 m 2 bytes less a parameter, bf16 weights 6 */
    config_t c16 = cfg;
    snprintf(c16.mu_dtype, sizeof c16.mu_dtype, "bfloat16");
    assert_int_equal(each - checkpoint_bytes(&c16, &d), 2 * n);
    c16.weight_dtype = DTYPE_BFLOAT16;
    assert_int_equal(each - checkpoint_bytes(&c16, &d), 6 * n);
    char err[512] = "";
    assert_int_equal(checkpoint_check_space(&cfg, &d, 3, 1 * each, err, sizeof err), 0); /* step 4 only */
    assert_int_equal(checkpoint_check_space(&cfg, &d, 0, 3 * each, err, sizeof err), 0);
    assert_int_equal(checkpoint_check_space(&cfg, &d, 0, 3 * each - 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "enable_checkpointing: the run's 3 checkpoints"));
    assert_non_null(strstr(err, "checkpoint_period=2"));
    assert_non_null(strstr(err, "out/r has"));
    assert_non_null(strstr(err, "raise checkpoint_period, lower steps or free space"));
}

/* A checkpoint lands at <base>/<run>/checkpoints/<step>/model.safetensors, at most the bound's
 * size, and reads back to the same bits; the folder of all of them passes the check, a file in
 * its place does not. */
static void test_write_and_read_back(void **state) {
    (void)state;
    char base[] = "/tmp/test_checkpoint.XXXXXX", err[600], path[4096], dir[4096];
    config_t cfg;
    qwen3_dims_t d;
    tiny_in_temp(&cfg, &d, base, 5, 2);
    int64_t n = qwen3_num_params(&d);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    qwen3_init_params(a, &d, 3);
    checkpoint_written_t w;
    assert_int_equal(checkpoint_write(&cfg, &d, a, NULL, NULL, 2, &w, err, sizeof err), 0);
    assert_int_equal(checkpoint_finish(&cfg, &d, 2, err, sizeof err), 0);
    assert_int_equal(w.step, 2);
    assert_true(w.seconds > 0.0);
    assert_int_equal(checkpoint_path(path, sizeof path, &cfg, 2), 0);
    char expect[4096];
    snprintf(expect, sizeof expect, "%s/r/checkpoints/2/model.safetensors", base);
    assert_string_equal(path, expect);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, w.bytes);
    assert_true(w.bytes <= checkpoint_file_bytes(&d));
    assert_int_equal(qwen3_load_safetensors(b, &d, path, err, sizeof err), 0);
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    assert_int_equal(checkpoint_check(&cfg, &d, 0, err, sizeof err), 0);

    /* Hugging Face's config.json beside it, with the shape */
    char cfg_path[4096], json[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/r/checkpoints/2/config.json", base);
    FILE *cf = fopen(cfg_path, "r");
    assert_non_null(cf);
    size_t len = fread(json, 1, sizeof json - 1, cf);
    json[len] = '\0';
    fclose(cf);
    assert_non_null(strstr(json, "\"model_type\": \"qwen3\""));
    assert_non_null(strstr(json, "\"num_key_value_heads\": 2,"));
    assert_non_null(strstr(json, "\"tie_word_embeddings\": true"));
    assert_int_equal(unlink(cfg_path), 0);
    assert_int_equal(unlink(path), 0);
    snprintf(dir, sizeof dir, "%s/r/checkpoints/2", base);
    assert_int_equal(rmdir(dir), 0); /* nothing else in it: no temporary file left */
    assert_int_equal(checkpoint_path(dir, sizeof dir, &cfg, -1), 0);
    assert_int_equal(rmdir(dir), 0);
    FILE *f = fopen(dir, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(checkpoint_check(&cfg, &d, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "is not a folder"));
    assert_int_equal(checkpoint_write(&cfg, &d, a, NULL, NULL, 4, &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot create"));
    assert_int_equal(unlink(dir), 0);
    snprintf(dir, sizeof dir, "%s/r", base);
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(rmdir(base), 0);
    free(a), free(b);
}

/* Shard k of `shards` of moments m and v (the parameters on shard 0), as a rank writes it. */
static void write_shard(const config_t *cfg, const qwen3_dims_t *d, const float *params, const float *m,
                        const float *v, int k, int shards, int64_t step, int64_t updates) {
    int64_t n = qwen3_num_params(d), lo, count;
    zero_shard_range(n, shards, k, &lo, &count);
    checkpoint_optimizer_shard_t sh = {.m = m + lo, .v = v + lo, .lo = lo, .count = count, .num_params = n,
                                       .updates_done = updates, .index = k, .shards = shards};
    checkpoint_written_t w;
    char err[600];
    assert_int_equal(checkpoint_write(cfg, d, k == 0 ? params : NULL, NULL, &sh, step, &w, err, sizeof err), 0);
    assert_true(w.bytes >= (uint64_t)count * 8);
}

static void expect_refused(const char *folder, const qwen3_dims_t *d, const char *needle) {
    full_state_t fs;
    char err[1024] = "";
    assert_int_equal(full_state_open(&fs, folder, d, err, sizeof err), -1);
    if (!strstr(err, needle)) fail_msg("expected \"%s\" in: %s", needle, err);
    assert_null(strchr(err, '\n'));
}

/* A full state's arrays for model d: parameters from seed 5, moments m and v in patterns that
 * bf16 does not hold exactly, and m2, v2 to read them back into. */
typedef struct state_arrays {
    int64_t n;
    float *p, *m, *v, *m2, *v2;
} state_arrays_t;

static state_arrays_t state_arrays(const qwen3_dims_t *d) {
    state_arrays_t a = {.n = qwen3_num_params(d)};
    float **all[] = {&a.p, &a.m, &a.v, &a.m2, &a.v2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) assert_non_null(*all[i] = malloc((size_t)a.n * sizeof(float)));
    qwen3_init_params(a.p, d, 5);
    for (int64_t i = 0; i < a.n; i++) a.m[i] = 1.2345e-3f * (float)(i % 977) - 0.4f, a.v[i] = 1e-6f * (float)(i % 313);
    return a;
}

static void state_arrays_free(state_arrays_t *a) { free(a->p), free(a->m), free(a->v), free(a->m2), free(a->v2); }

/* A full state written by 3 ranks (one shard each, rank 0 the parameters too) reads back to the
 * same bits over 1 and 2 shards' ranges, with its step and update count; an empty shard (more
 * ranks than 16-float blocks) is a file too. Refused, naming the problem: a folder without the
 * moments, a missing shard, shards of two writes, another model, a parameter path that is no
 * folder. */
static void test_full_state_in_shards(void **state) {
    (void)state;
    char base[] = "/tmp/test_checkpoint.XXXXXX", err[1024], folder[4096];
    config_t cfg;
    qwen3_dims_t d;
    tiny_in_temp(&cfg, &d, base, 8, 3);
    state_arrays_t a = state_arrays(&d);
    const int64_t n = a.n;
    float *p = a.p, *m = a.m, *v = a.v, *m2 = a.m2, *v2 = a.v2;
    for (int k = 0; k < 3; k++) write_shard(&cfg, &d, p, m, v, k, 3, 6, 7);
    assert_int_equal(checkpoint_finish(&cfg, &d, 6, err, sizeof err), 0);
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 6), 0);
    full_state_t fs;
    assert_int_equal(full_state_open(&fs, folder, &d, err, sizeof err), 0);
    assert_int_equal(fs.step, 6);
    assert_int_equal(fs.updates_done, 7);
    assert_int_equal(fs.shards, 3);
    for (int ranks = 1; ranks <= 2; ranks++) {
        memset(m2, 0xff, (size_t)n * sizeof(float));
        memset(v2, 0xff, (size_t)n * sizeof(float));
        for (int k = 0; k < ranks; k++) {
            int64_t lo, count;
            zero_shard_range(n, ranks, k, &lo, &count);
            assert_int_equal(full_state_read_moments(&fs, lo, count, m2 + lo, NULL, v2 + lo, NULL, err, sizeof err), 0);
        }
        assert_memory_equal(m, m2, (size_t)n * sizeof(float));
        assert_memory_equal(v, v2, (size_t)n * sizeof(float));
    }
    float *p2 = malloc((size_t)n * sizeof(float));
    assert_int_equal(qwen3_load_safetensors(p2, &d, fs.model_file, err, sizeof err), 0);
    assert_memory_equal(p, p2, (size_t)n * sizeof(float));
    full_state_close(&fs);

    /* so many shards that the last are empty */
    int many = (int)(n / 16) + 3;
    for (int k = 0; k < many; k++) write_shard(&cfg, &d, p, m, v, k, many, 2, 3);
    assert_int_equal(checkpoint_finish(&cfg, &d, 2, err, sizeof err), 0);
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 2), 0);
    assert_int_equal(full_state_open(&fs, folder, &d, err, sizeof err), 0);
    assert_int_equal(full_state_read_moments(&fs, 0, n, m2, NULL, v2, NULL, err, sizeof err), 0);
    assert_memory_equal(m, m2, (size_t)n * sizeof(float));
    full_state_close(&fs);

    /* refusals */
    char file[4200], other[4200];
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 6), 0);
    checkpoint_optimizer_file(file, sizeof file, folder, 1, 3);
    snprintf(other, sizeof other, "%s.aside", file);
    assert_int_equal(rename(file, other), 0);
    expect_refused(folder, &d, "lacks optimizer_state-00001-of-00003.safetensors of its 3");
    assert_int_equal(rename(other, file), 0);
    /* a folder holds one write: step 6 again replaces the first one whole */
    for (int k = 0; k < 2; k++) write_shard(&cfg, &d, p, m, v, k, 3, 6, 7);
    write_shard(&cfg, &d, p, m, v, 2, 3, 6, 8); /* shard 2 of another write */
    assert_int_equal(checkpoint_finish(&cfg, &d, 6, err, sizeof err), 0);
    expect_refused(folder, &d, "mixes two writes");
    for (int k = 0; k < 3; k++) write_shard(&cfg, &d, p, m, v, k, 3, 6, 7);
    write_shard(&cfg, &d, p, m, v, 1, 2, 6, 7); /* a 2-shard file among 3-shard ones */
    assert_int_equal(checkpoint_finish(&cfg, &d, 6, err, sizeof err), 0);
    expect_refused(folder, &d, "mixes optimizer_state files of");
    /* files not yet finished are in <step>.partial, and the check before a run removes them */
    write_shard(&cfg, &d, p, m, v, 0, 3, 7, 8);
    snprintf(file, sizeof file, "%s/r/checkpoints/7.partial", base);
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 7), 0);
    assert_int_not_equal(stat(folder, &st), 0);
    assert_int_equal(checkpoint_check(&cfg, &d, 0, err, sizeof err), 0);
    assert_int_not_equal(stat(file, &st), 0);
    checkpoint_written_t w;
    assert_int_equal(checkpoint_write(&cfg, &d, p, NULL, NULL, 9, &w, err, sizeof err), 0); /* parameters only */
    assert_int_equal(checkpoint_finish(&cfg, &d, 9, err, sizeof err), 0);
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 9), 0);
    expect_refused(folder, &d, "has no optimizer_state files: it holds parameters only; start a run from them with "
                               "load_parameters_path=");
    snprintf(file, sizeof file, "%s/model.safetensors", folder);
    expect_refused(file, &d, "is not a folder");
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 2), 0);
    qwen3_dims_t wider = d;
    wider.F += 32;
    expect_refused(folder, &wider, "another layout");
    free(p2);
    state_arrays_free(&a);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -r %s", base);
    assert_int_equal(system(cmd), 0);
}

/* AdamW's m in either dtype (mu_dtype): a bf16 m is written as BF16 (v stays F32) and reads
 * back to the same bits into bf16, and widened exactly into fp32; an fp32 m reads into bf16
 * rounded to nearest even. The shards' ranges are read across files, as on another rank count. */
static void test_full_state_moment_dtypes(void **state) {
    (void)state;
    char base[] = "/tmp/test_checkpoint.XXXXXX", err[1024], folder[4096], file[4200];
    config_t cfg;
    qwen3_dims_t d;
    tiny_in_temp(&cfg, &d, base, 8, 3);
    state_arrays_t a = state_arrays(&d);
    const int64_t n = a.n;
    float *p = a.p, *m = a.m, *v = a.v, *m2 = a.m2, *v2 = a.v2;
    bf16_t *m16 = malloc((size_t)n * sizeof(bf16_t)), *m16b = malloc((size_t)n * sizeof(bf16_t));
    for (int64_t i = 0; i < n; i++) m16[i] = bf16_from_f32(m[i]);
    for (int k = 0; k < 2; k++) {
        int64_t lo, count;
        zero_shard_range(n, 2, k, &lo, &count);
        checkpoint_optimizer_shard_t sh = {.m16 = m16 + lo, .v = v + lo, .lo = lo, .count = count, .num_params = n,
                                           .updates_done = 4, .index = k, .shards = 2};
        checkpoint_written_t w;
        assert_int_equal(checkpoint_write(&cfg, &d, k == 0 ? p : NULL, NULL, &sh, 3, &w, err, sizeof err), 0);
    }
    assert_int_equal(checkpoint_finish(&cfg, &d, 3, err, sizeof err), 0);
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 3), 0);
    checkpoint_optimizer_file(file, sizeof file, folder, 1, 2);
    safetensors_t st;
    assert_int_equal(safetensors_open(&st, file, err, sizeof err), 0);
    assert_int_equal(safetensors_find(&st, "exp_avg")->dtype, ST_BF16);
    assert_int_equal(safetensors_find(&st, "exp_avg_sq")->dtype, ST_F32);
    safetensors_close(&st);
    full_state_t fs;
    assert_int_equal(full_state_open(&fs, folder, &d, err, sizeof err), 0);
    memset(m16b, 0xff, (size_t)n * sizeof(bf16_t));
    assert_int_equal(full_state_read_moments(&fs, 0, n, NULL, m16b, v2, NULL, err, sizeof err), 0);
    assert_memory_equal(m16, m16b, (size_t)n * sizeof(bf16_t));
    assert_memory_equal(v, v2, (size_t)n * sizeof(float));
    assert_int_equal(full_state_read_moments(&fs, 0, n, m2, NULL, v2, NULL, err, sizeof err), 0);
    for (int64_t i = 0; i < n; i++) assert_true(m2[i] == bf16_to_f32(m16[i]));
    full_state_close(&fs);
    /* an fp32 m, read into bf16 */
    for (int k = 0; k < 3; k++) write_shard(&cfg, &d, p, m, v, k, 3, 5, 6);
    assert_int_equal(checkpoint_finish(&cfg, &d, 5, err, sizeof err), 0);
    assert_int_equal(checkpoint_folder(folder, sizeof folder, &cfg, 5), 0);
    assert_int_equal(full_state_open(&fs, folder, &d, err, sizeof err), 0);
    int64_t lo, count;
    zero_shard_range(n, 2, 1, &lo, &count);
    assert_int_equal(full_state_read_moments(&fs, lo, count, NULL, m16b + lo, v2 + lo, NULL, err, sizeof err), 0);
    assert_memory_equal(m16 + lo, m16b + lo, (size_t)count * sizeof(bf16_t));
    full_state_close(&fs);
    free(m16), free(m16b);
    state_arrays_free(&a);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -r %s", base);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_due_steps),
        cmocka_unit_test(test_space_needed),
        cmocka_unit_test(test_write_and_read_back),
        cmocka_unit_test(test_full_state_in_shards),
        cmocka_unit_test(test_full_state_moment_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
