/* stepscope: argv → config → plan → run, and the exit codes. Under mpirun every rank runs
 * this same sequence; each step that can fail on one rank (a file missing on one host)
 * ends in an agreement, so all ranks leave together with the one message. */
#include <omp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "dist/comm.h"
#include "plan/plan.h"
#include "train/checkpoint.h"
#include "train/resume.h"
#include "train/loop.h"

#define STEPSCOPE_VERSION "0.1.0"

static int finish(comm_t *world, int rc) {
    comm_finalize(world);
    return rc;
}

/* More compute threads than cores is allowed (a user may mean it) but never what a timing
 * wants: threads take turns on a core, and with OpenMP's barriers every step waits for the
 * slowest. Said once, on stderr, so no such step time goes unexplained. */
static void warn_oversubscribed(int threads, int ranks_per_host) {
    int mine = omp_get_num_procs(); /* the cores this process may run on (its affinity) */
    long host = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads > mine)
        fprintf(stderr, "stepscope: num_threads=%d is more than the %d core%s this process may run on: threads will "
                "share cores, so step times are slower and noisier (num_threads=0 uses every core)\n",
                threads, mine, mine == 1 ? "" : "s");
    else if (ranks_per_host > 1 && host > 0 && (long)threads * ranks_per_host > host)
        fprintf(stderr, "stepscope: %d ranks on this host with %d compute threads each need %ld cores, and it has "
                "%ld: threads will share cores, so step times are slower and noisier (lower num_threads, or "
                "bind each rank to its own cores)\n",
                ranks_per_host, threads, (long)threads * ranks_per_host, host);
}

int main(int argc, char **argv) {
    /* Users pipe the step lines through tee or a CI log: one line per step, as it happens. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    comm_t *world = comm_init(&argc, &argv);
    int ranks = comm_size(world);
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
            if (comm_rank(world) == 0) config_print_help(stdout);
            free(overrides);
            return finish(world, 0);
        }
        if (strcmp(argv[i], "--version") == 0) {
            if (comm_rank(world) == 0) printf("stepscope %s\n", STEPSCOPE_VERSION);
            free(overrides);
            return finish(world, 0);
        }
        if (strcmp(argv[i], "--dry-run") == 0) dry_run = true;
        else if (strncmp(argv[i], "--", 2) == 0) {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option %s; see stepscope --help", argv[i]);
            free(overrides);
            return finish(world, comm_agree(world, CONFIG_EXIT_CODE, msg));
        } else if (!config_path && !strchr(argv[i], '=')) config_path = argv[i];
        else overrides[num_overrides++] = argv[i];
    }
    if (!config_path) {
        free(overrides);
        return finish(world, comm_agree(world, CONFIG_EXIT_CODE,
                                        "no config file given; usage: stepscope configs/base.yml [key=value ...] (see --help)"));
    }
    static config_t cfg;
    char err[1024] = "";
    int rc = config_load(&cfg, config_path, num_overrides, overrides, err, sizeof err);
    free(overrides);
    if ((rc = comm_agree(world, rc, err)) != 0) return finish(world, rc);
    int threads = cfg.num_threads > 0 ? (int)cfg.num_threads : omp_get_num_procs();
    /* A dry run in one process may plan for the ranks the mesh keys name. */
    int plan_ranks = ranks;
    if (dry_run && ranks == 1 && cfg.ici_fsdp_parallelism > 0 && cfg.dcn_data_parallelism > 0)
        plan_ranks = (int)(cfg.ici_fsdp_parallelism * cfg.dcn_data_parallelism);
    plan_t plan;
    rc = plan_build(&plan, &cfg, threads, plan_ranks, err, sizeof err);
    plan.ranks_per_host = comm_host_ranks(world);
    if ((rc = comm_agree(world, rc, err)) != 0) return finish(world, rc);
    /* A dry run of a resumed run says where it resumes, and counts the checkpoints from there; it
     * refuses what the run would refuse (no steps left, a profiler window past the end). */
    int64_t first_step = 0;
    if (rc == 0 && dry_run && cfg.load_full_state_path[0] &&
        full_state_first_step(&cfg, &plan.dims, &first_step, err, sizeof err) != 0)
        rc = 1;
    if ((rc = comm_agree(world, rc, err)) != 0) return finish(world, rc);
    if (dry_run && comm_rank(world) == 0) {
        config_print(&cfg, stdout);
        plan_print(&plan, stdout);
        printf("memory_available_bytes: %llu\n", (unsigned long long)plan_memory_available(&plan, &cfg));
        if (cfg.load_full_state_path[0])
            printf("first_step: %lld (resumed from load_full_state_path)\n", (long long)first_step);
        if (cfg.enable_checkpointing)
            printf("checkpoints: %lld (steps that are multiples of checkpoint_period=%lld, and the last)\n"
                   "checkpoint_bytes_each: %llu (at most, over every rank: the parameters and AdamW's two moments "
                   "in the dtypes they are held in, and the safetensors headers)\n",
                   (long long)checkpoint_count(first_step, cfg.steps, cfg.checkpoint_period),
                   (long long)cfg.checkpoint_period, (unsigned long long)checkpoint_bytes(&cfg, &plan.dims));
    }
    rc = plan_check_memory(&plan, &cfg, err, sizeof err);
    if ((rc = comm_agree(world, rc, err)) != 0 || dry_run) return finish(world, rc);
    if (comm_rank(world) == 0) warn_oversubscribed(threads, plan.ranks_per_host);
    /* Set-up (arena touch, parameter init) runs on this thread's team: same size as the step's. */
    omp_set_num_threads(threads);
    return finish(world, loop_run(&cfg, &plan, world));
}
