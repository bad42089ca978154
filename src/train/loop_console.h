/* loop_console: the lines the loop prints beside MaxText's step lines and the summary (which
 * metrics/report.h prints): a multi-rank run's start-up and closing lines, what set-up found
 * and took, the lines under a step for its checkpoint and its evaluation, and the files the run
 * wrote. Rank 0's host thread prints them all, on stdout. */
#ifndef STEPSCOPE_LOOP_CONSOLE_H
#define STEPSCOPE_LOOP_CONSOLE_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "dist/comm.h"
#include "dist/zero.h"
#include "metrics/report.h"
#include "plan/plan.h"
#include "train/profile_files.h"
#include "train/state.h"

/* The checkpoints written so far. */
typedef struct checkpoints_written {
    int64_t count, last_step;
} checkpoints_written_t;

/* Start-up lines of a multi-rank run: who is there and what each rank keeps. */
void console_ranks(const plan_t *p, comm_t *world);
/* After set-up: which kernels run the matmuls and attention, the activations' rows, what is
 * resident against the plan, and where set-up's time went. */
void console_setup(const config_t *cfg, const plan_t *plan, const train_state_t *st, bool multi);
/* Under a step's line: what its checkpoint took; what its evaluation found and took. */
void console_checkpoint(const config_t *cfg, const plan_t *plan, const step_record_t *rec);
/* async_checkpointing: how long a step's update waited for the previous step's write. */
void console_checkpoint_wait(const step_record_t *rec);
void console_eval(const plan_t *plan, double peak_tflops, const step_record_t *rec);
/* Closing line of a multi-rank run: the collectives' traffic against theory, and how much of
 * it the step waited for, from step 1 (after_step0: the counters once step 0 was done). */
void console_comm(const plan_t *p, zero_t *zero, zero_stats_t after_step0);
/* The files written, and how to open the profile. */
void console_files(const report_t *r, const profile_files_t *pf, const checkpoints_written_t *ck, const config_t *cfg);

#endif
