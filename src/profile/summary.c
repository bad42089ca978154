/* summary: op summary, see summary.h for the counting rule. */
#include "profile/summary.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "profile/pb.h"
#include "util/atomic_file.h"

typedef struct { int64_t start, end, num; } step_span_t;

typedef struct {
    trace_category_t cat;
    const char *part;    /* NULL for a category total */
    int64_t calls, ns;
    double flops, bytes;
} acc_t;

static int cmp_step_num(const void *pa, const void *pb) {
    const step_span_t *a = pa, *b = pb;
    if (a->num != b->num) return a->num < b->num ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

static int cmp_step_start(const void *pa, const void *pb) {
    const step_span_t *a = pa, *b = pb;
    return (a->start > b->start) - (a->start < b->start);
}

/* Root steps in range from every lane, one per step number, sorted by start. */
static step_span_t *collect_steps(const trace_t *t, int64_t first, int64_t last, size_t *n) {
    size_t total = 0;
    for (size_t l = 0; l < t->num_lanes; l++) total += trace_lane_count(&t->lanes[l]);
    step_span_t *s = malloc((total ? total : 1) * sizeof *s);
    if (!s) return NULL;
    bool all = first < 0 || last < first;
    size_t k = 0;
    for (size_t l = 0; l < t->num_lanes; l++)
        /* k < total: a lane may have published more since total was taken. */
        for (size_t i = 0, n = trace_lane_count(&t->lanes[l]); i < n && k < total; i++) {
            const trace_event_t *e = &t->lanes[l].events[i];
            if (!trace_is_root_step(t, e) || (!all && (e->step_num < first || e->step_num > last))) continue;
            s[k++] = (step_span_t){e->start_ns, e->end_ns, e->step_num};
        }
    qsort(s, k, sizeof *s, cmp_step_num);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || s[u - 1].num != s[i].num) s[u++] = s[i];
    qsort(s, u, sizeof *s, cmp_step_start);
    *n = u;
    return s;
}

static void add(acc_t *a, const trace_event_t *e) {
    a->calls++;
    a->ns += e->end_ns - e->start_ns;
    a->flops += e->flops;
    a->bytes += e->bytes;
}

/* Part accumulators: parts are few (bounded by the names), so a linear search is fine. */
static acc_t *part_acc(acc_t *parts, size_t *n, trace_category_t cat, const char *part) {
    for (size_t i = 0; i < *n; i++)
        if (parts[i].cat == cat && strcmp(parts[i].part, part) == 0) return &parts[i];
    parts[*n] = (acc_t){.cat = cat, .part = part};
    return &parts[(*n)++];
}

typedef struct {
    acc_t cats[TRACE_CAT_COUNT];
    acc_t *parts;
    size_t num_parts;
    int64_t kernel_ns;
    /* the counted spans with flops, for the rows' spreads */
    const trace_event_t **rated;
    size_t num_rated;
} tally_t;

/* Walk the master lane's outermost kernel spans in time order and add each inside a selected
 * step to its rows (and, with flops, to ty->rated, which the caller frees). */
static int tally_lane(const trace_t *t, size_t lane, const step_span_t *steps, size_t num_steps, tally_t *ty) {
    size_t n;
    const trace_event_t **ev = trace_outermost_kernels(t, lane, &n);
    ty->rated = malloc((n ? n : 1) * sizeof *ty->rated);
    if (!ev || !ty->rated) {
        free(ev);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const trace_event_t *e = ev[i];
        while (k < num_steps && steps[k].end <= e->start_ns) k++;
        if (k == num_steps || e->start_ns < steps[k].start) continue;  /* outside the steps */
        const trace_name_t *nm = &t->names[e->name_id];
        add(&ty->cats[nm->category], e);
        if (nm->part) add(part_acc(ty->parts, &ty->num_parts, nm->category, nm->part), e);
        ty->kernel_ns += e->end_ns - e->start_ns;
        if (e->flops > 0 && e->end_ns > e->start_ns) ty->rated[ty->num_rated++] = e;
    }
    free(ev);
    return 0;
}

static double call_rate(const trace_event_t *e) { return e->flops / (double)(e->end_ns - e->start_ns); }

static int cmp_rate(const void *pa, const void *pb) {
    double a = call_rate(*(const trace_event_t *const *)pa), b = call_rate(*(const trace_event_t *const *)pb);
    return (a > b) - (a < b);
}

/* p10 and p90 of a row (category cat; part, or every part when NULL), weighted by flops: the
 * spans in ty->rated are sorted by rate once; per row, one walk sums the row's flops among them
 * and a second stops where 90% of those have been seen. */
static void row_spread(const trace_t *t, const tally_t *ty, trace_category_t cat, const char *part, double *p10,
                       double *p90) {
    double total = 0, seen = 0;
    *p10 = *p90 = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < ty->num_rated; i++) {
            const trace_event_t *e = ty->rated[i];
            const trace_name_t *nm = &t->names[e->name_id];
            if (nm->category != cat || (part && (!nm->part || strcmp(nm->part, part) != 0))) continue;
            if (pass == 0) {
                total += e->flops;
                continue;
            }
            seen += e->flops;
            if (*p10 == 0 && seen >= 0.1 * total) *p10 = call_rate(e);
            if (seen >= 0.9 * total) {
                *p90 = call_rate(e);
                return;
            }
        }
}

static void fill_row(summary_row_t *r, const char *cat, const char *part, const acc_t *a, double step_ns,
                     const summary_t *s) {
    double ns = (double)a->ns;
    memset(r, 0, sizeof *r);
    snprintf(r->category, sizeof r->category, "%s", cat);
    snprintf(r->part, sizeof r->part, "%s", part ? part : "");
    r->calls = a->calls;
    r->total_ms = ns * 1e-6;
    r->share = step_ns > 0 ? ns / step_ns : 0;
    r->flops = a->flops;
    r->gflops_per_s = ns > 0 ? a->flops / ns : 0;   /* flop per ns == GFLOP/s */
    r->pct_peak = s->peak_gflops > 0 ? 100.0 * r->gflops_per_s / s->peak_gflops : 0;
    r->bytes = a->bytes;
    r->gbytes_per_s = ns > 0 ? a->bytes / ns : 0;   /* byte per ns == GB/s */
    r->pct_bandwidth = s->peak_gbytes_per_s > 0 ? 100.0 * r->gbytes_per_s / s->peak_gbytes_per_s : 0;
}

/* Category then time descending, so each category's parts follow it biggest first. */
static int cmp_part(const void *pa, const void *pb) {
    const acc_t *a = pa, *b = pb;
    if (a->cat != b->cat) return a->cat < b->cat ? -1 : 1;
    return (a->ns < b->ns) - (a->ns > b->ns);
}

static void emit_rows(const trace_t *t, summary_t *s, tally_t *ty, double step_ns) {
    qsort(ty->parts, ty->num_parts, sizeof *ty->parts, cmp_part);
    if (ty->num_rated) qsort(ty->rated, ty->num_rated, sizeof *ty->rated, cmp_rate); /* NULL without a lane */
    size_t p = 0;
    acc_t total = {.calls = s->num_steps, .ns = llround(step_ns)}, other = {.ns = llround(s->other_ms * 1e6)};
    for (int c = 0; c < TRACE_CAT_COUNT; c++) {
        const acc_t *a = &ty->cats[c];
        if (a->calls == 0) continue;
        const char *name = trace_category_name((trace_category_t)c);
        summary_row_t *r = &s->rows[s->num_rows++];
        fill_row(r, name, NULL, a, step_ns, s);
        row_spread(t, ty, (trace_category_t)c, NULL, &r->gflops_p10, &r->gflops_p90);
        total.flops += a->flops;
        total.bytes += a->bytes;
        while (p < ty->num_parts && (int)ty->parts[p].cat < c) p++;
        for (; p < ty->num_parts && (int)ty->parts[p].cat == c; p++) {
            r = &s->rows[s->num_rows++];
            fill_row(r, name, ty->parts[p].part, &ty->parts[p], step_ns, s);
            row_spread(t, ty, (trace_category_t)c, ty->parts[p].part, &r->gflops_p10, &r->gflops_p90);
        }
    }
    fill_row(&s->rows[s->num_rows++], SUMMARY_OTHER_LABEL, NULL, &other, step_ns, s);
    fill_row(&s->rows[s->num_rows++], SUMMARY_TOTAL_LABEL, NULL, &total, step_ns, s);
}

int summary_compute(const trace_t *t, int64_t first_step, int64_t last_step, double peak_gflops,
                    double peak_gbytes_per_s, summary_t *out) {
    memset(out, 0, sizeof *out);
    out->first_step = out->last_step = -1;
    out->peak_gflops = peak_gflops;
    out->peak_gbytes_per_s = peak_gbytes_per_s;
    for (size_t l = 0; l < t->num_lanes; l++) out->dropped_events += t->lanes[l].dropped;
    size_t num_steps = 0;
    step_span_t *steps = collect_steps(t, first_step, last_step, &num_steps);
    tally_t ty = {.parts = malloc((t->num_names ? t->num_names : 1) * sizeof(acc_t))};
    /* Rows: at most one per category and one per name (part), plus other and total. */
    out->rows = calloc(TRACE_CAT_COUNT + t->num_names + 2, sizeof *out->rows);
    int rc = (steps && ty.parts && out->rows) ? 0 : -1;
    double step_ns = 0;
    for (size_t i = 0; rc == 0 && i < num_steps; i++) {
        step_ns += (double)(steps[i].end - steps[i].start);
        if (out->first_step < 0 || steps[i].num < out->first_step) out->first_step = steps[i].num;
        if (steps[i].num > out->last_step) out->last_step = steps[i].num;
    }
    if (rc == 0 && t->num_lanes > 0) {
        size_t m = trace_compute_lane(t);
        snprintf(out->lane, sizeof out->lane, "%s", t->lanes[m].name);
        rc = tally_lane(t, m, steps, num_steps, &ty);
    }
    if (rc == 0) {
        out->num_steps = (int64_t)num_steps;
        out->step_ms = step_ns * 1e-6;
        out->kernel_ms = (double)ty.kernel_ns * 1e-6;
        out->other_ms = out->step_ms - out->kernel_ms;
        emit_rows(t, out, &ty, step_ns);
    }
    free(steps);
    free(ty.parts);
    free(ty.rated);
    if (rc != 0) summary_free(out);
    return rc;
}

void summary_free(summary_t *s) {
    if (!s) return;
    free(s->rows);
    s->rows = NULL;
    s->num_rows = 0;
}

/* The row that went furthest past the reference the column is read against (pct_peak or
 * pct_bandwidth over 100), or NULL. The total row averages the others and is left out. */
static const summary_row_t *furthest_past(const summary_t *s, bool bandwidth) {
    const summary_row_t *worst = NULL;
    for (size_t i = 0; i < s->num_rows; i++) {
        const summary_row_t *r = &s->rows[i];
        double pct = bandwidth ? r->pct_bandwidth : r->pct_peak;
        if (strcmp(r->category, SUMMARY_TOTAL_LABEL) == 0 || pct <= 100.0) continue;
        if (!worst || pct > (bandwidth ? worst->pct_bandwidth : worst->pct_peak)) worst = r;
    }
    return worst;
}

/* More than this a call (MiB) is past any CPU's last-level cache (a core group's on the largest
 * server parts is 96 MiB), so such a call's bytes came over the bus. */
static const double CACHE_MIB_BOUND = 256.0;

/* A row over 100% of the peak means the peak was probed when the cores were slower than during
 * the steps, or was given low; over 100% of the bandwidth, also that the row's data stayed in
 * the caches (a small model's activations) or that the bus was probed in a slow moment (a
 * shared VM's moves by 2x within seconds). Say so under the table rather than leave a 172% to
 * be read as a fact about the kernel. */
static void print_reference_notes(const summary_t *s, FILE *f) {
    const summary_row_t *r = furthest_past(s, false);
    if (r)
        fprintf(f, "note: %s%s%s ran at %.1f GFLOP/s, %.2fx the %.1f GFLOP/s peak %%peak is read against: the cores "
                "were faster during the steps than when the peak was probed, or the peak given is low\n",
                r->category, r->part[0] ? " " : "", r->part, r->gflops_per_s, r->pct_peak / 100.0, s->peak_gflops);
    r = furthest_past(s, true);
    if (!r) return;
    fprintf(f, "note: %s%s%s moved %.1f GB/s, %.2fx the %.1f GB/s %%bw is read against: ", r->category,
            r->part[0] ? " " : "", r->part, r->gbytes_per_s, r->pct_bandwidth / 100.0, s->peak_gbytes_per_s);
    const double after = s->bandwidth_after_gbs, mib_a_call = r->bytes / (double)r->calls / 1048576.0;
    /* A call that moves more than any cache holds cannot have been served from one: then only
     * the bus can have moved. With the closing probe the causes part further: a row within what
     * the bus gave after the steps met a bus that moved. */
    const bool past_caches = mib_a_call > CACHE_MIB_BOUND;
    if (after > 0 && r->gbytes_per_s <= after)
        fprintf(f, "the memory bus was faster during the steps than when it was probed at start-up: it probed %.1f "
                   "GB/s after the steps, and the row is %.0f%% of that", after, 100.0 * r->gbytes_per_s / after);
    else {
        const char *when = after > 0 ? "at either probe" : "when it was probed";
        if (after > 0) fprintf(f, "past the bus's %.1f GB/s after the steps too, ", after);
        if (past_caches)
            fprintf(f, "with %.0f MiB a call, more than a cache holds: the memory bus ran faster during the steps than %s",
                    mib_a_call, when);
        else
            fprintf(f, "with %.1f MiB a call: its data stayed in the caches between kernels, or the memory bus ran "
                       "faster during the steps than %s", mib_a_call, when);
        fprintf(f, " (a shared VM's moves by 2x within seconds)");
    }
    fprintf(f, "; a fixed device_peak_gb_per_s compares runs\n");
}

void summary_print(const summary_t *s, FILE *f) {
    fprintf(f, "op summary: steps %lld..%lld (%lld), step time %.3f ms, kernels counted on lane \"%s\"",
            (long long)s->first_step, (long long)s->last_step, (long long)s->num_steps, s->step_ms, s->lane);
    if (s->peak_gflops > 0) fprintf(f, ", peak %.1f GFLOP/s", s->peak_gflops);
    if (s->peak_gbytes_per_s > 0) fprintf(f, ", memory bandwidth %.1f GB/s", s->peak_gbytes_per_s);
    if (s->peak_gbytes_per_s > 0 && s->bandwidth_after_gbs > 0)
        fprintf(f, " (%.1f after the steps)", s->bandwidth_after_gbs);
    fprintf(f, "\n");
    if (s->dropped_events)
        fprintf(f, "warning: %zu events were dropped (trace buffers full): figures undercount\n",
                s->dropped_events);
    fprintf(f, "%-24s %-20s %9s %12s %7s %11s %7s %15s %9s %6s\n", "category", "part", "calls", "total ms", "share",
            "GFLOP/s", "%peak", "p10-p90 GFLOP/s", "GB/s", "%bw");
    for (size_t i = 0; i < s->num_rows; i++) {
        const summary_row_t *r = &s->rows[i];
        char calls[24] = "-", gf[24] = "-", pk[24] = "-", spread[48] = "-", gb[24] = "-", bw[24] = "-";
        if (r->calls) snprintf(calls, sizeof calls, "%lld", (long long)r->calls);
        if (r->flops > 0) snprintf(gf, sizeof gf, "%.1f", r->gflops_per_s);
        if (r->flops > 0 && s->peak_gflops > 0) snprintf(pk, sizeof pk, "%.1f%%", r->pct_peak);
        if (r->gflops_p90 > 0) snprintf(spread, sizeof spread, "%.0f-%.0f", r->gflops_p10, r->gflops_p90);
        if (r->bytes > 0) snprintf(gb, sizeof gb, "%.1f", r->gbytes_per_s);
        if (r->bytes > 0 && s->peak_gbytes_per_s > 0) snprintf(bw, sizeof bw, "%.0f%%", r->pct_bandwidth);
        /* Part rows are indented under their category. */
        fprintf(f, "%-24s %-20s %9s %12.3f %6.1f%% %11s %7s %15s %9s %6s\n", r->part[0] ? "" : r->category,
                r->part, calls, r->total_ms, 100.0 * r->share, gf, pk, spread, gb, bw);
    }
    print_reference_notes(s, f);
}

/* JSON text helpers over a pb_buf_t used as a plain byte buffer. */
static void js_raw(pb_buf_t *b, const char *s) { pb_raw(b, s, strlen(s)); }

static void js_str(pb_buf_t *b, const char *s) {
    js_raw(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[8];
        if (c == '"' || c == '\\') snprintf(e, sizeof e, "\\%c", c);
        else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c);
        else snprintf(e, sizeof e, "%c", c);
        js_raw(b, e);
    }
    js_raw(b, "\"");
}

/* ,"key":number for each of n fields; JSON has no inf or nan, so those become 0. */
typedef struct { const char *key; double value; } js_field_t;
static void js_nums(pb_buf_t *b, const js_field_t *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char tmp[96];
        snprintf(tmp, sizeof tmp, ",\"%s\":%.10g", f[i].key, isfinite(f[i].value) ? f[i].value : 0.0);
        js_raw(b, tmp);
    }
}

static void js_row(pb_buf_t *b, const summary_row_t *r) {
    js_raw(b, "{\"category\":");
    js_str(b, r->category);
    js_raw(b, ",\"part\":");
    js_str(b, r->part);
    const js_field_t f[] = {{"calls", (double)r->calls}, {"total_ms", r->total_ms}, {"share", r->share},
                            {"flops", r->flops}, {"gflops_per_s", r->gflops_per_s}, {"pct_peak", r->pct_peak},
                            {"gflops_p10", r->gflops_p10}, {"gflops_p90", r->gflops_p90}, {"bytes", r->bytes},
                            {"gbytes_per_s", r->gbytes_per_s}, {"pct_bandwidth", r->pct_bandwidth}};
    js_nums(b, f, sizeof f / sizeof f[0]);
    js_raw(b, "}");
}

int summary_write_json(const summary_t *s, const char *path, char *err, size_t errlen) {
    pb_buf_t b;
    pb_init(&b);
    char first[64];
    snprintf(first, sizeof first, "{\"first_step\":%lld", (long long)s->first_step);
    js_raw(&b, first);
    const js_field_t f[] = {{"last_step", (double)s->last_step}, {"num_steps", (double)s->num_steps},
                            {"step_ms", s->step_ms}, {"kernel_ms", s->kernel_ms}, {"other_ms", s->other_ms},
                            {"peak_gflops", s->peak_gflops}, {"peak_gbytes_per_s", s->peak_gbytes_per_s},
                            {"dropped_events", (double)s->dropped_events}};
    js_nums(&b, f, sizeof f / sizeof f[0]);
    js_raw(&b, ",\"lane\":");
    js_str(&b, s->lane);
    js_raw(&b, ",\"rows\":[");
    for (size_t i = 0; i < s->num_rows; i++) {
        if (i) js_raw(&b, ",\n ");
        js_row(&b, &s->rows[i]);
    }
    js_raw(&b, "]}\n");
    int rc = -1;
    if (!pb_ok(&b)) snprintf(err, errlen, "summary: out of memory");
    else rc = atomic_write_file(path, b.data, b.len, err, errlen);
    pb_free(&b);
    return rc;
}
