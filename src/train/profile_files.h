/* profile_files: a profiled window of steps written as the files the user opens it in, under
 * <base_output_directory>/<run_name>/tensorboard/plugins/profile/<start time>/, where XProf and
 * TensorBoard's profile plugin look: <host>.xplane.pb (XProf's XSpace, with the memory plan for
 * its memory profile), <host>.trace.json.gz (the Chrome trace Perfetto loads) and
 * op_summary.json (the op summary the console prints). Each file is written whole or not at all. */
#ifndef STEPSCOPE_PROFILE_FILES_H
#define STEPSCOPE_PROFILE_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "config/config.h"
#include "plan/plan.h"
#include "profile/trace.h"

/* The profile's files, once written (written != 0). */
typedef struct profile_files {
    char dir[4096], xplane[4400], trace[4400], summary[4400];
    int written;
} profile_files_t;

/* What to write: steps first_step..last_step of trace, from rank `rank` of `ranks`. */
typedef struct profile_window {
    const config_t *cfg;
    const plan_t *plan;
    const trace_t *trace;
    time_t start_time;    /* names the folder: rank 0's, so that every rank's files land in one */
    int rank, ranks;      /* with several ranks the rank goes into the file names */
    int64_t first_step, last_step;
    double peak_tflops;   /* the op summary's % of peak */
    double peak_gb_per_s; /* its % of bandwidth; 0 = not known */
} profile_window_t;

/* Writes the three files and fills *pf. 0, or -1 with err set (a file may then be missing, never
 * half-written). */
int profile_files_write(const profile_window_t *w, profile_files_t *pf, char *err, size_t errlen);

#endif
