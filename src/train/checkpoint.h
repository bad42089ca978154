/* checkpoint: parameter checkpoints (enable_checkpointing, checkpoint_period), placed as
 * MaxText places them: after the update of every step that is a multiple of checkpoint_period,
 * and of the last step, in <base_output_directory>/<run_name>/checkpoints/<step>/model.safetensors.
 * The file holds the fp32 master parameters under Hugging Face's Qwen3 names, with the shape in a
 * config.json beside it (Qwen3 shapes, with q/k norms), so load_parameters_path reads it back and
 * transformers' Qwen3ForCausalLM.from_pretrained opens the folder. It is written whole (a temporary file,
 * then a rename) while the steps wait, outside every step's time. Parameters only: AdamW's
 * moments and the step count are not in it, so a run started from one starts its optimizer anew. */
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
/* How many steps of a run are checkpointed. */
int64_t checkpoint_count(int64_t steps, int64_t period);
/* An upper bound of one checkpoint file's size: the parameters in fp32 and the header. */
uint64_t checkpoint_file_bytes(const qwen3_dims_t *d);
/* <base_output_directory>/<run_name>/checkpoints/<step>/model.safetensors (or the folder of all
 * of them for step < 0). 0, or -1 if it does not fit in n. */
int checkpoint_path(char *out, size_t n, const config_t *cfg, int64_t step);
/* Before set-up, so that a run that cannot keep its checkpoints says so at once: the checkpoints
 * folder must be a folder if it exists, and the run folder's filesystem must have room for all
 * the run's checkpoints (available_bytes: statvfs's, or a test's). One line in err on refusal. */
int checkpoint_check(const config_t *cfg, const qwen3_dims_t *d, char *err, size_t errlen);
int checkpoint_check_space(const config_t *cfg, const qwen3_dims_t *d, uint64_t available_bytes, char *err,
                           size_t errlen);
/* The file load_parameters_path names: the path itself, or <folder>/model.safetensors where it
 * is a folder (a checkpoint's, or any Hugging Face model folder). 0, or -1 with one line in err. */
int checkpoint_parameters_file(const char *path, char *out, size_t n, char *err, size_t errlen);

/* Write the parameters after `step`'s update. 0, or -1 with one line in err (nothing left but
 * the folders). */
int checkpoint_write(const config_t *cfg, const qwen3_dims_t *d, const float *params, int64_t step,
                     checkpoint_written_t *out, char *err, size_t errlen);

#endif
