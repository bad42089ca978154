/* Parameter checkpoints (train/checkpoint.h): which steps are written (MaxText's rule: the
 * multiples of checkpoint_period and the last step), the space a run needs and the message when
 * it is not there, and a written checkpoint: its path, its size and the same bits read back. */
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
#include "train/checkpoint.h"

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
        int64_t steps = runs[r][0], period = runs[r][1], due = 0;
        for (int64_t s = 0; s < steps; s++) due += checkpoint_due(s, steps, period);
        assert_int_equal(checkpoint_count(steps, period), due);
    }
    assert_int_equal(checkpoint_count(5, 2), 3);  /* 0, 2, 4 */
    assert_int_equal(checkpoint_count(6, 2), 4);  /* 0, 2, 4, 5 */
    assert_int_equal(checkpoint_count(10, 10000), 2); /* 0 and 9 */
    assert_int_equal(checkpoint_count(1, 3), 1);
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

/* The bound covers the file as written, and a run's need is its count times the bound: refused
 * one byte short of it, with the numbers and the knobs in the message. */
static void test_space_needed(void **state) {
    (void)state;
    config_t cfg;
    qwen3_dims_t d;
    tiny(&cfg, &d, "out", 5, 2);
    uint64_t each = checkpoint_file_bytes(&d);
    assert_true(each >= (uint64_t)qwen3_num_params(&d) * 4);
    char err[512] = "";
    assert_int_equal(checkpoint_check_space(&cfg, &d, 3 * each, err, sizeof err), 0);
    assert_int_equal(checkpoint_check_space(&cfg, &d, 3 * each - 1, err, sizeof err), -1);
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
    assert_non_null(mkdtemp(base));
    config_t cfg;
    qwen3_dims_t d;
    tiny(&cfg, &d, base, 5, 2);
    int64_t n = qwen3_num_params(&d);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    qwen3_init_params(a, &d, 3);
    checkpoint_written_t w;
    assert_int_equal(checkpoint_write(&cfg, &d, a, 2, &w, err, sizeof err), 0);
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
    assert_int_equal(checkpoint_check(&cfg, &d, err, sizeof err), 0);

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
    assert_int_equal(checkpoint_check(&cfg, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "is not a folder"));
    assert_int_equal(checkpoint_write(&cfg, &d, a, 4, &w, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot create"));
    assert_int_equal(unlink(dir), 0);
    snprintf(dir, sizeof dir, "%s/r", base);
    assert_int_equal(rmdir(dir), 0);
    assert_int_equal(rmdir(base), 0);
    free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_due_steps),
        cmocka_unit_test(test_space_needed),
        cmocka_unit_test(test_write_and_read_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
