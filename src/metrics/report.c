#include "metrics/report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics/tfevents.h"
#include "util/atomic_file.h"
#include "util/memstat.h"

static const double GIB = 1073741824.0;

struct report {
    const config_t *cfg;
    plan_t plan;
    double peak_tflops;
    char metrics_path[4 * CONFIG_STR_MAX];
    char partial_path[4 * CONFIG_STR_MAX + 16];
    char summary_path[4 * CONFIG_STR_MAX + 16];
    char tb_dir[4 * CONFIG_STR_MAX];
    int metrics_fd;         /* -1 when closed */
    off_t metrics_size;     /* bytes of whole lines written */
    char created_top[2][4 * CONFIG_STR_MAX]; /* highest folder report_open created, per mkdir_p; "" = none */
    char created_leaf[2][4 * CONFIG_STR_MAX];
    tfevents_t *tb;
    double *seconds; /* per logged step */
    int64_t num_logged, cap;
    int64_t first_step; /* the run's first step: 0, or the one after a resumed checkpoint's */
    /* Evaluations' forward rates (tokens/s/device) and checkpoints' write seconds, in the same
     * allocation as seconds (cap each), for the summary's medians. */
    double *eval_rates, *checkpoint_seconds;
    int64_t evals, checkpoints, last_eval_step;
    double last_eval_loss, eval_rate_median, checkpoint_seconds_median; /* medians: set by report_summary */
    uint64_t checkpoint_bytes;
    int64_t checkpoints_async;   /* of them, written beside the next step (async_checkpointing) */
    double checkpoint_wait_s;    /* the steps' updates waiting for those writes, in all */
    double last_loss;
    bool warned_peak; /* an MFU over 100% has been pointed out */
    double probe_before, probe_after; /* report_set_machine_probes; 0 = not probed */
    double bus_before, bus_after;     /* report_set_bus_probes, GB/s; bus_before 0 = not probed */
    bool load_measured;               /* report_set_other_load */
    double others_cores, steal_cores;
    bool run_time_set;                /* report_set_run_time */
    run_time_t run_time;
    /* What report_summary printed, for summary.json at report_close. */
    bool summarised, memory_measured;
    double median, fastest, slowest;
    int64_t peak_rss_bytes;
    uint64_t physical_bytes;
};

static int dirname_of(const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash) {
        snprintf(out, n, ".");
        return 0;
    }
    *slash = '\0';
    return 0;
}

/* Before mkdir_p(dir): the highest missing folder on the way to dir ("" if dir exists), so
 * that report_discard removes exactly what was created. */
static void note_missing(const char *dir, char *top, char *leaf) {
    char p[4 * CONFIG_STR_MAX];
    struct stat st;
    top[0] = leaf[0] = '\0';
    snprintf(p, sizeof p, "%s", dir);
    while (p[0] && stat(p, &st) != 0 && errno == ENOENT) {
        snprintf(top, sizeof p, "%s", p);
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = '\0';
    }
    if (top[0]) snprintf(leaf, sizeof p, "%s", dir);
}

/* rmdir leaf and its parents up to and including top; stops at the first that is not empty.
 * Async-signal-safe (string calls POSIX.1-2016 lists, no snprintf): a second signal during
 * set-up, with the files open and no step logged, removes the folders too. */
static void remove_created(const char *top, const char *leaf) {
    if (!top[0]) return;
    char p[4 * CONFIG_STR_MAX];
    size_t n = strnlen(leaf, sizeof p - 1);
    memcpy(p, leaf, n);
    p[n] = '\0';
    size_t top_len = strlen(top);
    while (strlen(p) >= top_len && rmdir(p) == 0) {
        char *slash = strrchr(p, '/');
        if (!slash || slash == p) break;
        *slash = '\0';
    }
}

void report_discard(report_t *r) {
    if (!r) return;
    if (r->tb) {
        char path[4096];
        snprintf(path, sizeof path, "%s", tfevents_path(r->tb));
        tfevents_close(r->tb);
        unlink(path);
    }
    if (r->metrics_fd >= 0) {
        close(r->metrics_fd);
        unlink(r->partial_path);
    }
    remove_created(r->created_top[1], r->created_leaf[1]);
    remove_created(r->created_top[0], r->created_leaf[0]);
    free(r->seconds);
    free(r);
}

/* Beside the metrics file: summary.json in its folder (the run's), or <metrics_file>'s name with
 * ".summary.json" in place of its extension where metrics_file names the file. */
static void summary_path_of(const report_t *r, char *out, size_t n) {
    if (!r->cfg->metrics_file[0]) {
        char dir[sizeof r->metrics_path];
        dirname_of(r->metrics_path, dir, sizeof dir);
        snprintf(out, n, "%s/summary.json", dir);
        return;
    }
    const char *slash = strrchr(r->metrics_path, '/'), *dot = strrchr(r->metrics_path, '.');
    int stem = dot && (!slash || dot > slash + 1) ? (int)(dot - r->metrics_path) : (int)strlen(r->metrics_path);
    snprintf(out, n, "%.*s.summary.json", stem, r->metrics_path);
}

int report_open(report_t **out, const config_t *cfg, const plan_t *plan, double peak_tflops, int64_t first_step,
                char *err, size_t errlen) {
    report_t *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    r->cfg = cfg;
    r->plan = *plan;
    r->peak_tflops = peak_tflops;
    r->first_step = first_step;
    r->cap = cfg->steps - first_step;
    r->seconds = calloc(3 * (size_t)r->cap, sizeof(double));
    r->eval_rates = r->seconds ? r->seconds + r->cap : NULL;
    r->checkpoint_seconds = r->seconds ? r->seconds + 2 * r->cap : NULL;
    if (cfg->metrics_file[0]) snprintf(r->metrics_path, sizeof r->metrics_path, "%s", cfg->metrics_file);
    else snprintf(r->metrics_path, sizeof r->metrics_path, "%s/%s/metrics.jsonl", cfg->base_output_directory, cfg->run_name);
    snprintf(r->partial_path, sizeof r->partial_path, "%s.partial", r->metrics_path);
    summary_path_of(r, r->summary_path, sizeof r->summary_path);
    r->metrics_fd = -1;
    if (!r->seconds) {
        snprintf(err, errlen, "out of memory for %lld steps of metrics; lower steps", (long long)cfg->steps);
        report_discard(r);
        return 1;
    }
    char dir[sizeof r->metrics_path];
    dirname_of(r->metrics_path, dir, sizeof dir);
    note_missing(dir, r->created_top[0], r->created_leaf[0]);
    if (mkdir_p(dir) != 0) {
        snprintf(err, errlen, "cannot create the folder %s for metrics_file: %s; check base_output_directory",
                 dir, strerror(errno));
        report_discard(r);
        return 1;
    }
    r->metrics_fd = open(r->partial_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (r->metrics_fd < 0) {
        snprintf(err, errlen, "cannot write %s: %s; check base_output_directory", r->partial_path, strerror(errno));
        report_discard(r);
        return 1;
    }
    if (cfg->enable_tensorboard) {
        snprintf(r->tb_dir, sizeof r->tb_dir, "%s/%s/tensorboard/%s", cfg->base_output_directory, cfg->run_name, cfg->run_name);
        note_missing(r->tb_dir, r->created_top[1], r->created_leaf[1]);
        if (tfevents_open(&r->tb, r->tb_dir, err, errlen) != 0) {
            report_discard(r);
            return 1;
        }
    }
    *out = r;
    return 0;
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void json_write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* %.17g (every bit of the double, so runs compare exactly), or NaN / Infinity / -Infinity as Python's json (and so MaxText's metrics file) writes
 * them: printf's "nan", "-nan" and "inf" are not readable by any JSON parser. */
static const char *json_number(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "NaN");
    else if (isinf(v)) snprintf(buf, n, "%sInfinity", v < 0 ? "-" : "");
    else snprintf(buf, n, "%.17g", v);
    return buf;
}

/* An evaluation's TFLOP/s at tokens_s: a forward of the plan's batch per B·S tokens. */
static double eval_tflops_s(const report_t *r, double tokens_s) {
    return plan_forward_tflops_per_device(&r->plan) * tokens_s / (double)plan_batch_tokens_per_device(&r->plan);
}

int report_step(report_t *r, const step_record_t *rec, char *err, size_t errlen) {
    double tflops = r->plan.tflops_per_device;
    double tokens = (double)r->plan.tokens_per_device;
    double tflops_s = tflops / rec->seconds, tokens_s = tokens / rec->seconds;
    double mfu = r->peak_tflops > 0 ? 100.0 * tflops_s / r->peak_tflops : 0.0;
    printf("completed step: %lld, seconds: %.3f, TFLOP/s/device: %.3f, Tokens/s/device: %.3f, MFU: %.2f%%, "
           "total_weights: %lld, loss: %.4f\n",
           (long long)rec->step, rec->seconds, tflops_s, tokens_s, mfu, (long long)r->plan.tokens_per_device * r->plan.num_ranks,
           rec->loss);
    fflush(stdout);
    /* An MFU over 100% says the peak is wrong, not the step: most often the fp32 peak passed to
     * a dtype=bfloat16 run (device_peak_tflops is the matmul dtype's), or a probe taken while
     * another process held a core. Said once, on stderr, so that no such figure goes unexplained. */
    if (mfu > 100.0 && !r->warned_peak) {
        r->warned_peak = true;
        if (r->cfg->device_peak_tflops > 0)
            fprintf(stderr,
                    "stepscope: MFU %.1f%% at step %lld: device_peak_tflops=%g is below what this run reaches; it "
                    "is the peak of this run's matmul dtype (%s): pass that, or 0 to probe it\n",
                    mfu, (long long)rec->step, r->cfg->device_peak_tflops, dtype_name(r->cfg->dtype));
        else
            fprintf(stderr,
                    "stepscope: MFU %.1f%% at step %lld: the start-up probe's peak (%.4f TFLOP/s) is below what this "
                    "run reaches (was another process using a core then?); pass this machine's peak as "
                    "device_peak_tflops\n",
                    mfu, (long long)rec->step, r->peak_tflops);
    }
    char loss[32], gn[32], raw_gn[32];
    /* The line is built in memory and written with one write(): the file only ever holds
     * whole lines, and a failed write is cut back so it still does. */
    char *line = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&line, &len);
    if (!m) {
        snprintf(err, errlen, "out of memory writing %s", r->partial_path);
        return 1;
    }
    fprintf(m, "{\"step\": %lld, \"run_name\": ", (long long)rec->step);
    json_write_string(m, r->cfg->run_name);
    fprintf(m,
            ", \"learning/loss\": %s, \"learning/grad_norm\": %s, "
            "\"learning/raw_grad_norm\": %s, \"learning/current_learning_rate\": %.8g, "
            "\"learning/total_weights\": %lld, \"perf/step_time_seconds\": %.6f, \"perf/per_device_tflops\": %.6f, "
            "\"perf/per_device_tflops_per_sec\": %.6f, \"perf/per_device_tokens\": %lld, "
            "\"perf/per_device_tokens_per_sec\": %.4f, \"perf/mfu\": %.6f, \"perf/data_wait_seconds\": %.6f",
            json_number(loss, sizeof loss, rec->loss), json_number(gn, sizeof gn, rec->grad_norm),
            json_number(raw_gn, sizeof raw_gn, rec->raw_grad_norm), r->cfg->learning_rate,
            (long long)r->plan.tokens_per_device * r->plan.num_ranks, rec->seconds, tflops, tflops_s,
            (long long)r->plan.tokens_per_device, tokens_s, mfu / 100.0, rec->data_wait_seconds);
    if (rec->memory_measured)
        fprintf(m, ", \"memory/rss_gib\": %.6f, \"memory/peak_rss_gib\": %.6f", (double)rec->rss_bytes / GIB,
                (double)rec->peak_rss_bytes / GIB);
    if (rec->checkpoint_bytes)
        fprintf(m, ", \"checkpoint/write_seconds\": %.6f, \"checkpoint/bytes\": %llu, \"checkpoint/async\": %s",
                rec->checkpoint_seconds, (unsigned long long)rec->checkpoint_bytes, rec->checkpoint_async ? "true" : "false");
    if (rec->checkpoint_wait_seconds > 0)
        fprintf(m, ", \"checkpoint/wait_seconds\": %.6f", rec->checkpoint_wait_seconds);
    char eval_loss[32];
    const int64_t eval_tokens = rec->eval_batches * plan_batch_tokens_per_device(&r->plan);
    double eval_tokens_s = rec->eval_batches ? (double)eval_tokens / rec->eval_seconds : 0.0;
    if (rec->eval_batches)
        fprintf(m, ", \"eval/avg_loss\": %s, \"eval/total_weights\": %lld, \"eval/seconds\": %.6f, "
                "\"eval/per_device_tokens_per_sec\": %.4f, \"eval/per_device_tflops_per_sec\": %.6f",
                json_number(eval_loss, sizeof eval_loss, rec->eval_loss),
                (long long)(eval_tokens * r->plan.num_ranks), rec->eval_seconds,
                eval_tokens_s, eval_tflops_s(r, eval_tokens_s));
    fputs("}\n", m);
    int ok = fclose(m) == 0;
    size_t done = 0;
    while (ok && done < len) {
        ssize_t k = write(r->metrics_fd, line + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            if (ftruncate(r->metrics_fd, r->metrics_size) != 0) { /* the write error is the one to report */ }
            free(line);
            snprintf(err, errlen, "writing %s failed at step %lld: %s (disk full?); the steps before it are kept",
                     r->partial_path, (long long)rec->step, strerror(e));
            return 1;
        }
        done += (size_t)k;
    }
    free(line);
    if (!ok) {
        snprintf(err, errlen, "out of memory writing %s", r->partial_path);
        return 1;
    }
    r->metrics_size += (off_t)len;
    if (r->tb) {
        const char *tags[] = {"learning/loss", "learning/grad_norm", "learning/raw_grad_norm",
                              "learning/current_learning_rate", "perf/step_time_seconds", "perf/per_device_tflops",
                              "perf/per_device_tflops_per_sec", "perf/per_device_tokens",
                              "perf/per_device_tokens_per_sec", "perf/mfu", "perf/data_wait_seconds",
                              "memory/rss_gib", "memory/peak_rss_gib"};
        float values[] = {(float)rec->loss, (float)rec->grad_norm, (float)rec->raw_grad_norm, (float)r->cfg->learning_rate,
                          (float)rec->seconds, (float)tflops, (float)tflops_s, (float)tokens, (float)tokens_s,
                          (float)(mfu / 100.0), (float)rec->data_wait_seconds, (float)((double)rec->rss_bytes / GIB),
                          (float)((double)rec->peak_rss_bytes / GIB)};
        size_t n = sizeof values / sizeof values[0] - (rec->memory_measured ? 0 : 2);
        const char *eval_tag = "eval/avg_loss";
        float eval_value = (float)rec->eval_loss;
        if (tfevents_write_scalars(r->tb, rec->step, tfevents_wall_time(), n, tags, values) != 0 ||
            (rec->eval_batches && tfevents_write_scalars(r->tb, rec->step, tfevents_wall_time(), 1, &eval_tag, &eval_value) != 0)) {
            snprintf(err, errlen, "writing TensorBoard events failed: %s", tfevents_error(r->tb));
            return 1;
        }
    }
    if (r->num_logged < r->cap) r->seconds[r->num_logged++] = rec->seconds;
    if (rec->eval_batches && r->evals < r->cap) {
        r->eval_rates[r->evals++] = eval_tokens_s;
        r->last_eval_loss = rec->eval_loss;
        r->last_eval_step = rec->step;
    }
    if (rec->checkpoint_bytes && r->checkpoints < r->cap) {
        r->checkpoint_seconds[r->checkpoints++] = rec->checkpoint_seconds;
        r->checkpoint_bytes = rec->checkpoint_bytes;
        r->checkpoints_async += rec->checkpoint_async;
    }
    r->checkpoint_wait_s += rec->checkpoint_wait_seconds;
    r->last_loss = rec->loss;
    return 0;
}

void report_set_machine_probes(report_t *r, double before, double after) {
    r->probe_before = before;
    r->probe_after = after;
}

void report_set_bus_probes(report_t *r, double before, double after) {
    r->bus_before = before;
    r->bus_after = after;
}

void report_set_run_time(report_t *r, const run_time_t *t) {
    r->run_time_set = true;
    r->run_time = *t;
}

void report_set_other_load(report_t *r, double others_cores, double steal_cores) {
    r->load_measured = true;
    r->others_cores = others_cores;
    r->steal_cores = steal_cores;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The machine line: beyond a tenth either way, the cores' pace moved during the run. On a shared
 * VM the probe has read anywhere from 0.36 to 0.58 TFLOP/s within an hour, and whole steps moved
 * with it (docs/performance_log.md, runs BR and BS). */
enum { PROBE_DRIFT_PERCENT = 10 };
static bool probe_moved(const report_t *r) {
    return fabs(r->probe_after / r->probe_before - 1.0) * 100.0 > PROBE_DRIFT_PERCENT;
}

/* Other load over a tenth of a core: bench/vs_torch.py's threshold for a suspect timing. */
static const double OTHER_LOAD_CORES = 0.1;
static bool loaded(const report_t *r) { return r->others_cores + r->steal_cores > OTHER_LOAD_CORES; }

/* The median of x[0..n) (n >= 1), sorting x in place. */
static double median_sorting(double *x, int64_t n) {
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

void report_summary(report_t *r, FILE *out) {
    int64_t n = r->num_logged - 1; /* the run's first step pays one-time costs: left out */
    const long long first = (long long)r->first_step;
    if (n < 1) {
        fprintf(out, "summary: only %lld step(s) logged; run 2 steps or more for a summary without the first (step %lld)\n",
                (long long)r->num_logged, first);
        return;
    }
    double *s = malloc((size_t)n * sizeof(double));
    if (!s) {
        fprintf(out, "summary: out of memory\n");
        return;
    }
    memcpy(s, r->seconds + 1, (size_t)n * sizeof(double));
    r->median = median_sorting(s, n);
    r->fastest = s[0], r->slowest = s[n - 1];
    r->summarised = true;
    free(s);
    double median = r->median, tflops_s = r->plan.tflops_per_device / median;
    fprintf(out, "summary over steps %lld..%lld (%lld step%s; step %lld left out):\n", first + 1, first + n, (long long)n,
            n == 1 ? "" : "s", first);
    fprintf(out, "  step time     median %.3f s, min %.3f s, max %.3f s\n", median, r->fastest, r->slowest);
    fprintf(out, "  tokens/s/device %.1f (at the median)\n", (double)r->plan.tokens_per_device / median);
    fprintf(out, "  TFLOP/s/device  %.4f (%.4f TFLOP per step, MaxText's count)\n", tflops_s, r->plan.tflops_per_device);
    if (r->peak_tflops > 0)
        fprintf(out, "  MFU             %.2f%% of %.4f TFLOP/s\n", 100.0 * tflops_s / r->peak_tflops, r->peak_tflops);
    if (r->evals) {
        double rate = r->eval_rate_median = median_sorting(r->eval_rates, r->evals), ev_tflops = eval_tflops_s(r, rate);
        fprintf(out, "  evaluation      %lld, the last after step %lld: average loss %.4f; forward %.1f tokens/s/device, "
                     "%.4f TFLOP/s/device",
                (long long)r->evals, (long long)r->last_eval_step, r->last_eval_loss, rate, ev_tflops);
        if (r->peak_tflops > 0) fprintf(out, ", MFU %.2f%%", 100.0 * ev_tflops / r->peak_tflops);
        fprintf(out, " (median)\n");
    }
    if (r->checkpoints) {
        double secs = r->checkpoint_seconds_median = median_sorting(r->checkpoint_seconds, r->checkpoints);
        bool gib = r->checkpoint_bytes >= (uint64_t)GIB;
        fprintf(out, "  checkpoints     %lld written, %.3f %s each, %.3f s (%.3f GB/s) median, ", (long long)r->checkpoints,
                (double)r->checkpoint_bytes / (gib ? GIB : 1048576.0), gib ? "GiB" : "MiB", secs,
                (double)r->checkpoint_bytes / secs / 1e9);
        if (r->checkpoints_async)
            fprintf(out, "%lld beside the next step (async_checkpointing: the next steps' updates waited %.3f s in all "
                         "for them, in the step times), %lld outside the step times\n",
                    (long long)r->checkpoints_async, r->checkpoint_wait_s, (long long)(r->checkpoints - r->checkpoints_async));
        else
            fprintf(out, "outside the step times\n");
    }
    /* Read now, so the peak covers the whole run so far, steps and set-up alike. */
    memstat_t mem;
    r->memory_measured = memstat_read(&mem);
    if (!r->memory_measured) {
        fprintf(out, "  memory          not measured: /proc/self/status could not be read\n");
    } else {
        r->peak_rss_bytes = mem.peak_rss_bytes;
        fprintf(out, "  memory          peak RSS %.3f GiB%s, %.3fx the plan's %.3f GiB", (double)mem.peak_rss_bytes / GIB,
                r->plan.num_ranks > 1 ? " (rank 0)" : "", (double)mem.peak_rss_bytes / (double)r->plan.total_bytes,
                (double)r->plan.total_bytes / GIB);
        r->physical_bytes = memstat_physical_bytes();
        if (r->physical_bytes)
            fprintf(out, ", %.1f%% of %.1f GiB physical", 100.0 * (double)mem.peak_rss_bytes / (double)r->physical_bytes,
                    (double)r->physical_bytes / GIB);
        fputc('\n', out);
    }
    if (r->load_measured)
        fprintf(out, "  other load      %.2f cores used by other processes%s, %.2f taken by the hypervisor (steal), "
                     "while steps %lld..%lld ran%s\n",
                r->others_cores, r->plan.ranks_per_host > 1 ? " (this host's other ranks among them)" : "",
                r->steal_cores, first + 1, first + n,
                loaded(r) ? ": other work held the cores, so these step times are not the machine's alone" : "");
    if (r->probe_before > 0 && r->probe_after > 0) {
        fprintf(out, "  machine         probe %.4f TFLOP/s after the steps, %.3fx the start-up probe's %.4f%s",
                r->probe_after, r->probe_after / r->probe_before, r->probe_before,
                probe_moved(r) ? ": the cores' pace moved during the run, so compare its step times with another run's with care"
                               : "");
        /* No verdict for the bus: on a shared VM it flips by 2x within seconds, so the op
         * summary's notes read each row against both probes instead. */
        if (r->bus_before > 0 && r->bus_after > 0)
            fprintf(out, "; memory bus %.1f GB/s after the steps, %.3fx the start-up probe's %.1f", r->bus_after,
                    r->bus_after / r->bus_before, r->bus_before);
        else if (r->bus_before > 0)
            fprintf(out, "; memory bus not probed again (it runs in the run's activation and scratch buffers, under its "
                         "3 x 256 MiB here)");
        fputc('\n', out);
    }
    if (r->run_time_set) {
        const run_time_t *t = &r->run_time;
        double between = t->evaluation_s + t->checkpoints_s + t->profile_s;
        fprintf(out, "  run time        %.2f s wall: %.2f s before step %lld (probes, data, set-up), %.2f s in steps %lld..%lld, "
                     "%.2f s between them (evaluation %.2f, checkpoints %.2f, profile %.2f), %.2f s after (the closing probes, the "
                     "last reads)\n",
                t->wall_s, t->before_steps_s, first, t->steps_s, first, first + n, between, t->evaluation_s, t->checkpoints_s,
                t->profile_s, t->wall_s - t->before_steps_s - t->steps_s - between);
    }
}

/* summary.json: the summary's figures, unrounded, for scripts that compare runs. */
static int write_summary_json(FILE *f, void *ctx, char *err, size_t errlen) {
    (void)err, (void)errlen;
    const report_t *r = ctx;
    const config_t *c = r->cfg;
    const double tflops_s = r->plan.tflops_per_device / r->median;
    char num[32];
    fputs("{\n  \"run_name\": ", f);
    json_write_string(f, c->run_name);
    fputs(",\n  \"model_name\": ", f);
    json_write_string(f, c->model_name);
    fprintf(f, ",\n  \"dtype\": \"%s\",\n  \"weight_dtype\": \"%s\",\n  \"per_device_batch_size\": %lld,\n"
               "  \"max_target_length\": %lld,\n  \"num_threads\": %d,\n  \"num_ranks\": %d,\n",
            dtype_name(c->dtype), dtype_name(c->weight_dtype), (long long)r->plan.dims.B, (long long)r->plan.dims.S, r->plan.num_threads,
            r->plan.num_ranks);
    fprintf(f, "  \"steps_logged\": %lld,\n  \"summary_first_step\": %lld,\n  \"summary_last_step\": %lld,\n",
            (long long)r->num_logged, (long long)r->first_step + 1, (long long)(r->first_step + r->num_logged - 1));
    fprintf(f, "  \"perf/step_time_seconds_median\": %.9g,\n  \"perf/step_time_seconds_min\": %.9g,\n"
               "  \"perf/step_time_seconds_max\": %.9g,\n",
            r->median, r->fastest, r->slowest);
    fprintf(f, "  \"perf/per_device_tokens_per_sec\": %.9g,\n  \"perf/per_device_tflops\": %.9g,\n"
               "  \"perf/per_device_tflops_per_sec\": %.9g,\n",
            (double)r->plan.tokens_per_device / r->median, r->plan.tflops_per_device, tflops_s);
    if (r->peak_tflops > 0)
        fprintf(f, "  \"perf/mfu\": %.9g,\n  \"perf/peak_tflops\": %.9g,\n  \"perf/peak_source\": \"%s\",\n",
                tflops_s / r->peak_tflops, r->peak_tflops, c->device_peak_tflops > 0 ? "device_peak_tflops" : "probe");
    if (r->probe_before > 0 && r->probe_after > 0)
        fprintf(f, "  \"machine/probe_before_tflops\": %.9g,\n  \"machine/probe_after_tflops\": %.9g,\n"
                   "  \"machine/probe_ratio\": %.9g,\n  \"machine/probe_moved\": %s,\n",
                r->probe_before, r->probe_after, r->probe_after / r->probe_before, probe_moved(r) ? "true" : "false");
    if (r->bus_before > 0 && r->bus_after > 0)
        fprintf(f, "  \"machine/bus_before_gb_per_s\": %.9g,\n  \"machine/bus_after_gb_per_s\": %.9g,\n"
                   "  \"machine/bus_ratio\": %.9g,\n",
                r->bus_before, r->bus_after, r->bus_after / r->bus_before);
    if (r->load_measured)
        fprintf(f, "  \"machine/others_cores\": %.9g,\n  \"machine/steal_cores\": %.9g,\n  \"machine/other_load\": %s,\n",
                r->others_cores, r->steal_cores, loaded(r) ? "true" : "false");
    if (r->run_time_set)
        fprintf(f, "  \"time/wall_seconds\": %.9g,\n  \"time/before_steps_seconds\": %.9g,\n  \"time/steps_seconds\": %.9g,\n"
                   "  \"time/evaluation_seconds\": %.9g,\n  \"time/checkpoint_seconds\": %.9g,\n"
                   "  \"time/profile_write_seconds\": %.9g,\n",
                r->run_time.wall_s, r->run_time.before_steps_s, r->run_time.steps_s, r->run_time.evaluation_s,
                r->run_time.checkpoints_s, r->run_time.profile_s);
    if (r->evals) {
        double rate = r->eval_rate_median;
        fprintf(f, "  \"eval/count\": %lld,\n  \"eval/last_step\": %lld,\n  \"eval/last_avg_loss\": %s,\n"
                   "  \"eval/per_device_tokens_per_sec_median\": %.9g,\n  \"eval/per_device_tflops_per_sec_median\": %.9g,\n",
                (long long)r->evals, (long long)r->last_eval_step, json_number(num, sizeof num, r->last_eval_loss), rate,
                eval_tflops_s(r, rate));
    }
    if (r->checkpoints) {
        double secs = r->checkpoint_seconds_median;
        fprintf(f, "  \"checkpoint/count\": %lld,\n  \"checkpoint/bytes\": %llu,\n  \"checkpoint/write_seconds_median\": %.9g,\n"
                   "  \"checkpoint/async_count\": %lld,\n  \"checkpoint/wait_seconds\": %.9g,\n",
                (long long)r->checkpoints, (unsigned long long)r->checkpoint_bytes, secs, (long long)r->checkpoints_async,
                r->checkpoint_wait_s);
    }
    if (r->memory_measured) {
        fprintf(f, "  \"memory/peak_rss_gib\": %.9g,\n  \"memory/plan_gib\": %.9g,\n  \"memory/peak_rss_to_plan\": %.9g,\n",
                (double)r->peak_rss_bytes / GIB, (double)r->plan.total_bytes / GIB,
                (double)r->peak_rss_bytes / (double)r->plan.total_bytes);
        if (r->physical_bytes) fprintf(f, "  \"memory/physical_gib\": %.9g,\n", (double)r->physical_bytes / GIB);
    }
    fprintf(f, "  \"learning/final_loss\": %s\n}\n", json_number(num, sizeof num, r->last_loss));
    return 0;
}

const char *report_summary_path(const report_t *r) { return r->summarised ? r->summary_path : NULL; }

int report_close(report_t *r, char *err, size_t errlen) {
    int rc = 0;
    if (r->tb && tfevents_close(r->tb) != 0) {
        snprintf(err, errlen, "closing the TensorBoard event file failed");
        rc = 1;
    }
    if (r->metrics_fd >= 0) {
        bool ok = fsync(r->metrics_fd) == 0 || errno == EINVAL;
        ok = (close(r->metrics_fd) == 0) && ok;
        r->metrics_fd = -1;
        if (!ok || rename(r->partial_path, r->metrics_path) != 0) {
            if (!rc) snprintf(err, errlen, "could not finish %s: %s", r->metrics_path, strerror(errno));
            unlink(r->partial_path);
            rc = 1;
        }
    }
    /* Written with the metrics it summarises, or removed: an older run's under this run's name
     * would pass for this one's. */
    if (rc == 0 && r->summarised) {
        char werr[512];
        if (atomic_write_with(r->summary_path, write_summary_json, r, werr, sizeof werr) != 0) {
            snprintf(err, errlen, "%s", werr);
            rc = 1;
        }
    } else if (unlink(r->summary_path) != 0 && errno != ENOENT && !rc) {
        snprintf(err, errlen, "could not remove the stale %s: %s", r->summary_path, strerror(errno));
        rc = 1;
    }
    free(r->seconds);
    free(r);
    return rc;
}

bool report_salvage_on_signal(const report_t *r) {
    if (!r) return false;
    if (r->num_logged > 0) {
        rename(r->partial_path, r->metrics_path);
        return true;
    }
    unlink(r->partial_path);
    if (r->tb) unlink(tfevents_path(r->tb));
    remove_created(r->created_top[1], r->created_leaf[1]);
    remove_created(r->created_top[0], r->created_leaf[0]);
    return false;
}

const char *report_metrics_path(const report_t *r) { return r->metrics_path; }
const char *report_tensorboard_dir(const report_t *r) { return r->tb ? r->tb_dir : NULL; }
