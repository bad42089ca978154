/* safetensors reader and writer. The reader trusts nothing in the file: every header field
 * is checked against the mapping before a tensor pointer is handed out, so a truncated or
 * hand-edited file gives one line naming the file and the problem, never a crash. */
#include "io/safetensors.h"
#include "util/atomic_file.h"
#include "util/one_line.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian and is read in place; big-endian hosts need byte swaps");

/* A header is a few hundred bytes per tensor; anything near this is a corrupt length field. */
#define ST_MAX_HEADER ((uint64_t)100 << 20)
/* cJSON holds numbers as doubles: integers above 2^53 are not exact. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const struct {
    const char *name;
    st_dtype_t dtype;
    size_t size;
} DTYPES[] = {
    {"F32", ST_F32, 4}, {"BF16", ST_BF16, 2}, {"F16", ST_F16, 2},
    {"F64", ST_F64, 8}, {"I32", ST_I32, 4},   {"I64", ST_I64, 8},
};
enum { NUM_DTYPES = sizeof(DTYPES) / sizeof(DTYPES[0]) };

const char *st_dtype_name(st_dtype_t dtype) {
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (DTYPES[i].dtype == dtype) return DTYPES[i].name;
    return "?";
}

size_t st_dtype_size(st_dtype_t dtype) {
    for (size_t i = 0; i < NUM_DTYPES; i++)
        if (DTYPES[i].dtype == dtype) return DTYPES[i].size;
    return 0;
}

__attribute__((format(printf, 4, 5)))
static void set_err(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    int n = snprintf(err, errlen, "%s: ", path ? path : "(null)");
    if (n < 0 || (size_t)n >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    one_line(err); /* names come from the file */
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* A JSON number that is an exact non-negative integer <= 2^53. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= ST_MAX_JSON_INT)) return -1; /* also rejects NaN */
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return -1;
    *out = u;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Reading */

void safetensors_close(safetensors_t *st) {
    if (!st) return;
    if (st->map && st->map != MAP_FAILED) munmap(st->map, st->map_size);
    for (size_t i = 0; i < st->num_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->num_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st->path);
    memset(st, 0, sizeof(*st));
}

typedef struct {
    uint64_t begin, end;
    size_t index;
} st_range_t;

static int cmp_range(const void *a, const void *b) {
    const st_range_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int parse_metadata(safetensors_t *st, const cJSON *meta, const char *path, char *err,
                          size_t errlen) {
    if (st->meta_keys) {
        set_err(err, errlen, path, "header has more than one \"__metadata__\" entry");
        return -1;
    }
    if (!cJSON_IsObject(meta)) {
        set_err(err, errlen, path, "\"__metadata__\" must be an object of strings");
        return -1;
    }
    size_t n = (size_t)cJSON_GetArraySize(meta);
    st->meta_keys = calloc(n ? n : 1, sizeof(char *));
    st->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!st->meta_keys || !st->meta_values) {
        set_err(err, errlen, path, "out of memory reading the header");
        return -1;
    }
    const cJSON *kv;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv)) {
            set_err(err, errlen, path, "\"__metadata__\" value for key '%s' is not a string",
                    kv->string);
            return -1;
        }
        for (size_t i = 0; i < st->num_meta; i++) {
            if (strcmp(st->meta_keys[i], kv->string) == 0) {
                set_err(err, errlen, path, "\"__metadata__\" has the key '%s' twice", kv->string);
                return -1;
            }
        }
        st->meta_keys[st->num_meta] = dup_str(kv->string);
        st->meta_values[st->num_meta] = dup_str(kv->valuestring);
        st->num_meta++;
        if (!st->meta_keys[st->num_meta - 1] || !st->meta_values[st->num_meta - 1]) {
            set_err(err, errlen, path, "out of memory reading the header");
            return -1;
        }
    }
    return 0;
}

/* One tensor entry: dtype, shape and offsets checked; offsets kept in r. */
static int parse_entry(st_tensor_t *t, st_range_t *r, const cJSON *e, uint64_t data_size,
                       const char *path, char *err, size_t errlen) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) {
        set_err(err, errlen, path, "tensor '%s': entry is not an object with dtype, shape and data_offsets", name);
        return -1;
    }
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dtype || !shape || !offs) {
        set_err(err, errlen, path, "tensor '%s': entry is missing \"%s\"", name,
                !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
        return -1;
    }
    if (!cJSON_IsString(dtype)) {
        set_err(err, errlen, path, "tensor '%s': dtype is not a string", name);
        return -1;
    }
    size_t esize = 0;
    for (size_t i = 0; i < NUM_DTYPES; i++) {
        if (strcmp(dtype->valuestring, DTYPES[i].name) == 0) {
            t->dtype = DTYPES[i].dtype;
            esize = DTYPES[i].size;
        }
    }
    if (esize == 0) {
        set_err(err, errlen, path,
                "tensor '%s': unsupported dtype '%s' (stepscope reads F32, BF16, F16, F64, I32, I64); "
                "convert the checkpoint to one of these",
                name, dtype->valuestring);
        return -1;
    }
    if (!cJSON_IsArray(shape)) {
        set_err(err, errlen, path, "tensor '%s': shape is not a list", name);
        return -1;
    }
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS) {
        set_err(err, errlen, path, "tensor '%s': %d dimensions, more than the %d supported", name,
                ndim, (int)ST_MAX_DIMS);
        return -1;
    }
    t->ndim = ndim;
    uint64_t numel = 1;
    int d = 0;
    const cJSON *dim;
    cJSON_ArrayForEach(dim, shape) {
        uint64_t v;
        if (json_uint(dim, &v) != 0) {
            set_err(err, errlen, path, "tensor '%s': shape[%d] is not a non-negative integer", name, d);
            return -1;
        }
        if (v > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, v, &numel) ||
            numel > (uint64_t)INT64_MAX) {
            set_err(err, errlen, path, "tensor '%s': shape overflows a 64-bit element count", name);
            return -1;
        }
        t->shape[d++] = (int64_t)v;
    }
    t->numel = (int64_t)numel;
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)esize, &nbytes)) {
        set_err(err, errlen, path, "tensor '%s': shape overflows a 64-bit byte count", name);
        return -1;
    }
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_uint(cJSON_GetArrayItem(offs, 0), &begin) != 0 ||
        json_uint(cJSON_GetArrayItem(offs, 1), &end) != 0) {
        set_err(err, errlen, path, "tensor '%s': data_offsets is not [begin, end] with non-negative integers", name);
        return -1;
    }
    if (begin > end) {
        set_err(err, errlen, path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end",
                name, begin, end);
        return -1;
    }
    if (end > data_size) {
        set_err(err, errlen, path,
                "tensor '%s': data_offsets end %" PRIu64 " is past the %" PRIu64
                "-byte data section; the file is truncated",
                name, end, data_size);
        return -1;
    }
    if (end - begin != nbytes) {
        set_err(err, errlen, path,
                "tensor '%s': data_offsets span %" PRIu64 " bytes but %s x %" PRIu64 " elements needs %" PRIu64,
                name, end - begin, dtype->valuestring, numel, nbytes);
        return -1;
    }
    t->nbytes = (size_t)nbytes;
    r->begin = begin;
    r->end = end;
    return 0;
}

/* Names unique; byte ranges sorted by begin must tile [0, data_size) exactly. */
static int check_layout(const safetensors_t *st, st_range_t *ranges, uint64_t data_size,
                        const char *path, char *err, size_t errlen) {
    size_t n = st->num_tensors;
    const char **names = malloc((n ? n : 1) * sizeof(char *));
    if (!names) {
        set_err(err, errlen, path, "out of memory reading the header");
        return -1;
    }
    for (size_t i = 0; i < n; i++) names[i] = st->tensors[i].name;
    qsort(names, n, sizeof(char *), cmp_name_ptr);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            set_err(err, errlen, path, "tensor '%s' appears twice in the header", names[i]);
            free(names);
            return -1;
        }
    }
    free(names);

    qsort(ranges, n, sizeof(st_range_t), cmp_range);
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].begin < expect) {
            set_err(err, errlen, path, "tensors '%s' and '%s' have overlapping data_offsets",
                    st->tensors[ranges[i - 1].index].name, st->tensors[ranges[i].index].name);
            return -1;
        }
        if (ranges[i].begin > expect) {
            set_err(err, errlen, path,
                    "data bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor (before '%s'); the header is inconsistent",
                    expect, ranges[i].begin, st->tensors[ranges[i].index].name);
            return -1;
        }
        expect = ranges[i].end;
    }
    if (expect != data_size) {
        set_err(err, errlen, path,
                "data section is %" PRIu64 " bytes but the tensors cover only %" PRIu64
                "; the header is inconsistent",
                data_size, expect);
        return -1;
    }
    return 0;
}

int safetensors_open(safetensors_t *st, const char *path, char *err, size_t errlen) {
    if (!st) return -1;
    memset(st, 0, sizeof(*st));
    if (!path) {
        set_err(err, errlen, "(null)", "no path given");
        return -1;
    }
    cJSON *root = NULL;
    char *header = NULL;
    st_range_t *ranges = NULL;
    int fd = -1;

    st->path = dup_str(path);
    if (!st->path) goto oom;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, errlen, path, "cannot open: %s", strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        set_err(err, errlen, path, "cannot stat: %s", strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        set_err(err, errlen, path, "not a regular file");
        goto fail;
    }
    uint64_t file_size = (uint64_t)sb.st_size;
    if (file_size < 8) {
        set_err(err, errlen, path,
                "file is %" PRIu64 " bytes, too small for the 8-byte header length; not a safetensors file",
                file_size);
        goto fail;
    }
    st->map = mmap(NULL, (size_t)file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        set_err(err, errlen, path, "cannot memory-map: %s", strerror(errno));
        goto fail;
    }
    st->map_size = (size_t)file_size;
    close(fd);
    fd = -1;

    const unsigned char *bytes = st->map;
    uint64_t hlen;
    memcpy(&hlen, bytes, 8);
    if (hlen > ST_MAX_HEADER) {
        set_err(err, errlen, path,
                "header length %" PRIu64 " is absurd (over 100 MB); the file is corrupt or not a safetensors file",
                hlen);
        goto fail;
    }
    if (hlen > file_size - 8) {
        set_err(err, errlen, path,
                "header length %" PRIu64 " exceeds file size %" PRIu64
                " (less the 8-byte prefix); the file is truncated or not a safetensors file",
                hlen, file_size);
        goto fail;
    }
    uint64_t data_size = file_size - 8 - hlen;

    /* Parse a NUL-terminated copy: the mapping has no terminator and may end at the header. */
    header = malloc((size_t)hlen + 1);
    if (!header) goto oom;
    memcpy(header, bytes + 8, (size_t)hlen);
    header[hlen] = '\0';
    const char *parse_end = NULL;
    root = cJSON_ParseWithLengthOpts(header, (size_t)hlen, &parse_end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = (at && at >= header && at <= header + hlen) ? (size_t)(at - header) : 0;
        set_err(err, errlen, path, "header is not valid JSON (error near byte %zu of %" PRIu64 ")",
                off, hlen);
        goto fail;
    }
    for (const char *p = parse_end; p && p < header + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            set_err(err, errlen, path, "header has trailing bytes after the JSON object (at byte %zu)",
                    (size_t)(p - header));
            goto fail;
        }
    }
    if (!cJSON_IsObject(root)) {
        set_err(err, errlen, path, "header is not a JSON object");
        goto fail;
    }

    size_t n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) if (strcmp(e->string, "__metadata__") != 0) n++;
    st->tensors = calloc(n ? n : 1, sizeof(st_tensor_t));
    ranges = calloc(n ? n : 1, sizeof(st_range_t));
    if (!st->tensors || !ranges) goto oom;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (parse_metadata(st, e, path, err, errlen) != 0) goto fail;
            continue;
        }
        st_tensor_t *t = &st->tensors[st->num_tensors];
        t->name = dup_str(e->string);
        if (!t->name) goto oom;
        st->num_tensors++; /* counted before checks so close() frees the name */
        st_range_t *r = &ranges[st->num_tensors - 1];
        r->index = st->num_tensors - 1;
        if (parse_entry(t, r, e, data_size, path, err, errlen) != 0) goto fail;
        t->data = bytes + 8 + hlen + r->begin;
    }
    if (check_layout(st, ranges, data_size, path, err, errlen) != 0) goto fail;

    cJSON_Delete(root);
    free(header);
    free(ranges);
    return 0;

oom:
    set_err(err, errlen, path, "out of memory reading the header");
fail:
    if (fd >= 0) close(fd);
    cJSON_Delete(root);
    free(header);
    free(ranges);
    safetensors_close(st);
    return -1;
}

const st_tensor_t *safetensors_find(const safetensors_t *st, const char *name) {
    if (!st || !name) return NULL;
    for (size_t i = 0; i < st->num_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

const char *safetensors_meta(const safetensors_t *st, const char *key) {
    if (!st || !key) return NULL;
    for (size_t i = 0; i < st->num_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

/* IEEE half to single, exact for every input (subnormals, infinities, NaN payloads). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13); /* rebias 15 -> 127 */
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise the mantissa */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int safetensors_load_f32(const safetensors_t *st, const st_tensor_t *t, float *dst) {
    const char *base = st->map, *data = t->data;
    if (!safetensors_f32_convertible(t) || data < base || (size_t)(data - base) + t->nbytes > st->map_size) return -1;
    const size_t esize = st_dtype_size(t->dtype), page = (size_t)sysconf(_SC_PAGESIZE);
    const int64_t piece = (int64_t)((8u << 20) / esize);
    for (int64_t off = 0; off < t->numel; off += piece) {
        st_tensor_t part = *t;
        part.numel = t->numel - off < piece ? t->numel - off : piece;
        part.data = data + (size_t)off * esize;
        part.nbytes = (size_t)part.numel * esize;
        if (safetensors_to_f32(&part, dst + off) != 0) return -1;
        /* The whole pages of this piece go back: they count in the resident set while mapped,
         * and a model's file beside its planned buffers would otherwise add its size to the
         * run's peak (qwen3-0.6b: 2.2 GiB, 1.18x the plan where it was 1.00x). */
        uintptr_t lo = ((uintptr_t)part.data + page - 1) & ~(uintptr_t)(page - 1);
        uintptr_t hi = ((uintptr_t)part.data + part.nbytes) & ~(uintptr_t)(page - 1);
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    return 0;
}

bool safetensors_f32_convertible(const st_tensor_t *t) {
    return t && (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16 || t->dtype == ST_F64);
}

/* Element reads go through memcpy: the data offset need not be aligned for the dtype. */
int safetensors_to_f32(const st_tensor_t *t, float *dst) {
    if (!t || (!dst && t->numel > 0)) return -1;
    const unsigned char *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_F32:
        if (n) memcpy(dst, p, n * 4);
        return 0;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    case ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = half_to_float(h);
        }
        return 0;
    case ST_F64:
        for (size_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            dst[i] = (float)v;
        }
        return 0;
    default:
        return -1;
    }
}

int safetensors_to_i32(const st_tensor_t *t, int32_t *dst) {
    if (!t || (!dst && t->numel > 0)) return -1;
    const unsigned char *p = t->data;
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_I32:
        if (n) memcpy(dst, p, n * 4);
        return 0;
    case ST_I64:
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX) return -1;
            dst[i] = (int32_t)v;
        }
        return 0;
    default:
        return -1;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Writing */

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} strbuf_t;

static void sb_put(strbuf_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

#define SB_LIT(b, lit) sb_put((b), (lit), sizeof(lit) - 1)

__attribute__((format(printf, 2, 3)))
static void sb_printf(strbuf_t *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->oom = 1; /* only used for numbers and fixed text */
        return;
    }
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control characters escaped; other bytes
 * (UTF-8 included) copied as they are. */
static void sb_json_string(strbuf_t *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            sb_put(b, esc, 2);
        } else if (*p < 0x20) {
            sb_printf(b, "\\u%04x", *p);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* Header JSON in the Python library's layout, padded with spaces to a multiple of 8 bytes so
 * the data section starts 8-aligned. Checks entries; returns the total data size in *data_size. */
static int build_header(strbuf_t *h, const st_write_entry_t *entries, size_t n,
                        const char *const *meta_keys, const char *const *meta_values,
                        size_t num_meta, uint64_t *data_size, const char *path, char *err,
                        size_t errlen) {
    sb_put(h, "{", 1);
    int first = 1;
    if (num_meta > 0) {
        SB_LIT(h, "\"__metadata__\":{");
        for (size_t i = 0; i < num_meta; i++) {
            if (!meta_keys || !meta_values || !meta_keys[i] || !meta_values[i]) {
                set_err(err, errlen, path, "metadata entry %zu has a NULL key or value", i);
                return -1;
            }
            for (size_t j = 0; j < i; j++) {
                if (strcmp(meta_keys[i], meta_keys[j]) == 0) {
                    set_err(err, errlen, path, "metadata key '%s' given twice", meta_keys[i]);
                    return -1;
                }
            }
            if (i) sb_put(h, ",", 1);
            sb_json_string(h, meta_keys[i]);
            sb_put(h, ":", 1);
            sb_json_string(h, meta_values[i]);
        }
        sb_put(h, "}", 1);
        first = 0;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const st_write_entry_t *e = &entries[i];
        if (!e->name) {
            set_err(err, errlen, path, "tensor %zu has no name", i);
            return -1;
        }
        if (strcmp(e->name, "__metadata__") == 0) {
            set_err(err, errlen, path, "a tensor may not be called \"__metadata__\"");
            return -1;
        }
        if (e->ndim < 0 || e->ndim > ST_MAX_DIMS) {
            set_err(err, errlen, path, "tensor '%s': ndim %d outside [0, %d]", e->name, e->ndim,
                    (int)ST_MAX_DIMS);
            return -1;
        }
        uint64_t numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel)) {
                set_err(err, errlen, path, "tensor '%s': shape[%d] = %" PRId64 " is negative or overflows",
                        e->name, d, e->shape[d]);
                return -1;
            }
        }
        if (e->dtype != ST_F32 && e->dtype != ST_BF16) {
            set_err(err, errlen, path, "tensor '%s': dtype %s is not written (F32 or BF16 only)", e->name,
                    st_dtype_name(e->dtype));
            return -1;
        }
        uint64_t nbytes;
        if (__builtin_mul_overflow(numel, (uint64_t)st_dtype_size(e->dtype), &nbytes) ||
            __builtin_add_overflow(offset, nbytes, &offset) || offset > (uint64_t)ST_MAX_JSON_INT) {
            set_err(err, errlen, path, "tensor '%s': total data size overflows", e->name);
            return -1;
        }
        if (numel > 0 && !e->data) {
            set_err(err, errlen, path, "tensor '%s': data is NULL", e->name);
            return -1;
        }
        if (!first) sb_put(h, ",", 1);
        first = 0;
        sb_json_string(h, e->name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) sb_printf(h, d ? ",%" PRId64 : "%" PRId64, e->shape[d]);
        sb_printf(h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset - nbytes, offset);
    }
    sb_put(h, "}", 1);
    while (h->len % 8 != 0) sb_put(h, " ", 1);
    if (h->oom) {
        set_err(err, errlen, path, "out of memory building the header");
        return -1;
    }
    *data_size = offset;
    return 0;
}

static int check_unique_names(const st_write_entry_t *entries, size_t n, const char *path,
                              char *err, size_t errlen) {
    const char **names = malloc((n ? n : 1) * sizeof(char *));
    if (!names) {
        set_err(err, errlen, path, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) names[i] = entries[i].name;
    qsort(names, n, sizeof(char *), cmp_name_ptr);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            set_err(err, errlen, path, "tensor '%s' given twice", names[i]);
            rc = -1;
        }
    }
    free(names);
    return rc;
}

/* The file body after the header is known: 8-byte length, header, tensor data in order. */
typedef struct st_body {
    const strbuf_t *header;
    const st_write_entry_t *entries;
    size_t n;
} st_body_t;

static int write_body(FILE *f, void *ctx, char *err, size_t errlen) {
    const st_body_t *b = ctx;
    uint64_t hlen = b->header->len;
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(b->header->buf, 1, b->header->len, f) == b->header->len;
    for (size_t i = 0; ok && i < b->n; i++) {
        size_t numel = 1;
        for (int d = 0; d < b->entries[i].ndim; d++) numel *= (size_t)b->entries[i].shape[d];
        if (numel) ok = atomic_file_write_through(f, b->entries[i].data, numel * st_dtype_size(b->entries[i].dtype)) == 0;
    }
    if (!ok && err && errlen) snprintf(err, errlen, "write failed: %s", strerror(errno));
    return ok ? 0 : -1;
}

int safetensors_write(const char *path, const st_write_entry_t *entries, size_t n,
                      const char *const *meta_keys, const char *const *meta_values,
                      size_t num_meta, char *err, size_t errlen) {
    if (!path || (n > 0 && !entries)) {
        set_err(err, errlen, path, "no path or no entries given");
        return -1;
    }
    strbuf_t h = {0};
    uint64_t data_size = 0;
    if (build_header(&h, entries, n, meta_keys, meta_values, num_meta, &data_size, path, err,
                     errlen) != 0 ||
        check_unique_names(entries, n, path, err, errlen) != 0) {
        free(h.buf);
        return -1;
    }

    st_body_t body = {.header = &h, .entries = entries, .n = n};
    int rc = atomic_write_with(path, write_body, &body, err, errlen);
    (void)data_size;
    free(h.buf);
    return rc == 0 ? 0 : -1;
}
