#include "train/loop.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "data/data.h"
#include "metrics/report.h"
#include "profile/chrome_trace.h"
#include "profile/summary.h"
#include "profile/trace.h"
#include "profile/xplane.h"
#include "train/state.h"
#include "util/atomic_file.h"
#include "util/peak.h"

enum { LANE_COMPUTE = 0, LANE_DATA = 1, NUM_LANES = 2 };

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
    report_salvage_on_signal(g_report);
    static const char msg[] = "stepscope: second signal: stopped at once; the metrics of the completed steps are kept\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
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
    train_state_t state;
    data_source_t *data;
    trace_t *trace;
    int64_t profile_first, profile_last; /* -1 when not profiling */
    uint32_t span_train, span_data_wait;
    /* shared between the threads, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t started, completed; /* highest step started / completed, -1 before any */
    int finished;
    int stop_requested;
    int profile_pending;
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

static void *compute_main(void *arg) {
    loop_t *l = arg;
    omp_set_num_threads(l->plan->num_threads);
    int64_t last_end = now_ns();
    for (int64_t step = 0; step < l->cfg->steps; step++) {
        pthread_mutex_lock(&l->mu);
        if (l->stop_requested || g_signal) {
            pthread_mutex_unlock(&l->mu);
            break;
        }
        l->started = step;
        log_event(l, "start", step);
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);

        if (step == l->profile_first) trace_set_recording(l->trace, true);
        int64_t span = trace_begin(l->trace);
        double wait = 0.0;
        int64_t wait_span = trace_begin(l->trace);
        const int32_t *tokens = data_next(l->data, step, &wait);
        trace_end(l->trace, LANE_COMPUTE, l->span_data_wait, wait_span, 0);
        step_result_t res;
        train_step(&l->state, tokens, &res);
        data_release(l->data, step);
        int64_t end = now_ns();
        if (l->trace) trace_end_step(l->trace, LANE_COMPUTE, l->span_train, span, step);

        pthread_mutex_lock(&l->mu);
        l->records[step] = (step_record_t){.step = step, .loss = res.loss, .raw_grad_norm = res.raw_grad_norm,
                                           .grad_norm = res.grad_norm, .seconds = (double)(end - last_end) * 1e-9,
                                           .data_wait_seconds = wait};
        l->completed = step;
        pthread_cond_broadcast(&l->cv);
        if (step == l->profile_last) {
            trace_set_recording(l->trace, false);
            /* The host writes the profile now; the next step's clock starts after it. */
            l->profile_pending = 1;
            pthread_cond_broadcast(&l->cv);
            while (l->profile_pending) pthread_cond_wait(&l->cv, &l->mu);
            end = now_ns();
        }
        pthread_mutex_unlock(&l->mu);
        last_end = end;
    }
    pthread_mutex_lock(&l->mu);
    l->finished = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void hostname_for_files(char *out, size_t n) {
    if (gethostname(out, n) != 0 || !out[0]) snprintf(out, n, "localhost");
    out[n - 1] = '\0';
    for (char *c = out; *c; c++)
        if (*c == ':' || *c == '/') *c = '_';
}

typedef struct profile_files {
    char dir[4096], xplane[4400], trace[4400], summary[4400];
    int written;
} profile_files_t;

static int write_profile(loop_t *l, double peak_tflops, profile_files_t *pf, char *err, size_t errlen) {
    char stamp[32], host[256];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y_%m_%d_%H_%M_%S", &tm);
    hostname_for_files(host, sizeof host);
    snprintf(pf->dir, sizeof pf->dir, "%s/%s/tensorboard/plugins/profile/%s", l->cfg->base_output_directory,
             l->cfg->run_name, stamp);
    if (mkdir_p(pf->dir) != 0) {
        snprintf(err, errlen, "cannot create the profile folder %s: %s", pf->dir, strerror(errno));
        return 1;
    }
    snprintf(pf->xplane, sizeof pf->xplane, "%s/%s.xplane.pb", pf->dir, host);
    snprintf(pf->trace, sizeof pf->trace, "%s/%s.trace.json.gz", pf->dir, host);
    snprintf(pf->summary, sizeof pf->summary, "%s/op_summary.json", pf->dir);
    if (xplane_write(l->trace, pf->xplane, host, l->profile_first, l->profile_last, err, errlen) != 0) return 1;
    if (chrome_trace_write(l->trace, pf->trace, err, errlen) != 0) return 1;
    summary_t s;
    if (summary_compute(l->trace, l->profile_first, l->profile_last, peak_tflops * 1000.0, &s) == 0) {
        int rc = summary_write_json(&s, pf->summary, err, errlen);
        summary_free(&s);
        if (rc) return 1;
    }
    pf->written = 1;
    return 0;
}

static double resolve_peak(const config_t *cfg, int threads) {
    if (cfg->device_peak_tflops > 0) {
        printf("device peak: %.4f TFLOP/s (device_peak_tflops)\n", cfg->device_peak_tflops);
        return cfg->device_peak_tflops;
    }
    double p = peak_probe_fp32_tflops(threads, 0.25);
    printf("device peak: %.4f TFLOP/s fp32 on %d threads (%s; set device_peak_tflops to fix it)\n", p, threads,
           peak_probe_method());
    return p;
}

static int open_data(loop_t *l, char *err, size_t errlen) {
    const config_t *cfg = l->cfg;
    data_options_t opt = {.dataset_type = cfg->dataset_type, .dataset_path = cfg->dataset_path,
                          .vocab_size = cfg->vocab_size, .seq_len = cfg->max_target_length,
                          .global_batch = cfg->per_device_batch_size * l->plan->num_ranks, .row_offset = 0,
                          .local_batch = cfg->per_device_batch_size, .seed = (uint64_t)cfg->data_seed,
                          .depth = cfg->prefetch_depth, .delay_ms = cfg->data_delay_ms, .trace = l->trace,
                          .trace_lane = LANE_DATA};
    return data_open(&l->data, &opt, err, errlen);
}

static size_t events_per_step(const plan_t *p) {
    int64_t chunks = (p->tokens_per_device + p->xent_chunk - 1) / p->xent_chunk;
    return (size_t)(64 * p->dims.L + 8 * chunks + 64);
}

static void print_files(const report_t *r, const profile_files_t *pf, const config_t *cfg) {
    printf("files written:\n  %s\n", report_metrics_path(r));
    if (report_tensorboard_dir(r)) printf("  %s/ (TensorBoard scalars)\n", report_tensorboard_dir(r));
    if (pf->written) {
        printf("  %s\n  %s\n  %s\n", pf->xplane, pf->trace, pf->summary);
        printf("open the profile: xprof --logdir=%s/%s/tensorboard --port=6006  (or tensorboard --logdir=... with the "
               "xprof plugin), or load %s in https://ui.perfetto.dev\n",
               cfg->base_output_directory, cfg->run_name, pf->trace);
    }
}

int loop_run(const config_t *cfg, const plan_t *plan, char *err, size_t errlen) {
    loop_t l = {.cfg = cfg, .plan = plan, .started = -1, .completed = -1, .profile_first = -1, .profile_last = -1};
    int rc = LOOP_OK;
    report_t *report = NULL;
    profile_files_t pf = {0};
    pthread_mutex_init(&l.mu, NULL);
    pthread_cond_init(&l.cv, NULL);
    if (getenv("STEPSCOPE_EVENT_LOG")) {
        l.events_cap = (size_t)cfg->steps * 48 + 64;
        l.events = calloc(1, l.events_cap);
    }
    l.records = calloc((size_t)cfg->steps, sizeof *l.records);
    if (!l.records) {
        snprintf(err, errlen, "out of memory for %lld steps of records; lower steps", (long long)cfg->steps);
        free(l.events);
        return LOOP_FAILED;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (strcmp(cfg->profiler, "xplane") == 0) {
        l.profile_first = cfg->skip_first_n_steps_for_profiler;
        l.profile_last = l.profile_first + cfg->profiler_steps - 1;
        if (l.profile_last > cfg->steps - 1) l.profile_last = cfg->steps - 1;
        size_t per_lane = events_per_step(plan) * (size_t)(l.profile_last - l.profile_first + 1);
        l.trace = trace_create(NUM_LANES, per_lane);
        if (!l.trace) {
            snprintf(err, errlen, "out of memory for the profiler's buffers; lower profiler_steps");
            rc = LOOP_FAILED;
            goto done;
        }
        trace_set_lane(l.trace, LANE_COMPUTE, "compute (step thread)", LANE_COMPUTE + 1);
        l.span_train = trace_intern(l.trace, "train", TRACE_CAT_STEP, NULL);
        l.span_data_wait = trace_intern(l.trace, "data wait", TRACE_CAT_DATA, "data");
    }
    printf("stepscope: %s, %lld parameters, %.4f TFLOP per step per device, %d compute threads, memory plan %.3f GiB\n",
           cfg->model_name, (long long)plan->num_params, plan->tflops_per_device, plan->num_threads,
           (double)plan->total_bytes / 1073741824.0);
    double peak = resolve_peak(cfg, plan->num_threads);
    if (train_state_create(&l.state, cfg, plan, l.trace, err, errlen) != 0) {
        rc = LOOP_FAILED;
        goto done;
    }
    if ((rc = interrupted_in_setup(err, errlen)) != 0) goto done;
    if (open_data(&l, err, errlen) != 0) {
        rc = LOOP_FAILED;
        goto done;
    }
    if (report_open(&report, cfg, plan, peak, err, errlen) != 0) {
        rc = LOOP_FAILED;
        goto done;
    }
    g_report = report;

    pthread_t compute;
    if (pthread_create(&compute, NULL, compute_main, &l) != 0) {
        snprintf(err, errlen, "cannot start the compute thread");
        rc = LOOP_FAILED;
        goto done;
    }
    int64_t next = 0;
    char profile_err[512] = "";
    int profile_failed = 0;
    pthread_mutex_lock(&l.mu);
    for (;;) {
        if (l.profile_pending) {
            pthread_mutex_unlock(&l.mu);
            if (write_profile(&l, peak, &pf, profile_err, sizeof profile_err) != 0) profile_failed = 1;
            pthread_mutex_lock(&l.mu);
            l.profile_pending = 0;
            pthread_cond_broadcast(&l.cv);
            continue;
        }
        /* Read step `next` only once step next+1 has started (or the run is over). */
        if (l.completed >= next && (l.started > next || l.finished)) {
            step_record_t rec = l.records[next];
            log_event(&l, "read", next);
            pthread_mutex_unlock(&l.mu);
            if (rc == LOOP_OK && report_step(report, &rec, err, errlen) != 0) rc = LOOP_FAILED;
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
    /* Stopped inside the profiling window (a signal, a diverging run): keep the steps recorded. */
    if (l.trace && !pf.written && !profile_failed && l.completed >= l.profile_first && l.completed < l.profile_last) {
        trace_set_recording(l.trace, false);
        l.profile_last = l.completed;
        if (write_profile(&l, peak, &pf, profile_err, sizeof profile_err) != 0) profile_failed = 1;
    }
    if (rc == LOOP_OK && g_signal) {
        snprintf(err, errlen, "interrupted by %s after step %lld; metrics %s so far are written%s%s",
                 g_signal == SIGINT ? "SIGINT" : "SIGTERM", (long long)l.completed,
                 profile_failed ? "" : "and profile", profile_failed ? "; the profile could not be: " : "",
                 profile_failed ? profile_err : "");
        rc = 128 + g_signal;
    }
    if (rc == LOOP_OK && profile_failed) {
        snprintf(err, errlen, "the profile could not be written: %s; the metrics are complete", profile_err);
        rc = LOOP_FAILED;
    }
    report_summary(report, stdout);
    if (l.trace && pf.written) {
        summary_t s;
        if (summary_compute(l.trace, l.profile_first, l.profile_last, peak * 1000.0, &s) == 0) {
            printf("op summary, profiled steps %lld..%lld:\n", (long long)l.profile_first, (long long)l.profile_last);
            summary_print(&s, stdout);
            summary_free(&s);
        }
    }
done:
    g_report = NULL;
    if (report && l.completed < 0) {
        report_discard(report); /* no step measured: leave no files */
        if (g_signal) rc = interrupted_in_setup(err, errlen);
    } else if (report) {
        char cerr[512];
        print_files(report, &pf, cfg);
        if (report_close(report, cerr, sizeof cerr) != 0 && rc == LOOP_OK) {
            snprintf(err, errlen, "%s", cerr);
            rc = LOOP_FAILED;
        }
    }
    if (l.events) {
        FILE *f = fopen(getenv("STEPSCOPE_EVENT_LOG"), "w");
        if (f) {
            fwrite(l.events, 1, l.events_len, f);
            fclose(f);
        }
        free(l.events);
    }
    data_close(l.data);
    train_state_destroy(&l.state);
    trace_destroy(l.trace);
    free(l.records);
    pthread_mutex_destroy(&l.mu);
    pthread_cond_destroy(&l.cv);
    return rc;
}
