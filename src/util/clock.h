/* clock: CLOCK_MONOTONIC in seconds, for timed rounds: the machine probes (util/peak, util/membw)
 * and the C benchmarks (bench/benchutil.h). */
#ifndef STEPSCOPE_CLOCK_H
#define STEPSCOPE_CLOCK_H

#include <time.h>

static inline double clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
