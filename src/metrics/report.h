/* report: what a run tells its user, step by step and at the end: MaxText's console line,
 * metrics.jsonl (MaxText's tags as keys), TensorBoard scalars and summary.json, all written by the host
 * thread, never by the compute thread. Only measured numbers are reported. */
#ifndef STEPSCOPE_REPORT_H
#define STEPSCOPE_REPORT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "plan/plan.h"

typedef struct step_record {
    int64_t step;
    double loss, raw_grad_norm, grad_norm;
    double seconds;       /* completion of step − completion of the step before */
    double data_wait_seconds;
    /* A parameter checkpoint written after this step (enable_checkpointing), outside its time,
     * or with async_checkpointing beside the next step's forward and backward; 0 bytes: none. */
    uint64_t checkpoint_bytes;
    double checkpoint_seconds;
    bool checkpoint_async;
    /* async_checkpointing: how long this step's update waited for the previous step's write (in
     * its time). */
    double checkpoint_wait_seconds;
    /* An evaluation run after this step (eval_interval), outside its time: the mean loss over
     * eval_batches batches of the global batch and the seconds they took; 0 batches: none. */
    int64_t eval_batches;
    double eval_loss, eval_seconds;
    /* Read by the host thread when it reports the step (after the next one has started), not
     * by the compute thread: this process's resident set then and its peak so far. */
    bool memory_measured; /* false where /proc/self/status cannot be read: no figures reported */
    int64_t rss_bytes, peak_rss_bytes;
} step_record_t;

typedef struct report report_t;

/* Open the metrics file (written as <path>.partial, renamed whole at report_close) and, when
 * enabled, the TensorBoard event file, for the steps first_step .. cfg->steps - 1 (first_step:
 * 0, or the step after a resumed checkpoint's). */
int report_open(report_t **out, const config_t *cfg, const plan_t *plan, double peak_tflops, int64_t first_step,
                char *err, size_t errlen);
/* Console line, JSON line and scalars for one completed step. */
int report_step(report_t *r, const step_record_t *rec, char *err, size_t errlen);
/* The cores' probe before set-up and after the last step (machine_probe), for the summary's
 * machine line: whether the machine's pace held through the run. */
void report_set_machine_probes(report_t *r, double before, double after);
/* The memory bus's probe (GB/s) before set-up and after the last step, in a profiled run whose
 * op summary reads its % of bandwidth against the first; after 0 = not probed again (the run's
 * buffers it runs in were too small), said on the machine line. */
void report_set_bus_probes(report_t *r, double before, double after);
/* What other processes and the hypervisor took of the cores while the summarised steps ran, in
 * cores (util/cpustat.h), for the summary's "other load" line. */
void report_set_other_load(report_t *r, double others_cores, double steal_cores);
/* Where the run's wall time went, in seconds: before its first step (probes, data, output files,
 * set-up), in the steps (their times summed, the first's too), between them (evaluations,
 * checkpoint writes, the profile's write), and the rest after the last step; for the summary's
 * "run time" line. */
typedef struct run_time {
    double wall_s, before_steps_s, steps_s, evaluation_s, checkpoints_s, profile_s;
} run_time_t;
void report_set_run_time(report_t *r, const run_time_t *t);
/* Median, min and max step time (the run's first step left out), tokens/s/device, TFLOP/s/device, MFU, the
 * peak resident memory against the plan and the machine, and the machine line where probes
 * were set. Kept for summary.json. */
void report_summary(report_t *r, FILE *out);
/* Finish the files: rename the metrics file into place and write summary.json (the summary's
 * figures, unrounded) beside it, or remove a stale one where there was no summary. Frees r. */
int report_close(report_t *r, char *err, size_t errlen);
/* Remove everything report_open created (files and the folders it made): for a run that
 * ends before its first step. Frees r. NULL is fine. */
void report_discard(report_t *r);
/* For a signal handler about to _exit: put the metrics of the steps logged so far in place
 * (a rename), or remove the files and the folders report_open made when no step was logged.
 * Async-signal-safe. true where steps' metrics were kept. */
bool report_salvage_on_signal(const report_t *r);
/* Paths written, for the closing lines. */
const char *report_metrics_path(const report_t *r);
const char *report_tensorboard_dir(const report_t *r);
/* Where report_close writes summary.json; NULL where report_summary had no steps to summarise. */
const char *report_summary_path(const report_t *r);

#endif
