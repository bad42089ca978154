/* trace: the span recorder behind the profiler. Spans go into per-lane buffers that are
 * allocated before the profiling window opens, so recording takes no lock and allocates
 * nothing: a lane is written by exactly one thread (compute thread t uses lane t, the data
 * thread and the host thread have lanes of their own). Names are interned before the run;
 * the hot path passes small integer ids. When recording is off, trace_begin returns 0 and
 * trace_end does nothing, so instrumented code costs one branch. */
#ifndef STEPSCOPE_TRACE_H
#define STEPSCOPE_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a span is, for the op summary: matmuls, attention, norms, ... */
typedef enum {
    TRACE_CAT_STEP = 0,   /* the root "train" span of a step */
    TRACE_CAT_PHASE,      /* forward, backward, optimizer */
    TRACE_CAT_LAYER,      /* one decoder layer's forward or backward */
    TRACE_CAT_MATMUL,
    TRACE_CAT_ATTENTION,
    TRACE_CAT_NORM,
    TRACE_CAT_ROPE,
    TRACE_CAT_SWIGLU,
    TRACE_CAT_XENT,       /* LM head + cross-entropy chunks */
    TRACE_CAT_EMBED,
    TRACE_CAT_OPTIMIZER,
    TRACE_CAT_ELEMENTWISE,
    TRACE_CAT_COMM,       /* collectives */
    TRACE_CAT_DATA,       /* waiting for data (compute lane) or producing it (data lane) */
    TRACE_CAT_OTHER,
    TRACE_CAT_COUNT
} trace_category_t;

typedef struct trace_event {
    int64_t start_ns;  /* CLOCK_MONOTONIC */
    int64_t end_ns;
    int64_t step_num;  /* >= 0 on root "train" spans, -1 elsewhere */
    double flops;      /* floating-point operations the span performed, 0 if not counted */
    double bytes;      /* memory its kernel must move, 0 if not counted: each operand read once and
                        * each result written once, in their stored dtypes (a result it adds onto
                        * is read as well), as XLA's bytes_accessed counts it. Caches, re-reads
                        * and a write's read-for-ownership are not counted: it is the traffic
                        * no implementation avoids, so GB/s over it is a floor on what moved. */
    uint32_t name_id;
    uint32_t lane;
} trace_event_t;

typedef struct trace_name {
    char *name;
    trace_category_t category;
    char *part;        /* layer part for the summary ("attention", "mlp", "lm_head", ...) or NULL */
} trace_name_t;

typedef struct trace_lane {
    char name[64];     /* thread name shown in the viewers */
    int64_t tid;       /* OS thread id when known, else lane index */
    trace_event_t *events;
    size_t count, capacity;
    size_t dropped;    /* events lost because the buffer was full */
} trace_lane_t;

typedef struct trace {
    volatile bool recording;
    trace_name_t *names;
    size_t num_names, cap_names;
    trace_lane_t *lanes;
    size_t num_lanes;
    int64_t wall_minus_mono_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC at creation, for epoch timestamps */
} trace_t;

/* Events published on a lane so far. A lane's thread may still be appending while another
 * thread writes the profile (the data thread ends a span begun inside the window after the
 * window has closed): readers take this once and read only events below it; trace_record fills
 * an event before it publishes the new count. */
static inline size_t trace_lane_count(const trace_lane_t *L) { return __atomic_load_n(&L->count, __ATOMIC_ACQUIRE); }

/* Create a recorder with num_lanes lanes of events_per_lane events each. NULL on OOM. */
trace_t *trace_create(size_t num_lanes, size_t events_per_lane);
void trace_destroy(trace_t *t);
/* Name a lane (thread); tid is the OS thread id shown in the viewers. */
void trace_set_lane(trace_t *t, size_t lane, const char *name, int64_t tid);
/* Intern a span name (setup time only, not thread-safe). Same name returns the same id. */
uint32_t trace_intern(trace_t *t, const char *name, trace_category_t cat, const char *part);
/* Drop all recorded events (keeps names and lanes). */
void trace_clear(trace_t *t);

int64_t trace_now_ns(void); /* CLOCK_MONOTONIC in ns */

/* Hot path. t may be NULL. Returns the start time, or 0 when not recording. */
static inline int64_t trace_begin(const trace_t *t) {
    return (t && t->recording) ? trace_now_ns() : 0;
}
/* Record [start, now) on lane, with the span's flops and bytes (0 when not counted). No-op when
 * start == 0. */
void trace_end(trace_t *t, uint32_t lane, uint32_t name_id, int64_t start_ns, double flops, double bytes);
/* Record a root step span with its step number. */
void trace_end_step(trace_t *t, uint32_t lane, uint32_t name_id, int64_t start_ns, int64_t step_num);

/* Additions (formats layer). */
/* Turn recording on or off (spans begun while off are not recorded). */
void trace_set_recording(trace_t *t, bool on);
/* Append a finished span with explicit times; what trace_end does after reading the clock.
 * Also lets tests and importers build traces by hand. False when the lane is full (counted
 * in dropped) or lane is out of range. */
bool trace_record(trace_t *t, uint32_t lane, uint32_t name_id, int64_t start_ns, int64_t end_ns,
                  int64_t step_num, double flops, double bytes);
/* Lower-case category name ("step", "matmul", ...), used as the JSON "cat" and in the summary. */
const char *trace_category_name(trace_category_t c);
/* True for a root step span: category TRACE_CAT_STEP and step_num >= 0. */
bool trace_is_root_step(const trace_t *t, const trace_event_t *e);

/* Kernel categories (MATMUL ... DATA): the leaves the op summary counts. STEP, PHASE, LAYER and
 * OTHER are containers. */
bool trace_is_kernel_category(trace_category_t c);
/* The lane kernels are counted on: the first whose name starts with "compute" (worker lanes run
 * the same kernels in parallel), lane 0 if none does. */
size_t trace_compute_lane(const trace_t *t);
/* qsort order of trace_event_t pointers: start ascending, then longer first (an enclosing span
 * before what it contains), then recording order. */
int trace_cmp_start_longer_first(const void *pa, const void *pb);
/* The lane's kernel spans that no other kernel span of the lane contains, in start order
 * (malloc'd, *n of them; the caller frees). NULL on OOM. */
const trace_event_t **trace_outermost_kernels(const trace_t *t, size_t lane, size_t *n);

/* The compute lane's rate counters, which the Chrome trace and the XPlane both carry: per
 * outermost kernel span with flops or bytes, its GFLOP/s and GB/s from its start, and 0 from its
 * end unless the next such span starts there. value[c] is the counter TRACE_RATE_COUNTERS[c]'s;
 * TRACE_RATE_SERIES[c] names its one series. */
enum { TRACE_RATE_GFLOPS, TRACE_RATE_GBS, TRACE_RATE_COUNT };
extern const char *const TRACE_RATE_COUNTERS[TRACE_RATE_COUNT]; /* "compute lane GFLOP/s", ... */
extern const char *const TRACE_RATE_SERIES[TRACE_RATE_COUNT];   /* "GFLOP/s", "GB/s" */
typedef struct trace_rate_sample {
    int64_t ns;
    double value[TRACE_RATE_COUNT];
} trace_rate_sample_t;
/* The samples in time order (malloc'd, *n of them; the caller frees), of the spans that overlap
 * [lo, hi] where windowed, of all otherwise. NULL on OOM. */
trace_rate_sample_t *trace_rate_samples(const trace_t *t, bool windowed, int64_t lo, int64_t hi, size_t *n);

#endif
