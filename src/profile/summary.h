/* summary: the op summary of a profiled window: for each kernel category, and each (category,
 * part), how many calls, how much time, what share of the step time, and the achieved
 * GFLOP/s against a given peak; plus "other (outside kernels)", the step time no kernel span
 * covers, which is the host-overhead figure (scheduling, barriers, bookkeeping).
 *
 * Counting rule, chosen so no time is counted twice:
 *  - Step time is the sum of the root step spans (category STEP, step_num in [first, last]);
 *    a step recorded on several lanes counts once.
 *  - Kernel time comes from one lane only, the compute master: the first lane whose name
 *    starts with "compute" (lane 0 if none does). Worker lanes run the same kernels in
 *    parallel, so adding them would count wall time several times.
 *  - Only leaf categories count: MATMUL, ATTENTION, NORM, ROPE, SWIGLU, XENT, EMBED,
 *    OPTIMIZER, ELEMENTWISE, COMM, DATA. STEP, PHASE, LAYER and OTHER are containers.
 *  - A leaf span nested inside another leaf span is skipped (time, calls, flops and bytes):
 *    the outermost leaf span owns its interval.
 *  - A span belongs to the step whose interval contains its start; spans outside the
 *    selected steps are ignored.
 *  - other = step time - counted leaf time.
 * GFLOP/s = flops / time of the row; % of peak = 100 * GFLOP/s / peak (0 if peak <= 0).
 * GB/s = bytes / time of the row (the bytes each kernel must move: trace_event_t.bytes); % of
 * bandwidth = 100 * GB/s / the memory bandwidth given (0 if that is <= 0). A row can pass 100%
 * where its data stays in the caches between kernels (a layer's activations at small sizes), or
 * where its stores skip the read-for-ownership the bandwidth probe's own stores pay. Together the
 * two percentages say which limit a row is near: its FLOP/s peak (matmuls, attention) or the
 * memory bus (norms, elementwise passes, the optimizer).
 * The spread of a row with flops: its calls that count flops, ordered by their own GFLOP/s;
 * p10 and p90 are the rates of the calls within which the first 10% and 90% of the row's flops
 * fall (weighted by flops, so many small calls do not outvote the big ones). A wide spread
 * over calls of one shape says the machine, not the kernel, moved: a shared VM's neighbours. */
#ifndef STEPSCOPE_SUMMARY_H
#define STEPSCOPE_SUMMARY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "profile/trace.h"

#define SUMMARY_OTHER_LABEL "other (outside kernels)"
#define SUMMARY_TOTAL_LABEL "total (train steps)"

typedef struct summary_row {
    char category[32];   /* "matmul", ..., SUMMARY_OTHER_LABEL or SUMMARY_TOTAL_LABEL */
    char part[48];       /* "" on a category's total row */
    int64_t calls;
    double total_ms;
    double share;        /* of the step time, 0..1 */
    double flops;
    double gflops_per_s; /* 0 when the row recorded no flops */
    double pct_peak;
    double gflops_p10, gflops_p90; /* the spread over calls, see above; 0 without flops */
    double bytes;
    double gbytes_per_s;  /* 0 when the row recorded no bytes */
    double pct_bandwidth;
} summary_row_t;

typedef struct summary {
    int64_t first_step, last_step; /* steps found; -1 when none */
    int64_t num_steps;
    double step_ms;       /* sum of root step spans */
    double kernel_ms;     /* sum of counted leaf spans */
    double other_ms;      /* step_ms - kernel_ms */
    double peak_gflops;
    double peak_gbytes_per_s; /* memory bandwidth for % of bandwidth; 0 = not known */
    /* The bus probed again after the steps (machine_probe), set by the caller after
     * summary_compute for the table's header and notes; the % of bandwidth stays read against
     * peak_gbytes_per_s, as the profile's op_summary.json (written before it) has it. 0 = not. */
    double bandwidth_after_gbs;
    size_t dropped_events; /* over all lanes: when > 0 the figures undercount */
    char lane[64];         /* the lane kernels were counted on */
    /* Rows: per category (enum order) its total row then its parts (by time, descending),
     * then the "other" row, then the "total" row (calls = steps). */
    summary_row_t *rows;
    size_t num_rows;
} summary_t;

/* Steps in [first_step, last_step]; first_step < 0 selects every step. 0, or -1 on OOM. */
int summary_compute(const trace_t *t, int64_t first_step, int64_t last_step, double peak_gflops,
                    double peak_gbytes_per_s, summary_t *out);
void summary_free(summary_t *s);
/* Aligned, human-readable table. */
void summary_print(const summary_t *s, FILE *f);
/* The same as JSON, written atomically. 0, or -1 with err set. */
int summary_write_json(const summary_t *s, const char *path, char *err, size_t errlen);

#endif
