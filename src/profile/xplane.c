/* xplane: XSpace encoder, see xplane.h. Field numbers are from FORMATS.md section 1.1. */
#include "profile/xplane.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/atomic_file.h"

enum {
    STAT_R = 1, STAT_STEP_NUM = 2, STAT_FLOPS = 3, STAT_BYTES_ACCESSED = 4, STAT_GFLOPS = 5, STAT_GBS = 6,
    STAT_TF_OP = 7, STAT_IPL_STAGE_NAME = 8,
    /* the memory plan's allocation events */
    STAT_ALLOCATOR_NAME = 9, STAT_BYTES_ALLOCATED, STAT_BYTES_AVAILABLE, STAT_PEAK_BYTES_IN_USE, STAT_REQUESTED_BYTES,
    STAT_ALLOCATION_BYTES, STAT_ADDR, STAT_REGION_TYPE, STAT_DATA_TYPE,
    STAT_FIRST_STRING       /* interned strings (ref values) from here, one per op name */
};
static const char *const MEMORY_STAT_NAMES[] = {
    "allocator_name", "bytes_allocated", "bytes_available", "peak_bytes_in_use", "requested_bytes",
    "allocation_bytes", "addr", "region_type", "data_type"};
/* The memory plan's line id: one of the ids XProf reserves for lines it derives (0xdeadbeef up),
 * which its op statistics skip. Its allocation events carry tf_op (the memory profile's name for
 * a buffer), and on a thread's line XProf's host op table would count each as a zero-length op. */
enum { MEMORY_LINE_ID = 0xdeadbeef + 7 };

/* XProf's host op table (framework_op_stats) counts the events of /host:CPU that carry a
 * "tf_op" stat "<name>:<type>"; a lowercase type is a JAX-style op. (The overview page's top-ops
 * table stays empty: it lists device ops only.) Only the compute lane's kernel spans carry one,
 * so XProf's table counts what the op summary counts. The data wait also carries
 * "_ipl_stage_name", which makes XProf's step breakdown count its time as waiting for input. */

/* The compute lane's rate counters (trace_rate_samples, as the Chrome trace carries them): XProf's
 * trace viewer reads the events of a line named "_counters_" as counter samples, each event's
 * metadata the counter and its stat the value. */

/* What to write, gathered once so the encoder only walks sorted arrays. */
typedef struct {
    const trace_t *t;
    const trace_event_t ***events;  /* per lane: kept events, sorted */
    size_t *counts;                 /* per lane */
    size_t *lane_order;             /* non-empty lanes sorted by name */
    size_t num_lines;
    uint32_t *meta_id;              /* per name id: event-metadata id, 0 if unused */
    uint32_t *op_ref;               /* per name id: the tf_op string's stat-metadata id, 0 if none */
    char **op_string;               /* per name id: that string, NULL if none */
    size_t compute_lane;
    int64_t base_mono_ns;           /* start of the earliest kept event */
    bool any_flops, any_bytes;
    bool any_op, any_data_op;       /* a tf_op string is interned; one of them is a data wait's */
    trace_rate_sample_t *samples;   /* the counters' samples, in time order */
    size_t num_samples;
    uint32_t counter_meta_id;       /* the first of the two counters' event-metadata ids */
    const xplane_memory_t *memory;  /* NULL or with buffers: the memory plan's line */
    uint32_t memory_meta_id;        /* "MemoryAllocation"'s event-metadata id */
    int64_t window_start_ns;        /* where the memory plan's events stand */
} xplane_view_t;

static bool root_step_in(const trace_t *t, const trace_event_t *e, int64_t first, int64_t last) {
    return trace_is_root_step(t, e) && e->step_num >= first && e->step_num <= last;
}

/* The time window of the requested steps; false means "write everything". */
static bool step_window(const trace_t *t, int64_t first, int64_t last, int64_t *lo, int64_t *hi) {
    if (first < 0 || last < first) return false;
    bool found = false;
    for (size_t l = 0; l < t->num_lanes; l++)
        for (size_t i = 0, n = trace_lane_count(&t->lanes[l]); i < n; i++) {
            const trace_event_t *e = &t->lanes[l].events[i];
            if (!root_step_in(t, e, first, last)) continue;
            if (!found || e->start_ns < *lo) *lo = e->start_ns;
            if (!found || e->end_ns > *hi) *hi = e->end_ns;
            found = true;
        }
    return found;
}


static void view_free(xplane_view_t *v) {
    if (v->events)
        for (size_t l = 0; l < v->t->num_lanes; l++) free(v->events[l]);
    free(v->events);
    free(v->counts);
    free(v->lane_order);
    free(v->meta_id);
    if (v->op_string)
        for (size_t i = 0; i < v->t->num_names; i++) free(v->op_string[i]);
    free(v->op_string);
    free(v->op_ref);
    free(v->samples);
}

/* Keep events with a known name inside the window; note used names and the time base. */
static bool collect_lane(xplane_view_t *v, size_t l, bool windowed, int64_t lo, int64_t hi) {
    const trace_lane_t *L = &v->t->lanes[l];
    size_t published = trace_lane_count(L);
    v->events[l] = malloc((published ? published : 1) * sizeof *v->events[l]);
    if (!v->events[l]) return false;
    size_t n = 0;
    for (size_t i = 0; i < published; i++) {
        const trace_event_t *e = &L->events[i];
        if (e->name_id >= v->t->num_names) continue;
        if (windowed && (e->end_ns < lo || e->start_ns > hi)) continue;
        v->events[l][n++] = e;
        v->meta_id[e->name_id] = 1;
        if (e->start_ns < v->base_mono_ns) v->base_mono_ns = e->start_ns;
        if (e->flops > 0 && !trace_is_root_step(v->t, e)) v->any_flops = true;
        if (e->bytes > 0 && !trace_is_root_step(v->t, e)) v->any_bytes = true;
    }
    /* begin ascending, then duration descending: XProf's XEventsComparator */
    qsort(v->events[l], n, sizeof *v->events[l], trace_cmp_start_longer_first);
    v->counts[l] = n;
    return true;
}

/* Lines sorted by name, as TSL's host tracer does; tid breaks ties. A qsort comparator has
 * no context argument, so the order is built by insertion (lanes are few). */
static void order_lines(xplane_view_t *v) {
    const trace_lane_t *lanes = v->t->lanes;
    v->num_lines = 0;
    for (size_t l = 0; l < v->t->num_lanes; l++) {
        if (v->counts[l] == 0) continue;
        size_t j = v->num_lines++;
        while (j > 0) {
            const trace_lane_t *p = &lanes[v->lane_order[j - 1]];
            int c = strcmp(p->name, lanes[l].name);
            if (c < 0 || (c == 0 && p->tid <= lanes[l].tid)) break;
            v->lane_order[j] = v->lane_order[j - 1];
            j--;
        }
        v->lane_order[j] = l;
    }
}

static bool is_framework_op(const xplane_view_t *v, size_t lane, const trace_event_t *e) {
    return lane == v->compute_lane && trace_is_kernel_category(v->t->names[e->name_id].category);
}

/* "<part>/<name>:<category>"; a ':' in the name would end XProf's name early, so it becomes '_'. */
static char *make_op_string(const trace_name_t *n) {
    const char *part = n->part ? n->part : "", *type = trace_category_name(n->category);
    size_t len = strlen(part) + 1 + strlen(n->name) + 1 + strlen(type) + 1;
    char *s = malloc(len);
    if (!s) return NULL;
    int at = snprintf(s, len, "%s%s", part, n->part ? "/" : "");
    for (const char *c = n->name; *c; c++) s[at++] = *c == ':' ? '_' : *c;
    snprintf(s + at, len - (size_t)at, ":%s", type);
    return s;
}

/* Stat-metadata ids for the tf_op strings of the names the compute lane's kernels use, in
 * name-id order from STAT_FIRST_STRING: each event then refers to its string by id. */
static bool intern_op_strings(xplane_view_t *v) {
    size_t l = v->compute_lane;
    if (l >= v->t->num_lanes) return true;
    for (size_t i = 0; i < v->counts[l]; i++) {
        const trace_event_t *e = v->events[l][i];
        if (is_framework_op(v, l, e)) v->op_ref[e->name_id] = 1;
    }
    uint32_t next = STAT_FIRST_STRING;
    for (size_t i = 0; i < v->t->num_names; i++) {
        if (!v->op_ref[i]) continue;
        if (!(v->op_string[i] = make_op_string(&v->t->names[i]))) return false;
        v->op_ref[i] = next++;
        v->any_op = true;
        v->any_data_op |= v->t->names[i].category == TRACE_CAT_DATA;
    }
    return true;
}

static bool view_build(xplane_view_t *v, const trace_t *t, int64_t first, int64_t last, const xplane_memory_t *memory) {
    memset(v, 0, sizeof *v);
    v->t = t;
    v->memory = memory && memory->count ? memory : NULL;
    size_t nl = t->num_lanes ? t->num_lanes : 1, nn = t->num_names ? t->num_names : 1;
    v->events = calloc(nl, sizeof *v->events);
    v->counts = calloc(nl, sizeof *v->counts);
    v->lane_order = calloc(nl, sizeof *v->lane_order);
    v->meta_id = calloc(nn, sizeof *v->meta_id);
    v->op_ref = calloc(nn, sizeof *v->op_ref);
    v->op_string = calloc(nn, sizeof *v->op_string);
    if (!v->events || !v->counts || !v->lane_order || !v->meta_id || !v->op_ref || !v->op_string) return false;
    v->compute_lane = trace_compute_lane(t);
    int64_t lo = 0, hi = 0;
    bool windowed = step_window(t, first, last, &lo, &hi);
    v->base_mono_ns = INT64_MAX;
    for (size_t l = 0; l < t->num_lanes; l++)
        if (!collect_lane(v, l, windowed, lo, hi)) return false;
    if (v->base_mono_ns == INT64_MAX) v->base_mono_ns = 0;
    v->window_start_ns = windowed ? lo : v->base_mono_ns;
    if (!(v->samples = trace_rate_samples(t, windowed, lo, hi, &v->num_samples))) return false;
    /* Metadata ids from 1 in name-id order, then the counters': deterministic, and 0 stays unused. */
    uint32_t next = 1;
    for (size_t i = 0; i < t->num_names; i++)
        if (v->meta_id[i]) v->meta_id[i] = next++;
    v->counter_meta_id = next;
    v->memory_meta_id = next + TRACE_RATE_COUNT;
    if (!intern_op_strings(v)) return false;
    order_lines(v);
    return true;
}

static void put_stat_int64(pb_buf_t *b, int64_t meta_id, int64_t value) {
    size_t m = pb_begin(b, 4);          /* XEvent.stats */
    pb_int64(b, 1, meta_id);
    pb_int64(b, 4, value);              /* int64_value: oneof, written even when 0 */
    pb_end(b, m);
}

static void put_stat_uint64(pb_buf_t *b, int64_t meta_id, double value) {
    size_t s = pb_begin(b, 4);          /* XEvent.stats */
    pb_int64(b, 1, meta_id);
    pb_uint64(b, 3, (uint64_t)(value + 0.5));   /* uint64_value */
    pb_end(b, s);
}

static void put_stat_ref(pb_buf_t *b, int64_t meta_id, uint32_t string_id) {
    size_t s = pb_begin(b, 4);          /* XEvent.stats */
    pb_int64(b, 1, meta_id);
    pb_uint64(b, 7, string_id);         /* ref_value: the stat metadata whose name is the value */
    pb_end(b, s);
}

static void put_event(pb_buf_t *b, const xplane_view_t *v, size_t lane, const trace_event_t *e) {
    size_t m = pb_begin(b, 4);          /* XLine.events */
    pb_int64(b, 1, v->meta_id[e->name_id]);
    pb_int64(b, 2, (e->start_ns - v->base_mono_ns) * 1000);   /* offset_ps: oneof, always */
    pb_opt_int64(b, 3, (e->end_ns - e->start_ns) * 1000);
    if (trace_is_root_step(v->t, e)) {
        put_stat_int64(b, STAT_R, 1);
        put_stat_int64(b, STAT_STEP_NUM, e->step_num);
    } else {
        if (e->flops > 0) put_stat_uint64(b, STAT_FLOPS, e->flops);
        /* XProf's cost-model stat: the trace viewer shows it as an arg (flops it hides). */
        if (e->bytes > 0) put_stat_uint64(b, STAT_BYTES_ACCESSED, e->bytes);
        if (is_framework_op(v, lane, e)) {
            put_stat_ref(b, STAT_TF_OP, v->op_ref[e->name_id]);
            if (v->t->names[e->name_id].category == TRACE_CAT_DATA)
                put_stat_ref(b, STAT_IPL_STAGE_NAME, v->op_ref[e->name_id]);
        }
    }
    pb_end(b, m);
}

static void put_line(pb_buf_t *b, const xplane_view_t *v, size_t lane) {
    const trace_lane_t *L = &v->t->lanes[lane];
    size_t m = pb_begin(b, 3);          /* XPlane.lines */
    pb_opt_int64(b, 1, L->tid);
    pb_opt_string(b, 2, L->name);
    pb_opt_int64(b, 3, v->base_mono_ns + v->t->wall_minus_mono_ns);   /* epoch ns */
    for (size_t i = 0; i < v->counts[lane]; i++) put_event(b, v, lane, v->events[lane][i]);
    pb_end(b, m);
}

/* The counters' line: per sample one zero-length event a counter, its value a double stat. */
static void put_counter_line(pb_buf_t *b, const xplane_view_t *v) {
    size_t m = pb_begin(b, 3);          /* XPlane.lines */
    pb_opt_int64(b, 1, INT64_MAX);      /* TSL's id for it */
    pb_opt_string(b, 2, "_counters_");
    pb_opt_int64(b, 3, v->base_mono_ns + v->t->wall_minus_mono_ns);
    for (size_t i = 0; i < v->num_samples; i++)
        for (int c = 0; c < TRACE_RATE_COUNT; c++) {
            size_t e = pb_begin(b, 4);  /* XLine.events */
            pb_int64(b, 1, v->counter_meta_id + (uint32_t)c);
            pb_int64(b, 2, (v->samples[i].ns - v->base_mono_ns) * 1000);   /* offset_ps */
            size_t st = pb_begin(b, 4); /* XEvent.stats */
            pb_int64(b, 1, STAT_GFLOPS + c);  /* the series' stat ids follow TRACE_RATE_* */
            pb_double(b, 2, v->samples[i].value[c]);                       /* double_value */
            pb_end(b, st);
            pb_end(b, e);
        }
    pb_end(b, m);
}

static void put_stat_string(pb_buf_t *b, int64_t meta_id, const char *value) {
    size_t s = pb_begin(b, 4);          /* XEvent.stats */
    pb_int64(b, 1, meta_id);
    pb_string(b, 5, value);             /* str_value */
    pb_end(b, s);
}

/* The memory plan's line: one zero-length "MemoryAllocation" a buffer, at the window's start, in
 * plan order, each with the running totals XProf's memory profile plots. */
static void put_memory_line(pb_buf_t *b, const xplane_view_t *v) {
    const xplane_memory_t *mem = v->memory;
    size_t m = pb_begin(b, 3);          /* XPlane.lines */
    pb_opt_int64(b, 1, MEMORY_LINE_ID);
    pb_opt_string(b, 2, "memory plan");
    pb_opt_int64(b, 3, v->base_mono_ns + v->t->wall_minus_mono_ns);
    uint64_t allocated = 0;
    for (size_t i = 0; i < mem->count; i++) {
        const xplane_buffer_t *buf = &mem->buffers[i];
        size_t e = pb_begin(b, 4);      /* XLine.events */
        pb_int64(b, 1, v->memory_meta_id);
        pb_int64(b, 2, (v->window_start_ns - v->base_mono_ns) * 1000);   /* offset_ps */
        uint64_t addr = allocated;
        allocated += buf->bytes;
        put_stat_string(b, STAT_ALLOCATOR_NAME, mem->allocator);
        put_stat_int64(b, STAT_BYTES_ALLOCATED, (int64_t)allocated);
        put_stat_int64(b, STAT_BYTES_AVAILABLE, mem->capacity_bytes > allocated ? (int64_t)(mem->capacity_bytes - allocated) : 0);
        put_stat_int64(b, STAT_PEAK_BYTES_IN_USE, (int64_t)allocated);
        put_stat_int64(b, STAT_REQUESTED_BYTES, (int64_t)buf->bytes);
        put_stat_int64(b, STAT_ALLOCATION_BYTES, (int64_t)buf->bytes);
        put_stat_int64(b, STAT_ADDR, (int64_t)addr);
        put_stat_string(b, STAT_TF_OP, buf->name);
        put_stat_string(b, STAT_REGION_TYPE, buf->region);
        if (buf->data_type != XPLANE_DT_MIXED) put_stat_int64(b, STAT_DATA_TYPE, buf->data_type);
        pb_end(b, e);
    }
    pb_end(b, m);
}

/* map<int64, M> entry: {key=1, value=2 {id=1, name=2}}. Both metadata kinds share this shape. */
static void put_metadata_entry(pb_buf_t *b, uint32_t field, int64_t id, const char *name) {
    size_t entry = pb_begin(b, field);
    pb_int64(b, 1, id);
    size_t value = pb_begin(b, 2);
    pb_opt_int64(b, 1, id);
    pb_opt_string(b, 2, name);
    pb_end(b, value);
    pb_end(b, entry);
}

static void put_plane(pb_buf_t *b, const xplane_view_t *v) {
    size_t m = pb_begin(b, 1);          /* XSpace.planes */
    /* id 0 is the proto3 default and is left out. */
    pb_string(b, 2, "/host:CPU");
    for (size_t i = 0; i < v->num_lines; i++) put_line(b, v, v->lane_order[i]);
    if (v->memory) put_memory_line(b, v);
    if (v->num_samples) put_counter_line(b, v);
    for (size_t i = 0; i < v->t->num_names; i++)   /* ids ascend with name id: sorted by key */
        if (v->meta_id[i]) put_metadata_entry(b, 4, v->meta_id[i], v->t->names[i].name);
    for (int c = 0; v->num_samples && c < TRACE_RATE_COUNT; c++)
        put_metadata_entry(b, 4, v->counter_meta_id + (uint32_t)c, TRACE_RATE_COUNTERS[c]);
    if (v->memory) put_metadata_entry(b, 4, v->memory_meta_id, "MemoryAllocation");
    put_metadata_entry(b, 5, STAT_R, "_r");
    put_metadata_entry(b, 5, STAT_STEP_NUM, "step_num");
    if (v->any_flops) put_metadata_entry(b, 5, STAT_FLOPS, "flops");
    if (v->any_bytes) put_metadata_entry(b, 5, STAT_BYTES_ACCESSED, "bytes_accessed");
    for (int c = 0; v->num_samples && c < TRACE_RATE_COUNT; c++) put_metadata_entry(b, 5, STAT_GFLOPS + c, TRACE_RATE_SERIES[c]);
    if (v->any_op || v->memory) put_metadata_entry(b, 5, STAT_TF_OP, "tf_op");
    if (v->any_data_op) put_metadata_entry(b, 5, STAT_IPL_STAGE_NAME, "_ipl_stage_name");
    for (int i = 0; v->memory && i <= STAT_DATA_TYPE - STAT_ALLOCATOR_NAME; i++)
        put_metadata_entry(b, 5, STAT_ALLOCATOR_NAME + i, MEMORY_STAT_NAMES[i]);
    for (size_t i = 0; i < v->t->num_names; i++)
        if (v->op_ref[i]) put_metadata_entry(b, 5, v->op_ref[i], v->op_string[i]);
    pb_end(b, m);
}

int xplane_encode(const trace_t *t, const char *hostname, int64_t first_step, int64_t last_step,
                  const xplane_memory_t *memory, pb_buf_t *out, char *err, size_t errlen) {
    xplane_view_t v;
    bool ok = view_build(&v, t, first_step, last_step, memory);
    if (ok) {
        put_plane(out, &v);
        pb_string(out, 4, hostname && hostname[0] ? hostname : "localhost");
        ok = pb_ok(out);
    }
    view_free(&v);
    if (!ok) snprintf(err, errlen, "xplane: out of memory");
    return ok ? 0 : -1;
}

int xplane_write(const trace_t *t, const char *path, const char *hostname, int64_t first_step,
                 int64_t last_step, const xplane_memory_t *memory, char *err, size_t errlen) {
    pb_buf_t b;
    pb_init(&b);
    int rc = xplane_encode(t, hostname, first_step, last_step, memory, &b, err, errlen);
    if (rc == 0) rc = atomic_write_file(path, b.data, b.len, err, errlen);
    pb_free(&b);
    return rc;
}
