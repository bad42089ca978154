#include "train/profile_files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "profile/chrome_trace.h"
#include "profile/summary.h"
#include "profile/xplane.h"
#include "util/atomic_file.h"

/* The host name as a file name: XProf lists a profile under it. */
static void hostname_for_files(char *out, size_t n) {
    if (gethostname(out, n) != 0 || !out[0]) snprintf(out, n, "localhost");
    out[n - 1] = '\0';
    for (char *c = out; *c; c++)
        if (*c == ':' || *c == '/') *c = '_';
}

/* The memory plan as XProf's memory profile shows it: the --dry-run lines, in their order, each
 * with its dtype where it holds one kind (the optimizer's few norm partial sums, doubles, aside). */
enum { PLAN_BUFFERS = 7 };
static size_t plan_buffers(const plan_t *p, xplane_buffer_t out[PLAN_BUFFERS]) {
    const int mixed_or_float = p->bf16 ? XPLANE_DT_MIXED : XPLANE_DT_FLOAT;
    const xplane_buffer_t all[PLAN_BUFFERS] = {
        {"parameters", p->params_bytes, p->weights_bf16 ? XPLANE_DT_MIXED : XPLANE_DT_FLOAT, "persist"},
        {"bf16 weights", p->params_bf16_bytes, XPLANE_DT_BFLOAT16, "persist"},
        {"gradients", p->grads_bytes, XPLANE_DT_FLOAT, "persist"},
        {"optimizer state", p->optimizer_bytes, p->mu_bf16 || p->weights_bf16 ? XPLANE_DT_MIXED : XPLANE_DT_FLOAT,
         "persist"},
        {"saved activations", p->activations_bytes, mixed_or_float, "temp"},
        {"scratch", p->scratch_bytes, XPLANE_DT_MIXED, "temp"},
        {"data rings", p->data_bytes, XPLANE_DT_INT32, "persist"},
    };
    size_t n = 0;
    for (size_t i = 0; i < PLAN_BUFFERS; i++)
        if (all[i].bytes) out[n++] = all[i];
    return n;
}

int profile_files_write(const profile_window_t *w, profile_files_t *pf, char *err, size_t errlen) {
    char stamp[32], host[256], summary_name[64] = "op_summary.json";
    struct tm tm;
    localtime_r(&w->start_time, &tm);
    strftime(stamp, sizeof stamp, "%Y_%m_%d_%H_%M_%S", &tm);
    hostname_for_files(host, sizeof host);
    if (w->ranks > 1) {
        /* Ranks may share a host: the rank goes into the name XProf lists the profile under. */
        size_t len = strlen(host);
        snprintf(host + len, sizeof host - len, "_rank%d", w->rank);
        if (w->rank > 0) snprintf(summary_name, sizeof summary_name, "op_summary_rank%d.json", w->rank);
    }
    snprintf(pf->dir, sizeof pf->dir, "%s/%s/tensorboard/plugins/profile/%s", w->cfg->base_output_directory,
             w->cfg->run_name, stamp);
    if (mkdir_p(pf->dir) != 0) {
        snprintf(err, errlen, "cannot create the profile folder %s: %s", pf->dir, strerror(errno));
        return -1;
    }
    snprintf(pf->xplane, sizeof pf->xplane, "%s/%s.xplane.pb", pf->dir, host);
    snprintf(pf->trace, sizeof pf->trace, "%s/%s.trace.json.gz", pf->dir, host);
    snprintf(pf->summary, sizeof pf->summary, "%s/%s", pf->dir, summary_name);
    xplane_buffer_t buffers[PLAN_BUFFERS];
    const xplane_memory_t memory = {.allocator = "stepscope memory plan", .buffers = buffers,
                                    .count = plan_buffers(w->plan, buffers),
                                    .capacity_bytes = plan_memory_available(w->plan, w->cfg)};
    if (xplane_write(w->trace, pf->xplane, host, w->first_step, w->last_step, &memory, err, errlen) != 0) return -1;
    if (chrome_trace_write(w->trace, pf->trace, err, errlen) != 0) return -1;
    summary_t s;
    if (summary_compute(w->trace, w->first_step, w->last_step, w->peak_tflops * 1000.0, w->peak_gb_per_s, &s) == 0) {
        int rc = summary_write_json(&s, pf->summary, err, errlen);
        summary_free(&s);
        if (rc) return -1;
    }
    pf->written = 1;
    return 0;
}
