#include "train/loop.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/data.h"
#include "metrics/report.h"
#include "profile/summary.h"
#include "profile/trace.h"
#include "train/checkpoint.h"
#include "train/loop_console.h"
#include "train/profile_files.h"
#include "train/resume.h"
#include "train/state.h"
#include "util/atomic_file.h"
#include "util/cpustat.h"
#include "util/memstat.h"
#include "util/membw.h"
#include "util/peak.h"

/* The communication lane exists only with several ranks. */
enum { LANE_COMPUTE = 0, LANE_DATA = 1, LANE_COMM = 2 };

/* Set from the signal handler; read by the compute thread at each step boundary. */
static volatile sig_atomic_t g_signal;
/* The open report, for a second signal: the handler cannot reach loop_run's stack. */
static const report_t *volatile g_report;

static void on_signal(int sig) {
    if (!g_signal) {
        g_signal = sig;
        return;
    }
    /* A second signal: leave at once, with what is on disk whole (async-signal-safe calls only). */
    atomic_file_abandon();
    static const char kept[] = "stepscope: second signal: stopped at once; the metrics of the completed steps are kept\n";
    static const char none[] = "stepscope: second signal: stopped at once, before the first step; nothing was written\n";
    bool logged = report_salvage_on_signal(g_report);
    ssize_t w = logged ? write(STDERR_FILENO, kept, sizeof kept - 1) : write(STDERR_FILENO, none, sizeof none - 1);
    (void)w;
    _exit(128 + sig);
}

/* Set-up can take a while on a big model: a first signal during it ends the run before step 0. */
static int interrupted_in_setup(char *err, size_t errlen) {
    if (!g_signal) return 0;
    snprintf(err, errlen, "interrupted by %s before the first step; nothing was written",
             g_signal == SIGINT ? "SIGINT" : "SIGTERM");
    return 128 + g_signal;
}

typedef struct loop {
    const config_t *cfg;
    const plan_t *plan;
    comm_t *world, *shard, *replica;
    int rank;
    bool checkpoint_writer; /* holds a shard of the first shard group: writes it in checkpoints */
    /* The run's steps are first_step .. cfg->steps - 1: 0, or the step after a resumed
     * checkpoint's (load_full_state_path). Step `first_step + i` is the run's i-th: records, data
     * batches and the started/completed counters below go by i, what the user sees by the step. */
    int64_t first_step;
    time_t start_time;  /* rank 0's, so every rank's profile lands in one folder */
    train_state_t state;
    zero_stats_t comm_after_step0; /* step 0 pays one-time costs: left out of the comm figures */
    data_source_t *data;
    data_source_t *eval_data; /* NULL unless eval_interval > 0 */
    int64_t eval_batches_read;
    int64_t eval_batches;     /* per evaluation: eval_steps, or with -1 the whole set's */
    trace_t *trace;
    int64_t profile_first, profile_last; /* -1 when not profiling */
    double peak_gb_per_s; /* memory bandwidth for the op summary's % of bandwidth; 0 = not known */
    /* The bus's probe before set-up (0 where device_peak_gb_per_s gave the bandwidth or nothing
     * probed it) and after the steps (machine_probe; 0 = not probed again). */
    double bus_before_gbs, bus_after_gbs;
    uint32_t span_train, span_data_wait, span_eval, span_checkpoint;
    /* shared between the threads, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t started, completed; /* the run's i of the highest step started / completed, -1 before any */
    int finished;
    int stop_requested;
    int profile_pending;
    int64_t checkpoint_pending; /* i + 1 of the step whose checkpoint the host thread writes now; 0: none */
    bool checkpoint_finishing;  /* with it: rank 0's config.json after every rank's files */
    /* async_checkpointing, the compute thread's: i + 1 of the step whose checkpoint is being
     * written beside the next step (set on every rank, writer or not: they finish it together
     * before that step's update); 0: none. */
    int64_t checkpoint_async;
    double checkpoint_wait_s; /* how long this step's update waited for it (the step's record takes it) */
    uint32_t span_checkpoint_wait;
    /* the compute thread's clock: when step 0 started, and the pauses between steps
     * (evaluations, checkpoint writes, the profile's write) */
    int64_t steps_start_ns, eval_ns, checkpoint_ns, profile_ns;
    bool checkpoint_failed;
    step_record_t *records;
    /* test hook: the order of "step N started" and "loss N read" events */
    char *events;
    size_t events_len, events_cap;
} loop_t;

static void log_event(loop_t *l, const char *what, int64_t step) {
    if (!l->events) return;
    int n = snprintf(l->events + l->events_len, l->events_cap - l->events_len, "%s %lld\n", what, (long long)step);
    if (n > 0 && l->events_len + (size_t)n < l->events_cap) l->events_len += (size_t)n;
}

static int64_t now_ns(void) { return trace_now_ns(); }

/* A pause between steps that began at `since` ends now: added to its kind's total; returns now,
 * where the next step's clock starts. */
static int64_t pause_ended(int64_t *total_ns, int64_t since) {
    int64_t now = now_ns();
    *total_ns += now - since;
    return now;
}

/* MaxText's rule: after step s when s + 1 is a multiple of eval_interval, step 0 excepted. */
static bool eval_due(const config_t *cfg, int64_t step) {
    return cfg->eval_interval > 0 && step > 0 && (step + 1) % cfg->eval_interval == 0;
}

/* How many evaluations a run with no resume would have made before step `first`: a resumed run
 * reads its evaluation batches from there on, as the run it goes on from would have. */
static int64_t evaluations_before(const config_t *cfg, int64_t first) {
    int64_t n = 0;
    for (int64_t s = 0; s < first; s++) n += eval_due(cfg, s);
    return n;
}

/* eval_steps batches, forward and loss only, on the compute thread between two steps. In the
 * profiler's window it is one span, its kernels unrecorded: the window's kernels are the
 * training steps'. */
static void evaluate(loop_t *l, step_record_t *rec) {
    int64_t span = trace_begin(l->trace);
    bool recording = l->trace && l->trace->recording;
    if (recording) trace_set_recording(l->trace, false);
    int64_t t0 = now_ns();
    double sum = 0.0;
    for (int64_t i = 0; i < l->eval_batches; i++, l->eval_batches_read++) {
        double wait;
        sum += train_eval_loss(&l->state, data_next(l->eval_data, l->eval_batches_read, &wait));
        data_release(l->eval_data, l->eval_batches_read);
    }
    rec->eval_seconds = (double)(now_ns() - t0) * 1e-9;
    rec->eval_batches = l->eval_batches;
    rec->eval_loss = sum / (double)l->eval_batches;
    if (recording) {
        trace_set_recording(l->trace, true);
        trace_end(l->trace, LANE_COMPUTE, l->span_eval, span, 0, 0);
    }
}

/* The host thread writes this step's checkpoint files (finishing: rank 0's config.json); the
 * compute thread waits, holding mu. Whether the write failed. */
static bool host_writes_checkpoint(loop_t *l, int64_t i, bool finishing) {
    l->checkpoint_pending = i + 1;
    l->checkpoint_finishing = finishing;
    pthread_cond_broadcast(&l->cv);
    while (l->checkpoint_pending) pthread_cond_wait(&l->cv, &l->mu);
    return l->checkpoint_failed;
}

/* Step i's checkpoint, holding mu: the first shard group's files written (waited for where an
 * async write of them is already under way), every rank told whether they all were, and rank 0's
 * config.json marking it whole. A failure stops the ranks at the next step's vote. */
static void finish_checkpoint(loop_t *l, int64_t i, bool written_async) {
    bool failed = false;
    if (l->checkpoint_writer) {
        if (written_async) {
            while (l->checkpoint_pending) pthread_cond_wait(&l->cv, &l->mu);
            failed = l->checkpoint_failed;
        } else {
            failed = host_writes_checkpoint(l, i, false);
        }
    }
    if (l->state.zero) {
        pthread_mutex_unlock(&l->mu);
        failed = zero_any(l->state.zero, failed);
        pthread_mutex_lock(&l->mu);
    }
    if (!failed && l->rank == 0) failed = host_writes_checkpoint(l, i, true);
    if (failed) l->stop_requested = 1;
}

/* train_step's before_update hook: the previous step's async checkpoint must be whole before
 * this update writes the parameters and moments it reads. The wait is in this step's time. */
static void checkpoint_before_update(void *arg) {
    loop_t *l = arg;
    if (!l->checkpoint_async) return;
    int64_t t0 = now_ns(), span = trace_begin(l->trace);
    pthread_mutex_lock(&l->mu);
    finish_checkpoint(l, l->checkpoint_async - 1, true);
    pthread_mutex_unlock(&l->mu);
    l->checkpoint_wait_s = (double)(now_ns() - t0) * 1e-9;
    trace_end(l->trace, LANE_COMPUTE, l->span_checkpoint_wait, span, 0, 0);
    l->checkpoint_async = 0;
}

static void *compute_main(void *arg) {
    loop_t *l = arg;
    omp_set_num_threads(l->plan->num_threads);
    int64_t last_end = now_ns();
    l->steps_start_ns = last_end;
    for (int64_t i = 0, step = l->first_step; step < l->cfg->steps; i++, step++) {
        pthread_mutex_lock(&l->mu);
        int stop = l->stop_requested || g_signal;
        pthread_mutex_unlock(&l->mu);
        /* Ranks must leave together: one that stops alone would leave the others waiting
         * in the next step's collectives. */
        if (l->state.zero) stop = zero_any(l->state.zero, stop);
        if (stop) break;
        pthread_mutex_lock(&l->mu);
        l->started = i;
        log_event(l, "start", step);
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);

        if (step == l->profile_first) trace_set_recording(l->trace, true);
        int64_t span = trace_begin(l->trace);
        double wait = 0.0;
        int64_t wait_span = trace_begin(l->trace);
        const int32_t *tokens = data_next(l->data, i, &wait);
        trace_end(l->trace, LANE_COMPUTE, l->span_data_wait, wait_span, 0, 0);
        step_result_t res;
        train_step(&l->state, tokens, &res);
        data_release(l->data, i);
        if (i == 0 && l->state.zero) l->comm_after_step0 = zero_stats(l->state.zero);
        int64_t end = now_ns();
        if (l->trace) trace_end_step(l->trace, LANE_COMPUTE, l->span_train, span, step);
        step_record_t rec = {.step = step, .loss = res.loss, .raw_grad_norm = res.raw_grad_norm,
                             .grad_norm = res.grad_norm, .seconds = (double)(end - last_end) * 1e-9,
                             .data_wait_seconds = wait, .checkpoint_wait_seconds = l->checkpoint_wait_s};
        l->checkpoint_wait_s = 0.0;
        if (eval_due(l->cfg, step)) {
            evaluate(l, &rec);
            end = pause_ended(&l->eval_ns, end); /* the next step's clock starts after the evaluation */
        }

        pthread_mutex_lock(&l->mu);
        l->records[i] = rec;
        l->completed = i;
        pthread_cond_broadcast(&l->cv);
        if (step == l->profile_last) {
            trace_set_recording(l->trace, false);
            /* The host writes the profile now; the next step's clock starts after it. */
            l->profile_pending = 1;
            pthread_cond_broadcast(&l->cv);
            while (l->profile_pending) pthread_cond_wait(&l->cv, &l->mu);
            end = pause_ended(&l->profile_ns, end);
        }
        if (l->cfg->enable_checkpointing && checkpoint_due(step, l->cfg->steps, l->cfg->checkpoint_period)) {
            if (l->cfg->async_checkpointing && step + 1 < l->cfg->steps) {
                /* The host threads of the first shard group write its files while the next step's
                 * forward and backward run, which only read the parameters; that step's update
                 * waits for them (checkpoint_before_update), so its time holds the write's cost. */
                l->records[i].checkpoint_async = true;
                if (l->checkpoint_writer) {
                    l->checkpoint_pending = i + 1;
                    l->checkpoint_finishing = false;
                    pthread_cond_broadcast(&l->cv);
                }
                l->checkpoint_async = i + 1;
            } else {
                /* The host threads of the first shard group write its files (rank 0's the
                 * parameters too), then rank 0's config.json marks the checkpoint whole; every
                 * rank starts its next step, and its clock, after them, so no step time holds a
                 * write or a wait for one. The last step's is written so with async too. */
                int64_t span = trace_begin(l->trace);
                finish_checkpoint(l, i, false);
                trace_end(l->trace, LANE_COMPUTE, l->span_checkpoint, span, 0, 0);
                end = pause_ended(&l->checkpoint_ns, end);
            }
        }
        pthread_mutex_unlock(&l->mu);
        last_end = end;
    }
    pthread_mutex_lock(&l->mu);
    /* Stopped (a signal, a diverging run, a failed write) with an async write under way: every
     * rank stops at the same step, so all finish it here, and it is whole. */
    if (l->checkpoint_async) finish_checkpoint(l, l->checkpoint_async - 1, true);
    l->checkpoint_async = 0;
    l->finished = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* The profiled window's files; 1 where one could not be written (err says which). */
static int write_profile(loop_t *l, double peak_tflops, profile_files_t *pf, char *err, size_t errlen) {
    const profile_window_t w = {.cfg = l->cfg, .plan = l->plan, .trace = l->trace, .start_time = l->start_time,
                                .rank = l->rank, .ranks = comm_size(l->world), .first_step = l->profile_first,
                                .last_step = l->profile_last, .peak_tflops = peak_tflops,
                                .peak_gb_per_s = l->peak_gb_per_s};
    return profile_files_write(&w, pf, err, errlen) == 0 ? 0 : 1;
}

/* The cores' rate now, on the run's matmul dtype: the start-up probe and the one after the steps
 * are this same call, so that their ratio compares like with like. */
static double probe_cores(const config_t *cfg, int threads) {
    return peak_probe_tflops(cfg->dtype == DTYPE_BFLOAT16, threads, 0.25);
}

/* The MFU peak, and in *probe_before the start-up probe's reading where machine_probe asks for
 * the summary's machine line (else 0): the peak itself where device_peak_tflops is 0, else a
 * probe of its own (users who fix the peak to compare runs are the ones who need the line). */
static double resolve_peak(const config_t *cfg, int threads, double *probe_before) {
    bool bf16 = cfg->dtype == DTYPE_BFLOAT16;
    *probe_before = 0.0;
    if (cfg->device_peak_tflops > 0) {
        printf("device peak: %.4f TFLOP/s (device_peak_tflops)", cfg->device_peak_tflops);
        if (cfg->machine_probe) {
            *probe_before = probe_cores(cfg, threads);
            printf("; the cores probe %.4f TFLOP/s %s now (machine_probe)", *probe_before, bf16 ? "bf16" : "fp32");
        }
        printf("\n");
        return cfg->device_peak_tflops;
    }
    double p = probe_cores(cfg, threads);
    printf("device peak: %.4f TFLOP/s %s on %d threads (%s; set device_peak_tflops to fix it)\n", p,
           bf16 ? "bf16" : "fp32", threads, peak_probe_method(bf16));
    if (cfg->machine_probe) *probe_before = p;
    return p;
}

/* The memory bandwidth the op summary's % of bandwidth is read against: device_peak_gb_per_s, or
 * util/membw.h's probe over three 256 MiB arrays, mapped and unmapped before set-up maps the
 * plan. Smaller arrays read higher here (64 MiB ones 1.2-1.5x, though past the 32 MiB L3), and a
 * step's big passes stream gigabytes, so the probe streams as far as bench/mem_probe does. Its
 * half second is the best of 10-20 rounds: this VM's bus flips between ~50 and ~90 GB/s within
 * seconds, and the limit a row is read against is the faster. Only a profiled run takes it:
 * nothing else reads it. */
static const size_t BUS_PROBE_ARRAY_BYTES = (size_t)256 << 20;

static double resolve_bandwidth(const config_t *cfg, int threads, double *probed) {
    *probed = 0.0;
    if (cfg->device_peak_gb_per_s > 0) {
        printf("memory bandwidth: %.1f GB/s (device_peak_gb_per_s), for the op summary\n", cfg->device_peak_gb_per_s);
        return cfg->device_peak_gb_per_s;
    }
    /* The probe's 768 MiB would be the peak RSS of a run whose plan is smaller: it runs only where
     * the peak can be reset after it. */
    if (!memstat_reset_peak()) {
        printf("memory bandwidth: not measured (Linux here would not reset the peak RSS after the probe's 3 x 256 MiB); "
               "the op summary gives GB/s only; set device_peak_gb_per_s for its %% of bandwidth\n");
        return 0.0;
    }
    membw_t bw = membw_probe(threads, BUS_PROBE_ARRAY_BYTES, 0.5);
    memstat_reset_peak();
    *probed = bw.best_gbs;
    if (bw.best_gbs > 0)
        printf("memory bandwidth: %.1f GB/s on %d threads (probe, for the op summary: the better of a STREAM triad with "
               "streaming stores, %.1f, and an in-place a += s*b, %.1f, 12 bytes an element each; set "
               "device_peak_gb_per_s to fix it)\n", bw.best_gbs, threads, bw.triad_gbs, bw.update_gbs);
    else printf("memory bandwidth: not measured (no memory for the probe's 3 x 256 MiB); the op summary gives GB/s only\n");
    return bw.best_gbs;
}

/* The bus again once the steps are done, over the run's saved activations and scratch, dead by
 * then and resident since set-up: arrays mapped for it would raise the peak RSS that outside
 * readers take from getrusage (a benchmark's figure; it had read 0.75 GiB over the run's), and
 * resetting the peak after would lose the run's own. As many of the three 256 MiB arrays as fit
 * go in each buffer; 0 where the two hold fewer than three (small plans). */
static double probe_bus_after(const train_state_t *st, int threads) {
    const size_t n = BUS_PROBE_ARRAY_BYTES;
    char *buffers[2] = {(char *)st->acts, (char *)st->scratch};
    const uint64_t sizes[2] = {st->plan.activations_bytes, st->plan.scratch_bytes};
    float *arrays[3] = {NULL, NULL, NULL};
    int found = 0;
    for (int i = 0; i < 2; i++)
        for (uint64_t at = 0; buffers[i] && found < 3 && at + n <= sizes[i]; at += n) arrays[found++] = (float *)(buffers[i] + at);
    return found == 3 ? membw_probe_in(threads, arrays[0], arrays[1], arrays[2], n, 0.5).best_gbs : 0.0;
}

/* A step's batch: each rank's micro-batches one after another, B · micro_batches rows (a
 * micro-batch is B consecutive ones), the ranks' rows in rank order. */
static int open_data(loop_t *l, char *err, size_t errlen) {
    const config_t *cfg = l->cfg;
    const int64_t rows = cfg->per_device_batch_size * l->plan->micro_batches;
    data_options_t opt = {.dataset_type = cfg->dataset_type, .dataset_path = cfg->dataset_path,
                          .vocab_size = cfg->vocab_size, .seq_len = cfg->max_target_length,
                          .global_batch = rows * l->plan->num_ranks, .row_offset = rows * l->rank,
                          .local_batch = rows, .seed = (uint64_t)cfg->data_seed, .first_batch = l->first_step,
                          .depth = cfg->prefetch_depth, .delay_ms = cfg->data_delay_ms, .trace = l->trace,
                          .trace_lane = LANE_DATA};
    if (data_open(&l->data, &opt, err, errlen) != 0) return -1;
    if (cfg->eval_interval < 1) return 0;
    /* Its own batches: another seed, or eval_dataset_path's windows. Its producer records no
     * spans, since the data lane has one writer, the training data's producer. */
    if (cfg->eval_dataset_path[0]) opt.dataset_path = cfg->eval_dataset_path;
    opt.seed = (uint64_t)cfg->data_seed + 1;
    /* One forward a batch: B rows a rank, whatever gradient_accumulation_steps is. */
    opt.global_batch = cfg->per_device_batch_size * l->plan->num_ranks;
    opt.row_offset = cfg->per_device_batch_size * l->rank;
    opt.local_batch = cfg->per_device_batch_size;
    /* eval_steps=-1: each evaluation reads the whole set from its first batch (a cycle of its
     * batches), a resumed run's as well. */
    opt.cycle = cfg->eval_steps == -1 ? -1 : 0;
    opt.first_batch = cfg->eval_steps == -1 ? 0 : evaluations_before(cfg, l->first_step) * cfg->eval_steps;
    opt.trace = NULL;
    if (data_open(&l->eval_data, &opt, err, errlen) == 0) {
        l->eval_batches = cfg->eval_steps == -1 ? data_whole_batches(l->eval_data) : cfg->eval_steps;
        return 0;
    }
    char inner[512];
    snprintf(inner, sizeof inner, "%s", err);
    snprintf(err, errlen, "evaluation data: %s", inner);
    return -1;
}

static size_t events_per_step(const plan_t *p) {
    int64_t chunks = (plan_batch_tokens_per_device(p) + p->xent_chunk - 1) / p->xent_chunk;
    return (size_t)((64 * p->dims.L + 8 * chunks + 64) * p->micro_batches);
}

/* A write the steps wait for (the profile, a checkpoint), read on the machine's CPU counters so
 * that the other-load window, once open, leaves it out: the kernel's threads do part of its
 * writeback, which is busy time but no neighbour's. */
typedef struct pause {
    bool read;
    cpustat_t start;
} pause_t;

static pause_t pause_begin(bool window_open) {
    pause_t p = {0};
    p.read = window_open && cpustat_read(&p.start);
    return p;
}

static void pause_end(const pause_t *p, cpustat_t *window_start) {
    cpustat_t end;
    if (p->read && cpustat_read(&end)) cpustat_leave_out(window_start, &p->start, &end);
}

int loop_run(const config_t *cfg, const plan_t *plan, comm_t *world) {
    int64_t run_start_ns = now_ns();
    loop_t l = {.cfg = cfg, .plan = plan, .world = world, .rank = comm_rank(world), .started = -1, .completed = -1,
                .profile_first = -1, .profile_last = -1};
    char err_buf[1024] = "";
    char *err = err_buf;
    size_t errlen = sizeof err_buf;
    int rc = LOOP_OK;
    bool writer = l.rank == 0, multi = comm_size(world) > 1;
    /* Shard groups are consecutive ranks (mpirun places those on one host); replicas are the
     * ranks with the same place in each group. */
    l.shard = comm_split(world, l.rank / plan->shard_ranks, l.rank);
    l.replica = comm_split(world, l.rank % plan->shard_ranks, l.rank);
    int64_t start = (int64_t)time(NULL);
    comm_bcast_i64(world, &start, 1, 0);
    l.start_time = (time_t)start;
    l.checkpoint_writer = l.rank < plan->shard_ranks; /* the first shard group (dist/zero.h) */
    if (cfg->load_full_state_path[0] && full_state_first_step(cfg, &plan->dims, &l.first_step, err, errlen) != 0)
        rc = LOOP_FAILED;
    const int64_t run_steps = cfg->steps - l.first_step;
    report_t *report = NULL;
    profile_files_t pf = {0};
    checkpoints_written_t checkpoints = {0};
    pthread_mutex_init(&l.mu, NULL);
    pthread_cond_init(&l.cv, NULL);
    if (getenv("STEPSCOPE_EVENT_LOG")) {
        l.events_cap = (size_t)run_steps * 48 + 64;
        l.events = calloc(1, l.events_cap);
    }
    l.records = calloc((size_t)run_steps, sizeof *l.records);
    if (rc == LOOP_OK && !l.records) {
        snprintf(err, errlen, "out of memory for %lld steps of records; lower steps", (long long)cfg->steps);
        rc = LOOP_FAILED;
    }
    /* Installed before set-up, so a signal during a long start-up is seen (interrupted_in_setup). */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (rc == LOOP_OK && strcmp(cfg->profiler, "xplane") == 0 && (writer || cfg->upload_all_profiler_results)) {
        l.profile_first = l.first_step + cfg->skip_first_n_steps_for_profiler;
        l.profile_last = l.profile_first + cfg->profiler_steps - 1;
        if (l.profile_last > cfg->steps - 1) l.profile_last = cfg->steps - 1;
        size_t per_lane = events_per_step(plan) * (size_t)(l.profile_last - l.profile_first + 1);
        l.trace = trace_create(multi ? 3 : 2, per_lane);
        if (!l.trace) {
            snprintf(err, errlen, "out of memory for the profiler's buffers; lower profiler_steps");
            rc = LOOP_FAILED;
        } else {
            trace_set_lane(l.trace, LANE_COMPUTE, "compute (step thread)", LANE_COMPUTE + 1);
            if (multi) trace_set_lane(l.trace, LANE_COMM, "collectives (communication thread)", LANE_COMM + 1);
            l.span_train = trace_intern(l.trace, "train", TRACE_CAT_STEP, NULL);
            l.span_data_wait = trace_intern(l.trace, "data wait", TRACE_CAT_DATA, "data");
            /* Between two steps, outside both: the profile says what the gap between them was. */
            l.span_eval = trace_intern(l.trace, "evaluation (between steps)", TRACE_CAT_OTHER, "evaluation");
            l.span_checkpoint = trace_intern(l.trace, "checkpoint write (between steps)", TRACE_CAT_OTHER, "checkpoint");
            /* Inside a step: its update waiting for the previous step's async write. */
            l.span_checkpoint_wait = trace_intern(l.trace, "checkpoint wait (async)", TRACE_CAT_OTHER, "checkpoint");
        }
    }
    double peak = 0.0, probe_before = 0.0;
    if (writer) {
        printf("stepscope: %s, %lld parameters, %.4f TFLOP per step per device, %d compute threads, memory plan %.3f GiB%s\n",
               cfg->model_name, (long long)plan->num_params, plan->tflops_per_device, plan->num_threads,
               (double)plan->total_bytes / 1073741824.0, multi ? " per rank" : "");
        if (multi) console_ranks(plan, world);
        peak = resolve_peak(cfg, plan->num_threads, &probe_before);
        if (l.trace) l.peak_gb_per_s = resolve_bandwidth(cfg, plan->num_threads, &l.bus_before_gbs);
    }
    if (multi && strcmp(cfg->profiler, "xplane") == 0 && cfg->upload_all_profiler_results) {
        /* Every rank's op summary against rank 0's peaks, so that the ranks' files compare (and
         * the other ranks start set-up after the probes, not beside them). */
        double peaks[2] = {peak, l.peak_gb_per_s};
        int64_t bits[2];
        memcpy(bits, peaks, sizeof bits);
        comm_bcast_i64(world, bits, 2, 0);
        memcpy(peaks, bits, sizeof peaks);
        peak = peaks[0], l.peak_gb_per_s = peaks[1];
    }
    /* The data source and the output files are opened before set-up, which touches every planned
     * buffer (4-14 s for qwen3-0.6b here, minutes for the larger presets): a wrong dataset_path
     * or an unwritable base_output_directory is said at once, on every rank. */
    if (rc == LOOP_OK && (open_data(&l, err, errlen) != 0 || (writer && report_open(&report, cfg, plan, peak, l.first_step, err, errlen) != 0)))
        rc = LOOP_FAILED;
    if (rc == LOOP_OK && writer && cfg->enable_checkpointing && checkpoint_check(cfg, &plan->dims, l.first_step, err, errlen) != 0)
        rc = LOOP_FAILED;
    if (rc == LOOP_OK && cfg->load_parameters_path[0]) { /* its header, names and shapes: the data loads in set-up */
        char params_file[4096];
        if (checkpoint_parameters_file(cfg->load_parameters_path, params_file, sizeof params_file, err, errlen) != 0 ||
            qwen3_load_safetensors(NULL, &plan->dims, params_file, err, errlen) != 0)
            rc = LOOP_FAILED;
    }
    g_report = report;
    if ((rc = comm_agree(world, rc, err)) != LOOP_OK) {
        err[0] = '\0';
        goto done;
    }
    train_parallel_t par = {.world = world, .shard = l.shard, .replica = l.replica, .comm_lane = LANE_COMM,
                            .compute_lane = LANE_COMPUTE};
    if (rc == LOOP_OK && train_state_create(&l.state, cfg, plan, l.trace, &par, err, errlen) != 0) rc = LOOP_FAILED;
    if (cfg->enable_checkpointing && cfg->async_checkpointing) {
        l.state.before_update = checkpoint_before_update;
        l.state.before_update_arg = &l;
    }
    if (rc == LOOP_OK && writer) console_setup(cfg, plan, &l.state, multi);
    if (rc == LOOP_OK) rc = interrupted_in_setup(err, errlen);
    /* Every rank is ready, or none starts. */
    if ((rc = comm_agree(world, rc, err)) != LOOP_OK) {
        err[0] = '\0';
        goto done;
    }

    /* Set-up ran on this thread's OpenMP team; the steps run on the compute thread's own team.
     * libgomp keeps a team per thread, and this one's idle workers wait by spinning: under
     * OMP_WAIT_POLICY=active (or a large GOMP_SPINCOUNT) they spin for the whole run on the
     * cores the step needs, and the tiny default's step took 1.8-1.9x as long (2 cores, Zen 4).
     * Pausing frees this thread's workers; the compute thread's team is its own. */
    omp_pause_resource_all(omp_pause_soft);
    pthread_t compute;
    if (pthread_create(&compute, NULL, compute_main, &l) != 0) {
        snprintf(err, errlen, "cannot start the compute thread");
        if (multi) { /* the other ranks are already in the first step's collectives */
            fprintf(stderr, "stepscope: rank %d: %s\n", l.rank, err);
            comm_abort(world, LOOP_FAILED);
        }
        rc = LOOP_FAILED;
        goto done;
    }
    int64_t next = 0;
    /* The machine's CPU time from just after step 1 starts to the end of the steps, against ours:
     * the summary's "other load" line. Read by this thread, never the compute thread. */
    cpustat_t load_before;
    bool load_from_step1 = false;
    char profile_err[512] = "";
    char checkpoint_err[800] = "";
    int profile_failed = 0;
    pthread_mutex_lock(&l.mu);
    for (;;) {
        if (l.profile_pending) {
            pthread_mutex_unlock(&l.mu);
            pause_t pause = pause_begin(load_from_step1);
            if (write_profile(&l, peak, &pf, profile_err, sizeof profile_err) != 0) profile_failed = 1;
            pause_end(&pause, &load_before);
            pthread_mutex_lock(&l.mu);
            l.profile_pending = 0;
            pthread_cond_broadcast(&l.cv);
            continue;
        }
        if (l.checkpoint_pending) {
            int64_t i = l.checkpoint_pending - 1, step = l.first_step + i;
            bool finishing = l.checkpoint_finishing;
            pthread_mutex_unlock(&l.mu);
            checkpoint_written_t ck = {0};
            char ck_err[600];
            pause_t pause = pause_begin(load_from_step1);
            const train_state_t *st = &l.state;
            const checkpoint_optimizer_shard_t shard = {
                .m = st->adam_m, .m16 = st->adam_m16, .v = st->adam_v, .v16 = st->adam_v16, .lo = st->shard_lo, .count = st->shard_n,
                .num_params = plan->num_params, .updates_done = st->updates_done,
                .index = comm_rank(l.shard), .shards = plan->shard_ranks};
            bool ok = finishing ? checkpoint_finish(cfg, &plan->dims, step, ck_err, sizeof ck_err) == 0
                                : checkpoint_write(cfg, &plan->dims, l.rank == 0 ? st->params : NULL,
                                                   l.rank == 0 && !st->params ? st->params_bf16 : NULL, &shard, step, &ck,
                                                   ck_err, sizeof ck_err) == 0;
            pause_end(&pause, &load_before);
            pthread_mutex_lock(&l.mu);
            if (!finishing) log_event(&l, "checkpoint", step);
            if (ok && !finishing) {
                l.records[i].checkpoint_bytes = ck.bytes;
                l.records[i].checkpoint_seconds = ck.seconds;
            } else if (ok) {
                checkpoints.count++;
                checkpoints.last_step = step;
            } else if (!checkpoint_err[0]) {
                /* Said once the steps up to this one are reported: their metrics stand. */
                snprintf(checkpoint_err, sizeof checkpoint_err, "the checkpoint of step %lld could not be written: %s; "
                         "the run stopped %s, and the metrics up to it are kept", (long long)step, ck_err,
                         l.records[i].checkpoint_async ? "after the step beside which it was written" : "after that step");
            }
            l.checkpoint_failed = !ok;
            l.checkpoint_pending = 0;
            pthread_cond_broadcast(&l.cv);
            continue;
        }
        /* Read step `next` only once step next+1 has started (or the run is over). */
        if (l.completed >= next && (l.started > next || l.finished)) {
            step_record_t rec = l.records[next];
            log_event(&l, "read", l.first_step + next);
            pthread_mutex_unlock(&l.mu);
            if (next == 0) load_from_step1 = cpustat_read(&load_before); /* step 1 has started */
            memstat_t mem;
            rec.memory_measured = memstat_read(&mem);
            rec.rss_bytes = mem.rss_bytes, rec.peak_rss_bytes = mem.peak_rss_bytes;
            if (rc == LOOP_OK && report && report_step(report, &rec, err, errlen) != 0) rc = LOOP_FAILED;
            if (report && rec.checkpoint_wait_seconds > 0) console_checkpoint_wait(&rec);
            if (report && rec.checkpoint_bytes) console_checkpoint(cfg, plan, &rec);
            if (report && rec.eval_batches) console_eval(plan, peak, &rec);
            if (rc == LOOP_OK && ((isnan(rec.loss) && cfg->abort_on_nan_loss) || (isinf(rec.loss) && cfg->abort_on_inf_loss))) {
                snprintf(err, errlen, "loss is %s at step %lld; the run diverged: lower learning_rate or set "
                         "gradient_clipping_threshold (abort_on_nan_loss/abort_on_inf_loss=false to continue)",
                         isnan(rec.loss) ? "NaN" : "Inf", (long long)rec.step);
                rc = LOOP_FAILED;
            }
            if (rc == LOOP_OK && !isfinite(rec.raw_grad_norm) && isfinite(rec.loss)) {
                snprintf(err, errlen, "the gradient norm is not finite at step %lld; lower learning_rate", (long long)rec.step);
                rc = LOOP_FAILED;
            }
            pthread_mutex_lock(&l.mu);
            if (rc != LOOP_OK) l.stop_requested = 1;
            next++;
            continue;
        }
        if (l.finished && l.completed < next) break;
        pthread_cond_wait(&l.cv, &l.mu);
    }
    pthread_mutex_unlock(&l.mu);
    pthread_join(compute, NULL);
    cpustat_t load_after;
    if (load_from_step1 && cpustat_read(&load_after) && report && l.completed >= 1) {
        double others, steal;
        cpustat_load(&load_before, &load_after, &others, &steal);
        report_set_other_load(report, others, steal);
    }
    /* Stopped inside the profiling window (a signal, a diverging run): keep the steps recorded. */
    const int64_t last_completed = l.first_step + l.completed;
    if (l.trace && !pf.written && !profile_failed && last_completed >= l.profile_first && last_completed < l.profile_last) {
        trace_set_recording(l.trace, false);
        l.profile_last = last_completed;
        if (write_profile(&l, peak, &pf, profile_err, sizeof profile_err) != 0) profile_failed = 1;
    }
    if (rc == LOOP_OK && g_signal) {
        /* "and profile" only where one was written: a run without the profiler, or stopped before
         * its window, has none to keep. */
        snprintf(err, errlen, "interrupted by %s after step %lld; the metrics%s so far are written%s%s",
                 g_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)last_completed,
                 pf.written ? " and profile" : "", profile_failed ? "; the profile could not be: " : "",
                 profile_failed ? profile_err : "");
        rc = 128 + g_signal;
    }
    if (rc == LOOP_OK && checkpoint_err[0]) {
        snprintf(err, errlen, "%s", checkpoint_err);
        rc = LOOP_FAILED;
    }
    if (rc == LOOP_OK && profile_failed) {
        snprintf(err, errlen, "the profile could not be written: %s; the metrics are complete", profile_err);
        rc = LOOP_FAILED;
    }
    /* Probed again after the steps, the cores say whether their pace held through the run, and
     * so whether its step times compare with another run's. */
    if (report && probe_before > 0 && rc == LOOP_OK && l.completed >= 1) {
        report_set_machine_probes(report, probe_before, probe_cores(cfg, plan->num_threads));
        /* And the bus, where the op summary reads its % of bandwidth against a probe: whether a
         * row past 100% met a bus that moved or data that stayed in the caches. */
        if (l.bus_before_gbs > 0) {
            l.bus_after_gbs = probe_bus_after(&l.state, plan->num_threads);
            report_set_bus_probes(report, l.bus_before_gbs, l.bus_after_gbs);
        }
    }
    if (report && l.completed >= 0) {
        double steps_s = 0.0;
        for (int64_t i = 0; i <= l.completed; i++) steps_s += l.records[i].seconds;
        run_time_t t = {.wall_s = (double)(now_ns() - run_start_ns) * 1e-9,
                        .before_steps_s = (double)(l.steps_start_ns - run_start_ns) * 1e-9,
                        .steps_s = steps_s,
                        .evaluation_s = (double)l.eval_ns * 1e-9,
                        .checkpoints_s = (double)l.checkpoint_ns * 1e-9,
                        .profile_s = (double)l.profile_ns * 1e-9};
        report_set_run_time(report, &t);
    }
    if (report) report_summary(report, stdout);
    if (writer && l.state.zero) console_comm(plan, l.state.zero, l.comm_after_step0);
    if (writer && l.trace && pf.written) {
        summary_t s;
        if (summary_compute(l.trace, l.profile_first, l.profile_last, peak * 1000.0, l.peak_gb_per_s, &s) == 0) {
            s.bandwidth_after_gbs = l.bus_after_gbs;
            printf("op summary, profiled steps %lld..%lld:\n", (long long)l.profile_first, (long long)l.profile_last);
            summary_print(&s, stdout);
            summary_free(&s);
        }
    }
done:
    g_report = NULL;
    if (report && l.completed < 0) {
        report_discard(report); /* no step measured: leave no files */
        if (g_signal && rc == LOOP_OK) rc = interrupted_in_setup(err, errlen); /* not said yet */
    } else if (report) {
        char cerr[512];
        console_files(report, &pf, &checkpoints, cfg);
        if (report_close(report, cerr, sizeof cerr) != 0 && rc == LOOP_OK) {
            snprintf(err, errlen, "%s", cerr);
            rc = LOOP_FAILED;
        }
    }
    /* One message for the job, from rank 0 when it has one. */
    rc = comm_agree(world, rc, err);
    if (l.events) {
        FILE *f = fopen(getenv("STEPSCOPE_EVENT_LOG"), "w");
        if (f) {
            fwrite(l.events, 1, l.events_len, f);
            fclose(f);
        }
        free(l.events);
    }
    data_close(l.data);
    data_close(l.eval_data);
    train_state_destroy(&l.state);
    trace_destroy(l.trace);
    free(l.records);
    comm_free(l.shard);
    comm_free(l.replica);
    pthread_mutex_destroy(&l.mu);
    pthread_cond_destroy(&l.cv);
    return rc;
}
