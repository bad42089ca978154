/* test_formats: the output-format layer. Byte-exact checks of the protobuf encoders against
 * the vectors in docs/FORMATS.md (CRC-32C, tfevents records, XSpace), the gzipped Chrome
 * trace read back with zlib, the op-summary arithmetic on a hand-built trace, trace buffers
 * that drop instead of overflowing, and atomic writes that leave nothing behind on failure.
 * With STEPSCOPE_SAMPLE_DIR set, also writes a realistic sample profile there for the
 * Python reader tests (tests/py/test_formats_readers.py). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <zlib.h>

#include "metrics/crc32c.h"
#include "metrics/tfevents.h"
#include "profile/chrome_trace.h"
#include "profile/pb.h"
#include "profile/summary.h"
#include "profile/trace.h"
#include "profile/xplane.h"
#include "util/atomic_file.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* Parse "0a 63 12 ..." into bytes; returns the count. */
static size_t hex_bytes(const char *hex, uint8_t *out, size_t cap) {
    size_t n = 0;
    while (*hex) {
        if (*hex == ' ' || *hex == '\n') { hex++; continue; }
        unsigned v;
        assert_int_equal(sscanf(hex, "%2x", &v), 1);
        assert_true(n < cap);
        out[n++] = (uint8_t)v;
        hex += 2;
    }
    return n;
}

static void assert_bytes(const uint8_t *got, size_t got_len, const char *hex) {
    uint8_t want[512];
    size_t n = hex_bytes(hex, want, sizeof want);
    if (got_len != n || memcmp(got, want, n) != 0) {
        fprintf(stderr, "got  (%zu):", got_len);
        for (size_t i = 0; i < got_len; i++) fprintf(stderr, " %02x", got[i]);
        fprintf(stderr, "\nwant (%zu): %s\n", n, hex);
    }
    assert_int_equal(got_len, n);
    assert_memory_equal(got, want, n);
}

/* A fresh empty directory under /tmp; the caller removes it with rm_tree. */
static void make_tmpdir(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/stepscope_fmt_XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void rm_tree(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    p[len] = 0;
    *n = (size_t)len;
    return p;
}

/* Count the directory entries whose name contains needle. */
static int count_entries(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, needle)) n++;
    closedir(d);
    return n;
}

/* ---- crc32c ----------------------------------------------------------------------------- */

static void test_crc32c(void **state) {
    (void)state;
    assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c_masked("123456789", 9), 0xC78AB0E5u);
    assert_int_equal(crc32c_extend(crc32c("1234", 4), "56789", 5), 0xE3069283u);
    assert_int_equal(crc32c("", 0), 0u);
}

/* ---- pb --------------------------------------------------------------------------------- */

static void test_pb_varint_and_nesting(void **state) {
    (void)state;
    pb_buf_t b;
    pb_init(&b);
    pb_varint(&b, 300);
    assert_bytes(b.data, b.len, "ac 02");
    pb_reset(&b);
    pb_int64(&b, 1, -1);   /* no zigzag: 10 bytes */
    assert_bytes(b.data, b.len, "08 ff ff ff ff ff ff ff ff ff 01");
    /* A 200-byte body needs a 2-byte length: pb_end must shift the body. */
    pb_reset(&b);
    size_t m = pb_begin(&b, 2);
    char body[200];
    memset(body, 'x', sizeof body);
    pb_raw(&b, body, sizeof body);
    pb_end(&b, m);
    assert_int_equal(b.len, 1 + 2 + 200);
    assert_int_equal(b.data[0], 0x12);
    assert_int_equal(b.data[1], 0xc8);
    assert_int_equal(b.data[2], 0x01);
    assert_int_equal(b.data[3], 'x');
    assert_int_equal(b.data[202], 'x');
    assert_true(pb_ok(&b));
    pb_free(&b);
}

/* ---- tfevents --------------------------------------------------------------------------- */

#define FILE_VERSION_PAYLOAD "09 00 00 00 40 6e 55 da 41 1a 0d 62 72 61 69 6e 2e 45 76 65 6e 74 3a 32"
#define FILE_VERSION_RECORD "18 00 00 00 00 00 00 00 a3 7f 4b 22 " FILE_VERSION_PAYLOAD " c3 48 6d fc"
#define SCALAR_PAYLOAD \
    "09 00 00 40 40 6e 55 da 41 10 01 2a 16 0a 14 0a 0d 6c 65 61 72 6e 69 6e 67 2f 6c 6f 73 73 15 00 00 20 41"
#define SCALAR_RECORD "23 00 00 00 00 00 00 00 b0 9f 77 43 " SCALAR_PAYLOAD " 11 44 33 2d"
#define TENSOR_PAYLOAD                                                                          \
    "09 00 00 40 40 6e 55 da 41 10 01 2a 2c 0a 2a 0a 0d 6c 65 61 72 6e 69 6e 67 2f 6c 6f 73 73 " \
    "4a 0d 0a 09 0a 07 73 63 61 6c 61 72 73 20 01 42 0a 08 01 12 00 2a 04 00 00 20 41"
#define TENSOR_RECORD "39 00 00 00 00 00 00 00 8b 07 37 f1 " TENSOR_PAYLOAD " 83 55 76 0d"

static void check_framed(pb_buf_t *payload, const char *payload_hex, const char *record_hex) {
    assert_bytes(payload->data, payload->len, payload_hex);
    pb_buf_t rec;
    pb_init(&rec);
    tfevents_frame(&rec, payload->data, payload->len);
    assert_bytes(rec.data, rec.len, record_hex);
    pb_free(&rec);
}

static void test_tfevents_vectors(void **state) {
    (void)state;
    pb_buf_t p;
    pb_init(&p);
    tfevents_encode_file_version(&p, 1767225600.0);
    check_framed(&p, FILE_VERSION_PAYLOAD, FILE_VERSION_RECORD);
    pb_reset(&p);
    const char *tags[] = {"learning/loss"};
    const float vals[] = {10.0f};
    tfevents_encode_scalars(&p, 1, 1767225601.0, 1, tags, vals);
    check_framed(&p, SCALAR_PAYLOAD, SCALAR_RECORD);
    pb_reset(&p);
    tfevents_encode_scalar_tensor(&p, 1, 1767225601.0, "learning/loss", 10.0f);
    check_framed(&p, TENSOR_PAYLOAD, TENSOR_RECORD);
    pb_free(&p);
}

/* Walk the TFRecord framing, checking both CRCs of every record; returns the record count. */
static int count_valid_records(const uint8_t *d, size_t n) {
    int records = 0;
    size_t off = 0;
    while (off < n) {
        assert_true(n - off >= 12);
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)d[off + i] << (8 * i);
        uint32_t c1 = d[off + 8] | d[off + 9] << 8 | d[off + 10] << 16 | (uint32_t)d[off + 11] << 24;
        assert_int_equal(c1, crc32c_masked(d + off, 8));
        assert_true(n - off - 12 >= len + 4);
        const uint8_t *p = d + off + 12, *c = p + len;
        uint32_t c2 = c[0] | c[1] << 8 | c[2] << 16 | (uint32_t)c[3] << 24;
        assert_int_equal(c2, crc32c_masked(p, len));
        off += 12 + len + 4;
        records++;
    }
    return records;
}

static void test_tfevents_file(void **state) {
    (void)state;
    char dir[256], sub[300], err[512];
    make_tmpdir(dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/run/a", dir);   /* created by open */
    tfevents_t *w;
    assert_int_equal(tfevents_open_at(&w, sub, "testhost", 1767225600.0, err, sizeof err), 0);
    char want[400];
    snprintf(want, sizeof want, "%s/events.out.tfevents.1767225600.testhost", sub);
    assert_string_equal(tfevents_path(w), want);
    assert_int_equal(tfevents_add_scalar(w, "learning/loss", 10.0f, 1, 1767225601.0), 0);
    const char *tags[] = {"learning/loss", "perf/step_time_seconds"};
    const float vals[] = {9.5f, 0.25f};
    assert_int_equal(tfevents_write_scalars(w, 2, 1767225602.0, 2, tags, vals), 0);
    /* Records are visible before close: nothing is held back in a user-space buffer. */
    size_t n;
    uint8_t *d = read_all(want, &n);
    assert_non_null(d);
    assert_int_equal(count_valid_records(d, n), 3);
    assert_bytes(d, 40, FILE_VERSION_RECORD);
    uint8_t rec2[64];
    assert_int_equal(hex_bytes(SCALAR_RECORD, rec2, sizeof rec2), 51);
    assert_memory_equal(d + 40, rec2, 51);
    free(d);
    /* A second writer in the same second gets its own file. */
    tfevents_t *w2;
    assert_int_equal(tfevents_open_at(&w2, sub, "testhost", 1767225600.0, err, sizeof err), 0);
    assert_string_not_equal(tfevents_path(w2), want);
    assert_int_equal(tfevents_close(w2), 0);
    assert_int_equal(tfevents_close(w), 0);
    rm_tree(dir);
}

static void test_tfevents_open_fails_cleanly(void **state) {
    (void)state;
    char dir[256], path[300], err[512] = "";
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/file", dir);
    assert_int_equal(atomic_write_file(path, "x", 1, err, sizeof err), 0);
    tfevents_t *w = (tfevents_t *)1;
    assert_int_equal(tfevents_open_at(&w, path, "h", 1.0, err, sizeof err), -1);  /* a file, not a dir */
    assert_null(w);
    assert_true(strlen(err) > 0);
    rm_tree(dir);
}

/* ---- trace ------------------------------------------------------------------------------ */

static void test_trace_drops_when_full(void **state) {
    (void)state;
    trace_t *t = trace_create(2, 4);
    assert_non_null(t);
    uint32_t id = trace_intern(t, "op", TRACE_CAT_MATMUL, "mlp");
    assert_int_equal(trace_intern(t, "op", TRACE_CAT_MATMUL, "mlp"), id);
    assert_int_equal(trace_begin(t), 0);          /* not recording: no clock read, no event */
    trace_end(t, 0, id, 0, 1.0, 0);
    assert_int_equal(t->lanes[0].count, 0);
    trace_set_recording(t, true);
    for (int i = 0; i < 7; i++) {
        int64_t s = trace_begin(t);
        assert_true(s > 0);
        trace_end(t, 0, id, s, 1.0, 0);
    }
    assert_int_equal(t->lanes[0].count, 4);
    assert_int_equal(t->lanes[0].dropped, 3);
    assert_int_equal(t->lanes[1].count, 0);
    trace_end(t, 9, id, trace_begin(t), 1.0, 0);     /* bad lane: ignored, no crash */
    trace_end_step(t, 1, id, trace_begin(t), 5);
    assert_int_equal(t->lanes[1].events[0].step_num, 5);
    assert_true(t->lanes[0].events[0].end_ns >= t->lanes[0].events[0].start_ns);
    trace_clear(t);
    assert_int_equal(t->lanes[0].count, 0);
    assert_int_equal(t->lanes[0].dropped, 0);
    trace_destroy(t);
    trace_end(NULL, 0, 0, 123, 0, 0);                /* NULL recorder is a no-op */
}

/* ---- xplane ----------------------------------------------------------------------------- */

#define XSPACE_VECTOR                                                                           \
    "0a 63 12 09 2f 68 6f 73 74 3a 43 50 55 1a 29 08 01 12 04 6d 61 69 6e 18 80 80 e8 ef 9e ca " \
    "9c c3 18 22 15 08 01 10 00 18 c0 96 b1 02 22 04 08 01 20 01 22 04 08 02 20 00 22 0d 08 01 " \
    "12 09 08 01 12 05 74 72 61 69 6e 2a 0a 08 01 12 06 08 01 12 02 5f 72 2a 10 08 02 12 0c 08 " \
    "02 12 08 73 74 65 70 5f 6e 75 6d 22 01 68"

static trace_t *one_step_trace(void) {
    trace_t *t = trace_create(1, 16);
    assert_non_null(t);
    trace_set_lane(t, 0, "main", 1);
    uint32_t train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    assert_true(trace_record(t, 0, train, 1000, 1000 + 5000, 0, 0.0, 0));   /* 5 us, step 0 */
    /* Pin the epoch base: earliest start 1000 ns maps to 1767225600 s exactly. */
    t->wall_minus_mono_ns = 1767225600LL * 1000000000LL - 1000;
    return t;
}

static void test_xspace_vector(void **state) {
    (void)state;
    trace_t *t = one_step_trace();
    pb_buf_t b;
    pb_init(&b);
    char err[256];
    assert_int_equal(xplane_encode(t, "h", 0, 0, NULL, &b, err, sizeof err), 0);
    assert_bytes(b.data, b.len, XSPACE_VECTOR);
    /* The step window changes nothing here; no window (-1) neither. */
    pb_reset(&b);
    assert_int_equal(xplane_encode(t, "h", -1, -1, NULL, &b, err, sizeof err), 0);
    assert_bytes(b.data, b.len, XSPACE_VECTOR);
    pb_free(&b);
    trace_destroy(t);
}

static void test_xplane_write_atomic(void **state) {
    (void)state;
    trace_t *t = one_step_trace();
    char dir[256], path[300], err[512];
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/h.xplane.pb", dir);
    assert_int_equal(xplane_write(t, path, "h", 0, 0, NULL, err, sizeof err), 0);
    size_t n;
    uint8_t *d = read_all(path, &n);
    assert_non_null(d);
    assert_bytes(d, n, XSPACE_VECTOR);
    free(d);
    assert_int_equal(count_entries(dir, ".tmp."), 0);
    rm_tree(dir);
    trace_destroy(t);
}

/* A one-lane trace naming a train step and one matmul (of layer part `part`). */
static trace_t *one_matmul_trace(const char *lane, int tid, const char *matmul, const char *part, uint32_t *train,
                                 uint32_t *mm) {
    trace_t *t = trace_create(1, 64);
    trace_set_lane(t, 0, lane, tid);
    *train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    *mm = trace_intern(t, matmul, TRACE_CAT_MATMUL, part);
    return t;
}

/* Window filtering and flops: a trace with steps 0..2, asking for step 1 only. */
static void test_xplane_window_and_flops(void **state) {
    (void)state;
    uint32_t train, mm;
    trace_t *t = one_matmul_trace("compute0", 7, "q_proj:MatMul", "attention", &train, &mm);
    for (int s = 0; s < 3; s++) {
        int64_t b = 1000000 * (s + 1);
        trace_record(t, 0, train, b, b + 500000, s, 0, 0);
        trace_record(t, 0, mm, b + 1000, b + 2000, -1, 1e9, 0);
    }
    pb_buf_t all, one;
    pb_init(&all);
    pb_init(&one);
    char err[256];
    assert_int_equal(xplane_encode(t, "h", -1, -1, NULL, &all, err, sizeof err), 0);
    assert_int_equal(xplane_encode(t, "h", 1, 1, NULL, &one, err, sizeof err), 0);
    assert_true(one.len < all.len);
    /* The flops stat metadata is declared: "flops" appears in the bytes. */
    assert_non_null(memmem(one.data, one.len, "flops", 5));
    /* uint64 1e9 = varint 80 94 eb dc 03, tagged 0x18. */
    assert_non_null(memmem(one.data, one.len, "\x18\x80\x94\xeb\xdc\x03", 6));
    /* No span carries bytes: no bytes_accessed metadata. The matmuls' FLOP/s make counters. */
    assert_null(memmem(all.data, all.len, "bytes_accessed", 14));
    assert_non_null(memmem(all.data, all.len, "_counters_", 10));
    pb_free(&all);
    pb_free(&one);
    trace_destroy(t);
}

/* The whole trace as an XSpace, no step window, into a fresh b (the caller frees it). */
static void encode_whole(const trace_t *t, pb_buf_t *b) {
    pb_init(b);
    char err[256];
    assert_int_equal(xplane_encode(t, "h", -1, -1, NULL, b, err, sizeof err), 0);
}

/* A span's bytes become XProf's "bytes_accessed" stat (uint64, metadata id 4) beside its flops,
 * and a span with bytes alone carries that stat alone. */
static void test_xplane_bytes_accessed(void **state) {
    (void)state;
    uint32_t train, mm;
    trace_t *t = one_matmul_trace("compute0", 7, "q_proj:MatMul", "attention", &train, &mm);
    uint32_t norm = trace_intern(t, "rmsnorm", TRACE_CAT_NORM, "norms");
    trace_record(t, 0, train, 1000, 9000, 0, 0, 0);
    trace_record(t, 0, mm, 2000, 3000, -1, 1e9, 300);
    trace_record(t, 0, norm, 4000, 5000, -1, 0, 1e9);
    pb_buf_t b;
    encode_whole(t, &b);
    /* the stat metadata entry: {key 4, value {id 4, name "bytes_accessed"}} */
    assert_non_null(memmem(b.data, b.len, "\x08\x04\x12\x12\x08\x04\x12\x0e" "bytes_accessed", 22));
    /* the matmul's stats: {metadata_id 3, uint64 1e9}, then {metadata_id 4, uint64 300 = ac 02} */
    assert_non_null(memmem(b.data, b.len, "\x22\x08\x08\x03\x18\x80\x94\xeb\xdc\x03\x22\x05\x08\x04\x18\xac\x02", 17));
    /* the norm's bytes: {metadata_id 4, uint64 1e9}, its only number */
    assert_non_null(memmem(b.data, b.len, "\x22\x08\x08\x04\x18\x80\x94\xeb\xdc\x03", 10));
    assert_null(memmem(b.data, b.len, "\x22\x08\x08\x03\x18\x80\x94\xeb\xdc\x03\x22\x08", 12));
    /* The rate counters on a line XProf's viewer reads as counters: the norm's 1e9 bytes in 1 us
     * are a GB/s sample of 1e6, a double stat (field 2, fixed64) of the "GB/s" series (id 6). */
    assert_non_null(memmem(b.data, b.len, "_counters_", 10));
    assert_non_null(memmem(b.data, b.len, "compute lane GB/s", 17));
    assert_non_null(memmem(b.data, b.len, "\x08\x06\x11\x00\x00\x00\x00\x80\x84\x2e\x41", 11));
    pb_free(&b);
    trace_destroy(t);
}

/* The compute lane's kernels carry XProf's "tf_op" stat as a reference to an interned string
 * "<part>/<name>:<category>" (':' in the name made '_'), the data wait "_ipl_stage_name" too; a
 * worker lane's kernels and the step carry neither. */
static void test_xplane_framework_ops(void **state) {
    (void)state;
    trace_t *t = trace_create(2, 16);
    trace_set_lane(t, 0, "compute0", 7);
    trace_set_lane(t, 1, "compute1", 8);
    uint32_t train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    uint32_t wait = trace_intern(t, "data wait", TRACE_CAT_DATA, "data");
    uint32_t mm = trace_intern(t, "q_proj:MatMul", TRACE_CAT_MATMUL, "attention");
    uint32_t chunk = trace_intern(t, "chunk", TRACE_CAT_MATMUL, "mlp");
    trace_record(t, 0, train, 1000, 9000, 0, 0, 0);
    trace_record(t, 0, wait, 1000, 1500, -1, 0, 0);
    trace_record(t, 0, mm, 2000, 3000, -1, 0, 0);
    trace_record(t, 1, chunk, 2000, 2500, -1, 0, 0);
    pb_buf_t b;
    encode_whole(t, &b);
    /* stat metadata: tf_op (7), _ipl_stage_name (8), then (after the memory plan's 9..17) the strings in name-id order (18, 19) */
    assert_non_null(memmem(b.data, b.len, "\x08\x07\x12\x09\x08\x07\x12\x05" "tf_op", 13));
    assert_non_null(memmem(b.data, b.len, "\x08\x08\x12\x13\x08\x08\x12\x0f" "_ipl_stage_name", 23));
    assert_non_null(memmem(b.data, b.len, "\x08\x12\x12\x17\x08\x12\x12\x13" "data/data wait:data", 27));
    assert_non_null(memmem(b.data, b.len, "\x08\x13\x12\x22\x08\x13\x12\x1e" "attention/q_proj_MatMul:matmul", 38));
    assert_null(memmem(b.data, b.len, "chunk:matmul", 12));
    /* the wait's stats {7, ref 18} {8, ref 18}; the matmul's {7, ref 19}; nothing else refers */
    assert_non_null(memmem(b.data, b.len, "\x22\x04\x08\x07\x38\x12\x22\x04\x08\x08\x38\x12", 12));
    assert_non_null(memmem(b.data, b.len, "\x22\x04\x08\x07\x38\x13", 6));
    size_t refs = 0;
    for (size_t i = 0; i + 3 < b.len; i++) refs += b.data[i] == 0x22 && b.data[i + 1] == 4 && b.data[i + 4] == 0x38;
    assert_int_equal(refs, 3);
    pb_free(&b);
    trace_destroy(t);
}

/* The memory plan: a line of its own (id 0xdeadbeef + 7, which XProf's op statistics skip) with
 * one zero-length "MemoryAllocation" a buffer at the window's start, carrying the stats XProf's
 * memory profile reads and the running totals; a buffer of several dtypes has no data_type. */
static void test_xplane_memory_plan(void **state) {
    (void)state;
    trace_t *t = one_step_trace();
    const xplane_buffer_t buffers[] = {{"parameters", 300, XPLANE_DT_FLOAT, "persist"},
                                       {"scratch", 200, XPLANE_DT_MIXED, "temp"}};
    const xplane_memory_t memory = {.allocator = "plan", .buffers = buffers, .count = 2, .capacity_bytes = 1000};
    pb_buf_t b;
    pb_init(&b);
    char err[256];
    assert_int_equal(xplane_encode(t, "h", 0, 0, &memory, &b, err, sizeof err), 0);
    /* the line: {id 0xdeadbef6, name "memory plan"} */
    assert_non_null(memmem(b.data, b.len, "\x08\xf6\xfd\xb6\xf5\x0d\x12\x0b" "memory plan", 19));
    assert_non_null(memmem(b.data, b.len, "MemoryAllocation", 16));
    for (int i = 0; i < 9; i++) {
        const char *names[] = {"allocator_name", "bytes_allocated", "bytes_available", "peak_bytes_in_use",
                               "requested_bytes", "allocation_bytes", "addr", "region_type", "data_type"};
        assert_non_null(memmem(b.data, b.len, names[i], strlen(names[i])));
    }
    /* the first buffer's stats: allocator "plan", allocated 300 (ac 02), available 700 (bc 05),
     * peak 300, requested and allocation 300, addr 0, tf_op, region, data_type 1 */
    static const char first[] = "\x22\x08\x08\x09\x2a\x04plan" "\x22\x05\x08\x0a\x20\xac\x02"
                                "\x22\x05\x08\x0b\x20\xbc\x05" "\x22\x05\x08\x0c\x20\xac\x02"
                                "\x22\x05\x08\x0d\x20\xac\x02" "\x22\x05\x08\x0e\x20\xac\x02"
                                "\x22\x04\x08\x0f\x20\x00" "\x22\x0e\x08\x07\x2a\x0aparameters"
                                "\x22\x0b\x08\x10\x2a\x07persist" "\x22\x04\x08\x11\x20\x01";
    assert_non_null(memmem(b.data, b.len, first, sizeof first - 1));
    /* the second: allocated 500 (f4 03), available 500, addr 300, and no data_type after its region */
    static const char second[] = "\x22\x05\x08\x0a\x20\xf4\x03" "\x22\x05\x08\x0b\x20\xf4\x03";
    assert_non_null(memmem(b.data, b.len, second, sizeof second - 1));
    assert_non_null(memmem(b.data, b.len, "\x22\x05\x08\x0f\x20\xac\x02", 7));
    assert_non_null(memmem(b.data, b.len, "\x2a\x04temp", 6));
    assert_null(memmem(b.data, b.len, "\x2a\x04temp\x22\x04\x08\x11", 10));
    /* no memory, no line */
    pb_reset(&b);
    assert_int_equal(xplane_encode(t, "h", 0, 0, NULL, &b, err, sizeof err), 0);
    assert_bytes(b.data, b.len, XSPACE_VECTOR);
    pb_free(&b);
    trace_destroy(t);
}

/* ---- chrome trace ----------------------------------------------------------------------- */

/* Inflate one gzip member; fails the test if there is trailing data (a second member). */
static char *gunzip_one_member(const uint8_t *d, size_t n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(inflateInit2(&z, 15 + 16), Z_OK);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    z.next_in = (uint8_t *)d;
    z.avail_in = (uInt)n;
    int rc;
    do {
        if (cap - len < 4096) out = realloc(out, cap *= 2);
        z.next_out = (uint8_t *)out + len;
        z.avail_out = (uInt)(cap - len - 1);
        rc = inflate(&z, Z_NO_FLUSH);
        assert_true(rc == Z_OK || rc == Z_STREAM_END);
        len = cap - 1 - z.avail_out;
    } while (rc != Z_STREAM_END);
    assert_int_equal(z.avail_in, 0);
    inflateEnd(&z);
    out[len] = 0;
    return out;
}

static void test_chrome_trace(void **state) {
    (void)state;
    trace_t *t = trace_create(2, 16);
    trace_set_lane(t, 0, "main", 1);
    trace_set_lane(t, 1, "data \"loader\"", 2);
    uint32_t train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    uint32_t mm = trace_intern(t, "layer0/mlp\\up:MatMul", TRACE_CAT_MATMUL, "mlp");
    uint32_t dl = trace_intern(t, "next_batch", TRACE_CAT_DATA, NULL);
    trace_record(t, 0, train, 1000, 6000, 0, 0, 0);
    trace_record(t, 0, mm, 1500, 2750, -1, 2e6, 0);
    trace_record(t, 0, mm, 3000, 3500, -1, 4e6, 1.5e6);
    trace_record(t, 0, dl, 4000, 4500, -1, 0, 64);
    trace_record(t, 1, dl, 1200, 1201, -1, 0, 0);
    char dir[256], path[300], err[512];
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/h.trace.json.gz", dir);
    assert_int_equal(chrome_trace_write(t, path, err, sizeof err), 0);
    size_t n;
    uint8_t *gz = read_all(path, &n);
    assert_non_null(gz);
    assert_int_equal(gz[0], 0x1f);
    assert_int_equal(gz[1], 0x8b);
    char *json = gunzip_one_member(gz, n);
    assert_int_equal(strncmp(json, "{\"traceEvents\":[", 16), 0);
    assert_non_null(strstr(json, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,"));
    assert_non_null(strstr(json, "\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"data \\\"loader\\\"\"}"));
    assert_non_null(strstr(json, "{\"name\":\"train\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,"
                                 "\"ts\":0.000,\"dur\":5.000,\"args\":{\"step_num\":0}}"));
    assert_non_null(strstr(json, "{\"name\":\"layer0/mlp\\\\up:MatMul\",\"cat\":\"matmul\",\"ph\":\"X\","
                                 "\"pid\":1,\"tid\":1,\"ts\":0.500,\"dur\":1.250,\"args\":{\"flops\":2000000}}"));
    assert_non_null(strstr(json, "\"ts\":2.000,\"dur\":0.500,\"args\":{\"flops\":4000000,\"bytes_accessed\":1500000}}"));
    assert_non_null(strstr(json, "\"ts\":3.000,\"dur\":0.500,\"args\":{\"bytes_accessed\":64}}"));
    /* The compute lane's rates as two counter tracks: each kernel's from its start, 0 after it. */
    static const char *const samples_expected[][3] = {
        {"GFLOP/s", "0.500", "1600"}, {"GB/s", "0.500", "0"},    {"GFLOP/s", "1.750", "0"},
        {"GFLOP/s", "2.000", "8000"}, {"GB/s", "2.000", "3000"}, {"GB/s", "3.000", "0.128"},
        {"GB/s", "3.500", "0"},
    };
    for (size_t i = 0; i < sizeof samples_expected / sizeof samples_expected[0]; i++) {
        const char *const *x = samples_expected[i];
        char want[160];
        snprintf(want, sizeof want, "{\"name\":\"compute lane %s\",\"ph\":\"C\",\"pid\":1,\"ts\":%s,\"args\":{\"%s\":%s}}",
                 x[0], x[1], x[0], x[2]);
        assert_non_null(strstr(json, want));
    }
    size_t samples = 0;
    for (const char *p = json; (p = strstr(p, "\"ph\":\"C\"")); p++) samples++;
    assert_int_equal(samples, 2 * 6);   /* three kernels with a rate, each a start and an end, on two tracks */
    assert_non_null(strstr(json, "\"tid\":2,\"ts\":0.200,\"dur\":0.001}"));
    char *tail = strstr(json, "],\"displayTimeUnit\":\"ns\"");
    assert_non_null(tail);
    assert_null(strstr(tail, "traceEvents"));   /* displayTimeUnit only after the array */
    free(json);
    free(gz);
    assert_int_equal(count_entries(dir, ".tmp."), 0);
    rm_tree(dir);
    trace_destroy(t);
}

/* ---- summary ---------------------------------------------------------------------------- */

#define MS 1000000LL

static const summary_row_t *find_row(const summary_t *s, const char *cat, const char *part) {
    for (size_t i = 0; i < s->num_rows; i++)
        if (strcmp(s->rows[i].category, cat) == 0 && strcmp(s->rows[i].part, part) == 0) return &s->rows[i];
    return NULL;
}

/* Steps 0 and 1 of 10 ms on compute0; step 2 outside the window; a worker lane and a data
 * lane whose spans must not count; a matmul nested in a matmul that must not double count. */
static trace_t *summary_trace(void) {
    trace_t *t = trace_create(3, 64);
    trace_set_lane(t, 0, "data", 30);         /* lane 0 is not a compute lane here */
    trace_set_lane(t, 1, "compute0", 10);
    trace_set_lane(t, 2, "compute1", 11);
    uint32_t train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    uint32_t fwd = trace_intern(t, "forward", TRACE_CAT_PHASE, NULL);
    uint32_t qkv = trace_intern(t, "qkv:MatMul", TRACE_CAT_MATMUL, "attention");
    uint32_t up = trace_intern(t, "up:MatMul", TRACE_CAT_MATMUL, "mlp");
    uint32_t inner = trace_intern(t, "inner:MatMul", TRACE_CAT_MATMUL, "mlp");
    uint32_t norm = trace_intern(t, "rmsnorm", TRACE_CAT_NORM, NULL);
    uint32_t attn = trace_intern(t, "attention", TRACE_CAT_ATTENTION, "attention");
    uint32_t dl = trace_intern(t, "next_batch", TRACE_CAT_DATA, NULL);
    int64_t s0 = 100 * MS, s1 = 110 * MS, s2 = 120 * MS;
    trace_record(t, 1, train, s0, s0 + 10 * MS, 0, 0, 0);
    trace_record(t, 1, fwd, s0, s0 + 8 * MS, -1, 0, 0);
    trace_record(t, 1, qkv, s0 + 1 * MS, s0 + 3 * MS, -1, 2e9, 4e6);   /* 2 ms, 1000 GFLOP/s, 2 GB/s */
    trace_record(t, 1, up, s0 + 3 * MS, s0 + 6 * MS, -1, 6e9, 0);      /* 3 ms, 2000 GFLOP/s */
    trace_record(t, 1, inner, s0 + 4 * MS, s0 + 5 * MS, -1, 9e9, 9e9); /* nested: ignored */
    trace_record(t, 1, norm, s0 + 6 * MS, s0 + 7 * MS, -1, 0, 40e6);   /* 1 ms, 40 GB/s */
    trace_record(t, 2, up, s0 + 3 * MS, s0 + 6 * MS, -1, 6e9, 9e9);    /* worker lane: ignored */
    trace_record(t, 0, dl, s0 + 1 * MS, s0 + 9 * MS, -1, 0, 0);      /* data lane: ignored */
    trace_record(t, 1, train, s1, s1 + 10 * MS, 1, 0, 0);
    trace_record(t, 1, attn, s1 + 2 * MS, s1 + 6 * MS, -1, 4e9, 0);  /* 4 ms */
    trace_record(t, 1, train, s2, s2 + 10 * MS, 2, 0, 0);
    trace_record(t, 1, up, s2 + 1 * MS, s2 + 2 * MS, -1, 1e9, 0);    /* step 2: outside */
    trace_record(t, 1, norm, 50 * MS, 51 * MS, -1, 0, 0);            /* before any step */
    return t;
}

/* The spread is weighted by flops, not by calls: one slow call with 5% of a row's flops is
 * below its p10 (by calls it would be the p10: one call of ten). */
static void test_summary_spread_weighted_by_flops(void **state) {
    (void)state;
    uint32_t train, mm;
    trace_t *t = one_matmul_trace("compute", 10, "mm:MatMul", "mlp", &train, &mm);
    trace_record(t, 0, train, 0, 100 * MS, 0, 0, 0);
    trace_record(t, 0, mm, 1 * MS, 6 * MS, -1, 0.5e9, 0); /* 5 ms: 100 GFLOP/s */
    for (int i = 0; i < 9; i++)                        /* 1 ms each: 1000 GFLOP/s */
        trace_record(t, 0, mm, (10 + i) * MS, (11 + i) * MS, -1, 1e9, 0);
    summary_t s;
    assert_int_equal(summary_compute(t, 0, 0, 0.0, 0, &s), 0);
    const summary_row_t *r = find_row(&s, "matmul", "mlp");
    assert_non_null(r);
    assert_int_equal(r->calls, 10);
    assert_float_equal(r->gflops_p10, 1000.0, 1e-6);
    assert_float_equal(r->gflops_p90, 1000.0, 1e-6);
    assert_float_equal(r->gflops_per_s, 9.5e9 / 14e6, 1e-6);
    summary_free(&s);
    /* With the slow call holding 20% of the flops, p10 is the slow call's rate. */
    trace_record(t, 0, mm, 30 * MS, 51 * MS, -1, 2.1e9, 0); /* 21 ms: 100 GFLOP/s */
    assert_int_equal(summary_compute(t, 0, 0, 0.0, 0, &s), 0);
    r = find_row(&s, "matmul", "mlp");
    assert_float_equal(r->gflops_p10, 100.0, 1e-6);
    assert_float_equal(r->gflops_p90, 1000.0, 1e-6);
    summary_free(&s);
    trace_destroy(t);
}

/* The table printed into a string (freed by the caller). */
static char *printed_summary(const summary_t *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    summary_print(s, f);
    fclose(f);
    return text;
}

/* A row past 100% of the peak or the bandwidth gets a note under the table naming it, its rate
 * and how far past the reference it went; within them, no note. summary_trace's mlp matmul runs
 * at 2000 GFLOP/s and its norm moves 40 GB/s. */
static void test_summary_notes_rows_past_the_reference(void **state) {
    (void)state;
    trace_t *t = summary_trace();
    summary_t s;
    assert_int_equal(summary_compute(t, 0, 1, 4000.0, 80.0, &s), 0);
    char *text = printed_summary(&s);
    assert_null(strstr(text, "note:"));
    free(text);
    summary_free(&s);
    assert_int_equal(summary_compute(t, 0, 1, 1000.0, 16.0, &s), 0);
    text = printed_summary(&s);
    assert_non_null(strstr(text, "\nnote: matmul mlp ran at 2000.0 GFLOP/s, 2.00x the 1000.0 GFLOP/s peak %peak is "
                                 "read against: the cores were faster during the steps than when the peak was probed, "
                                 "or the peak given is low\n"));
    assert_non_null(strstr(text, "\nnote: norm moved 40.0 GB/s, 2.50x the 16.0 GB/s %bw is read against: with 38.1 MiB "
                                 "a call: its data stayed in the caches between kernels, or the memory bus ran faster "
                                 "during the steps than when it was probed (a shared VM's moves by 2x within seconds); "
                                 "a fixed device_peak_gb_per_s compares runs\n"));
    free(text);
    /* The bus probed again after the steps tells the two causes apart: the norm's 40 GB/s is
     * within a closing 50 (the bus moved), past a closing 20 (the caches). */
    s.bandwidth_after_gbs = 50.0;
    text = printed_summary(&s);
    assert_non_null(strstr(text, ", memory bandwidth 16.0 GB/s (50.0 after the steps)\n"));
    assert_non_null(strstr(text, "\nnote: norm moved 40.0 GB/s, 2.50x the 16.0 GB/s %bw is read against: the memory "
                                 "bus was faster during the steps than when it was probed at start-up: it probed 50.0 "
                                 "GB/s after the steps, and the row is 80% of that; a fixed device_peak_gb_per_s "
                                 "compares runs\n"));
    free(text);
    s.bandwidth_after_gbs = 20.0;
    text = printed_summary(&s);
    assert_non_null(strstr(text, "\nnote: norm moved 40.0 GB/s, 2.50x the 16.0 GB/s %bw is read against: past the "
                                 "bus's 20.0 GB/s after the steps too, with 38.1 MiB a call: its data stayed in the "
                                 "caches between kernels, or the memory bus ran faster during the steps than at either "
                                 "probe (a shared VM's moves by 2x within seconds); a fixed device_peak_gb_per_s "
                                 "compares runs\n"));
    free(text);
    summary_free(&s);
    trace_destroy(t);
}

/* A call that moves more than any cache holds (an optimizer update over gigabytes) past the
 * bandwidth can only have met a faster bus, and the note says so rather than offer the caches. */
static void test_summary_note_rules_out_the_caches_for_big_calls(void **state) {
    (void)state;
    trace_t *t = trace_create(1, 16);
    trace_set_lane(t, 0, "compute", 10);
    uint32_t train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    uint32_t update = trace_intern(t, "adamw update", TRACE_CAT_OPTIMIZER, "adamw update");
    trace_record(t, 0, train, 0, 1000 * MS, 0, 0, 0);
    trace_record(t, 0, update, 0, 500 * MS, -1, 0, 30e9); /* 30 GB in 0.5 s: 60 GB/s, 28610 MiB */
    summary_t s;
    assert_int_equal(summary_compute(t, 0, 0, 1000.0, 40.0, &s), 0);
    char *text = printed_summary(&s);
    assert_non_null(strstr(text, "\nnote: optimizer moved 60.0 GB/s, 1.50x the 40.0 GB/s %bw is read against: with "
                                 "28610 MiB a call, more than a cache holds: the memory bus ran faster during the steps "
                                 "than when it was probed (a shared VM's moves by 2x within seconds); a fixed "
                                 "device_peak_gb_per_s compares runs\n"));
    free(text);
    s.bandwidth_after_gbs = 50.0;
    text = printed_summary(&s);
    assert_non_null(strstr(text, "is read against: past the bus's 50.0 GB/s after the steps too, with 28610 MiB a call, "
                                 "more than a cache holds: the memory bus ran faster during the steps than at either "
                                 "probe (a shared VM's"));
    free(text);
    summary_free(&s);
    trace_destroy(t);
}

static void test_summary_arithmetic(void **state) {
    (void)state;
    trace_t *t = summary_trace();
    summary_t s;
    assert_int_equal(summary_compute(t, 0, 1, 4000.0, 80.0, &s), 0);
    assert_int_equal(s.num_steps, 2);
    assert_int_equal(s.first_step, 0);
    assert_int_equal(s.last_step, 1);
    assert_string_equal(s.lane, "compute0");
    assert_float_equal(s.step_ms, 20.0, 1e-9);
    assert_float_equal(s.kernel_ms, 2 + 3 + 1 + 4, 1e-9);
    assert_float_equal(s.other_ms, 10.0, 1e-9);
    const summary_row_t *r = find_row(&s, "matmul", "");
    assert_non_null(r);
    assert_int_equal(r->calls, 2);
    assert_float_equal(r->total_ms, 5.0, 1e-9);
    assert_float_equal(r->share, 0.25, 1e-12);
    assert_float_equal(r->gflops_per_s, 8e9 / 5e6, 1e-6);   /* 1600 */
    assert_float_equal(r->pct_peak, 40.0, 1e-9);
    /* flops 2e9 at 1000 GFLOP/s, 6e9 at 2000: the first 10% of 8e9 in the slower call, 90% in the faster */
    assert_float_equal(r->gflops_p10, 1000.0, 1e-6);
    assert_float_equal(r->gflops_p90, 2000.0, 1e-6);
    r = find_row(&s, "matmul", "mlp");
    assert_non_null(r);
    assert_int_equal(r->calls, 1);
    assert_float_equal(r->gflops_per_s, 2000.0, 1e-6);
    assert_ptr_equal(r, find_row(&s, "matmul", "") + 1);   /* parts by time: mlp before attention */
    r = find_row(&s, "matmul", "attention");
    assert_float_equal(r->total_ms, 2.0, 1e-9);
    /* bytes: 4e6 in 5 ms of matmuls, 40e6 in the 1 ms norm; % of the 80 GB/s given */
    r = find_row(&s, "matmul", "");
    assert_float_equal(r->bytes, 4e6, 0);
    assert_float_equal(r->gbytes_per_s, 0.8, 1e-12);
    assert_float_equal(r->pct_bandwidth, 1.0, 1e-9);
    assert_float_equal(find_row(&s, "matmul", "mlp")->gbytes_per_s, 0.0, 0);
    r = find_row(&s, "norm", "");
    assert_float_equal(r->gbytes_per_s, 40.0, 1e-9);
    assert_float_equal(r->pct_bandwidth, 50.0, 1e-9);
    assert_int_equal(r->calls, 1);
    assert_float_equal(r->gflops_per_s, 0.0, 0);
    assert_float_equal(r->gflops_p10, 0.0, 0);
    assert_float_equal(r->gflops_p90, 0.0, 0);
    r = find_row(&s, "attention", "");
    assert_float_equal(r->gflops_p10, 1000.0, 1e-6);   /* one call: its rate, twice */
    assert_float_equal(r->gflops_p90, 1000.0, 1e-6);
    r = find_row(&s, "attention", "attention");
    assert_float_equal(r->total_ms, 4.0, 1e-9);
    assert_null(find_row(&s, "data", ""));
    assert_null(find_row(&s, "phase", ""));
    r = find_row(&s, SUMMARY_OTHER_LABEL, "");
    assert_float_equal(r->total_ms, 10.0, 1e-9);
    assert_float_equal(r->share, 0.5, 1e-12);
    r = &s.rows[s.num_rows - 1];
    assert_string_equal(r->category, SUMMARY_TOTAL_LABEL);
    assert_int_equal(r->calls, 2);
    assert_float_equal(r->flops, 12e9, 1);
    assert_float_equal(r->gflops_per_s, 600.0, 1e-6);
    assert_float_equal(r->bytes, 44e6, 0);
    assert_float_equal(r->gbytes_per_s, 2.2, 1e-12);   /* 44e6 bytes over the 20 ms of steps */
    assert_float_equal(find_row(&s, SUMMARY_OTHER_LABEL, "")->gbytes_per_s, 0.0, 0);

    /* The table prints and the JSON is written atomically. */
    char dir[256], path[300], err[512];
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/op_summary.json", dir);
    FILE *f = fopen("/dev/null", "w");
    summary_print(&s, f);
    fclose(f);
    assert_int_equal(summary_write_json(&s, path, err, sizeof err), 0);
    size_t n;
    char *json = (char *)read_all(path, &n);
    assert_non_null(strstr(json, "\"num_steps\":2"));
    assert_non_null(strstr(json, "{\"category\":\"matmul\",\"part\":\"mlp\",\"calls\":1,\"total_ms\":3,"));
    assert_non_null(strstr(json, "\"gflops_p10\":2000,\"gflops_p90\":2000,\"bytes\":0,\"gbytes_per_s\":0,\"pct_bandwidth\":0}"));
    assert_non_null(strstr(json, "\"bytes\":40000000,\"gbytes_per_s\":40,\"pct_bandwidth\":50}"));
    assert_non_null(strstr(json, "\"peak_gbytes_per_s\":80,"));
    free(json);
    rm_tree(dir);
    summary_free(&s);

    /* All steps: step 2 adds 10 ms and a 1 ms matmul. */
    assert_int_equal(summary_compute(t, -1, -1, 0.0, 0, &s), 0);
    assert_int_equal(s.num_steps, 3);
    assert_float_equal(s.step_ms, 30.0, 1e-9);
    assert_float_equal(find_row(&s, "matmul", "")->total_ms, 6.0, 1e-9);
    assert_float_equal(find_row(&s, "matmul", "")->pct_peak, 0.0, 0);
    summary_free(&s);
    trace_destroy(t);
}

/* ---- atomic_file ------------------------------------------------------------------------ */

static int failing_writer(FILE *f, void *ctx, char *err, size_t errlen) {
    (void)ctx;
    fputs("partial", f);
    snprintf(err, errlen, "writer gave up");
    return -1;
}

static void test_atomic_file(void **state) {
    (void)state;
    char dir[256], path[300], err[512] = "";
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    assert_int_equal(atomic_write_file(path, "old", 3, err, sizeof err), 0);
    assert_int_equal(atomic_write_file(path, "newer", 5, err, sizeof err), 0);
    size_t n;
    uint8_t *d = read_all(path, &n);
    assert_int_equal(n, 5);
    assert_memory_equal(d, "newer", 5);
    free(d);

    /* A writer that fails leaves the old file and no temp. */
    assert_int_equal(atomic_write_with(path, failing_writer, NULL, err, sizeof err), -1);
    assert_string_equal(err, "writer gave up");
    d = read_all(path, &n);
    assert_memory_equal(d, "newer", 5);
    free(d);
    assert_int_equal(count_entries(dir, ".tmp."), 0);

    /* rename onto a directory fails (even as root): the temp must be gone. */
    char sub[320];
    snprintf(sub, sizeof sub, "%s/adir", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    err[0] = 0;
    assert_int_equal(atomic_write_file(sub, "x", 1, err, sizeof err), -1);
    assert_true(strlen(err) > 0);
    assert_int_equal(count_entries(dir, ".tmp."), 0);

    /* A missing directory: an error naming the path, nothing created. */
    char missing[340];
    snprintf(missing, sizeof missing, "%s/no/such/dir/f", dir);
    err[0] = 0;
    assert_int_equal(atomic_write_file(missing, "x", 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "no/such/dir"));

    /* A read-only directory (only meaningful when not root: root ignores the mode). */
    char ro[320], rof[340];
    snprintf(ro, sizeof ro, "%s/ro", dir);
    snprintf(rof, sizeof rof, "%s/f", ro);
    assert_int_equal(mkdir(ro, 0555), 0);
    if (geteuid() != 0) {
        assert_int_equal(atomic_write_file(rof, "x", 1, err, sizeof err), -1);
        assert_int_equal(count_entries(ro, ""), 2);   /* "." and ".." only */
    }
    chmod(ro, 0755);
    rm_tree(dir);
}

/* A writer of 100 MiB + 3 bytes in pieces (one call for 1 byte, one for 96 MiB + 1, one for the
 * rest) writes the same bytes as fwrite, and drops from the page cache what lies 64 MiB or more
 * behind its last byte; where the filesystem keeps files in memory (tmpfs) nothing can be
 * dropped and only the bytes are checked. */
typedef struct { const uint8_t *data; size_t parts[3]; } through_t;

static int through_writer(FILE *f, void *ctx, char *err, size_t errlen) {
    (void)err, (void)errlen;
    const through_t *t = ctx;
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        if (atomic_file_write_through(f, t->data + at, t->parts[i]) != 0) return -1;
        at += t->parts[i];
    }
    return 0;
}

static void test_atomic_file_write_through(void **state) {
    (void)state;
    char dir[256], path[300], err[512] = "";
    make_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/big.bin", dir);
    const size_t mib = 1u << 20, n = 100 * mib + 3;
    uint8_t *data = malloc(n);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 2654435761u >> 13);
    through_t t = {data, {1, 96 * mib + 1, 4 * mib + 1}};
    assert_int_equal(atomic_write_with(path, through_writer, &t, err, sizeof err), 0);
    size_t got;
    uint8_t *back = read_all(path, &got);
    assert_int_equal(got, n);
    assert_memory_equal(back, data, n);
    free(back); /* read_all brought every page back: write it again to see what the writer leaves */
    assert_int_equal(atomic_write_with(path, through_writer, &t, err, sizeof err), 0);
    struct statfs fs;
    assert_int_equal(statfs(dir, &fs), 0);
    if (fs.f_type != TMPFS_MAGIC) {
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        void *map = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(map != MAP_FAILED);
        long page = sysconf(_SC_PAGESIZE);
        size_t behind = 32 * mib / (size_t)page, resident = 0; /* the first 32 MiB: well behind */
        unsigned char *vec = malloc(behind);
        assert_int_equal(mincore(map, behind * (size_t)page, vec), 0);
        for (size_t i = 0; i < behind; i++) resident += vec[i] & 1;
        assert_true(resident < behind / 10);
        free(vec);
        munmap(map, n);
        close(fd);
    }
    free(data);
    rm_tree(dir);
}

static void test_mkdir_p(void **state) {
    (void)state;
    char dir[256], p[400], f[300], err[64];
    make_tmpdir(dir, sizeof dir);
    snprintf(p, sizeof p, "%s/a/b//c/", dir);
    assert_int_equal(mkdir_p(p), 0);
    assert_int_equal(mkdir_p(p), 0);                 /* exists: fine */
    struct stat st;
    snprintf(p, sizeof p, "%s/a/b/c", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    snprintf(f, sizeof f, "%s/file", dir);
    assert_int_equal(atomic_write_file(f, "x", 1, err, sizeof err), 0);
    snprintf(p, sizeof p, "%s/file/sub", dir);
    assert_int_equal(mkdir_p(p), -1);                /* a file is in the way */
    assert_int_equal(errno, ENOTDIR);
    rm_tree(dir);
}

/* ---- sample profile for the reader tests ------------------------------------------------ */

typedef struct {
    trace_t *t;
    uint32_t train, fwd, bwd, opt, layer_f[2], layer_b[2], qkv, attn, o_proj, mlp, norm, xent,
        embed, worker, data, wait;
} sample_names_t;

static void sample_intern(sample_names_t *s) {
    trace_t *t = s->t;
    s->train = trace_intern(t, "train", TRACE_CAT_STEP, NULL);
    s->fwd = trace_intern(t, "forward", TRACE_CAT_PHASE, NULL);
    s->bwd = trace_intern(t, "backward", TRACE_CAT_PHASE, NULL);
    s->opt = trace_intern(t, "adamw_update", TRACE_CAT_OPTIMIZER, "optimizer");
    s->layer_f[0] = trace_intern(t, "layer0/forward", TRACE_CAT_LAYER, NULL);
    s->layer_f[1] = trace_intern(t, "layer1/forward", TRACE_CAT_LAYER, NULL);
    s->layer_b[0] = trace_intern(t, "layer0/backward", TRACE_CAT_LAYER, NULL);
    s->layer_b[1] = trace_intern(t, "layer1/backward", TRACE_CAT_LAYER, NULL);
    s->qkv = trace_intern(t, "matmul qkv_proj", TRACE_CAT_MATMUL, "attention");
    s->attn = trace_intern(t, "flash_attention", TRACE_CAT_ATTENTION, "attention");
    s->o_proj = trace_intern(t, "matmul o_proj", TRACE_CAT_MATMUL, "attention");
    s->mlp = trace_intern(t, "matmul gate_up_down", TRACE_CAT_MATMUL, "mlp");
    s->norm = trace_intern(t, "rmsnorm", TRACE_CAT_NORM, "norms");
    s->xent = trace_intern(t, "cross_entropy", TRACE_CAT_XENT, "lm_head");
    s->embed = trace_intern(t, "embed", TRACE_CAT_EMBED, "embed");
    s->worker = trace_intern(t, "matmul gate_up_down chunk", TRACE_CAT_MATMUL, "mlp");
    s->data = trace_intern(t, "data/produce", TRACE_CAT_DATA, NULL);
    s->wait = trace_intern(t, "data wait", TRACE_CAT_DATA, "data");
}

/* One layer's ops from *at on the master lane (and a worker chunk on lane 1); advances *at. */
static void sample_layer(sample_names_t *s, uint32_t layer, int64_t *at, int64_t us) {
    trace_t *t = s->t;
    int64_t b = *at;
    const uint32_t ops[] = {s->norm, s->qkv, s->attn, s->o_proj, s->norm, s->mlp};
    const int64_t durs[] = {20, 120, 200, 60, 20, 300};
    const double flops[] = {0, 1.2e8, 1.6e8, 4e7, 0, 3.6e8};
    int64_t c = b + 5 * us;
    for (size_t i = 0; i < 6; i++) {
        trace_record(t, 0, ops[i], c, c + durs[i] * us, -1, flops[i], 0);
        if (ops[i] == s->mlp) trace_record(t, 1, s->worker, c + 5 * us, c + (durs[i] - 5) * us, -1, 0, 0);
        c += durs[i] * us + 3 * us;
    }
    trace_record(t, 0, layer, b, c + 5 * us, -1, 0, 0);
    *at = c + 10 * us;
}

static void sample_step(sample_names_t *s, int step, int64_t b, int64_t us) {
    trace_t *t = s->t;
    int64_t at = b + 50 * us;
    trace_record(t, 0, s->wait, b + 10 * us, b + 40 * us, -1, 0, 0);
    int64_t f0 = at;
    trace_record(t, 0, s->embed, at + 5 * us, at + 25 * us, -1, 0, 0);
    at += 30 * us;
    for (int l = 0; l < 2; l++) sample_layer(s, s->layer_f[l], &at, us);
    trace_record(t, 0, s->xent, at, at + 150 * us, -1, 1.5e8, 0);
    at += 160 * us;
    trace_record(t, 0, s->fwd, f0, at, -1, 0, 0);
    int64_t b0 = at + 10 * us;
    at = b0 + 5 * us;
    for (int l = 1; l >= 0; l--) sample_layer(s, s->layer_b[l], &at, 2 * us);
    trace_record(t, 0, s->bwd, b0, at, -1, 0, 0);
    trace_record(t, 0, s->opt, at + 10 * us, at + 110 * us, -1, 2e7, 0);
    at += 130 * us;
    trace_record(t, 0, s->train, b, at, step, 0, 0);
    trace_record(t, 2, s->data, b + 200 * us, b + 900 * us, -1, 0, 0);   /* prefetching the next batch */
}

static void write_sample_tb(const char *dir) {
    char tb[4200], err[512];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    tfevents_t *w;
    assert_int_equal(tfevents_open_at(&w, tb, "testhost", 1767225600.0, err, sizeof err), 0);
    for (int step = 0; step < 4; step++) {
        const char *tags[] = {"learning/loss", "perf/step_time_seconds"};
        const float vals[] = {10.0f - (float)step, 0.25f};
        assert_int_equal(tfevents_write_scalars(w, step, 1767225601.0 + step, 2, tags, vals), 0);
    }
    assert_int_equal(tfevents_close(w), 0);
}

static void test_sample_profile(void **state) {
    (void)state;
    const char *dir = getenv("STEPSCOPE_SAMPLE_DIR");
    if (!dir || !dir[0]) skip();
    sample_names_t s = {.t = trace_create(3, 4096)};
    assert_non_null(s.t);
    trace_set_lane(s.t, 0, "compute0", 4101);
    trace_set_lane(s.t, 1, "compute1", 4102);
    trace_set_lane(s.t, 2, "data_loader", 4103);
    sample_intern(&s);
    const int64_t us = 1000, base = 5000000000LL;
    for (int step = 0; step < 4; step++) sample_step(&s, step, base + step * 10000 * us, us);
    s.t->wall_minus_mono_ns = 1767225600LL * 1000000000LL - base;
    char run[4200], path[4300], err[4400];
    snprintf(run, sizeof run, "%s/plugins/profile/2026_01_01_00_00_00", dir);
    assert_int_equal(mkdir_p(run), 0);
    snprintf(path, sizeof path, "%s/testhost.xplane.pb", run);
    const xplane_buffer_t buffers[] = {{"parameters", 4000000, XPLANE_DT_FLOAT, "persist"},
                                       {"bf16 weights", 2000000, XPLANE_DT_BFLOAT16, "persist"},
                                       {"scratch", 1000000, XPLANE_DT_MIXED, "temp"}};
    const xplane_memory_t memory = {.allocator = "stepscope memory plan", .buffers = buffers, .count = 3,
                                    .capacity_bytes = 10000000};
    assert_int_equal(xplane_write(s.t, path, "testhost", 0, 3, &memory, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/testhost.trace.json.gz", run);
    assert_int_equal(chrome_trace_write(s.t, path, err, sizeof err), 0);
    summary_t sum;
    assert_int_equal(summary_compute(s.t, 0, 3, 1000.0, 0, &sum), 0);
    snprintf(path, sizeof path, "%s/op_summary.json", dir);
    assert_int_equal(summary_write_json(&sum, path, err, sizeof err), 0);
    summary_print(&sum, stdout);
    summary_free(&sum);
    write_sample_tb(dir);
    trace_destroy(s.t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_pb_varint_and_nesting),
        cmocka_unit_test(test_tfevents_vectors),
        cmocka_unit_test(test_tfevents_file),
        cmocka_unit_test(test_tfevents_open_fails_cleanly),
        cmocka_unit_test(test_trace_drops_when_full),
        cmocka_unit_test(test_xspace_vector),
        cmocka_unit_test(test_xplane_write_atomic),
        cmocka_unit_test(test_xplane_window_and_flops),
        cmocka_unit_test(test_xplane_bytes_accessed),
        cmocka_unit_test(test_xplane_framework_ops),
        cmocka_unit_test(test_xplane_memory_plan),
        cmocka_unit_test(test_chrome_trace),
        cmocka_unit_test(test_summary_arithmetic),
        cmocka_unit_test(test_summary_notes_rows_past_the_reference),
        cmocka_unit_test(test_summary_note_rules_out_the_caches_for_big_calls),
        cmocka_unit_test(test_summary_spread_weighted_by_flops),
        cmocka_unit_test(test_atomic_file),
        cmocka_unit_test(test_atomic_file_write_through),
        cmocka_unit_test(test_mkdir_p),
        cmocka_unit_test(test_sample_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
