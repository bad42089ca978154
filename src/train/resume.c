/* resume: see resume.h. */
#include "train/resume.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "util/one_line.h"

/* optimizer_state-<k>-of-<R>.safetensors: k and R, or false for another name. */
static bool shard_name(const char *name, int *index, int *shards) {
    int end = 0;
    if (sscanf(name, "optimizer_state-%5d-of-%5d.safetensors%n", index, shards, &end) != 2) return false;
    return end > 0 && name[end] == '\0' && *shards >= 1 && *index >= 0 && *index < *shards;
}

/* The shard count of the folder's optimizer_state files: 0 where it has none, -1 where they
 * disagree (one line in err). */
static int count_shards(const char *path, char *err, size_t errlen) {
    DIR *dir = opendir(path);
    if (!dir) {
        snprintf(err, errlen, "load_full_state_path=%s cannot be read: %s", path, strerror(errno));
        return -1;
    }
    int shards = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        int k, r;
        if (!shard_name(e->d_name, &k, &r)) continue;
        if (shards && r != shards) {
            snprintf(err, errlen, "load_full_state_path=%s mixes optimizer_state files of %d and %d shards; keep one "
                     "checkpoint's files in a folder", path, shards, r);
            shards = -1;
            break;
        }
        shards = r;
    }
    closedir(dir);
    return shards;
}

/* A metadata value written as a decimal integer (or, with hex, 16 hex digits). */
static bool meta_int(const safetensors_t *st, const char *key, bool hex, int64_t *out) {
    const char *v = safetensors_meta(st, key);
    if (!v || !*v) return false;
    char *end;
    errno = 0;
    unsigned long long u = hex ? strtoull(v, &end, 16) : 0;
    long long s = hex ? 0 : strtoll(v, &end, 10);
    if (errno || *end) return false;
    *out = hex ? (int64_t)u : (int64_t)s;
    return true;
}

typedef struct shard_meta {
    int64_t step, updates_done, num_params, lo, count, layout;
} shard_meta_t;

/* One file's metadata and tensors, as checkpoint_write writes them. */
static int check_shard(const safetensors_t *st, const char *file, shard_meta_t *m, char *err, size_t errlen) {
    const char *format = safetensors_meta(st, "format");
    if (!format || strcmp(format, CHECKPOINT_OPTIMIZER_FORMAT) != 0) {
        snprintf(err, errlen, "%s: not stepscope's AdamW state (its metadata's format is %s, not \"%s\")", file,
                 format ? format : "missing", CHECKPOINT_OPTIMIZER_FORMAT);
        return -1;
    }
    if (!meta_int(st, "step", false, &m->step) || !meta_int(st, "updates_done", false, &m->updates_done) ||
        !meta_int(st, "num_params", false, &m->num_params) || !meta_int(st, "shard_lo", false, &m->lo) ||
        !meta_int(st, "shard_count", false, &m->count) || !meta_int(st, "param_layout", true, &m->layout) ||
        m->step < 0 || m->updates_done < 1 || m->lo < 0 || m->count < 0 || m->num_params < 1) {
        snprintf(err, errlen, "%s: its metadata (step, updates_done, num_params, shard_lo, shard_count, param_layout) "
                 "is missing or not valid; the file is damaged", file);
        return -1;
    }
    /* exp_avg is held in the writer's mu_dtype, exp_avg_sq in its weight_dtype: F32 or BF16. */
    static const char *const names[] = {"exp_avg", "exp_avg_sq"};
    for (int i = 0; i < 2; i++) {
        const st_tensor_t *t = safetensors_find(st, names[i]);
        if (!t || !(t->dtype == ST_F32 || t->dtype == ST_BF16) || t->ndim != 1 || t->numel != m->count) {
            snprintf(err, errlen, "%s: needs an F32 or BF16 tensor %s of shape [%lld] (its shard_count); the file is "
                     "damaged", file, names[i], (long long)m->count);
            return -1;
        }
    }
    if (st->num_tensors != 2) {
        snprintf(err, errlen, "%s: holds %zu tensors where AdamW's state has 2 (exp_avg, exp_avg_sq)", file,
                 st->num_tensors);
        return -1;
    }
    return 0;
}

/* Every shard's file: the same step and update count, this model's layout, and ranges that
 * cover [0, n) once in shard order. */
static int open_shards(full_state_t *fs, const char *path, const qwen3_dims_t *d, char *err, size_t errlen) {
    const int64_t n = qwen3_num_params(d);
    const int64_t layout = (int64_t)qwen3_layout_hash(d);
    int64_t next_lo = 0;
    for (int k = 0; k < fs->shards; k++) {
        char file[4096];
        struct stat sb;
        if (checkpoint_optimizer_file(file, sizeof file, path, k, fs->shards) != 0) {
            snprintf(err, errlen, "load_full_state_path=%s is too long", path);
            return -1;
        }
        if (stat(file, &sb) != 0) {
            snprintf(err, errlen, "load_full_state_path=%s lacks %s of its %d optimizer_state files; the checkpoint is "
                     "incomplete: use another step's folder", path, strrchr(file, '/') + 1, fs->shards);
            return -1;
        }
        safetensors_t *st = &fs->files[k];
        if (safetensors_open(st, file, err, errlen) != 0) {
            memset(st, 0, sizeof *st);
            return -1;
        }
        shard_meta_t m;
        if (check_shard(st, file, &m, err, errlen) != 0) return -1;
        if (m.num_params != n || m.layout != layout) {
            snprintf(err, errlen, "load_full_state_path=%s holds the AdamW state of another model (%lld parameters in "
                     "another layout; this config's has %lld); resume with the config that wrote it", path,
                     (long long)m.num_params, (long long)n);
            return -1;
        }
        if (k == 0) {
            fs->step = m.step;
            fs->updates_done = m.updates_done;
        } else if (m.step != fs->step || m.updates_done != fs->updates_done) {
            snprintf(err, errlen, "load_full_state_path=%s: %s is of step %lld and shard 0 of step %lld; the checkpoint "
                     "mixes two writes: use another step's folder", path, strrchr(file, '/') + 1, (long long)m.step,
                     (long long)fs->step);
            return -1;
        }
        if (m.lo != next_lo || m.count > n - m.lo) {
            snprintf(err, errlen, "%s: parameters [%lld, %lld) where shard %d should start at %lld of %lld; the file "
                     "is damaged", file, (long long)m.lo, (long long)(m.lo + m.count), k, (long long)next_lo,
                     (long long)n);
            return -1;
        }
        fs->shard_lo[k] = m.lo;
        next_lo = m.lo + m.count;
    }
    if (next_lo != n) {
        snprintf(err, errlen, "load_full_state_path=%s: its optimizer_state files cover %lld of the %lld parameters; "
                 "the checkpoint is damaged", path, (long long)next_lo, (long long)n);
        return -1;
    }
    return 0;
}

int full_state_open(full_state_t *fs, const char *path, const qwen3_dims_t *d, char *err, size_t errlen) {
    memset(fs, 0, sizeof *fs);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "load_full_state_path=%s is not a folder; name a checkpoint's folder "
                 "(<base_output_directory>/<run_name>/checkpoints/<step>)", path);
        return -1;
    }
    int k = snprintf(fs->model_file, sizeof fs->model_file, "%s/model.safetensors", path);
    if (k < 0 || (size_t)k >= sizeof fs->model_file) {
        snprintf(err, errlen, "load_full_state_path=%s is too long", path);
        return -1;
    }
    int shards = count_shards(path, err, errlen);
    if (shards < 0) return -1;
    if (shards == 0) {
        snprintf(err, errlen, "load_full_state_path=%s has no optimizer_state files: it holds parameters only; start "
                 "a run from them with load_parameters_path=%s", path, path);
        return -1;
    }
    if (stat(fs->model_file, &sb) != 0) {
        snprintf(err, errlen, "load_full_state_path=%s has no model.safetensors; the checkpoint is incomplete: use "
                 "another step's folder", path);
        return -1;
    }
    fs->shards = shards;
    fs->files = calloc((size_t)shards, sizeof *fs->files);
    fs->shard_lo = calloc((size_t)shards, sizeof *fs->shard_lo);
    if (!fs->files || !fs->shard_lo) {
        full_state_close(fs);
        snprintf(err, errlen, "out of memory opening load_full_state_path=%s", path);
        return -1;
    }
    if (open_shards(fs, path, d, err, errlen) != 0 || qwen3_load_safetensors(NULL, d, fs->model_file, err, errlen) != 0) {
        one_line(err);
        full_state_close(fs);
        return -1;
    }
    return 0;
}

/* bytes [at, at + len) of the open file st (fd), read with pread into dst. */
static int read_bytes(const safetensors_t *st, int fd, off_t at, size_t len, void *dst, char *err, size_t errlen) {
    char *out = dst;
    while (len > 0) {
        ssize_t got = pread(fd, out, len, at);
        if (got <= 0) {
            snprintf(err, errlen, "cannot read %s: %s", st->path, got < 0 ? strerror(errno) : "it is shorter than its header says");
            return -1;
        }
        out += got, at += got, len -= (size_t)got;
    }
    return 0;
}

/* Values [from, from + count) of tensor t (F32 or BF16, as checked) of file st (open as fd),
 * into dst32 (floats) or dst16 (bf16; the other NULL): read as they are where the dtypes agree,
 * else in pieces, widened or rounded to nearest even (a checkpoint of another mu_dtype or
 * weight_dtype). */
static int read_values(const safetensors_t *st, int fd, const st_tensor_t *t, int64_t from, int64_t count,
                       float *dst32, bf16_t *dst16, char *err, size_t errlen) {
    const size_t esize = st_dtype_size(t->dtype);
    const off_t base = (off_t)((const char *)t->data - (const char *)st->map) + (off_t)from * (off_t)esize;
    int rc = 0;
    if ((t->dtype == ST_F32) == (dst32 != NULL)) {
        rc = read_bytes(st, fd, base, (size_t)count * esize, dst32 ? (void *)dst32 : (void *)dst16, err, errlen);
    } else {
        enum { PIECE = 1 << 16 };
        float *piece = malloc(PIECE * sizeof(float));
        if (!piece) {
            snprintf(err, errlen, "out of memory reading %s", st->path);
            rc = -1;
        }
        for (int64_t i = 0; rc == 0 && i < count; i += PIECE) {
            const int64_t n = count - i < PIECE ? count - i : PIECE;
            rc = read_bytes(st, fd, base + (off_t)i * (off_t)esize, (size_t)n * esize, piece, err, errlen);
            if (rc == 0 && dst16) bf16_from_f32_block(dst16 + i, piece, n);
            for (int64_t j = 0; rc == 0 && dst32 && j < n; j++) dst32[i + j] = bf16_to_f32(((const bf16_t *)piece)[j]);
        }
        free(piece);
    }
    return rc;
}

int full_state_read_moments(const full_state_t *fs, int64_t lo, int64_t count, float *m, bf16_t *m16, float *v,
                            bf16_t *v16, char *err, size_t errlen) {
    for (int k = 0; k < fs->shards && count > 0; k++) {
        const safetensors_t *st = &fs->files[k];
        const st_tensor_t *tm = safetensors_find(st, "exp_avg"), *tv = safetensors_find(st, "exp_avg_sq");
        const int64_t file_lo = fs->shard_lo[k], file_count = tm->numel;
        int64_t a = lo > file_lo ? lo : file_lo, b = lo + count < file_lo + file_count ? lo + count : file_lo + file_count;
        if (a >= b) continue;
        int fd = open(st->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(err, errlen, "cannot read %s: %s", st->path, strerror(errno));
            return -1;
        }
        int rc = read_values(st, fd, tm, a - file_lo, b - a, m ? m + (a - lo) : NULL, m ? NULL : m16 + (a - lo), err,
                             errlen) != 0 ||
                 read_values(st, fd, tv, a - file_lo, b - a, v ? v + (a - lo) : NULL, v ? NULL : v16 + (a - lo), err,
                             errlen) != 0;
        close(fd);
        if (rc) return -1;
    }
    return 0;
}

void full_state_close(full_state_t *fs) {
    for (int k = 0; fs->files && k < fs->shards; k++)
        if (fs->files[k].path) safetensors_close(&fs->files[k]);
    free(fs->files);
    free(fs->shard_lo);
    memset(fs, 0, sizeof *fs);
}

/* See resume.h: the run goes on from the step after its checkpoint, so there must be steps
 * left, and the profiler's window (skip_first_n_steps_for_profiler counts from the run's first
 * step, as in MaxText) must open before the last. */
int full_state_first_step(const config_t *cfg, const qwen3_dims_t *d, int64_t *first_step, char *err, size_t errlen) {
    full_state_t fs;
    if (full_state_open(&fs, cfg->load_full_state_path, d, err, errlen) != 0) return -1;
    int64_t step = fs.step;
    full_state_close(&fs);
    if (step + 1 >= cfg->steps) {
        snprintf(err, errlen, "load_full_state_path=%s holds the state after step %lld, and steps=%lld ends the run "
                 "there (steps counts from step 0, as in MaxText); set steps above %lld", cfg->load_full_state_path,
                 (long long)step, (long long)cfg->steps, (long long)(step + 1));
        return -1;
    }
    if (strcmp(cfg->profiler, "xplane") == 0 && step + 1 + cfg->skip_first_n_steps_for_profiler >= cfg->steps) {
        snprintf(err, errlen, "skip_first_n_steps_for_profiler=%lld: the run resumes at step %lld (load_full_state_path) "
                 "and ends before step %lld, so the profiler's window would open past its last step; lower it, raise "
                 "steps, or set profiler=\"\"", (long long)cfg->skip_first_n_steps_for_profiler, (long long)(step + 1),
                 (long long)cfg->steps);
        return -1;
    }
    *first_step = step + 1;
    return 0;
}
