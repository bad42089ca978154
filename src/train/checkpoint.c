/* checkpoint: see checkpoint.h. */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "util/atomic_file.h"

bool checkpoint_due(int64_t step, int64_t steps, int64_t period) {
    return step >= 0 && step < steps && (step % period == 0 || step == steps - 1);
}

int64_t checkpoint_count(int64_t first, int64_t steps, int64_t period) {
    if (first < 0) first = 0;
    if (steps <= first) return 0;
    /* the multiples of period in [first, steps - 1], and the last step if it is none */
    int64_t multiples = (steps - 1) / period - (first + period - 1) / period + 1;
    return multiples + ((steps - 1) % period != 0);
}

/* A header's allowance: an entry is the name, dtype, shape and offsets, well under 256 bytes. */
static uint64_t header_bytes(const qwen3_dims_t *d) { return (uint64_t)qwen3_tensor_table(d, NULL) * 256 + 4096; }

uint64_t checkpoint_file_bytes(const qwen3_dims_t *d) {
    return (uint64_t)qwen3_num_params(d) * sizeof(float) + header_bytes(d);
}

uint64_t checkpoint_bytes(const config_t *cfg, const qwen3_dims_t *d) {
    const uint64_t w = cfg->weight_dtype == DTYPE_BFLOAT16 ? 2 : 4, m = config_mu_dtype(cfg) == DTYPE_BFLOAT16 ? 2 : 4;
    /* model.safetensors' header allowance for every file: the moments' files (two tensors and a
     * few metadata strings each, one a rank) need far less. */
    return (uint64_t)qwen3_num_params(d) * (w + m + w) + 3 * header_bytes(d);
}

int checkpoint_folder(char *out, size_t n, const config_t *cfg, int64_t step) {
    int k = snprintf(out, n, "%s/%s/checkpoints/%lld", cfg->base_output_directory, cfg->run_name, (long long)step);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

int checkpoint_optimizer_file(char *out, size_t n, const char *folder, int index, int shards) {
    int k = snprintf(out, n, "%s/optimizer_state-%05d-of-%05d.safetensors", folder, index, shards);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* Where a step's files are written before the folder is whole: <step>.partial beside it. */
static int partial_folder(char *out, size_t n, const config_t *cfg, int64_t step) {
    static const char suffix[] = ".partial";
    if (checkpoint_folder(out, n, cfg, step) != 0 || strlen(out) + sizeof suffix > n) return -1;
    strcat(out, suffix);
    return 0;
}

/* A folder of files only (a checkpoint's): each file removed, then the folder. 0, or -1 with
 * errno set (ENOTEMPTY where it holds a folder). */
static int remove_flat_folder(const char *path) {
    DIR *dir = opendir(path);
    if (!dir) return -1;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(dir));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char file[4400];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        rc = unlink(file);
    }
    int saved = errno;
    closedir(dir);
    if (rc != 0) {
        errno = saved == EISDIR ? ENOTEMPTY : saved;
        return -1;
    }
    return rmdir(path);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int checkpoint_path(char *out, size_t n, const config_t *cfg, int64_t step) {
    int k = step < 0 ? snprintf(out, n, "%s/%s/checkpoints", cfg->base_output_directory, cfg->run_name)
                     : snprintf(out, n, "%s/%s/checkpoints/%lld/model.safetensors", cfg->base_output_directory,
                                cfg->run_name, (long long)step);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

static double gib(uint64_t b) { return (double)b / 1073741824.0; }

int checkpoint_check_space(const config_t *cfg, const qwen3_dims_t *d, int64_t first_step, uint64_t available_bytes,
                           char *err, size_t errlen) {
    int64_t count = checkpoint_count(first_step, cfg->steps, cfg->checkpoint_period);
    uint64_t each = checkpoint_bytes(cfg, d), need = (uint64_t)count * each;
    if (need <= available_bytes) return 0;
    snprintf(err, errlen,
             "enable_checkpointing: the run's %lld checkpoints (the steps that are multiples of checkpoint_period=%lld, and the last) need %.3f GiB "
             "(%.3f GiB each) and %s/%s has %.3f GiB free; raise checkpoint_period, lower steps or free space",
             (long long)count, (long long)cfg->checkpoint_period, gib(need), gib(each), cfg->base_output_directory,
             cfg->run_name, gib(available_bytes));
    return -1;
}

int checkpoint_check(const config_t *cfg, const qwen3_dims_t *d, int64_t first_step, char *err, size_t errlen) {
    char dir[4096];
    if (checkpoint_path(dir, sizeof dir, cfg, -1) != 0) {
        snprintf(err, errlen, "base_output_directory and run_name make a path too long for the checkpoints");
        return -1;
    }
    struct stat st;
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "enable_checkpointing: %s is not a folder; remove it or choose another run_name", dir);
        return -1;
    }
    /* An earlier run under this name that stopped mid-write left <step>.partial folders: whole
     * files of a checkpoint that never became one. Gone before this run writes its own, so that
     * none of their files (another rank count's optimizer shards) ends up in a new checkpoint. */
    DIR *ck = opendir(dir);
    for (struct dirent *e; ck && (e = readdir(ck));) {
        char stale[4400];
        snprintf(stale, sizeof stale, "%s/%s", dir, e->d_name);
        if (ends_with(e->d_name, ".partial") && stat(stale, &st) == 0 && S_ISDIR(st.st_mode) &&
            remove_flat_folder(stale) != 0) {
            snprintf(err, errlen, "enable_checkpointing: cannot remove %s, an earlier run's unfinished checkpoint: %s; "
                     "remove it or choose another run_name", stale, strerror(errno));
            closedir(ck);
            return -1;
        }
    }
    if (ck) closedir(ck);
    /* The run folder exists by now (the metrics file is open in it). */
    *strrchr(dir, '/') = '\0';
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        snprintf(err, errlen, "enable_checkpointing: cannot read the free space of %s: %s", dir, strerror(errno));
        return -1;
    }
    return checkpoint_check_space(cfg, d, first_step, (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize, err, errlen);
}

/* Hugging Face's config.json for the shape, so that Qwen3ForCausalLM.from_pretrained(folder) opens
 * the checkpoint as it is. rope_theta both at the top (transformers 4) and in rope_parameters
 * (transformers 5). */
static int write_hf_config(const char *folder, const qwen3_dims_t *d, int64_t max_positions, char *err, size_t errlen) {
    char path[4096], json[2048];
    snprintf(path, sizeof path, "%s/config.json", folder);
    int n = snprintf(json, sizeof json,
                     "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"model_type\": \"qwen3\",\n"
                     "  \"vocab_size\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
                     "  \"num_hidden_layers\": %lld,\n  \"num_attention_heads\": %lld,\n"
                     "  \"num_key_value_heads\": %lld,\n  \"head_dim\": %lld,\n  \"hidden_act\": \"silu\",\n"
                     "  \"rms_norm_eps\": %.17g,\n  \"rope_theta\": %.17g,\n"
                     "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": %.17g},\n"
                     "  \"max_position_embeddings\": %lld,\n  \"tie_word_embeddings\": %s,\n"
                     "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n  \"use_sliding_window\": false,\n"
                     "  \"torch_dtype\": \"float32\"\n}\n",
                     (long long)d->V, (long long)d->D, (long long)d->F, (long long)d->L, (long long)d->H,
                     (long long)d->KV, (long long)d->HD, d->eps, d->rope_theta, d->rope_theta,
                     (long long)max_positions, d->tied ? "true" : "false");
    return atomic_write_file(path, json, (size_t)n, err, errlen);
}

int checkpoint_parameters_file(const char *path, char *out, size_t n, char *err, size_t errlen) {
    struct stat st;
    bool folder = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    int k = folder ? snprintf(out, n, "%s/model.safetensors", path) : snprintf(out, n, "%s", path);
    if (k < 0 || (size_t)k >= n) {
        snprintf(err, errlen, "load_parameters_path=%s is too long", path);
        return -1;
    }
    if (folder && stat(out, &st) != 0) {
        snprintf(err, errlen, "load_parameters_path=%s is a folder without model.safetensors; name the file, or a "
                 "checkpoint's folder", path);
        return -1;
    }
    return 0;
}

static uint64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static int write_optimizer_shard(const char *folder, const qwen3_dims_t *d, const checkpoint_optimizer_shard_t *sh,
                                 int64_t step, uint64_t *bytes, char *err, size_t errlen) {
    char path[4096], v_step[24], v_updates[24], v_n[24], v_lo[24], v_count[24], v_layout[24];
    if (checkpoint_optimizer_file(path, sizeof path, folder, sh->index, sh->shards) != 0) {
        snprintf(err, errlen, "the optimizer state's path in %s is too long", folder);
        return -1;
    }
    snprintf(v_step, sizeof v_step, "%lld", (long long)step);
    snprintf(v_updates, sizeof v_updates, "%lld", (long long)sh->updates_done);
    snprintf(v_n, sizeof v_n, "%lld", (long long)sh->num_params);
    snprintf(v_lo, sizeof v_lo, "%lld", (long long)sh->lo);
    snprintf(v_count, sizeof v_count, "%lld", (long long)sh->count);
    snprintf(v_layout, sizeof v_layout, "%016llx", (unsigned long long)qwen3_layout_hash(d));
    const char *keys[] = {"format", "step", "updates_done", "num_params", "shard_lo", "shard_count", "param_layout"};
    const char *values[] = {CHECKPOINT_OPTIMIZER_FORMAT, v_step, v_updates, v_n, v_lo, v_count, v_layout};
    /* F32 before BF16 (v first where both are alike): every tensor's data is then aligned to its
     * element size. */
    st_write_entry_t v = {.name = "exp_avg_sq", .ndim = 1, .shape = {sh->count},
                          .data = sh->v16 ? (const void *)sh->v16 : (const void *)sh->v, .dtype = sh->v16 ? ST_BF16 : ST_F32};
    st_write_entry_t m = {.name = "exp_avg", .ndim = 1, .shape = {sh->count},
                          .data = sh->m16 ? (const void *)sh->m16 : (const void *)sh->m, .dtype = sh->m16 ? ST_BF16 : ST_F32};
    bool m_first = v.dtype == ST_BF16 && m.dtype == ST_F32;
    st_write_entry_t e[2] = {m_first ? m : v, m_first ? v : m};
    if (safetensors_write(path, e, 2, keys, values, sizeof keys / sizeof *keys, err, errlen) != 0) return -1;
    *bytes += file_size(path);
    return 0;
}

int checkpoint_write(const config_t *cfg, const qwen3_dims_t *d, const float *params, const bf16_t *params16,
                     const checkpoint_optimizer_shard_t *shard, int64_t step, checkpoint_written_t *out, char *err,
                     size_t errlen) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char folder[4096], path[4400];
    if (partial_folder(folder, sizeof folder, cfg, step) != 0) {
        snprintf(err, errlen, "the checkpoint path of step %lld is too long", (long long)step);
        return -1;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", folder);
    if (mkdir_p(folder) != 0) {
        snprintf(err, errlen, "cannot create %s: %s", folder, strerror(errno));
        return -1;
    }
    uint64_t bytes = 0;
    if (shard && write_optimizer_shard(folder, d, shard, step, &bytes, err, errlen) != 0) return -1;
    if (params || params16) {
        if ((params ? qwen3_save_safetensors(params, d, path, err, errlen)
                    : qwen3_save_safetensors_bf16(params16, d, path, err, errlen)) != 0)
            return -1;
        bytes += file_size(path);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *out = (checkpoint_written_t){.step = step,
                                  .bytes = bytes,
                                  .seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)};
    return 0;
}

int checkpoint_finish(const config_t *cfg, const qwen3_dims_t *d, int64_t step, char *err, size_t errlen) {
    char partial[4096], folder[4096];
    if (partial_folder(partial, sizeof partial, cfg, step) != 0 || checkpoint_folder(folder, sizeof folder, cfg, step) != 0) {
        snprintf(err, errlen, "the checkpoint path of step %lld is too long", (long long)step);
        return -1;
    }
    /* The positions: Qwen3's own 40960, or the run's length where longer. */
    if (d->qk_norm &&
        write_hf_config(partial, d, cfg->max_target_length > 40960 ? cfg->max_target_length : 40960, err, errlen) != 0)
        return -1;
    /* An earlier run's checkpoint of this step goes whole, so that the folder holds one write. */
    struct stat st;
    if (stat(folder, &st) == 0 && S_ISDIR(st.st_mode) && remove_flat_folder(folder) != 0) {
        snprintf(err, errlen, "cannot replace %s, an earlier run's checkpoint: %s", folder, strerror(errno));
        return -1;
    }
    if (rename(partial, folder) != 0) {
        snprintf(err, errlen, "cannot put %s in place: %s", folder, strerror(errno));
        return -1;
    }
    fsync_parent_dir(folder); /* the rename made durable, as atomic_file does for its files */
    return 0;
}
