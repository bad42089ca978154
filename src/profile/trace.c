/* trace: the span recorder, see trace.h. Every lane owns a buffer sized at creation; the hot
 * path only bumps that lane's count, so a lane needs no lock as long as one thread writes it. */
#include "profile/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t trace_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

trace_t *trace_create(size_t num_lanes, size_t events_per_lane) {
    trace_t *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->lanes = calloc(num_lanes ? num_lanes : 1, sizeof *t->lanes);
    if (!t->lanes) { free(t); return NULL; }
    t->num_lanes = num_lanes;
    for (size_t i = 0; i < num_lanes; i++) {
        trace_lane_t *L = &t->lanes[i];
        /* All events exist before the profiling window opens, so trace_end never allocates. */
        L->events = calloc(events_per_lane ? events_per_lane : 1, sizeof *L->events);
        if (!L->events) { trace_destroy(t); return NULL; }
        L->capacity = events_per_lane;
        L->tid = (int64_t)i;
        snprintf(L->name, sizeof L->name, "lane%zu", i);
    }
    /* Realtime minus monotonic, read back to back: spans use the clock that never jumps, and
     * this offset turns them into the epoch time the viewers expect. */
    int64_t mono = clock_ns(CLOCK_MONOTONIC);
    t->wall_minus_mono_ns = clock_ns(CLOCK_REALTIME) - mono;
    return t;
}

void trace_destroy(trace_t *t) {
    if (!t) return;
    for (size_t i = 0; i < t->num_lanes; i++) free(t->lanes[i].events);
    free(t->lanes);
    for (size_t i = 0; i < t->num_names; i++) {
        free(t->names[i].name);
        free(t->names[i].part);
    }
    free(t->names);
    free(t);
}

void trace_set_lane(trace_t *t, size_t lane, const char *name, int64_t tid) {
    if (!t || lane >= t->num_lanes) return;
    snprintf(t->lanes[lane].name, sizeof t->lanes[lane].name, "%s", name ? name : "");
    t->lanes[lane].tid = tid;
}

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Returns UINT32_MAX on allocation failure; writers skip events with unknown ids. */
uint32_t trace_intern(trace_t *t, const char *name, trace_category_t cat, const char *part) {
    if (!t || !name) return UINT32_MAX;
    /* A name is one span kind: the first interning fixes its category and part. */
    for (size_t i = 0; i < t->num_names; i++)
        if (strcmp(t->names[i].name, name) == 0) return (uint32_t)i;
    if (t->num_names == t->cap_names) {
        size_t cap = t->cap_names ? 2 * t->cap_names : 64;
        trace_name_t *p = realloc(t->names, cap * sizeof *p);
        if (!p) return UINT32_MAX;
        t->names = p;
        t->cap_names = cap;
    }
    trace_name_t *n = &t->names[t->num_names];
    n->name = dup_or_null(name);
    n->part = dup_or_null(part);
    n->category = cat;
    if (!n->name || (part && !n->part)) {
        free(n->name);
        free(n->part);
        return UINT32_MAX;
    }
    return (uint32_t)t->num_names++;
}

void trace_clear(trace_t *t) {
    if (!t) return;
    for (size_t i = 0; i < t->num_lanes; i++) {
        t->lanes[i].count = 0;
        t->lanes[i].dropped = 0;
    }
}

void trace_set_recording(trace_t *t, bool on) {
    if (t) t->recording = on;
}

bool trace_record(trace_t *t, uint32_t lane, uint32_t name_id, int64_t start_ns, int64_t end_ns,
                  int64_t step_num, double flops, double bytes) {
    if (!t || lane >= t->num_lanes) return false;
    trace_lane_t *L = &t->lanes[lane];
    /* A full lane drops the newest span and counts it: the buffer never grows mid-run. */
    if (L->count >= L->capacity) {
        L->dropped++;
        return false;
    }
    size_t n = L->count; /* only this lane's thread writes it */
    trace_event_t *e = &L->events[n];
    e->start_ns = start_ns;
    e->end_ns = end_ns < start_ns ? start_ns : end_ns;
    e->step_num = step_num;
    e->flops = flops;
    e->bytes = bytes;
    e->name_id = name_id;
    e->lane = lane;
    __atomic_store_n(&L->count, n + 1, __ATOMIC_RELEASE); /* publish after the event is whole */
    return true;
}

void trace_end(trace_t *t, uint32_t lane, uint32_t name_id, int64_t start_ns, double flops, double bytes) {
    if (!t || start_ns == 0) return;
    trace_record(t, lane, name_id, start_ns, trace_now_ns(), -1, flops, bytes);
}

void trace_end_step(trace_t *t, uint32_t lane, uint32_t name_id, int64_t start_ns, int64_t step_num) {
    if (!t || start_ns == 0) return;
    trace_record(t, lane, name_id, start_ns, trace_now_ns(), step_num, 0.0, 0.0);
}

const char *trace_category_name(trace_category_t c) {
    static const char *const names[TRACE_CAT_COUNT] = {
        [TRACE_CAT_STEP] = "step",         [TRACE_CAT_PHASE] = "phase",
        [TRACE_CAT_LAYER] = "layer",       [TRACE_CAT_MATMUL] = "matmul",
        [TRACE_CAT_ATTENTION] = "attention", [TRACE_CAT_NORM] = "norm",
        [TRACE_CAT_ROPE] = "rope",         [TRACE_CAT_SWIGLU] = "swiglu",
        [TRACE_CAT_XENT] = "xent",         [TRACE_CAT_EMBED] = "embed",
        [TRACE_CAT_OPTIMIZER] = "optimizer", [TRACE_CAT_ELEMENTWISE] = "elementwise",
        [TRACE_CAT_COMM] = "comm",         [TRACE_CAT_DATA] = "data",
        [TRACE_CAT_OTHER] = "other",
    };
    if ((int)c < 0 || c >= TRACE_CAT_COUNT) return "other";
    return names[c];
}

bool trace_is_root_step(const trace_t *t, const trace_event_t *e) {
    return e->name_id < t->num_names && t->names[e->name_id].category == TRACE_CAT_STEP &&
           e->step_num >= 0;
}

bool trace_is_kernel_category(trace_category_t c) { return c >= TRACE_CAT_MATMUL && c <= TRACE_CAT_DATA; }

size_t trace_compute_lane(const trace_t *t) {
    for (size_t l = 0; l < t->num_lanes; l++)
        if (strncmp(t->lanes[l].name, "compute", 7) == 0) return l;
    return 0;
}

int trace_cmp_start_longer_first(const void *pa, const void *pb) {
    const trace_event_t *a = *(const trace_event_t *const *)pa;
    const trace_event_t *b = *(const trace_event_t *const *)pb;
    if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns ? -1 : 1;
    int64_t da = a->end_ns - a->start_ns, db = b->end_ns - b->start_ns;
    if (da != db) return da > db ? -1 : 1;
    return a < b ? -1 : (a > b);
}

const trace_event_t **trace_outermost_kernels(const trace_t *t, size_t lane, size_t *n) {
    *n = 0;
    const trace_lane_t *L = lane < t->num_lanes ? &t->lanes[lane] : NULL;
    size_t published = L ? trace_lane_count(L) : 0;
    const trace_event_t **ev = malloc((published ? published : 1) * sizeof *ev);
    if (!ev) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < published; i++)
        if (L->events[i].name_id < t->num_names && trace_is_kernel_category(t->names[L->events[i].name_id].category))
            ev[k++] = &L->events[i];
    qsort(ev, k, sizeof *ev, trace_cmp_start_longer_first);
    size_t kept = 0;
    int64_t open_end = INT64_MIN; /* end of the outermost kernel span being inside */
    for (size_t i = 0; i < k; i++) {
        if (ev[i]->start_ns < open_end) continue;
        open_end = ev[i]->end_ns;
        ev[kept++] = ev[i];
    }
    *n = kept;
    return ev;
}

const char *const TRACE_RATE_COUNTERS[TRACE_RATE_COUNT] = {"compute lane GFLOP/s", "compute lane GB/s"};
const char *const TRACE_RATE_SERIES[TRACE_RATE_COUNT] = {"GFLOP/s", "GB/s"};

trace_rate_sample_t *trace_rate_samples(const trace_t *t, bool windowed, int64_t lo, int64_t hi, size_t *n) {
    size_t k, rated = 0;
    *n = 0;
    const trace_event_t **ev = trace_outermost_kernels(t, trace_compute_lane(t), &k);
    trace_rate_sample_t *out = malloc((2 * k + 1) * sizeof *out);
    if (!ev || !out) {
        free(ev);
        free(out);
        return NULL;
    }
    for (size_t i = 0; i < k; i++) { /* the spans with a rate (a data wait has none) in the window */
        const trace_event_t *e = ev[i];
        if (windowed && (e->end_ns < lo || e->start_ns > hi)) continue;
        if (e->end_ns > e->start_ns && (e->flops > 0 || e->bytes > 0)) ev[rated++] = e;
    }
    for (size_t i = 0; i < rated; i++) {
        const trace_event_t *e = ev[i];
        double ns = (double)(e->end_ns - e->start_ns);
        out[(*n)++] = (trace_rate_sample_t){e->start_ns, {e->flops / ns, e->bytes / ns}}; /* per ns: GFLOP/s, GB/s */
        if (i + 1 == rated || ev[i + 1]->start_ns > e->end_ns) out[(*n)++] = (trace_rate_sample_t){e->end_ns, {0, 0}};
    }
    free(ev);
    return out;
}
