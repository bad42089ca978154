/* loop: the training run. A compute thread runs the steps back to back on its OpenMP team
 * and never does I/O; the host thread (the caller) reads each step's loss only once the next
 * step has started, and writes the console line, metrics, TensorBoard scalars and the
 * profile. Step time is completion to completion on a monotonic clock; writing the profile
 * happens between steps with the clock restarted after it, so it is in no step's time. */
#ifndef STEPSCOPE_LOOP_H
#define STEPSCOPE_LOOP_H

#include "config/config.h"
#include "dist/comm.h"
#include "plan/plan.h"

/* Exit codes a run can end with. */
enum {
    LOOP_OK = 0,
    LOOP_FAILED = 1,       /* a diverging run (NaN/Inf loss or gradient), a write that failed */
    LOOP_INTERRUPTED = 130, /* SIGINT; SIGTERM gives 143 */
};

/* Run cfg->steps steps on this rank of `world` (one rank without mpirun). Only rank 0 writes
 * the console, metrics and TensorBoard; the profile is rank 0's, or every rank's with
 * upload_all_profiler_results. Ranks stop at the same step: a rank that must stop (NaN
 * loss, a failed write, a signal) says so in a vote after each step. Returns the exit code
 * the ranks agree on; the one-line reason is already printed on stderr. */
int loop_run(const config_t *cfg, const plan_t *plan, comm_t *world);

#endif
