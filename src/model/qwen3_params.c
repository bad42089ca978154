/* qwen3_params: the parameter layout (from QWEN3_LAYER_TENSORS), seeded init, and weights in
 * and out in Hugging Face's safetensors naming. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "model/qwen3.h"
#include "util/one_line.h"
#include "util/rng.h"

static void add_tensor(qwen3_tensor_info_t *out, int64_t *count, int64_t *offset,
                       const char *name, int64_t rows, int64_t cols, qwen3_init_t init) {
    if (out) {
        qwen3_tensor_info_t *t = &out[*count];
        snprintf(t->hf_name, sizeof t->hf_name, "%s", name);
        t->offset = *offset;
        t->rows = rows;
        t->cols = cols;
        t->init = init;
    }
    (*count)++;
    *offset += rows * (cols ? cols : 1);
}

int64_t qwen3_tensor_table(const qwen3_dims_t *d, qwen3_tensor_info_t *out) {
    int64_t count = 0, offset = 0;
    char name[96];
    add_tensor(out, &count, &offset, "model.embed_tokens.weight", d->V, d->D, QWEN3_INIT_NORMAL);
    for (int64_t l = 0; l < d->L; l++) {
#define QWEN3_ADD(field, suffix, rows, cols, init, present)                                     \
    if (present) {                                                                              \
        snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, suffix);              \
        add_tensor(out, &count, &offset, name, rows, cols, init);                               \
    }
        QWEN3_LAYER_TENSORS(QWEN3_ADD, d)
#undef QWEN3_ADD
    }
    add_tensor(out, &count, &offset, "model.norm.weight", d->D, 0, QWEN3_INIT_ONES);
    if (!d->tied) add_tensor(out, &count, &offset, "lm_head.weight", d->V, d->D, QWEN3_INIT_NORMAL);
    return count;
}

int64_t qwen3_num_params(const qwen3_dims_t *d) {
    int64_t n = qwen3_tensor_table(d, NULL);
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    if (!t) return -1;
    qwen3_tensor_table(d, t);
    int64_t total = t[n - 1].offset + t[n - 1].rows * (t[n - 1].cols ? t[n - 1].cols : 1);
    free(t);
    return total;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

uint64_t qwen3_layout_hash(const qwen3_dims_t *d) {
    int64_t n = qwen3_tensor_table(d, NULL);
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    if (!t) return 0;
    qwen3_tensor_table(d, t);
    uint64_t h = 14695981039346656037ull;
    for (int64_t i = 0; i < n; i++) {
        int64_t where[3] = {t[i].offset, t[i].rows, t[i].cols};
        h = fnv1a(h, t[i].hf_name, strlen(t[i].hf_name) + 1);
        h = fnv1a(h, where, sizeof where);
    }
    free(t);
    return h ? h : 1;
}

static int64_t tensor_numel(int64_t rows, int64_t cols) { return rows * (cols ? cols : 1); }

/* Binds view v's fields to the tensors of the table's layout in its order: the caller defines
 * BIND_AT(rows, cols) as the pointer for the next tensor of that shape (cols 0: a vector).
 * Shared by the fp32 and bf16 views and the compact view of the vectors. */
#define QWEN3_BIND_VIEW(v, d)                                                                   \
    do {                                                                                        \
        (v)->embed = BIND_AT((d)->V, (d)->D);                                                   \
        for (int64_t l = 0; l < (d)->L; l++) {                                                  \
            QWEN3_LAYER_TENSORS(QWEN3_BIND_FIELD, d)                                            \
        }                                                                                       \
        (v)->final_norm = BIND_AT((d)->D, 0);                                                   \
        (v)->lm_head = (d)->tied ? (v)->embed : BIND_AT((d)->V, (d)->D);                        \
    } while (0)
#define QWEN3_BIND_FIELD(field, suffix, rows, cols, init, present)                              \
    if (present) v->layers[l].field = BIND_AT(rows, cols);

int qwen3_params_view(qwen3_params_t *v, const qwen3_dims_t *d, float *base) {
    memset(v, 0, sizeof *v);
    if (!(v->layers = calloc((size_t)d->L, sizeof *v->layers))) return -1;
    float *p = base;
#define BIND_AT(rows, cols) (p += tensor_numel(rows, cols), p - tensor_numel(rows, cols))
    QWEN3_BIND_VIEW(v, d);
#undef BIND_AT
    return 0;
}

int qwen3_params16_view(qwen3_params16_t *v, const qwen3_dims_t *d, const bf16_t *base) {
    memset(v, 0, sizeof *v);
    if (!(v->layers = calloc((size_t)d->L, sizeof *v->layers))) return -1;
    const bf16_t *p = base;
#define BIND_AT(rows, cols) (p += tensor_numel(rows, cols), p - tensor_numel(rows, cols))
    QWEN3_BIND_VIEW(v, d);
#undef BIND_AT
    return 0;
}

int qwen3_params_view_vectors(qwen3_params_t *v, const qwen3_dims_t *d, float *vectors) {
    memset(v, 0, sizeof *v);
    if (!(v->layers = calloc((size_t)d->L, sizeof *v->layers))) return -1;
    float *p = vectors;
#define BIND_AT(rows, cols) ((cols) != 0 ? NULL : (p += (rows), p - (rows)))
    QWEN3_BIND_VIEW(v, d);
#undef BIND_AT
    return 0;
}

void qwen3_params_free(qwen3_params_t *v) {
    free(v->layers);
    v->layers = NULL;
}

void qwen3_params16_free(qwen3_params16_t *v) {
    free(v->layers);
    v->layers = NULL;
}

int64_t qwen3_vector_floats(const qwen3_dims_t *d) {
    int64_t n = qwen3_tensor_table(d, NULL), total = 0;
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    if (!t) return -1;
    qwen3_tensor_table(d, t);
    for (int64_t i = 0; i < n; i++)
        if (!t[i].cols) total += t[i].rows;
    free(t);
    return total;
}

void qwen3_widen_vectors(float *vectors, const qwen3_dims_t *d, const bf16_t *base) {
    int64_t n = qwen3_tensor_table(d, NULL);
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    if (!t) abort();
    qwen3_tensor_table(d, t);
    for (int64_t i = 0; i < n; i++) {
        if (t[i].cols) continue;
        for (int64_t j = 0; j < t[i].rows; j++) vectors[j] = bf16_to_f32(base[t[i].offset + j]);
        vectors += t[i].rows;
    }
    free(t);
}

enum { QWEN3_INIT_STD_MILLI = 20 }; /* Hugging Face's initializer_range, 0.02 */

void qwen3_init_params(float *base, const qwen3_dims_t *d, uint64_t seed) {
    int64_t n = qwen3_tensor_table(d, NULL);
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    if (!t) abort();
    qwen3_tensor_table(d, t);
    const float std = (float)(QWEN3_INIT_STD_MILLI / 1000.0);
    for (int64_t i = 0; i < n; i++) {
        float *p = base + t[i].offset;
        int64_t numel = t[i].rows * (t[i].cols ? t[i].cols : 1);
        if (t[i].init == QWEN3_INIT_ONES) {
            for (int64_t j = 0; j < numel; j++) p[j] = 1.0f;
            continue;
        }
        /* Whole pairs in a vectorised loop, an odd last element after it: each draw is the same
         * arithmetic in a vector lane or alone (util/rng.h), so the bits depend on neither the
         * thread count nor where a thread's range starts. */
        const int64_t pairs = numel / 2;
#pragma omp parallel for simd schedule(static)
        for (int64_t k = 0; k < pairs; k++) {
            float z0, z1;
            rng_normal_pair(seed, (uint64_t)i, (uint64_t)k, &z0, &z1);
            p[2 * k] = std * z0;
            p[2 * k + 1] = std * z1;
        }
        if (numel % 2) {
            float z0, z1;
            rng_normal_pair(seed, (uint64_t)i, (uint64_t)pairs, &z0, &z1);
            p[numel - 1] = std * z0;
        }
    }
    free(t);
}

static int check_shape(const st_tensor_t *st, const qwen3_tensor_info_t *t, const char *path,
                       char *err, size_t errlen) {
    bool ok = t->cols ? (st->ndim == 2 && st->shape[0] == t->rows && st->shape[1] == t->cols)
                      : (st->ndim == 1 && st->shape[0] == t->rows);
    if (ok) return 0;
    char got[96] = "", want[64];
    size_t used = 0;
    for (int k = 0; k < st->ndim && used < sizeof got; k++)
        used += (size_t)snprintf(got + used, sizeof got - used, "%s%lld", k ? ", " : "", (long long)st->shape[k]);
    if (t->cols) snprintf(want, sizeof want, "%lld, %lld", (long long)t->rows, (long long)t->cols);
    else snprintf(want, sizeof want, "%lld", (long long)t->rows);
    snprintf(err, errlen, "%s: tensor %s has shape [%s] but the config needs [%s]; check model_name and the base_* keys",
             path, t->hf_name, got, want);
    return -1;
}

int qwen3_load_safetensors(float *base, const qwen3_dims_t *d, const char *path, char *err, size_t errlen) {
    safetensors_t st;
    if (safetensors_open(&st, path, err, errlen) != 0) return -1;
    int64_t n = qwen3_tensor_table(d, NULL);
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    int rc = -1;
    if (!t) {
        snprintf(err, errlen, "out of memory reading %s", path);
        goto done;
    }
    qwen3_tensor_table(d, t);
    for (int64_t i = 0; i < n; i++) {
        const st_tensor_t *s = safetensors_find(&st, t[i].hf_name);
        if (!s) {
            snprintf(err, errlen, "%s: tensor %s is missing; the file does not match this config (model_name, base_num_decoder_layers, use_qk_norm, logits_via_embedding)",
                     path, t[i].hf_name);
            goto done;
        }
        if (check_shape(s, &t[i], path, err, errlen) != 0) goto done;
        bool loadable = base ? safetensors_load_f32(&st, s, base + t[i].offset) == 0 : safetensors_f32_convertible(s);
        if (!loadable) {
            snprintf(err, errlen, "%s: tensor %s has a dtype stepscope cannot load; use F32, BF16, F16 or F64", path, t[i].hf_name);
            goto done;
        }
    }
    for (size_t j = 0; j < st.num_tensors; j++) {
        bool known = false;
        for (int64_t i = 0; i < n && !known; i++) known = strcmp(st.tensors[j].name, t[i].hf_name) == 0;
        if (!known) {
            if (strcmp(st.tensors[j].name, "lm_head.weight") == 0)
                snprintf(err, errlen, "%s: holds lm_head.weight but logits_via_embedding=true ties the LM head to the embedding; set logits_via_embedding=false", path);
            else
                snprintf(err, errlen, "%s: unexpected tensor %s; the file does not match this config", path, st.tensors[j].name);
            goto done;
        }
    }
    rc = 0;
done:
    if (rc != 0 && err && errlen) one_line(err); /* tensor names come from the file */
    free(t);
    safetensors_close(&st);
    return rc;
}

static int save_safetensors(const void *base, st_dtype_t dtype, const qwen3_dims_t *d, const char *path, char *err,
                            size_t errlen) {
    const size_t esize = st_dtype_size(dtype);
    int64_t n = qwen3_tensor_table(d, NULL);
    qwen3_tensor_info_t *t = malloc((size_t)n * sizeof *t);
    st_write_entry_t *e = malloc((size_t)n * sizeof *e);
    int rc = -1;
    if (!t || !e) {
        snprintf(err, errlen, "out of memory writing %s", path);
    } else {
        qwen3_tensor_table(d, t);
        for (int64_t i = 0; i < n; i++) {
            e[i] = (st_write_entry_t){.name = t[i].hf_name, .ndim = t[i].cols ? 2 : 1,
                                      .data = (const char *)base + (size_t)t[i].offset * esize, .dtype = dtype};
            e[i].shape[0] = t[i].rows;
            e[i].shape[1] = t[i].cols;
        }
        rc = safetensors_write(path, e, (size_t)n, NULL, NULL, 0, err, errlen);
    }
    free(t);
    free(e);
    return rc;
}

int qwen3_save_safetensors(const float *base, const qwen3_dims_t *d, const char *path, char *err, size_t errlen) {
    return save_safetensors(base, ST_F32, d, path, err, errlen);
}

int qwen3_save_safetensors_bf16(const bf16_t *base, const qwen3_dims_t *d, const char *path, char *err, size_t errlen) {
    return save_safetensors(base, ST_BF16, d, path, err, errlen);
}
