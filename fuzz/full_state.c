/* libFuzzer target: a full-state checkpoint's AdamW file as load_full_state_path reads it
 * (train/resume.c): the input is the folder's optimizer_state-00000-of-00001.safetensors, beside
 * a valid model.safetensors of the micro model of fuzz/safetensors.c (written once). Whatever
 * the file holds, the reader refuses it in one line or accepts it with a step, an update count
 * and moments it can read back; the seed corpus holds a valid file and near-misses of each
 * refusal (fuzz/make_corpus.py). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_file.h"
#include "model/qwen3.h"
#include "train/resume.h"

static const qwen3_dims_t MICRO = {.B = 1, .S = 4, .D = 4, .F = 8, .L = 1, .H = 2, .KV = 1, .HD = 2, .V = 8,
                                   .tied = true, .qk_norm = true, .rope_theta = 10000.0, .eps = 1e-6};
enum { MAX_PARAMS = 4096 };

static char folder[4096], state_file[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(folder, sizeof folder, "%s/stepscope-fuzz-full-state-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(folder)) abort();
    static float params[MAX_PARAMS];
    char path[4200], err[1024];
    if (qwen3_num_params(&MICRO) > MAX_PARAMS) abort();
    snprintf(path, sizeof path, "%s/model.safetensors", folder);
    if (qwen3_save_safetensors(params, &MICRO, path, err, sizeof err) != 0) abort();
    snprintf(state_file, sizeof state_file, "%s/optimizer_state-00000-of-00001.safetensors", folder);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(state_file, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    full_state_t fs;
    char err[1024];
    if (full_state_open(&fs, folder, &MICRO, err, sizeof err) != 0) {
        fuzz_check_message(err);
        return 0;
    }
    /* accepted: one shard of this model's parameters, after at least one update */
    const int64_t n = qwen3_num_params(&MICRO);
    if (fs.shards != 1 || fs.step < 0 || fs.updates_done < 1) abort();
    static float m[MAX_PARAMS], v[MAX_PARAMS];
    static bf16_t m16[MAX_PARAMS], v16[MAX_PARAMS];
    if (full_state_read_moments(&fs, 0, n, m, NULL, v, NULL, err, sizeof err) != 0) fuzz_check_message(err);
    if (full_state_read_moments(&fs, 3, n - 5, m, NULL, v, NULL, err, sizeof err) != 0) fuzz_check_message(err);
    if (full_state_read_moments(&fs, 1, n - 2, NULL, m16, v, NULL, err, sizeof err) != 0) fuzz_check_message(err);
    if (full_state_read_moments(&fs, 2, n - 2, NULL, m16, NULL, v16, err, sizeof err) != 0) fuzz_check_message(err);
    full_state_close(&fs);
    return 0;
}
