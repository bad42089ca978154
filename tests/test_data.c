/* test_data: the synthetic and tokens sources (exact batch contents, refusals with their
 * messages) and the prefetch ring (the wait is reported, the producer runs ahead, close
 * is prompt, spans land on the data lane). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"

static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/test_data_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int remove_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {}
}

static data_options_t synthetic_opts(int64_t vocab, int64_t S, int64_t global_batch, uint64_t seed) {
    return (data_options_t){.dataset_type = "synthetic", .vocab_size = vocab, .seq_len = S,
                            .global_batch = global_batch, .row_offset = 0,
                            .local_batch = global_batch, .seed = seed, .depth = 2};
}

static int32_t *fill(const data_options_t *o, int64_t step) {
    int32_t *out = malloc((size_t)o->local_batch * (size_t)(o->seq_len + 1) * sizeof(int32_t));
    assert_non_null(out);
    char err[512] = "";
    int rc = data_fill_batch(o, step, out, err, sizeof err);
    if (rc) fail_msg("data_fill_batch: %s", err);
    return out;
}

static size_t batch_elems(const data_options_t *o) {
    return (size_t)o->local_batch * (size_t)(o->seq_len + 1);
}

/* ---- synthetic ---- */

static void test_synthetic_deterministic(void **state) {
    (void)state;
    data_options_t o = synthetic_opts(151936, 63, 4, 1234);
    int32_t *a = fill(&o, 0), *b = fill(&o, 0);
    assert_memory_equal(a, b, batch_elems(&o) * sizeof(int32_t));
    o.seed = 1235;
    int32_t *c = fill(&o, 0);
    size_t same = 0;
    for (size_t i = 0; i < batch_elems(&o); i++) same += a[i] == c[i];
    /* independent uniform ids over 151936 values: a coincidence is ~1e-5 per position */
    assert_true(same <= 2);
    free(a), free(b), free(c);
}

static void test_synthetic_range_and_uniform(void **state) {
    (void)state;
    /* chi-square over V=256 bins with 65536 ids (256 expected per bin): 255 degrees of
     * freedom, mean 255, sd sqrt(2*255) = 22.6. The generator is deterministic so this
     * cannot flake; [255-6sd, 255+6sd] = [120, 390] fails only for a real bias. */
    enum { V = 256 };
    for (uint64_t seed = 0; seed < 3; seed++) {
        data_options_t o = synthetic_opts(V, 1023, 64, seed);
        int32_t *ids = fill(&o, 0);
        size_t n = batch_elems(&o);
        double count[V] = {0};
        for (size_t i = 0; i < n; i++) {
            assert_true(ids[i] >= 0 && ids[i] < V);
            count[ids[i]] += 1;
        }
        double expect = (double)n / V, chi2 = 0;
        for (int v = 0; v < V; v++) chi2 += (count[v] - expect) * (count[v] - expect) / expect;
        if (chi2 < 120 || chi2 > 390) fail_msg("seed %d: chi2 %.1f outside [120, 390]", (int)seed, chi2);
        free(ids);
    }
    /* modulo bias check: V = 1.5 * 2^30, so 2^32 = 2V + 2^30. `x % V` would put ids below
     * 2^30 at 3/4 of the mass; unbiased they are 2^30/V = 2/3. 65536 draws give sd 0.0018. */
    data_options_t o = synthetic_opts((int64_t)3 << 29, 1023, 64, 7);
    int32_t *ids = fill(&o, 0);
    size_t n = batch_elems(&o), low = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(ids[i] >= 0 && (int64_t)ids[i] < o.vocab_size);
        low += ids[i] < (1 << 30);
    }
    double frac = (double)low / (double)n;
    if (frac < 2.0 / 3 - 0.012 || frac > 2.0 / 3 + 0.012) fail_msg("fraction below 2^30: %.4f, want 0.6667", frac);
    free(ids);
    /* the largest vocab ids fit in int32: every id in [0, 2^31) */
    o = synthetic_opts((int64_t)1 << 31, 255, 4, 9);
    ids = fill(&o, 0);
    for (size_t i = 0; i < batch_elems(&o); i++) assert_true(ids[i] >= 0);
    free(ids);
    /* vocab 1: every id is 0 */
    o = synthetic_opts(1, 15, 2, 9);
    ids = fill(&o, 0);
    for (size_t i = 0; i < batch_elems(&o); i++) assert_int_equal(ids[i], 0);
    free(ids);
}

static void test_synthetic_row_offset(void **state) {
    (void)state;
    data_options_t whole = synthetic_opts(1000, 31, 4, 42);
    int32_t *all = fill(&whole, 0);
    size_t S1 = 32;
    for (int rank = 0; rank < 2; rank++) {
        data_options_t part = whole;
        part.local_batch = 2;
        part.row_offset = 2 * rank;
        int32_t *mine = fill(&part, 0);
        assert_memory_equal(mine, all + (size_t)rank * 2 * S1, 2 * S1 * sizeof(int32_t));
        free(mine);
    }
    /* and rows differ from each other (rows are not one stream repeated) */
    assert_memory_not_equal(all, all + S1, S1 * sizeof(int32_t));
    free(all);
}

static void test_synthetic_same_every_step(void **state) {
    (void)state;
    data_options_t o = synthetic_opts(5000, 127, 3, 3);
    int32_t *ref = fill(&o, 0);
    for (int64_t step = 1; step < 40; step += 13) {
        int32_t *b = fill(&o, step);
        assert_memory_equal(ref, b, batch_elems(&o) * sizeof(int32_t));
        free(b);
    }
    /* the producer hands out the same batch */
    data_source_t *d;
    char err[512];
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    for (int64_t step = 0; step < 5; step++) {
        double w;
        const int32_t *b = data_next(d, step, &w);
        assert_memory_equal(ref, b, batch_elems(&o) * sizeof(int32_t));
        data_release(d, step);
    }
    data_close(d);
    free(ref);
}

/* ---- tokens ---- */

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_ids(const char *path, const uint32_t *ids, size_t n) {
    uint32_t *le = malloc((n ? n : 1) * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) le[i] = htole32(ids[i]);
    write_bytes(path, le, n * sizeof(uint32_t));
    free(le);
}

static data_options_t tokens_opts(const char *path, int64_t vocab, int64_t S, int64_t global_batch) {
    return (data_options_t){.dataset_type = "tokens", .dataset_path = path, .vocab_size = vocab,
                            .seq_len = S, .global_batch = global_batch, .row_offset = 0,
                            .local_batch = global_batch, .depth = 2};
}

static void expect_refused(const data_options_t *o, const char *const *substrings);

static void test_tokens_windows(void **state) {
    (void)state;
    /* N = 23 ids 100..122, S = 4: W = floor(22/4) = 5 windows, window w = ids[4w .. 4w+4].
     * Global batch 3: step i row b reads window (3i + b) mod 5. */
    enum { N = 23, S = 4, GB = 3, W = 5 };
    uint32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = 100 + (uint32_t)i;
    char path[300];
    snprintf(path, sizeof path, "%s/windows.bin", g_dir);
    write_ids(path, ids, N);
    data_options_t o = tokens_opts(path, 1000, S, GB);
    /* spelled out for the first steps: step 1 = windows 3, 4, 0 (wraps), step 2 = 1, 2, 3 */
    static const int expect_windows[3][GB] = {{0, 1, 2}, {3, 4, 0}, {1, 2, 3}};
    for (int64_t step = 0; step < 7; step++) {
        int32_t *b = fill(&o, step);
        for (int r = 0; r < GB; r++) {
            int w = (int)((step * GB + r) % W);
            if (step < 3) assert_int_equal(w, expect_windows[step][r]);
            for (int j = 0; j <= S; j++) assert_int_equal(b[r * (S + 1) + j], 100 + w * S + j);
        }
        free(b);
    }
    /* the last window ends on the last usable id: window 4 is ids [16, 20]; 21, 22 unused */
    int32_t *b = fill(&o, 1);
    assert_int_equal(b[1 * (S + 1) + S], 120);
    free(b);
    /* a rank with rows 1..2 of the global batch */
    data_options_t part = o;
    part.row_offset = 1;
    part.local_batch = 2;
    for (int64_t step = 0; step < 6; step++) {
        int32_t *whole = fill(&o, step), *mine = fill(&part, step);
        assert_memory_equal(mine, whole + (S + 1), 2 * (S + 1) * sizeof(int32_t));
        free(whole), free(mine);
    }
    /* the producer hands out the same batches, through a ring smaller than the run */
    data_source_t *d;
    char err[512];
    o.depth = 2;
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    for (int64_t step = 0; step < 9; step++) {
        double w;
        const int32_t *got = data_next(d, step, &w);
        int32_t *ref = fill(&o, step);
        assert_memory_equal(got, ref, batch_elems(&o) * sizeof(int32_t));
        free(ref);
        data_release(d, step);
    }
    data_close(d);
    /* a pass over the data (cycle = -1): 5 windows make 1 whole batch of 3 (windows 3 and 4
     * left out), and every step reads it, from any first batch that is a multiple of the cycle */
    o.cycle = -1;
    o.first_batch = 0;
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    assert_int_equal(data_whole_batches(d), 1);
    int32_t *first = fill(&o, 0);
    for (int64_t step = 0; step < 4; step++) {
        double w;
        assert_memory_equal(data_next(d, step, &w), first, batch_elems(&o) * sizeof(int32_t));
        data_release(d, step);
    }
    data_close(d);
    free(first);
    o.global_batch = o.local_batch = 2; /* 2 whole batches: windows 0-1, 2-3 */
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    assert_int_equal(data_whole_batches(d), 2);
    for (int64_t step = 0; step < 5; step++) {
        double w;
        int32_t *ref = fill(&o, step % 2);
        assert_memory_equal(data_next(d, step, &w), ref, batch_elems(&o) * sizeof(int32_t));
        free(ref);
        data_release(d, step);
    }
    data_close(d);
    o.global_batch = o.local_batch = 6; /* more rows than windows: no whole batch */
    const char *const fewer[] = {"fewer windows of 4 + 1 ids than one batch of 6", NULL};
    expect_refused(&o, fewer);
    o = tokens_opts(path, 1000, S, GB);
    /* an exact fit: N = S+1 is one window, every row reads it */
    snprintf(path, sizeof path, "%s/one_window.bin", g_dir);
    write_ids(path, ids, S + 1);
    o = tokens_opts(path, 1000, S, 2);
    b = fill(&o, 5);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j <= S; j++) assert_int_equal(b[r * (S + 1) + j], 100 + j);
    free(b);
}

static void expect_refused(const data_options_t *o, const char *const *substrings) {
    char err[512] = "";
    data_source_t *d = (data_source_t *)0x1;
    int rc = data_open(&d, o, err, sizeof err);
    assert_int_not_equal(rc, 0);
    assert_null(d);
    assert_null(strchr(err, '\n')); /* one line */
    for (const char *const *s = substrings; *s; s++)
        if (!strstr(err, *s)) fail_msg("message lacks \"%s\": %s", *s, err);
}

static void test_tokens_refused(void **state) {
    (void)state;
    char path[300];
    uint32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = (uint32_t)i;

    snprintf(path, sizeof path, "%s/missing.bin", g_dir);
    data_options_t o = tokens_opts(path, 1000, 4, 1);
    expect_refused(&o, (const char *[]){path, "cannot open", "No such file", "dataset_path", NULL});

    expect_refused(&(data_options_t){.dataset_type = "tokens", .dataset_path = g_dir, .vocab_size = 1000,
                                     .seq_len = 4, .global_batch = 1, .local_batch = 1, .depth = 1},
                   (const char *[]){g_dir, "not a regular file", NULL});

    snprintf(path, sizeof path, "%s/empty.bin", g_dir);
    write_bytes(path, "", 0);
    expect_refused(&o, (const char *[]){path, "is empty", "dataset_path", NULL});

    snprintf(path, sizeof path, "%s/odd.bin", g_dir);
    write_bytes(path, ids, 4 * 5 + 3);
    expect_refused(&o, (const char *[]){path, "23 bytes", "multiple of 4", NULL});

    snprintf(path, sizeof path, "%s/short.bin", g_dir);
    write_ids(path, ids, 6);
    o.seq_len = 8; /* needs 9 */
    expect_refused(&o, (const char *[]){path, "has 6 tokens", "needs 9", "smaller max_target_length", NULL});

    snprintf(path, sizeof path, "%s/badid.bin", g_dir);
    ids[11] = 1000;
    ids[13] = 5000;
    write_ids(path, ids, 16);
    o.seq_len = 4;
    expect_refused(&o, (const char *[]){path, "id 1000", "index 11", "vocab_size 1000", NULL});
    o.vocab_size = 1001; /* now only the 5000 at index 13 is out of range */
    expect_refused(&o, (const char *[]){"id 5000", "index 13", "vocab_size 1001", NULL});
    o.vocab_size = 5001;
    data_source_t *d;
    char err[512];
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    data_close(d);

    o.dataset_path = "";
    expect_refused(&o, (const char *[]){"dataset_path is empty", NULL});
}

static void test_tokens_large_scan(void **state) {
    (void)state;
    /* big enough for the threaded scan; the first bad id must still be the reported one,
     * whichever thread finds which */
    size_t n = (size_t)3 << 20;
    uint32_t *ids = malloc(n * sizeof(uint32_t));
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)(i * 2654435761u % 50000);
    char path[300];
    snprintf(path, sizeof path, "%s/large.bin", g_dir);
    write_ids(path, ids, n);
    data_options_t o = tokens_opts(path, 50000, 1024, 4);
    data_source_t *d;
    char err[512];
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    double w;
    const int32_t *b = data_next(d, 0, &w);
    assert_int_equal(b[5], (int32_t)ids[5]);
    data_release(d, 0);
    data_close(d);

    ids[2900001] = 60000;
    ids[1700003] = 50000;
    ids[n - 1] = 70000;
    write_ids(path, ids, n);
    expect_refused(&o, (const char *[]){"id 50000", "index 1700003", "vocab_size 50000", NULL});
    free(ids);
}

static void test_options_refused(void **state) {
    (void)state;
    data_options_t o = synthetic_opts(1000, 8, 4, 0);
    o.dataset_type = "hf";
    expect_refused(&o, (const char *[]){"'hf'", "synthetic", "tokens", NULL});
    o = synthetic_opts(1000, 8, 4, 0);
    o.row_offset = 3;
    o.local_batch = 2;
    expect_refused(&o, (const char *[]){"rows [3, 5)", "global batch of 4", NULL});
    o = synthetic_opts(1000, 8, 4, 0);
    o.depth = 0;
    expect_refused(&o, (const char *[]){"prefetch_depth", NULL});
    o = synthetic_opts(0, 8, 4, 0);
    expect_refused(&o, (const char *[]){"vocab_size 0", NULL});
    o = synthetic_opts(1000, 0, 4, 0);
    expect_refused(&o, (const char *[]){"max_target_length", NULL});
}

/* ---- prefetch ---- */

static void test_prefetch_wait_visible(void **state) {
    (void)state;
    /* 50 ms to make each batch, a consumer that needs no time: every step waits for the
     * producer, and the wait must be reported, not hidden */
    data_options_t o = synthetic_opts(1000, 63, 2, 1);
    o.delay_ms = 50;
    data_source_t *d;
    char err[512];
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    double total = 0, t0 = now_s();
    for (int64_t step = 0; step < 5; step++) {
        double w = -1;
        data_next(d, step, &w);
        assert_true(w >= 0);
        if (step > 0 && w < 0.040) fail_msg("step %d waited %.1f ms, want ~50", (int)step, w * 1e3);
        total += w;
        data_release(d, step);
    }
    double elapsed = now_s() - t0;
    data_close(d);
    if (total < 4 * 0.050 - 0.020) fail_msg("total wait %.1f ms, want >= 180", total * 1e3);
    assert_true(total <= elapsed + 1e-3);
}

static void test_prefetch_runs_ahead(void **state) {
    (void)state;
    /* no delay, 20 ms of "compute" per step: after the first batch the producer is ahead */
    data_options_t o = synthetic_opts(1000, 255, 4, 1);
    data_source_t *d;
    char err[512];
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    for (int64_t step = 0; step < 6; step++) {
        double w = -1;
        const int32_t *b = data_next(d, step, &w);
        assert_non_null(b);
        if (step > 0 && w > 0.005) fail_msg("step %d waited %.2f ms with the producer ahead", (int)step, w * 1e3);
        sleep_ms(20);
        data_release(d, step);
    }
    data_close(d);
}

static void test_close_prompt(void **state) {
    (void)state;
    data_options_t o = synthetic_opts(1000, 15, 2, 1);
    data_source_t *d;
    char err[512];
    /* producer blocked on a full ring (depth 1, the consumer holds the only slot) */
    o.depth = 1;
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    double w;
    data_next(d, 0, &w);
    sleep_ms(30);
    double t0 = now_s();
    data_close(d);
    double took = now_s() - t0;
    if (took > 0.2) fail_msg("close took %.1f ms with the producer blocked", took * 1e3);
    /* a full ring nobody consumes */
    o.depth = 3;
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    sleep_ms(30);
    t0 = now_s();
    data_close(d);
    took = now_s() - t0;
    if (took > 0.2) fail_msg("close took %.1f ms with the ring full", took * 1e3);
    /* producer in the middle of a long delay */
    o.delay_ms = 10000;
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    sleep_ms(30);
    t0 = now_s();
    data_close(d);
    took = now_s() - t0;
    if (took > 0.2) fail_msg("close took %.1f ms with the producer sleeping", took * 1e3);
    data_close(NULL);
}

static void test_trace_spans(void **state) {
    (void)state;
    trace_t *t = trace_create(3, 64);
    assert_non_null(t);
    t->recording = true;
    data_options_t o = synthetic_opts(1000, 15, 2, 1);
    o.trace = t;
    o.trace_lane = 2;
    o.delay_ms = 2;
    data_source_t *d;
    char err[512];
    assert_int_equal(data_open(&d, &o, err, sizeof err), 0);
    for (int64_t step = 0; step < 4; step++) {
        double w;
        data_next(d, step, &w);
        data_release(d, step);
    }
    data_close(d); /* joins the producer: its spans are visible now */
    uint32_t id = trace_intern(t, "data/produce", TRACE_CAT_DATA, NULL);
    assert_int_equal(t->names[id].category, TRACE_CAT_DATA);
    const trace_lane_t *lane = &t->lanes[2];
    assert_string_equal(lane->name, "data");
    assert_true(lane->tid > 0 && lane->tid != (int64_t)getpid());
    assert_true(lane->count >= 4);
    for (size_t i = 0; i < lane->count; i++) {
        assert_int_equal(lane->events[i].name_id, id);
        /* each span covers the 2 ms delay */
        assert_true(lane->events[i].end_ns - lane->events[i].start_ns >= 1900000);
    }
    assert_int_equal(t->lanes[0].count, 0);
    trace_destroy(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_deterministic),
        cmocka_unit_test(test_synthetic_range_and_uniform),
        cmocka_unit_test(test_synthetic_row_offset),
        cmocka_unit_test(test_synthetic_same_every_step),
        cmocka_unit_test(test_tokens_windows),
        cmocka_unit_test(test_tokens_refused),
        cmocka_unit_test(test_tokens_large_scan),
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_prefetch_wait_visible),
        cmocka_unit_test(test_prefetch_runs_ahead),
        cmocka_unit_test(test_close_prompt),
        cmocka_unit_test(test_trace_spans),
    };
    return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
