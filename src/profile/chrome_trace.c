/* chrome_trace: gzipped Chrome Trace Event JSON, see chrome_trace.h. The JSON is produced
 * in 64 KiB pieces and deflated straight into the temp file, so a large trace never sits in
 * memory whole. */
#include "profile/chrome_trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "util/atomic_file.h"

enum { STAGE_BYTES = 64 * 1024, OUT_BYTES = 64 * 1024 };

typedef struct {
    const trace_t *t;
    int64_t base_ns;         /* earliest event: ts 0.000 */
    FILE *f;
    z_stream z;
    char stage[STAGE_BYTES]; /* JSON text waiting to be deflated */
    size_t staged;
    unsigned char out[OUT_BYTES];
    bool failed;
    char *err;
    size_t errlen;
} jw_t;

/* Deflate the staged text (flush = Z_FINISH at the end) and write what comes out. */
static void jw_deflate(jw_t *w, int flush) {
    w->z.next_in = (unsigned char *)w->stage;
    w->z.avail_in = (uInt)w->staged;
    int rc;
    do {
        w->z.next_out = w->out;
        w->z.avail_out = OUT_BYTES;
        rc = deflate(&w->z, flush);
        size_t have = OUT_BYTES - w->z.avail_out;
        if (rc == Z_STREAM_ERROR || (have && fwrite(w->out, 1, have, w->f) != have)) {
            if (!w->failed) snprintf(w->err, w->errlen, "chrome trace: write failed: %s", strerror(errno));
            w->failed = true;
            return;
        }
    } while (w->z.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
    w->staged = 0;
}

static void jw_puts(jw_t *w, const char *s, size_t n) {
    while (n && !w->failed) {
        if (w->staged == STAGE_BYTES) jw_deflate(w, Z_NO_FLUSH);
        size_t k = STAGE_BYTES - w->staged < n ? STAGE_BYTES - w->staged : n;
        memcpy(w->stage + w->staged, s, k);
        w->staged += k;
        s += k;
        n -= k;
    }
}

__attribute__((format(printf, 2, 3)))
static void jw_printf(jw_t *w, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    jw_puts(w, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal: quotes, backslashes and control bytes escaped; UTF-8 passes through. */
static void jw_string(jw_t *w, const char *s) {
    jw_puts(w, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            jw_puts(w, e, 2);
        } else if (c < 0x20) {
            jw_printf(w, "\\u%04x", c);
        } else {
            jw_puts(w, (const char *)&c, 1);
        }
    }
    jw_puts(w, "\"", 1);
}

/* Microseconds with exactly 3 decimals, from integer ns: no float rounding. */
static void jw_us(jw_t *w, int64_t ns) {
    if (ns < 0) ns = 0;
    jw_printf(w, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

static void write_metadata(jw_t *w) {
    jw_printf(w, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"stepscope (host)\"}}");
    for (size_t l = 0; l < w->t->num_lanes; l++) {
        const trace_lane_t *L = &w->t->lanes[l];
        if (trace_lane_count(L) == 0) continue;
        jw_printf(w, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%lld,\"args\":{\"name\":",
                  (long long)L->tid);
        jw_string(w, L->name);
        jw_puts(w, "}}", 2);
        jw_printf(w, ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%lld,"
                     "\"args\":{\"sort_index\":%zu}}", (long long)L->tid, l);
    }
}

static void write_event(jw_t *w, const trace_lane_t *L, const trace_event_t *e) {
    const trace_name_t *n = &w->t->names[e->name_id];
    jw_puts(w, ",\n{\"name\":", 10);
    jw_string(w, n->name);
    jw_printf(w, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":%lld,\"ts\":",
              trace_category_name(n->category), (long long)L->tid);
    jw_us(w, e->start_ns - w->base_ns);
    jw_puts(w, ",\"dur\":", 7);
    jw_us(w, e->end_ns - e->start_ns);
    if (trace_is_root_step(w->t, e))
        jw_printf(w, ",\"args\":{\"step_num\":%lld}", (long long)e->step_num);
    else if (e->flops > 0 && e->bytes > 0)
        jw_printf(w, ",\"args\":{\"flops\":%.17g,\"bytes_accessed\":%.17g}", e->flops, e->bytes);
    else if (e->flops > 0)
        jw_printf(w, ",\"args\":{\"flops\":%.17g}", e->flops);
    else if (e->bytes > 0)
        jw_printf(w, ",\"args\":{\"bytes_accessed\":%.17g}", e->bytes);
    jw_puts(w, "}", 1);
}

/* Two counter tracks over the compute lane's kernels (trace_rate_samples): each kernel's GFLOP/s
 * and GB/s while it runs, 0 between kernels, so Perfetto draws where the step is near the cores'
 * limit and where near the bus's. False on OOM. */
static bool write_rate_counters(jw_t *w) {
    size_t n;
    trace_rate_sample_t *samples = trace_rate_samples(w->t, false, 0, 0, &n);
    if (!samples) return false;
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < TRACE_RATE_COUNT; c++) {
            jw_printf(w, ",\n{\"name\":\"%s\",\"ph\":\"C\",\"pid\":1,\"ts\":", TRACE_RATE_COUNTERS[c]);
            jw_us(w, samples[i].ns - w->base_ns);
            jw_printf(w, ",\"args\":{\"%s\":%.6g}}", TRACE_RATE_SERIES[c], samples[i].value[c]);
        }
    free(samples);
    return true;
}

static int64_t earliest_start(const trace_t *t) {
    int64_t base = INT64_MAX;
    for (size_t l = 0; l < t->num_lanes; l++)
        for (size_t i = 0, n = trace_lane_count(&t->lanes[l]); i < n; i++)
            if (t->lanes[l].events[i].start_ns < base) base = t->lanes[l].events[i].start_ns;
    return base == INT64_MAX ? 0 : base;
}

/* atomic_write_with callback: the whole gzip stream into the temp file. */
static int write_gz(FILE *f, void *ctx, char *err, size_t errlen) {
    jw_t *w = ctx;
    w->f = f;
    w->err = err;
    w->errlen = errlen;
    /* windowBits 15 + 16: a gzip wrapper, one member. */
    if (deflateInit2(&w->z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        snprintf(err, errlen, "chrome trace: deflateInit2 failed");
        return -1;
    }
    jw_puts(w, "{\"traceEvents\":[\n", 17);
    write_metadata(w);
    for (size_t l = 0; l < w->t->num_lanes; l++) {
        const trace_lane_t *L = &w->t->lanes[l];
        for (size_t i = 0, n = trace_lane_count(L); i < n; i++)
            if (L->events[i].name_id < w->t->num_names) write_event(w, L, &L->events[i]);
    }
    if (!write_rate_counters(w) && !w->failed) {
        snprintf(err, errlen, "chrome trace: out of memory");
        w->failed = true;
    }
    size_t dropped = 0;
    for (size_t l = 0; l < w->t->num_lanes; l++) dropped += w->t->lanes[l].dropped;
    jw_printf(w, "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"stepscope\","
                 "\"dropped_events\":%zu}}\n", dropped);
    if (!w->failed) jw_deflate(w, Z_FINISH);
    deflateEnd(&w->z);
    return w->failed ? -1 : 0;
}

int chrome_trace_write(const trace_t *t, const char *path_json_gz, char *err, size_t errlen) {
    jw_t *w = calloc(1, sizeof *w);   /* ~128 KiB of buffers: heap, not stack */
    if (!w) {
        snprintf(err, errlen, "chrome trace: out of memory");
        return -1;
    }
    w->t = t;
    w->base_ns = earliest_start(t);
    int rc = atomic_write_with(path_json_gz, write_gz, w, err, errlen);
    free(w);
    return rc;
}
