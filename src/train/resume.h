/* resume: reading a full-state checkpoint back (load_full_state_path): the folder's
 * model.safetensors, and AdamW's moments and step from its optimizer_state files
 * (train/checkpoint.h). The moments are flat ranges of the parameter vector, so a run reads its
 * shard from whichever files cover it: a checkpoint written by R ranks resumes on any number.
 * Everything is checked from the headers before set-up (full_state_open): every file of the set
 * present, one step and update count, the ranges covering the parameters once, and the layout's
 * fingerprint and count equal to this model's; only then are moments read (pread, so the files'
 * pages do not count in the process's resident set). */
#ifndef STEPSCOPE_RESUME_H
#define STEPSCOPE_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "io/safetensors.h"
#include "model/qwen3.h"

typedef struct full_state {
    char model_file[4096];
    int64_t step;         /* the step whose update the checkpoint holds; the run resumes at step + 1 */
    int64_t updates_done; /* AdamW's update count (its bias corrections) */
    int shards;
    safetensors_t *files; /* [shards], in shard order */
    int64_t *shard_lo;    /* [shards]: the first parameter each file's moments start at */
} full_state_t;

/* Open and check the checkpoint folder `path` for a model of shape d (the parameters' names and
 * shapes too, from model.safetensors' header). 0, or -1 with one line in err that names what is
 * wrong and what to do (nothing left open). */
int full_state_open(full_state_t *fs, const char *path, const qwen3_dims_t *d, char *err, size_t errlen);
/* m and v of parameters [lo, lo + count): m into m (fp32) or, where m is NULL, m16 (bf16,
 * mu_dtype=bfloat16), and v into v or, where v is NULL, v16 (weight_dtype=bfloat16), whichever
 * dtype the checkpoint holds them in (widened, or rounded to nearest even). 0, or -1 with one
 * line in err. */
int full_state_read_moments(const full_state_t *fs, int64_t lo, int64_t count, float *m, bf16_t *m16, float *v,
                            bf16_t *v16, char *err, size_t errlen);
void full_state_close(full_state_t *fs);
/* The first step of a run that resumes from cfg->load_full_state_path (the checkpoint's step + 1),
 * checked as the run and its dry run both check it: the checkpoint opens for a model of shape d,
 * steps are left after it, and the profiler's window opens before the last. 0, or -1 with one
 * line in err. */
int full_state_first_step(const config_t *cfg, const qwen3_dims_t *d, int64_t *first_step, char *err, size_t errlen);

#endif
