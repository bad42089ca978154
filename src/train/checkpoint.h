/* checkpoint: full-state checkpoints (enable_checkpointing, checkpoint_period), placed as
 * MaxText places them: after the update of every step that is a multiple of checkpoint_period,
 * and of the last step, in <base_output_directory>/<run_name>/checkpoints/<step>/ (written as
 * <step>.partial/, renamed into place once every rank's files are in it, so that a <step>
 * folder is always a whole checkpoint):
 *   model.safetensors  the parameters under Hugging Face's Qwen3 names (rank 0): F32 master
 *                      weights, or BF16 with weight_dtype=bfloat16;
 *   optimizer_state-<k>-of-<R>.safetensors
 *                      AdamW's moments of shard k of the flat parameter vector (dist/zero.h's
 *                      shards; one file with one rank), with the step, the update count and
 *                      the layout's fingerprint in its metadata (each rank of the first replica
 *                      group writes its own);
 *   config.json        the Qwen3 shape, written by rank 0 after every rank's files, so that
 *                      transformers' Qwen3ForCausalLM.from_pretrained opens the folder as a
 *                      model folder.
 * load_parameters_path reads the parameters back; load_full_state_path (train/resume.h) resumes
 * from the whole folder. Files are written whole (a temporary file, then a rename) while the
 * steps wait, outside every step's time. */
#ifndef STEPSCOPE_CHECKPOINT_H
#define STEPSCOPE_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "model/qwen3.h"

typedef struct checkpoint_written {
    int64_t step;
    uint64_t bytes;
    double seconds; /* the whole write: folder, file, fsync and rename */
} checkpoint_written_t;

/* Whether the update of `step` (0-based, of `steps`) is checkpointed. */
bool checkpoint_due(int64_t step, int64_t steps, int64_t period);
/* How many of the steps first .. steps - 1 are checkpointed. */
int64_t checkpoint_count(int64_t first, int64_t steps, int64_t period);
/* An upper bound of model.safetensors' size: the parameters in fp32 and the header. */
uint64_t checkpoint_file_bytes(const qwen3_dims_t *d);
/* An upper bound of a whole checkpoint's size over every rank: the parameters and v in
 * weight_dtype, m in mu_dtype (what the files hold), and the headers. */
uint64_t checkpoint_bytes(const config_t *cfg, const qwen3_dims_t *d);
/* <base_output_directory>/<run_name>/checkpoints/<step>/model.safetensors (or the folder of all
 * of them for step < 0). 0, or -1 if it does not fit in n. */
int checkpoint_path(char *out, size_t n, const config_t *cfg, int64_t step);
/* <base_output_directory>/<run_name>/checkpoints/<step>. 0, or -1 if it does not fit in n. */
int checkpoint_folder(char *out, size_t n, const config_t *cfg, int64_t step);
/* <folder>/optimizer_state-<index>-of-<shards>.safetensors (five digits each, from 0). */
int checkpoint_optimizer_file(char *out, size_t n, const char *folder, int index, int shards);
/* The metadata of an optimizer_state file: its format's name, and the keys train/resume.c reads. */
#define CHECKPOINT_OPTIMIZER_FORMAT "stepscope adamw state 1"
/* Before set-up, so that a run that cannot keep its checkpoints says so at once: the checkpoints
 * folder must be a folder if it exists, and the run folder's filesystem must have room for all
 * the checkpoints of steps first_step .. steps - 1 (available_bytes: statvfs's, or a test's).
 * It also removes the <step>.partial folders an earlier run under this name left unfinished
 * (rank 0, before any rank writes). One line in err on refusal. */
int checkpoint_check(const config_t *cfg, const qwen3_dims_t *d, int64_t first_step, char *err, size_t errlen);
int checkpoint_check_space(const config_t *cfg, const qwen3_dims_t *d, int64_t first_step, uint64_t available_bytes,
                           char *err, size_t errlen);
/* The file load_parameters_path names: the path itself, or <folder>/model.safetensors where it
 * is a folder (a checkpoint's, or any Hugging Face model folder). 0, or -1 with one line in err. */
int checkpoint_parameters_file(const char *path, char *out, size_t n, char *err, size_t errlen);

/* This rank's part of AdamW's state: the moments m and v of parameters [lo, lo + count) of
 * num_params, shard `index` of `shards`, after `updates_done` updates. m is fp32, or bf16 in m16
 * (mu_dtype=bfloat16, then m is NULL), v fp32 or bf16 in v16 (weight_dtype=bfloat16), each
 * written in the dtype it is held in. */
typedef struct checkpoint_optimizer_shard {
    const float *m, *v;
    const bf16_t *m16, *v16;
    int64_t lo, count, num_params, updates_done;
    int index, shards;
} checkpoint_optimizer_shard_t;

/* This rank's files of the checkpoint after `step`'s update, into <step>.partial: params, or
 * params16 with weight_dtype=bfloat16 (both NULL on ranks other than 0), to model.safetensors,
 * and shard (NULL on ranks that hold a replica's copy) to its optimizer_state file. out gets the
 * bytes written and the seconds. 0, or -1 with one line in err (no file half-written). */
int checkpoint_write(const config_t *cfg, const qwen3_dims_t *d, const float *params, const bf16_t *params16,
                     const checkpoint_optimizer_shard_t *shard, int64_t step, checkpoint_written_t *out, char *err,
                     size_t errlen);
/* Rank 0, once every rank's checkpoint_write of `step` is done: config.json (Qwen3 shapes only:
 * without the q/k norms the shape is no Hugging Face model), then <step>.partial renamed to
 * <step>, replacing an earlier run's <step> folder. 0, or -1 with one line in err. */
int checkpoint_finish(const config_t *cfg, const qwen3_dims_t *d, int64_t step, char *err, size_t errlen);

#endif
