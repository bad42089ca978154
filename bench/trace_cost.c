/* trace_cost: what one profiler span costs the thread that records it, recording on and off.
 * A span is a trace_begin/trace_end pair around the work it names; the model makes one per
 * kernel call. Multiply by the spans per step (the op summary's call count) to bound the
 * profiler's share of a step without a noisy wall-clock comparison.
 *   build/bench/trace_cost [spans=2000000] [rounds=7] */
#include <stdio.h>
#include <stdlib.h>

#include "profile/trace.h"
#include "benchutil.h"

/* ns per span, median over rounds; the buffer is cleared between rounds (outside the timing),
 * as the loop's buffers are sized before the window. */
static double ns_per_span(trace_t *t, uint32_t name, long spans, int rounds, bool on) {
    double *r = malloc(sizeof(double) * (size_t)rounds);
    for (int k = 0; k < rounds; k++) {
        trace_clear(t);
        trace_set_recording(t, on);
        int64_t t0 = trace_now_ns();
        for (long i = 0; i < spans; i++) {
            int64_t s = trace_begin(t);
            trace_end(t, 0, name, s, (double)i, 0);
        }
        r[k] = (double)(trace_now_ns() - t0) / (double)spans;
        trace_set_recording(t, false);
    }
    qsort(r, (size_t)rounds, sizeof(double), bench_cmp_double);
    double med = r[rounds / 2];
    free(r);
    return med;
}

int main(int argc, char **argv) {
    long spans = argc > 1 ? atol(argv[1]) : 2000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 7;
    if (spans < 1 || rounds < 1) {
        fprintf(stderr, "usage: trace_cost [spans>=1] [rounds>=1]\n");
        return 2;
    }
    trace_t *t = trace_create(1, (size_t)spans);
    if (!t) {
        fprintf(stderr, "trace_cost: out of memory for %ld spans\n", spans);
        return 1;
    }
    uint32_t name = trace_intern(t, "matmul probe", TRACE_CAT_MATMUL, "mlp");
    /* Touch the buffer once so the first timed round does not pay its page faults. */
    ns_per_span(t, name, spans, 1, true);
    double off = ns_per_span(t, name, spans, rounds, false), on = ns_per_span(t, name, spans, rounds, true);
    printf("span cost, median of %d rounds of %ld spans: recording %.1f ns, not recording %.2f ns\n", rounds, spans, on, off);
    printf("span_ns_recording=%.3f span_ns_off=%.3f\n", on, off);
    trace_destroy(t);
    return 0;
}
