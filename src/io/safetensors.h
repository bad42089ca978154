/* safetensors: read and write Hugging Face's safetensors files (an 8-byte little-endian
 * header length, a JSON header naming each tensor's dtype, shape and byte range, then the
 * data). Reading memory-maps the file and validates every entry before anything is used:
 * header length within the file, offsets in range, non-overlapping and covering the data,
 * sizes matching dtype x shape. Writing goes to a temporary name, fsync, then rename. */
#ifndef STEPSCOPE_SAFETENSORS_H
#define STEPSCOPE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { ST_F32, ST_BF16, ST_F16, ST_F64, ST_I32, ST_I64, ST_OTHER } st_dtype_t;

enum { ST_MAX_DIMS = 8 };

typedef struct st_tensor {
    char *name;
    st_dtype_t dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data;   /* points into the mapping */
    size_t nbytes;
} st_tensor_t;

typedef struct safetensors {
    char *path;
    void *map;
    size_t map_size;
    st_tensor_t *tensors;
    size_t num_tensors;
    char **meta_keys, **meta_values; /* the "__metadata__" string map */
    size_t num_meta;
} safetensors_t;

/* Open and validate. On error: one line in err naming the file and the problem; non-zero. */
int safetensors_open(safetensors_t *st, const char *path, char *err, size_t errlen);
void safetensors_close(safetensors_t *st);
const st_tensor_t *safetensors_find(const safetensors_t *st, const char *name);
const char *safetensors_meta(const safetensors_t *st, const char *key); /* NULL if absent */
/* Convert a F32, BF16, F16 or F64 tensor to float32 into dst[numel]. Non-zero on other dtypes. */
int safetensors_to_f32(const st_tensor_t *t, float *dst);
/* safetensors_to_f32 of a tensor of st, in 8 MiB pieces, handing each piece's whole pages of
 * the mapping back once read (madvise DONTNEED; the file is read-only, so they are read again
 * from the page cache if touched), so that loading a large file does not add its size to the
 * process's resident set. Non-zero on other dtypes or a tensor outside st's mapping. */
int safetensors_load_f32(const safetensors_t *st, const st_tensor_t *t, float *dst);
/* Whether safetensors_to_f32 converts t's dtype (F32, BF16, F16, F64). */
bool safetensors_f32_convertible(const st_tensor_t *t);
/* Convert an I32 or I64 tensor to int32 into dst[numel]. Non-zero on other dtypes, or when an
 * I64 value does not fit in int32 (dst is then partly written). */
int safetensors_to_i32(const st_tensor_t *t, int32_t *dst);
/* The safetensors spelling of a dtype ("F32", "BF16", ...; "?" for ST_OTHER) and its size in
 * bytes (0 for ST_OTHER). */
const char *st_dtype_name(st_dtype_t dtype);
size_t st_dtype_size(st_dtype_t dtype);

typedef struct st_write_entry {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;   /* numel values of dtype, written as they are */
    st_dtype_t dtype;   /* ST_F32 (the zero value: floats) or ST_BF16 (bf16_t bit patterns) */
} st_write_entry_t;

/* Write F32 and BF16 tensors (and optional string metadata) atomically. Non-zero with err on
 * failure (another dtype among them included). */
int safetensors_write(const char *path, const st_write_entry_t *entries, size_t n,
                      const char *const *meta_keys, const char *const *meta_values,
                      size_t num_meta, char *err, size_t errlen);

#endif
