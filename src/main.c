/* stepscope: argv → config → plan → run, and the exit codes. */
#include <omp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "plan/plan.h"
#include "train/loop.h"

#define STEPSCOPE_VERSION "0.1.0"

/* The one line every failure ends with. Paths and names in err come from the user: a newline
 * in one must not split the line. */
static int fail_with(int rc, char *err) {
    for (char *p = err; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "stepscope: %s\n", err);
    return rc;
}

int main(int argc, char **argv) {
    /* Users pipe the step lines through tee or a CI log: one line per step, as it happens. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* A file-size limit (ulimit -f) must fail the write with EFBIG and a message, and a closed
     * stdout (stepscope ... | head) must not end the run: signals would kill us mid-write. */
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    bool dry_run = false;
    const char *config_path = NULL;
    char **overrides = calloc((size_t)argc + 1, sizeof *overrides);
    int num_overrides = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            config_print_help(stdout);
            free(overrides);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("stepscope %s\n", STEPSCOPE_VERSION);
            free(overrides);
            return 0;
        }
        if (strcmp(argv[i], "--dry-run") == 0) dry_run = true;
        else if (strncmp(argv[i], "--", 2) == 0) {
            char err[1024];
            snprintf(err, sizeof err, "unknown option %s; see stepscope --help", argv[i]);
            free(overrides);
            return fail_with(CONFIG_EXIT_CODE, err);
        } else if (!config_path && !strchr(argv[i], '=')) config_path = argv[i];
        else overrides[num_overrides++] = argv[i];
    }
    if (!config_path) {
        fprintf(stderr, "stepscope: no config file given; usage: stepscope configs/base.yml [key=value ...] (see --help)\n");
        free(overrides);
        return CONFIG_EXIT_CODE;
    }
    static config_t cfg;
    char err[1024];
    int rc = config_load(&cfg, config_path, num_overrides, overrides, err, sizeof err);
    free(overrides);
    if (rc != 0) return fail_with(rc, err);
    int threads = cfg.num_threads > 0 ? (int)cfg.num_threads : omp_get_num_procs();
    plan_t plan;
    if ((rc = plan_build(&plan, &cfg, threads, 1, err, sizeof err)) != 0) return fail_with(rc, err);
    if (dry_run) {
        config_print(&cfg, stdout);
        plan_print(&plan, stdout);
        printf("memory_available_bytes: %llu\n", (unsigned long long)plan_memory_available(&cfg));
    }
    if ((rc = plan_check_memory(&plan, &cfg, err, sizeof err)) != 0) return fail_with(rc, err);
    if (dry_run) return 0;
    /* Set-up (arena touch, parameter init) runs on this thread's team: same size as the step's. */
    omp_set_num_threads(threads);
    rc = loop_run(&cfg, &plan, err, sizeof err);
    return rc != 0 ? fail_with(rc, err) : 0;
}
