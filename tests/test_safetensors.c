/* Tests for src/io/safetensors: write/read round trips, BF16/F16/F64/integer conversion from
 * crafted bytes, one crafted file per malformed-header case (each must be refused with a
 * message naming the file and the problem), and the committed Python-made fixtures in
 * tests/fixtures/<case>/ (metadata and shapes consistent; numerics are tested elsewhere).
 * Run from the repository root, or set STEPSCOPE_FIXTURES to the fixtures folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "kernels/bf16.h"
#include "util/memstat.h"

/* ---------------------------------------------------------------------------------------- */
/* A temporary directory per test, removed (with its files) afterwards. */

static int tmpdir_setup(void **state) {
    char *dir = strdup("/tmp/test_safetensors.XXXXXX");
    assert_non_null(dir);
    assert_non_null(mkdtemp(dir));
    *state = dir;
    return 0;
}

static int tmpdir_teardown(void **state) {
    char *dir = *state;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4096];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            if (unlink(path) != 0) rmdir(path);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
    return 0;
}

static size_t count_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static void join(char *out, size_t n, const char *dir, const char *name) {
    int len = snprintf(out, n, "%s/%s", dir, name);
    assert_true(len > 0 && (size_t)len < n);
}

/* Writes an 8-byte length, the header (with ' turned into " so tests can spell JSON without
 * escapes), spaces to pad it to hlen_pad bytes, and data. hlen overrides the length field
 * when non-zero. */
static void write_crafted(const char *path, const char *header, uint64_t hlen,
                          const void *data, size_t data_len) {
    size_t n = strlen(header);
    char *h = malloc(n + 1);
    assert_non_null(h);
    for (size_t i = 0; i <= n; i++) h[i] = header[i] == '\'' ? '"' : header[i];
    uint64_t len = hlen ? hlen : (uint64_t)n;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(&len, 8, 1, f), 1);
    assert_int_equal(fwrite(h, 1, n, f), n);
    if (data_len) assert_int_equal(fwrite(data, 1, data_len, f), data_len);
    assert_int_equal(fclose(f), 0);
    free(h);
}

/* ---------------------------------------------------------------------------------------- */

static void test_roundtrip_with_metadata(void **state) {
    const char *dir = *state;
    char path[4096], err[512] = "";
    join(path, sizeof(path), dir, "model.safetensors");
    float a[6] = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 65504.0f};
    float b[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    float c[1] = {42.0f};
    st_write_entry_t entries[] = {
        {.name = "layer.weight", .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "norm \"odd\"\nname", .ndim = 1, .shape = {5}, .data = b},
        {.name = "scalar", .ndim = 0, .data = c},
        {.name = "empty", .ndim = 2, .shape = {0, 7}, .data = NULL},
    };
    const char *keys[] = {"format", "note"};
    const char *values[] = {"pt", "quotes \" and \\ and\ttabs"};
    assert_int_equal(safetensors_write(path, entries, 4, keys, values, 2, err, sizeof(err)), 0);
    assert_int_equal(count_files(dir), 1); /* no temp file left behind */

    /* The header is padded to a multiple of 8 so the data section is 8-aligned. */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint64_t hlen = 0;
    assert_int_equal(fread(&hlen, 8, 1, f), 1);
    fclose(f);
    assert_int_equal(hlen % 8, 0);

    safetensors_t st;
    int rc = safetensors_open(&st, path, err, sizeof(err));
    if (rc != 0) fail_msg("%s", err);
    assert_int_equal(st.num_tensors, 4);
    assert_int_equal(st.num_meta, 2);
    assert_string_equal(safetensors_meta(&st, "format"), "pt");
    assert_string_equal(safetensors_meta(&st, "note"), values[1]);
    assert_null(safetensors_meta(&st, "missing"));

    const st_tensor_t *t = safetensors_find(&st, "layer.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 24);
    float got[6];
    assert_int_equal(safetensors_to_f32(t, got), 0);
    assert_memory_equal(got, a, sizeof(a)); /* bit-exact, including -0 */

    t = safetensors_find(&st, entries[1].name);
    assert_non_null(t);
    assert_int_equal(safetensors_to_f32(t, got), 0);
    assert_memory_equal(got, b, sizeof(b));

    t = safetensors_find(&st, "scalar");
    assert_non_null(t);
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    assert_int_equal(safetensors_to_f32(t, got), 0);
    assert_true(got[0] == 42.0f);

    t = safetensors_find(&st, "empty");
    assert_non_null(t);
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->nbytes, 0);
    assert_null(safetensors_find(&st, "nope"));
    safetensors_close(&st);
    assert_null(st.map);
    safetensors_close(&st); /* idempotent */

    /* Overwriting an existing file replaces it. */
    assert_int_equal(safetensors_write(path, entries, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_int_equal(safetensors_open(&st, path, err, sizeof(err)), 0);
    assert_int_equal(st.num_tensors, 1);
    assert_int_equal(st.num_meta, 0);
    safetensors_close(&st);
}

static void test_write_errors(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    float a[2] = {1, 2};
    st_write_entry_t dup[] = {
        {.name = "x", .ndim = 1, .shape = {2}, .data = a},
        {.name = "x", .ndim = 1, .shape = {2}, .data = a},
    };
    join(path, sizeof(path), dir, "dup.safetensors");
    err[0] = '\0';
    assert_int_not_equal(safetensors_write(path, dup, 2, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "tensor 'x' given twice"));
    assert_non_null(strstr(err, "dup.safetensors"));

    st_write_entry_t neg = {.name = "n", .ndim = 1, .shape = {-2}, .data = a};
    assert_int_not_equal(safetensors_write(path, &neg, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "negative"));

    st_write_entry_t meta_name = {.name = "__metadata__", .ndim = 1, .shape = {2}, .data = a};
    assert_int_not_equal(safetensors_write(path, &meta_name, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "__metadata__"));

    const char *keys[] = {"k", "k"}, *values[] = {"1", "2"};
    assert_int_not_equal(safetensors_write(path, dup, 1, keys, values, 2, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "metadata key 'k' given twice"));
    assert_int_equal(count_files(dir), 0);

    /* Only F32 and BF16 are written: another dtype is refused by name, nothing written. */
    st_write_entry_t half = {.name = "h", .ndim = 1, .shape = {2}, .data = a, .dtype = ST_F16};
    join(path, sizeof(path), dir, "half.safetensors");
    assert_int_not_equal(safetensors_write(path, &half, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "tensor 'h': dtype F16 is not written (F32 or BF16 only)"));
    assert_int_equal(count_files(dir), 0);

    /* Unwritable destination: error names the file, and no temp file is left. */
    join(path, sizeof(path), dir, "no/such/dir/model.safetensors");
    assert_int_not_equal(safetensors_write(path, dup, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "model.safetensors"));
    assert_non_null(strstr(err, "cannot create"));

    /* Rename onto a directory fails after the data is written: the temp file is removed. */
    join(path, sizeof(path), dir, "adir");
    assert_int_equal(mkdir(path, 0755), 0);
    char inner[4096];
    join(inner, sizeof(inner), path, "keep");
    assert_int_equal(mkdir(inner, 0755), 0); /* non-empty, so rename(2) refuses */
    assert_int_not_equal(safetensors_write(path, dup, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "cannot rename"));
    assert_int_equal(count_files(dir), 1); /* only adir */
    rmdir(inner);
}

/* A BF16 tensor is written as its bit patterns, with its size in the offsets, beside an F32
 * one (an odd count first, so the F32 data after it starts 2 bytes off a float), and both read
 * back to the same values. */
static void test_write_bf16_beside_f32(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    join(path, sizeof(path), dir, "mixed.safetensors");
    const bf16_t h[3] = {0x3F80, 0xC000, 0x3F01};
    const float f[2] = {0.25f, -7.5f};
    st_write_entry_t e[] = {{.name = "h", .ndim = 1, .shape = {3}, .data = h, .dtype = ST_BF16},
                            {.name = "f", .ndim = 1, .shape = {2}, .data = f}};
    assert_int_equal(safetensors_write(path, e, 2, NULL, NULL, 0, err, sizeof(err)), 0);
    safetensors_t st;
    assert_int_equal(safetensors_open(&st, path, err, sizeof(err)), 0);
    const st_tensor_t *th = safetensors_find(&st, "h"), *tf = safetensors_find(&st, "f");
    assert_int_equal(th->dtype, ST_BF16);
    assert_int_equal(th->nbytes, 6);
    assert_memory_equal(th->data, h, sizeof h);
    assert_int_equal(tf->dtype, ST_F32);
    float got[3];
    assert_int_equal(safetensors_to_f32(tf, got), 0);
    assert_memory_equal(got, f, sizeof f);
    assert_int_equal(safetensors_to_f32(th, got), 0);
    assert_true(got[0] == 1.0f && got[1] == -2.0f && got[2] == bf16_to_f32(0x3F01));
    safetensors_close(&st);
}

/* BF16 is the top half of a float32: exact. */
static void test_bf16_conversion(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    join(path, sizeof(path), dir, "bf16.safetensors");
    const uint16_t bits[] = {0x3F80, 0xC000, 0x3F00, 0x4049, 0x7F80, 0xFF80, 0x0001, 0x8000, 0x7FC0};
    const float want[] = {1.0f, -2.0f, 0.5f, 3.140625f, INFINITY, -INFINITY, 0x1p-133f, -0.0f};
    write_crafted(path, "{'w':{'dtype':'BF16','shape':[3,3],'data_offsets':[0,18]}}      ", 0,
                  bits, sizeof(bits));
    safetensors_t st;
    int rc = safetensors_open(&st, path, err, sizeof(err));
    if (rc != 0) fail_msg("%s", err);
    const st_tensor_t *t = safetensors_find(&st, "w");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_BF16);
    float got[9];
    assert_int_equal(safetensors_to_f32(t, got), 0);
    for (int i = 0; i < 8; i++) {
        assert_memory_equal(&got[i], &want[i], 4);
    }
    assert_true(isnan(got[8]));
    int32_t ig[9];
    assert_int_not_equal(safetensors_to_i32(t, ig), 0); /* not an integer dtype */
    safetensors_close(&st);
}

/* F16 (IEEE half): normals, subnormals, the extremes, signed zero, infinities, NaN. */
static void test_f16_conversion(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    join(path, sizeof(path), dir, "f16.safetensors");
    const uint16_t bits[] = {0x3C00, 0xC000, 0x3555, 0x7BFF, 0x0001, 0x03FF,
                             0x0400, 0x8000, 0x7C00, 0xFC00, 0x8001, 0x7E00};
    const float want[] = {1.0f,         -2.0f,         0x1.554p-2f, 65504.0f,  0x1p-24f, 0x1.ff8p-15f,
                          0x1p-14f,     -0.0f,         INFINITY,    -INFINITY, -0x1p-24f};
    /* Header length 57 is not a multiple of 8: data is unaligned, reads must still work. */
    write_crafted(path, "{'h':{'dtype':'F16','shape':[12],'data_offsets':[0,24]}}", 0, bits,
                  sizeof(bits));
    safetensors_t st;
    int rc = safetensors_open(&st, path, err, sizeof(err));
    if (rc != 0) fail_msg("%s", err);
    const st_tensor_t *t = safetensors_find(&st, "h");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F16);
    float got[12];
    assert_int_equal(safetensors_to_f32(t, got), 0);
    for (int i = 0; i < 11; i++) {
        if (memcmp(&got[i], &want[i], 4) != 0) fail_msg("element %d: got %a want %a", i, got[i], want[i]);
    }
    assert_true(isnan(got[11]));
    safetensors_close(&st);
}

static void test_f64_and_integers(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    join(path, sizeof(path), dir, "mixed.safetensors");
    unsigned char data[24 + 12 + 16 + 8];
    const double d[3] = {0.1, -1e300, 3.0};
    const int32_t i32[3] = {7, -1, 2147483647};
    const int64_t i64[2] = {95, -3};
    const int64_t big = (int64_t)1 << 40;
    memcpy(data, d, 24);
    memcpy(data + 24, i32, 12);
    memcpy(data + 36, i64, 16);
    memcpy(data + 52, &big, 8);
    write_crafted(path,
                  "{'__metadata__':{'a':'b'},'d':{'dtype':'F64','shape':[3],'data_offsets':[0,24]},"
                  "'i':{'dtype':'I32','shape':[1,3],'data_offsets':[24,36]},"
                  "'l':{'dtype':'I64','shape':[2],'data_offsets':[36,52]},"
                  "'big':{'dtype':'I64','shape':[],'data_offsets':[52,60]}}",
                  0, data, sizeof(data));
    safetensors_t st;
    int rc = safetensors_open(&st, path, err, sizeof(err));
    if (rc != 0) fail_msg("%s", err);
    float f[3];
    assert_int_equal(safetensors_to_f32(safetensors_find(&st, "d"), f), 0);
    assert_true(f[0] == 0.1f && f[1] == -INFINITY && f[2] == 3.0f);
    int32_t v[3];
    assert_int_not_equal(safetensors_to_f32(safetensors_find(&st, "i"), f), 0);
    assert_int_equal(safetensors_to_i32(safetensors_find(&st, "i"), v), 0);
    assert_memory_equal(v, i32, sizeof(i32));
    assert_int_equal(safetensors_to_i32(safetensors_find(&st, "l"), v), 0);
    assert_int_equal(v[0], 95);
    assert_int_equal(v[1], -3);
    assert_int_not_equal(safetensors_to_i32(safetensors_find(&st, "big"), v), 0); /* > INT32_MAX */
    assert_string_equal(st_dtype_name(ST_BF16), "BF16");
    assert_int_equal(st_dtype_size(ST_I64), 8);
    assert_int_equal(st_dtype_size(ST_OTHER), 0);
    safetensors_close(&st);
}

/* ---------------------------------------------------------------------------------------- */
/* Malformed files: each refused, with the file name and a message that says what is wrong. */

typedef struct {
    const char *label;
    const char *header;  /* ' stands for " */
    uint64_t hlen;       /* 0: the header's own length */
    size_t data_len;     /* zero bytes appended */
    const char *expect;  /* substring of the error */
} bad_case_t;

#define E(dtype, shape, offs) "{'dtype':'" dtype "','shape':" shape ",'data_offsets':" offs "}"

static const bad_case_t BAD[] = {
    {"header length past the end", "{}", 999999, 0, "header length 999999 exceeds file size"},
    {"absurd header length", "{}", (uint64_t)1 << 40, 0, "absurd"},
    {"not JSON", "this is not json", 0, 0, "not valid JSON"},
    {"JSON but not an object", "[1,2,3]", 0, 0, "not a JSON object"},
    {"trailing garbage", "{}  xyz", 0, 0, "trailing bytes"},
    {"entry not an object", "{'a':5}", 0, 0, "tensor 'a': entry is not an object"},
    {"missing dtype", "{'a':{'shape':[2],'data_offsets':[0,8]}}", 0, 8, "tensor 'a': entry is missing \"dtype\""},
    {"missing shape", "{'a':{'dtype':'F32','data_offsets':[0,8]}}", 0, 8, "missing \"shape\""},
    {"missing offsets", "{'a':{'dtype':'F32','shape':[2]}}", 0, 8, "missing \"data_offsets\""},
    {"dtype not a string", "{'a':{'dtype':4,'shape':[2],'data_offsets':[0,8]}}", 0, 8, "dtype is not a string"},
    {"unknown dtype", "{'a':" E("U8", "[8]", "[0,8]") "}", 0, 8, "tensor 'a': unsupported dtype 'U8'"},
    {"shape not a list", "{'a':" E("F32", "2", "[0,8]") "}", 0, 8, "shape is not a list"},
    {"negative shape", "{'a':" E("F32", "[-2]", "[0,8]") "}", 0, 8, "shape[0] is not a non-negative integer"},
    {"fractional shape", "{'a':" E("F32", "[2,1.5]", "[0,8]") "}", 0, 8, "shape[1] is not a non-negative integer"},
    {"string in shape", "{'a':" E("F32", "['2']", "[0,8]") "}", 0, 8, "shape[0] is not a non-negative integer"},
    {"overflowing shape", "{'a':" E("F32", "[4294967296,4294967296,4]", "[0,8]") "}", 0, 8, "overflows"},
    {"too many dims", "{'a':" E("F32", "[1,1,1,1,1,1,1,1,2]", "[0,8]") "}", 0, 8, "9 dimensions"},
    {"offsets one number", "{'a':" E("F32", "[2]", "[0]") "}", 0, 8, "data_offsets is not [begin, end]"},
    {"offsets not a list", "{'a':" E("F32", "[2]", "8") "}", 0, 8, "data_offsets is not [begin, end]"},
    {"negative offset", "{'a':" E("F32", "[2]", "[-8,0]") "}", 0, 8, "data_offsets is not [begin, end]"},
    {"begin after end", "{'a':" E("F32", "[2]", "[8,0]") "}", 0, 8, "begin > end"},
    {"end past the data", "{'a':" E("F32", "[4]", "[0,16]") "}", 0, 8, "past the 8-byte data section; the file is truncated"},
    {"size mismatch", "{'a':" E("F32", "[3]", "[0,8]") "}", 0, 8, "span 8 bytes but F32 x 3 elements needs 12"},
    {"overlap", "{'a':" E("F32", "[2]", "[0,8]") ",'b':" E("F32", "[2]", "[4,12]") "}", 0, 12,
     "tensors 'a' and 'b' have overlapping data_offsets"},
    {"gap", "{'a':" E("F32", "[2]", "[0,8]") ",'b':" E("F32", "[2]", "[12,20]") "}", 0, 20,
     "data bytes [8, 12) belong to no tensor"},
    {"uncovered tail", "{'a':" E("F32", "[2]", "[0,8]") "}", 0, 12, "tensors cover only 8"},
    {"duplicate name", "{'a':" E("F32", "[2]", "[0,8]") ",'a':" E("F32", "[2]", "[8,16]") "}", 0, 16,
     "tensor 'a' appears twice"},
    {"metadata not an object", "{'__metadata__':5}", 0, 0, "\"__metadata__\" must be an object of strings"},
    {"metadata value not a string", "{'__metadata__':{'k':1}}", 0, 0, "value for key 'k' is not a string"},
    /* found by fuzz/safetensors: a name with a newline made the message two lines */
    {"newline in a name", "{'a\\nb':{'dtype':'F32','shape':[2]}}", 0, 8, "tensor 'a?b': entry is missing"},
};

static void test_malformed_files(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    unsigned char zeros[64] = {0};
    for (size_t i = 0; i < sizeof(BAD) / sizeof(BAD[0]); i++) {
        const bad_case_t *c = &BAD[i];
        snprintf(path, sizeof(path), "%s/bad%02zu.safetensors", dir, i);
        write_crafted(path, c->header, c->hlen, zeros, c->data_len);
        safetensors_t st;
        strcpy(err, "(no message)");
        int rc = safetensors_open(&st, path, err, sizeof(err));
        if (rc == 0) {
            safetensors_close(&st);
            fail_msg("case '%s' was accepted", c->label);
        }
        if (!strstr(err, c->expect)) fail_msg("case '%s': got \"%s\", want \"%s\"", c->label, err, c->expect);
        if (strncmp(err, path, strlen(path)) != 0) fail_msg("case '%s': message does not name the file: %s", c->label, err);
        if (strchr(err, '\n')) fail_msg("case '%s': message is not one line", c->label);
        assert_null(st.map); /* everything released */
        assert_null(st.tensors);
        unlink(path);
    }
}

static void test_unreadable_files(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    safetensors_t st;

    join(path, sizeof(path), dir, "missing.safetensors");
    assert_int_not_equal(safetensors_open(&st, path, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "missing.safetensors: cannot open"));

    join(path, sizeof(path), dir, "tiny.safetensors");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite("abcde", 1, 5, f);
    fclose(f);
    assert_int_not_equal(safetensors_open(&st, path, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "tiny.safetensors: file is 5 bytes, too small"));

    join(path, sizeof(path), dir, "empty.safetensors");
    f = fopen(path, "wb");
    assert_non_null(f);
    fclose(f);
    assert_int_not_equal(safetensors_open(&st, path, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "file is 0 bytes"));

    assert_int_not_equal(safetensors_open(&st, dir, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "not a regular file"));

    /* A truncated real file: header intact, data cut short. */
    join(path, sizeof(path), dir, "cut.safetensors");
    float a[4] = {1, 2, 3, 4};
    st_write_entry_t e = {.name = "a", .ndim = 1, .shape = {4}, .data = a};
    assert_int_equal(safetensors_write(path, &e, 1, NULL, NULL, 0, err, sizeof(err)), 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 4), 0);
    assert_int_not_equal(safetensors_open(&st, path, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "tensor 'a': data_offsets end 16 is past the 12-byte data section"));
}

/* ---------------------------------------------------------------------------------------- */
/* The committed fixtures, written by Python's safetensors library (tools/make_fixtures.py). */

static const char *fixtures_dir(void) {
    const char *d = getenv("STEPSCOPE_FIXTURES");
    return d && *d ? d : "tests/fixtures";
}

static void open_fixture(safetensors_t *st, const char *fixture_case, const char *file) {
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s/%s/%s", fixtures_dir(), fixture_case, file);
    if (safetensors_open(st, path, err, sizeof(err)) != 0)
        fail_msg("%s (run from the repository root or set STEPSCOPE_FIXTURES)", err);
}

static long meta_long(const safetensors_t *st, const char *key) {
    const char *v = safetensors_meta(st, key);
    if (!v) fail_msg("%s: no metadata '%s'", st->path, key);
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x <= 0) fail_msg("%s: metadata %s = '%s' is not a positive integer", st->path, key, v);
    return x;
}

static double meta_double(const safetensors_t *st, const char *key) {
    const char *v = safetensors_meta(st, key);
    if (!v) fail_msg("%s: no metadata '%s'", st->path, key);
    char *end;
    double x = strtod(v, &end);
    if (*end || !isfinite(x) || x < 0) fail_msg("%s: metadata %s = '%s' is not a number >= 0", st->path, key, v);
    return x;
}

static void test_python_fixture_reads(void **state) {
    (void)state;
    safetensors_t st;
    open_fixture(&st, "tied_gqa", "weights.safetensors");
    assert_string_equal(safetensors_meta(&st, "format"), "pt");
    const st_tensor_t *t = safetensors_find(&st, "model.norm.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], 64);
    float w[64];
    assert_int_equal(safetensors_to_f32(t, w), 0);
    for (int i = 0; i < 64; i++) assert_true(w[i] > 0.5f && w[i] < 1.5f); /* 1 + 0.1 N(0,1) */
    assert_null(safetensors_find(&st, "lm_head.weight"));                 /* tied */
    safetensors_close(&st);
}

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[2];
} want_t;

/* The parameters a Qwen3 of this shape has, with HF names and shapes. */
static size_t expected_params(want_t *w, long V, long D, long F, long L, long H, long KV, long HD, int tied) {
    size_t n = 0;
#define ADD(nd, s0, s1, ...) \
    do { snprintf(w[n].name, sizeof(w[n].name), __VA_ARGS__); w[n].ndim = nd; \
         w[n].shape[0] = s0; w[n].shape[1] = s1; n++; } while (0)
    ADD(2, V, D, "model.embed_tokens.weight");
    for (long l = 0; l < L; l++) {
        ADD(1, D, 0, "model.layers.%ld.input_layernorm.weight", l);
        ADD(2, H * HD, D, "model.layers.%ld.self_attn.q_proj.weight", l);
        ADD(2, KV * HD, D, "model.layers.%ld.self_attn.k_proj.weight", l);
        ADD(2, KV * HD, D, "model.layers.%ld.self_attn.v_proj.weight", l);
        ADD(2, D, H * HD, "model.layers.%ld.self_attn.o_proj.weight", l);
        ADD(1, HD, 0, "model.layers.%ld.self_attn.q_norm.weight", l);
        ADD(1, HD, 0, "model.layers.%ld.self_attn.k_norm.weight", l);
        ADD(1, D, 0, "model.layers.%ld.post_attention_layernorm.weight", l);
        ADD(2, F, D, "model.layers.%ld.mlp.gate_proj.weight", l);
        ADD(2, F, D, "model.layers.%ld.mlp.up_proj.weight", l);
        ADD(2, D, F, "model.layers.%ld.mlp.down_proj.weight", l);
    }
    ADD(1, D, 0, "model.norm.weight");
    if (!tied) ADD(2, V, D, "lm_head.weight");
#undef ADD
    return n;
}

static const st_tensor_t *find_f32(const safetensors_t *st, const char *name, const want_t *w) {
    const st_tensor_t *t = safetensors_find(st, name);
    if (!t) fail_msg("%s: no tensor '%s'", st->path, name);
    if (t->dtype != ST_F32 || t->ndim != w->ndim || t->shape[0] != w->shape[0] ||
        (w->ndim == 2 && t->shape[1] != w->shape[1]))
        fail_msg("%s: '%s' is %s ndim %d [%lld, %lld], want F32 [%lld, %lld]", st->path, name,
                 st_dtype_name(t->dtype), t->ndim, (long long)t->shape[0],
                 (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)w->shape[0],
                 (long long)w->shape[1]);
    return t;
}

static const float *vector_f32(const safetensors_t *st, const char *name, int64_t len, float *buf) {
    const st_tensor_t *t = safetensors_find(st, name);
    if (!t || t->dtype != ST_F32 || t->ndim != 1 || t->shape[0] != len)
        fail_msg("%s: '%s' missing or not F32 [%lld]", st->path, name, (long long)len);
    assert_int_equal(safetensors_to_f32(t, buf), 0);
    return buf;
}

static void check_fixture_case(const char *fixture_case, int want_tied) {
    safetensors_t w, r;
    open_fixture(&w, fixture_case, "weights.safetensors");
    open_fixture(&r, fixture_case, "reference.safetensors");

    /* Weights carry the model keys; they must agree with the reference's. */
    static const char *const model_keys[] = {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings"};
    for (size_t i = 0; i < sizeof(model_keys) / sizeof(model_keys[0]); i++) {
        const char *a = safetensors_meta(&w, model_keys[i]), *b = safetensors_meta(&r, model_keys[i]);
        if (!a || !b || strcmp(a, b) != 0) fail_msg("%s: metadata %s differs between the two files", fixture_case, model_keys[i]);
    }
    long V = meta_long(&r, "vocab_size"), D = meta_long(&r, "hidden_size");
    long F = meta_long(&r, "intermediate_size"), L = meta_long(&r, "num_hidden_layers");
    long H = meta_long(&r, "num_attention_heads"), KV = meta_long(&r, "num_key_value_heads");
    long HD = meta_long(&r, "head_dim"), B = meta_long(&r, "batch"), S = meta_long(&r, "seq");
    const char *tie = safetensors_meta(&r, "tie_word_embeddings");
    assert_non_null(tie);
    assert_true(strcmp(tie, "true") == 0 || strcmp(tie, "false") == 0);
    int tied = strcmp(tie, "true") == 0;
    assert_int_equal(tied, want_tied);
    assert_int_equal(H % KV, 0);
    assert_int_equal(HD % 2, 0);
    assert_true(meta_double(&r, "rope_theta") > 0 && meta_double(&r, "rms_norm_eps") > 0);
    double lr = meta_double(&r, "lr"), clip = meta_double(&r, "clip");
    double b1 = meta_double(&r, "beta1"), b2 = meta_double(&r, "beta2");
    assert_true(lr > 0 && clip > 0 && b1 < 1 && b2 < 1);
    assert_true(meta_double(&r, "eps") > 0);
    (void)meta_double(&r, "weight_decay");
    assert_int_equal(meta_long(&r, "steps"), 3);

    want_t want[128];
    size_t np = expected_params(want, V, D, F, L, H, KV, HD, tied);
    assert_true(np <= 128);
    assert_int_equal(w.num_tensors, np);
    assert_int_equal(r.num_tensors, 4 + 2 * np); /* tokens, loss, losses, grad_norm, grad.*, step3.* */

    /* tokens: I32 [B, S+1], all inside the vocabulary. */
    const st_tensor_t *tok = safetensors_find(&r, "tokens");
    assert_non_null(tok);
    assert_int_equal(tok->dtype, ST_I32);
    assert_int_equal(tok->ndim, 2);
    assert_int_equal(tok->shape[0], B);
    assert_int_equal(tok->shape[1], S + 1);
    int32_t *ids = malloc((size_t)tok->numel * sizeof(int32_t));
    assert_non_null(ids);
    assert_int_equal(safetensors_to_i32(tok, ids), 0);
    for (int64_t i = 0; i < tok->numel; i++) assert_true(ids[i] >= 0 && ids[i] < V);
    free(ids);

    float loss[1], losses[4], gnorm[3];
    vector_f32(&r, "loss", 1, loss);
    vector_f32(&r, "losses", 4, losses);
    vector_f32(&r, "grad_norm", 3, gnorm);
    assert_true(loss[0] == losses[0]);
    for (int i = 0; i < 4; i++) assert_true(isfinite(losses[i]) && losses[i] > 0);
    assert_true(losses[3] < losses[0]);        /* training moved */
    assert_true(gnorm[0] > clip);              /* clipping is exercised */

    /* Every parameter: weights, grad.<name> and step3.<name> with one shape; the stored
     * gradients reproduce grad_norm[0]; the 3 steps moved every tensor. */
    double sumsq = 0;
    char name[160];
    for (size_t i = 0; i < np; i++) {
        const st_tensor_t *p = find_f32(&w, want[i].name, &want[i]);
        snprintf(name, sizeof(name), "grad.%.127s", want[i].name);
        const st_tensor_t *g = find_f32(&r, name, &want[i]);
        snprintf(name, sizeof(name), "step3.%.127s", want[i].name);
        const st_tensor_t *s = find_f32(&r, name, &want[i]);
        size_t n = (size_t)p->numel;
        float *pv = malloc(n * 4), *gv = malloc(n * 4), *sv = malloc(n * 4);
        assert_true(pv && gv && sv);
        assert_int_equal(safetensors_to_f32(p, pv), 0);
        assert_int_equal(safetensors_to_f32(g, gv), 0);
        assert_int_equal(safetensors_to_f32(s, sv), 0);
        double moved = 0;
        for (size_t j = 0; j < n; j++) {
            assert_true(isfinite(pv[j]) && isfinite(gv[j]) && isfinite(sv[j]));
            sumsq += (double)gv[j] * gv[j];
            moved = fmax(moved, fabs((double)sv[j] - pv[j]));
        }
        if (moved < 1e-3) fail_msg("%s: %s moved only %g in 3 steps", fixture_case, want[i].name, moved);
        free(pv);
        free(gv);
        free(sv);
    }
    double norm = sqrt(sumsq);
    if (fabs(norm - gnorm[0]) > 1e-4 * gnorm[0])
        fail_msg("%s: norm of grad.* is %.7g but grad_norm[0] is %.7g", fixture_case, norm, gnorm[0]);

    safetensors_close(&w);
    safetensors_close(&r);
}

static void test_fixture_tied_gqa(void **state) {
    (void)state;
    check_fixture_case("tied_gqa", 1);
}

static void test_fixture_untied_wide(void **state) {
    (void)state;
    check_fixture_case("untied_wide", 0);
}

static void test_fixture_padded_rows(void **state) {
    (void)state;
    check_fixture_case("padded_rows", 1);
}

/* safetensors_load_f32 reads a 48 MiB tensor (BF16 of an odd length: pieces that end inside a
 * page) to the same values as safetensors_to_f32, and hands the mapping's pages back as it
 * goes: the resident set grows by the destination only, where reading the mapping whole adds
 * the file (checked side by side, so the measure is shown to see the pages). */
static void test_load_hands_pages_back(void **state) {
    const char *dir = *state;
    char path[4096], err[512];
    join(path, sizeof(path), dir, "big.safetensors");
    const int64_t n = (48 << 20) / 2 + 3;
    float *src = malloc((size_t)n * sizeof(float)), *a = malloc((size_t)n * sizeof(float)),
          *b = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) src[i] = (float)(i % 1000) * 0.25f;
    memset(a, 1, (size_t)n * sizeof(float)); /* touched now (not 0: malloc + memset 0 becomes calloc) */
    memset(b, 1, (size_t)n * sizeof(float));
    st_write_entry_t e = {.name = "w", .ndim = 1, .shape = {n}, .data = src};
    assert_int_equal(safetensors_write(path, &e, 1, NULL, NULL, 0, err, sizeof err), 0);
    safetensors_t st;
    assert_int_equal(safetensors_open(&st, path, err, sizeof err), 0);
    const st_tensor_t *t = safetensors_find(&st, "w");
    memstat_t m0, m1, m2;
    assert_true(memstat_read(&m0));
    assert_int_equal(safetensors_load_f32(&st, t, a), 0);
    assert_true(memstat_read(&m1));
    assert_int_equal(safetensors_to_f32(t, b), 0);
    assert_true(memstat_read(&m2));
    assert_memory_equal(a, src, (size_t)n * sizeof(float));
    assert_memory_equal(b, src, (size_t)n * sizeof(float));
    int64_t bytes = n * 4;
    if (m1.rss_bytes - m0.rss_bytes > bytes / 8) fail_msg("load_f32 grew the set by %lld bytes", (long long)(m1.rss_bytes - m0.rss_bytes));
    if (m2.rss_bytes - m1.rss_bytes < bytes / 2) fail_msg("to_f32 grew it by %lld bytes only", (long long)(m2.rss_bytes - m1.rss_bytes));
    st_tensor_t outside = *t;
    outside.data = src;
    assert_int_not_equal(safetensors_load_f32(&st, &outside, a), 0); /* not in the mapping: refused */
    safetensors_close(&st);
    free(src), free(a), free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_with_metadata, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_write_errors, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_write_bf16_beside_f32, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_bf16_conversion, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_f16_conversion, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_f64_and_integers, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_files, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_files, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_load_hands_pages_back, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test(test_python_fixture_reads),
        cmocka_unit_test(test_fixture_tied_gqa),
        cmocka_unit_test(test_fixture_untied_wide),
        cmocka_unit_test(test_fixture_padded_rows),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
