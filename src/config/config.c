/* config: table-driven loading of base YAML + model preset + key=value overrides.
 * Every key is one row of config_keys.def; parsing, validation, --help, the printed
 * config and "did you mean" all read that table, so adding a key touches one line. */
#include "config/config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <yaml.h>

typedef enum { KT_INT, KT_FLOAT, KT_BOOL, KT_STR, KT_DTYPE } key_type_t;

/* A dtype's name or alias (float32/fp32, bfloat16/bf16) into *out; false for anything else. */
static bool dtype_parse(const char *text, dtype_t *out) {
    if (!strcmp(text, "float32") || !strcmp(text, "fp32")) *out = DTYPE_FLOAT32;
    else if (!strcmp(text, "bfloat16") || !strcmp(text, "bf16")) *out = DTYPE_BFLOAT16;
    else return false;
    return true;
}

enum { R_LO_OPEN = 1, R_HI_OPEN = 2 };

typedef struct key_def {
    const char *name;
    key_type_t type;
    size_t offset;         /* into config_t */
    const char *def;       /* default as text */
    double lo, hi;         /* numeric range */
    int open;              /* R_LO_OPEN | R_HI_OPEN */
    const char *allowed;   /* "|"-separated, or NULL = any */
    const char *supported; /* "|"-separated canonical values implemented now, or NULL = all */
    const char *note;      /* why an unsupported value is refused */
    const char *help;
} key_def_t;

#define ANY -INFINITY, INFINITY, 0
#define GE(x) (x), INFINITY, 0
#define GT(x) (x), INFINITY, R_LO_OPEN
#define CO(a, b) (a), (b), R_HI_OPEN
#define IN(a, b) (a), (b), 0

static const key_def_t KEYS[] = {
#define KEY(name, type, def, range, allowed, supported, note, help) \
    {#name, KT_##type, offsetof(config_t, name), def, range, allowed, supported, note, help},
#include "config/config_keys.def"
#undef KEY
};

enum { N_KEYS = sizeof(KEYS) / sizeof(KEYS[0]) };

/* The declared type of each row must match its config_t field. */
#define FIELD_KIND(f)                                                                   \
    _Generic((((config_t *)0)->f), int64_t: KT_INT, double: KT_FLOAT, bool: KT_BOOL,    \
             char *: KT_STR, dtype_t: KT_DTYPE)
#define KEY(name, type, def, range, allowed, supported, note, help) \
    _Static_assert(FIELD_KIND(name) == KT_##type, "config_keys.def: wrong type for " #name);
#include "config/config_keys.def"
#undef KEY

static const char *const TYPE_NAMES[] = {"int", "float", "bool", "string", "dtype"};

/* Where a key's current value came from, for error messages. */
typedef struct origin {
    const char *src; /* file path, "command line" or "default" */
    int line;        /* 1-based line in src, 0 = none */
} origin_t;

typedef struct loader {
    config_t *cfg;
    origin_t origin[N_KEYS];
    bool in_preset[N_KEYS]; /* the model preset file sets this key */
    char *err;
    size_t errlen;
} loader_t;

static const origin_t CMDLINE = {"command line", 0};

/* ---------------------------------------------------------------- errors */

/* Writes one line into err (newlines become spaces) and returns CONFIG_EXIT_CODE. */
static int fail(loader_t *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(loader_t *L, const char *fmt, ...) {
    if (L->err && L->errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(L->err, L->errlen, fmt, ap);
        va_end(ap);
        for (char *p = L->err; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
    }
    return CONFIG_EXIT_CODE;
}

/* "(path:line)" / "(command line)" into buf. */
static const char *where(origin_t o, char *buf, size_t n) {
    if (o.line > 0) snprintf(buf, n, "(%s:%d)", o.src, o.line);
    else snprintf(buf, n, "(%s)", o.src);
    return buf;
}

/* ---------------------------------------------------------------- table helpers */

static int find_key(const char *name) {
    for (int k = 0; k < N_KEYS; k++)
        if (strcmp(KEYS[k].name, name) == 0) return k;
    return -1;
}

static void *field(config_t *cfg, int k) { return (char *)cfg + KEYS[k].offset; }
static const void *cfield(const config_t *cfg, int k) { return (const char *)cfg + KEYS[k].offset; }

/* Is value one of the "|"-separated entries of list? */
static bool in_list(const char *list, const char *value) {
    size_t n = strlen(value);
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, value, n) == 0) return true;
        if (!bar) return false;
        p = bar + 1;
    }
}

/* "synthetic, tokens" from "synthetic|tokens"; an empty entry shows as "". */
static void list_text(const char *list, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (const char *p = list;;) {
        const char *bar = strchr(p, '|');
        int len = bar ? (int)(bar - p) : (int)strlen(p);
        int w = snprintf(buf + used, n - used, "%s%.*s", p == list ? "" : ", ",
                         len ? len : 2, len ? p : "\"\"");
        if (w < 0 || (size_t)w >= n - used) return;
        used += (size_t)w;
        if (!bar) return;
        p = bar + 1;
    }
}

/* What a key accepts, as a phrase: "an integer >= 1", "a number in [0, 1)", ... */
static void allowed_text(int k, char *buf, size_t n) {
    const key_def_t *d = &KEYS[k];
    char lst[200];
    switch (d->type) {
    case KT_BOOL: snprintf(buf, n, "true or false"); return;
    case KT_DTYPE: snprintf(buf, n, "float32 or bfloat16 (aliases fp32, bf16)"); return;
    case KT_STR:
        if (d->allowed) {
            list_text(d->allowed, lst, sizeof lst);
            snprintf(buf, n, "one of %s", lst);
        } else {
            snprintf(buf, n, "any string (at most %d bytes)", CONFIG_STR_MAX - 1);
        }
        return;
    case KT_INT:
    case KT_FLOAT: {
        const char *what = d->type == KT_INT ? "an integer" : "a number";
        bool has_lo = isfinite(d->lo), has_hi = isfinite(d->hi);
        if (has_lo && has_hi)
            snprintf(buf, n, "%s in %c%g, %g%c", what, (d->open & R_LO_OPEN) ? '(' : '[', d->lo,
                     d->hi, (d->open & R_HI_OPEN) ? ')' : ']');
        else if (has_lo)
            snprintf(buf, n, "%s %s %g", what, (d->open & R_LO_OPEN) ? ">" : ">=", d->lo);
        else if (has_hi)
            snprintf(buf, n, "%s %s %g", what, (d->open & R_HI_OPEN) ? "<" : "<=", d->hi);
        else
            snprintf(buf, n, "%s", what);
        return;
    }
    }
    snprintf(buf, n, "?");
}

/* Canonical text of a key's value (what config_print shows). */
static void value_text(const config_t *cfg, int k, char *buf, size_t n) {
    const void *p = cfield(cfg, k);
    switch (KEYS[k].type) {
    case KT_INT: snprintf(buf, n, "%" PRId64, *(const int64_t *)p); return;
    case KT_FLOAT: snprintf(buf, n, "%.10g", *(const double *)p); return;
    case KT_BOOL: snprintf(buf, n, "%s", *(const bool *)p ? "true" : "false"); return;
    case KT_STR: snprintf(buf, n, "%s", (const char *)p); return;
    case KT_DTYPE: snprintf(buf, n, "%s", dtype_name(*(const dtype_t *)p)); return;
    }
    buf[0] = '\0';
}

/* ---------------------------------------------------------------- suggestions */

static size_t levenshtein(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    size_t row[129];
    if (lb > 128) return (size_t)-1;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* "; did you mean: a, b?" or a pointer to --help; up to 3 closest keys. */
static void suggest(const char *name, char *buf, size_t n) {
    int best[3] = {-1, -1, -1};
    size_t bestd[3] = {0, 0, 0};
    size_t len = strlen(name);
    size_t thr = len / 3 > 2 ? len / 3 : 2;
    if (len <= 128) {
        for (int k = 0; k < N_KEYS; k++) {
            size_t d = levenshtein(KEYS[k].name, name);
            bool sub = len >= 4 && strstr(KEYS[k].name, name) != NULL;
            if (d > thr && !sub) continue;
            for (int s = 0; s < 3; s++) {
                if (best[s] < 0 || d < bestd[s]) {
                    for (int t = 2; t > s; t--) best[t] = best[t - 1], bestd[t] = bestd[t - 1];
                    best[s] = k, bestd[s] = d;
                    break;
                }
            }
        }
    }
    if (best[0] < 0) {
        snprintf(buf, n, "; run with --help to list the keys");
        return;
    }
    snprintf(buf, n, "; did you mean: %s%s%s%s%s?", KEYS[best[0]].name, best[1] >= 0 ? ", " : "",
             best[1] >= 0 ? KEYS[best[1]].name : "", best[2] >= 0 ? ", " : "",
             best[2] >= 0 ? KEYS[best[2]].name : "");
}

static int fail_unknown(loader_t *L, const char *name, origin_t o) {
    char w[CONFIG_STR_MAX + 32], s[256];
    suggest(name, s, sizeof s);
    return fail(L, "unknown config key '%.128s' %s%s", name, where(o, w, sizeof w), s);
}

/* ---------------------------------------------------------------- value parsing */

static bool parse_i64(const char *s, int64_t *out, bool *overflow) {
    *overflow = false;
    if (!*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0') return false;
    if (errno == ERANGE) {
        *overflow = true;
        return false;
    }
    *out = (int64_t)v;
    return true;
}

static bool parse_f64(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || !isfinite(v)) return false;
    if (errno == ERANGE && fabs(v) > 1.0) return false; /* overflow; underflow is fine */
    *out = v;
    return true;
}

/* Type-checks text and stores it into key k; ranges are checked after merging. */
static int set_value(loader_t *L, int k, const char *text, origin_t o) {
    const key_def_t *d = &KEYS[k];
    void *p = field(L->cfg, k);
    char w[CONFIG_STR_MAX + 32], allowed[256];
    const char *why = NULL;
    switch (d->type) {
    case KT_INT: {
        bool overflow;
        if (!parse_i64(text, (int64_t *)p, &overflow))
            why = overflow ? "integer out of int64 range" : "not an integer";
        break;
    }
    case KT_FLOAT:
        if (!parse_f64(text, (double *)p)) why = "not a finite number";
        break;
    case KT_BOOL:
        if (!strcmp(text, "true") || !strcmp(text, "True") || !strcmp(text, "TRUE") ||
            !strcmp(text, "1"))
            *(bool *)p = true;
        else if (!strcmp(text, "false") || !strcmp(text, "False") || !strcmp(text, "FALSE") ||
                 !strcmp(text, "0"))
            *(bool *)p = false;
        else
            why = "not a bool";
        break;
    case KT_STR:
        if (strlen(text) >= CONFIG_STR_MAX) why = "too long";
        else strcpy((char *)p, text);
        break;
    case KT_DTYPE:
        if (!dtype_parse(text, (dtype_t *)p)) why = "not a dtype";
        break;
    }
    if (why) {
        allowed_text(k, allowed, sizeof allowed);
        return fail(L, "invalid value '%.64s' for %s %s: %s; allowed: %s", text, d->name,
                    where(o, w, sizeof w), why, allowed);
    }
    L->origin[k] = o;
    return 0;
}

/* ---------------------------------------------------------------- YAML */

/* Applies a flat "key: scalar" YAML mapping. In a preset (model != NULL) every key it
 * sets is remembered for the override_model_config rule. */
static int apply_yaml(loader_t *L, const char *path, const char *model) {
    FILE *f = fopen(path, "rb");
    if (!f) return fail(L, "cannot open config file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return fail(L, "config file %s is a folder; give a YAML file such as configs/base.yml", path);
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return fail(L, "cannot initialise the YAML parser for %s", path);
    }
    yaml_parser_set_input_file(&parser, f);

    bool seen[N_KEYS] = {false};
    enum { TOP, KEY_NEXT, VALUE_NEXT, DONE } state = TOP;
    int key = -1, rc = 0;
    for (bool end = false; !end && rc == 0;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            yaml_mark_t m = parser.problem_mark;
            rc = fail(L, "YAML syntax error in %s line %zu column %zu: %s%s%s", path, m.line + 1,
                      m.column + 1, parser.problem ? parser.problem : "unknown error",
                      parser.context ? " " : "", parser.context ? parser.context : "");
            break;
        }
        int line = (int)ev.start_mark.line + 1;
        origin_t o = {path, line};
        switch (ev.type) {
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
        case YAML_SEQUENCE_END_EVENT: /* unreachable: a sequence start already failed */
        case YAML_NO_EVENT: break;
        case YAML_STREAM_END_EVENT: end = true; break;
        case YAML_DOCUMENT_START_EVENT:
            if (state != TOP)
                rc = fail(L, "%s line %d: only one YAML document is allowed", path, line);
            break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT:
            if (state == VALUE_NEXT)
                rc = fail(L, "nested structures are not supported: %s %s must be a scalar; the "
                             "config is a flat mapping of key: value",
                          KEYS[key].name, where(o, (char[CONFIG_STR_MAX + 32]){0}, CONFIG_STR_MAX + 32));
            else if (state == TOP && ev.type == YAML_MAPPING_START_EVENT)
                state = KEY_NEXT;
            else
                rc = fail(L, "%s line %d: expected a flat mapping of key: value", path, line);
            break;
        case YAML_MAPPING_END_EVENT: state = DONE; break;
        case YAML_ALIAS_EVENT:
            rc = fail(L, "%s line %d: YAML aliases are not supported", path, line);
            break;
        case YAML_SCALAR_EVENT: {
            const char *text = (const char *)ev.data.scalar.value;
            if (state == TOP && ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !*text) {
                state = DONE; /* an empty document */
            } else if (state == KEY_NEXT) {
                key = find_key(text);
                if (key < 0) rc = fail_unknown(L, text, o);
                else if (seen[key])
                    rc = fail(L, "duplicate config key '%s' in %s line %d", text, path, line);
                else if (model && (key == find_key("model_name") ||
                                   key == find_key("override_model_config")))
                    rc = fail(L, "%s line %d: a model preset cannot set %s", path, line, text);
                else
                    seen[key] = true, state = VALUE_NEXT;
            } else if (state == VALUE_NEXT) {
                bool null = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                            (!strcmp(text, "~") || !strcmp(text, "null") || !*text);
                if (null && KEYS[key].type != KT_STR)
                    rc = fail(L, "missing value for %s in %s line %d", KEYS[key].name, path, line);
                else rc = set_value(L, key, null ? "" : text, o);
                if (model) L->in_preset[key] = true;
                state = KEY_NEXT;
            } else {
                rc = fail(L, "%s line %d: expected a flat mapping of key: value", path, line);
            }
            break;
        }
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- presets */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "qwen3-0.6b, ..., tiny" from the *.yml files of dir. */
static void list_presets(const char *dir, char *buf, size_t n) {
    char *names[256];
    size_t count = 0;
    DIR *d = opendir(dir);
    buf[0] = '\0';
    if (!d) {
        snprintf(buf, n, "none (cannot open %s: %s)", dir, strerror(errno));
        return;
    }
    for (struct dirent *e; (e = readdir(d)) != NULL && count < 256;) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".yml") == 0 && e->d_name[0] != '.') {
            names[count] = strndup(e->d_name, len - 4);
            if (names[count]) count++;
        }
    }
    closedir(d);
    qsort(names, count, sizeof names[0], cmp_str);
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
        int w = snprintf(buf + used, n > used ? n - used : 0, "%s%s", i ? ", " : "", names[i]);
        if (w > 0) used += (size_t)w;
        free(names[i]);
    }
    if (count == 0) snprintf(buf, n, "none");
}

/* ---------------------------------------------------------------- overrides */

/* Splits "key=value" into key (NUL-terminated copy) and value (one pair of matching
 * surrounding quotes removed). */
static int split_override(loader_t *L, const char *arg, char *key, size_t keylen, char *val,
                          size_t vallen) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return fail(L, "malformed override '%.128s': expected key=value, e.g. steps=20", arg);
    size_t kl = (size_t)(eq - arg);
    if (kl >= keylen) kl = keylen - 1; /* over-long keys stay unknown */
    memcpy(key, arg, kl);
    key[kl] = '\0';
    const char *v = eq + 1;
    size_t vl = strlen(v);
    if (vl >= 2 && (v[0] == '"' || v[0] == '\'') && v[vl - 1] == v[0]) v++, vl -= 2;
    if (vl >= vallen)
        return fail(L, "value of %s on the command line is too long (at most %d bytes)", key,
                    CONFIG_STR_MAX - 1);
    memcpy(val, v, vl);
    val[vl] = '\0';
    return 0;
}

/* ---------------------------------------------------------------- validation */

static int check_ranges(loader_t *L) {
    char w[CONFIG_STR_MAX + 32], allowed[256], val[CONFIG_STR_MAX];
    for (int k = 0; k < N_KEYS; k++) {
        const key_def_t *d = &KEYS[k];
        bool ok = true;
        if (d->type == KT_INT || d->type == KT_FLOAT) {
            double v = d->type == KT_INT ? (double)*(const int64_t *)cfield(L->cfg, k)
                                         : *(const double *)cfield(L->cfg, k);
            ok = ((d->open & R_LO_OPEN) ? v > d->lo : v >= d->lo) &&
                 ((d->open & R_HI_OPEN) ? v < d->hi : v <= d->hi);
        } else if (d->type == KT_STR && d->allowed) {
            ok = in_list(d->allowed, (const char *)cfield(L->cfg, k));
        }
        if (!ok) {
            value_text(L->cfg, k, val, sizeof val);
            allowed_text(k, allowed, sizeof allowed);
            return fail(L, "%s=%s %s is %s; allowed: %s", d->name, val,
                        where(L->origin[k], w, sizeof w),
                        d->type == KT_STR ? "not allowed" : "out of range", allowed);
        }
    }
    return 0;
}

static int check_supported(loader_t *L) {
    char w[CONFIG_STR_MAX + 32], val[CONFIG_STR_MAX];
    for (int k = 0; k < N_KEYS; k++) {
        if (!KEYS[k].supported) continue;
        value_text(L->cfg, k, val, sizeof val);
        if (!in_list(KEYS[k].supported, val))
            return fail(L, "%s=%s %s: %s", KEYS[k].name, val, where(L->origin[k], w, sizeof w),
                        KEYS[k].note);
    }
    return 0;
}

#define ORIGIN(name) where(L->origin[find_key(#name)], (char[CONFIG_STR_MAX + 32]){0}, CONFIG_STR_MAX + 32)

/* run_name is a folder under base_output_directory (and under its tensorboard/ folder): a name,
 * or names joined by '/', none of them empty, "." or "..", so a run never writes outside its
 * base_output_directory (run_name=.. had put metrics.jsonl in its parent). */
static bool run_name_stays_inside(const char *name) {
    /* A leading, trailing or doubled '/' makes an empty part. */
    for (const char *part = name, *end;; part = end + 1) {
        end = strchr(part, '/');
        size_t n = end ? (size_t)(end - part) : strlen(part);
        if (n == 0 || (n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.')) return false;
        if (!end) return true;
    }
}

static int check_cross(loader_t *L) {
    const config_t *c = L->cfg;
    if (c->run_name[0] && !run_name_stays_inside(c->run_name))
        return fail(L, "run_name=%s %s would write outside base_output_directory or to an empty or '.' folder; "
                       "allowed: a name, or names joined by '/' with no part empty, '.' or '..'",
                    c->run_name, ORIGIN(run_name));
    if (c->base_num_query_heads % c->base_num_kv_heads != 0)
        return fail(L,
                    "base_num_query_heads=%" PRId64 " %s must be a multiple of base_num_kv_heads=%" PRId64
                    " %s (grouped-query attention shares each kv head among whole query heads)",
                    c->base_num_query_heads, ORIGIN(base_num_query_heads), c->base_num_kv_heads,
                    ORIGIN(base_num_kv_heads));
    bool tokens = strcmp(c->dataset_type, "tokens") == 0;
    if (tokens && !c->dataset_path[0])
        return fail(L, "dataset_type=tokens %s requires dataset_path (a file of uint32 token ids); "
                       "set dataset_path=PATH or dataset_type=synthetic",
                    ORIGIN(dataset_type));
    if (!tokens && c->dataset_path[0])
        return fail(L, "dataset_path=%s %s is only used with dataset_type=tokens, but dataset_type=%s; "
                       "set dataset_type=tokens or dataset_path=\"\"",
                    c->dataset_path, ORIGIN(dataset_path), c->dataset_type);
    if (!tokens && c->eval_dataset_path[0])
        return fail(L, "eval_dataset_path=%s %s is only used with dataset_type=tokens (synthetic data evaluates on "
                       "a batch of seed data_seed + 1); set dataset_type=tokens or eval_dataset_path=\"\"",
                    c->eval_dataset_path, ORIGIN(eval_dataset_path));
    if (c->weight_dtype == DTYPE_BFLOAT16 && c->dtype != DTYPE_BFLOAT16)
        return fail(L, "weight_dtype=bfloat16 %s needs dtype=bfloat16 %s (the matmuls read the bf16 weights as they "
                       "are); set dtype=bfloat16, or weight_dtype=float32",
                    ORIGIN(weight_dtype), ORIGIN(dtype));
    if (c->bf16_weight_copy && (c->dtype != DTYPE_BFLOAT16 || c->weight_dtype != DTYPE_FLOAT32))
        return fail(L, "bf16_weight_copy=true %s copies fp32 weights for bf16 matmuls, but dtype=%s %s, weight_dtype=%s "
                       "%s; set dtype=bfloat16 weight_dtype=float32, or bf16_weight_copy=false",
                    ORIGIN(bf16_weight_copy), dtype_name(c->dtype), ORIGIN(dtype), dtype_name(c->weight_dtype),
                    ORIGIN(weight_dtype));
    if (c->stochastic_rounding && c->weight_dtype != DTYPE_BFLOAT16)
        return fail(L, "stochastic_rounding=true %s rounds bf16 weights, but weight_dtype=%s %s keeps fp32 master "
                       "weights; set weight_dtype=bfloat16 dtype=bfloat16, or stochastic_rounding=false",
                    ORIGIN(stochastic_rounding), dtype_name(c->weight_dtype), ORIGIN(weight_dtype));
    if (c->load_parameters_path[0] && c->load_full_state_path[0])
        return fail(L, "load_parameters_path=%s %s and load_full_state_path=%s %s: at most one of them; "
                       "load_full_state_path resumes a run (parameters and optimizer state), "
                       "load_parameters_path starts one from parameters",
                    c->load_parameters_path, ORIGIN(load_parameters_path), c->load_full_state_path,
                    ORIGIN(load_full_state_path));
    if (c->eval_steps == 0)
        return fail(L, "eval_steps=0 %s: allowed: -1 (the whole evaluation set: every whole batch of the token "
                       "file, or synthetic data's one batch) or N >= 1 (batches per evaluation)",
                    ORIGIN(eval_steps));
    if (c->eval_interval == 0)
        return fail(L, "eval_interval=0 %s: allowed: -1 (no evaluation) or N >= 1 (evaluate after every N steps)",
                    ORIGIN(eval_interval));
    if (c->ici_fsdp_parallelism == 0 || c->dcn_data_parallelism == 0 ||
        (c->ici_fsdp_parallelism == -1 && c->dcn_data_parallelism == -1))
        return fail(L, "ici_fsdp_parallelism=%" PRId64 " %s, dcn_data_parallelism=%" PRId64
                       " %s: allowed: each >= 1 or -1 (= the ranks left), at most one of them -1",
                    c->ici_fsdp_parallelism, ORIGIN(ici_fsdp_parallelism), c->dcn_data_parallelism,
                    ORIGIN(dcn_data_parallelism));
    if (strcmp(c->profiler, "xplane") == 0) {
        if (c->skip_first_n_steps_for_profiler >= c->steps)
            return fail(L, "skip_first_n_steps_for_profiler=%" PRId64 " %s with steps=%" PRId64
                           " %s: the profiler window starts past the last step; allowed: "
                           "0 <= skip_first_n_steps_for_profiler < steps, or profiler=\"\"",
                        c->skip_first_n_steps_for_profiler, ORIGIN(skip_first_n_steps_for_profiler),
                        c->steps, ORIGIN(steps));
        if (c->profiler_steps < 1)
            return fail(L, "profiler_steps=%" PRId64 " %s with profiler=xplane: allowed: an integer "
                           ">= 1, or profiler=\"\" to turn the profiler off",
                        c->profiler_steps, ORIGIN(profiler_steps));
    }
    return 0;
}

/* ---------------------------------------------------------------- load */

static int set_defaults(loader_t *L) {
    static const origin_t DEF = {"default", 0};
    memset(L->cfg, 0, sizeof *L->cfg);
    for (int k = 0; k < N_KEYS; k++)
        if (set_value(L, k, KEYS[k].def, DEF)) return CONFIG_EXIT_CODE; /* a table bug */
    return 0;
}

int config_load(config_t *cfg, const char *base_path, int n_overrides, char *const overrides[],
                char *err, size_t errlen) {
    loader_t L = {.cfg = cfg, .err = err, .errlen = errlen};
    char key[128], val[CONFIG_STR_MAX];
    if (err && errlen) err[0] = '\0';
    if (set_defaults(&L)) return CONFIG_EXIT_CODE;
    if (base_path && apply_yaml(&L, base_path, NULL)) return CONFIG_EXIT_CODE;

    /* Pass 1 over the overrides: syntax, known keys, and the final model_name. */
    const int k_model = find_key("model_name");
    char model[CONFIG_STR_MAX];
    strcpy(model, cfg->model_name);
    for (int i = 0; i < n_overrides; i++) {
        if (split_override(&L, overrides[i], key, sizeof key, val, sizeof val))
            return CONFIG_EXIT_CODE;
        int k = find_key(key);
        if (k < 0) return fail_unknown(&L, key, CMDLINE);
        if (k == k_model) strcpy(model, val);
    }

    /* The model preset, from <dir of base_path>/models/. */
    char preset[2 * CONFIG_STR_MAX + 16] = "";
    if (strcmp(model, "default") != 0) {
        char dir[CONFIG_STR_MAX];
        const char *slash = base_path ? strrchr(base_path, '/') : NULL;
        if (!base_path) snprintf(dir, sizeof dir, "configs/models");
        else if (!slash) snprintf(dir, sizeof dir, "models");
        else snprintf(dir, sizeof dir, "%.*s/models", (int)(slash - base_path), base_path);
        if (!model[0] || strchr(model, '/') || model[0] == '.') {
            char list[1024];
            list_presets(dir, list, sizeof list);
            return fail(&L, "invalid model_name '%s': expected a preset name in %s (available: %s) "
                            "or default", model, dir, list);
        }
        snprintf(preset, sizeof preset, "%s/%s.yml", dir, model);
        FILE *f = fopen(preset, "rb");
        if (!f) {
            char list[1024];
            list_presets(dir, list, sizeof list);
            return fail(&L, "model preset '%s' not found: %s: %s; available presets: %s (or "
                            "model_name=default for the base_* keys)",
                        model, preset, strerror(errno), list);
        }
        fclose(f);
        if (apply_yaml(&L, preset, model)) return CONFIG_EXIT_CODE;
    }

    /* Pass 2: apply the overrides in order (later ones win). */
    for (int i = 0; i < n_overrides; i++) {
        split_override(&L, overrides[i], key, sizeof key, val, sizeof val);
        if (set_value(&L, find_key(key), val, CMDLINE)) return CONFIG_EXIT_CODE;
    }
    /* Pass 3: preset keys change only with override_model_config=true (its final value). */
    if (!cfg->override_model_config) {
        for (int i = 0; i < n_overrides; i++) {
            split_override(&L, overrides[i], key, sizeof key, val, sizeof val);
            if (L.in_preset[find_key(key)])
                return fail(&L, "%s is set by model %s (%s); pass override_model_config=true to "
                                "change it",
                            key, model, preset);
        }
    }

    if (check_ranges(&L) || check_cross(&L) || check_supported(&L)) return CONFIG_EXIT_CODE;

    if (!cfg->run_name[0]) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        strftime(cfg->run_name, sizeof cfg->run_name, "stepscope_%Y%m%d_%H%M%S", &tm);
    }
    return 0;
}

/* ---------------------------------------------------------------- printing */

void config_print(const config_t *cfg, FILE *out) {
    char val[CONFIG_STR_MAX];
    for (int k = 0; k < N_KEYS; k++) {
        value_text(cfg, k, val, sizeof val);
        fprintf(out, "%s: %s\n", KEYS[k].name, val);
    }
}

void config_print_help(FILE *out) {
    fprintf(out,
            "usage: stepscope CONFIG.yml [key=value ...] [--dry-run] [--help] [--version]\n"
            "\n"
            "Values come from the built-in defaults, then CONFIG.yml, then the model preset\n"
            "<dir of CONFIG.yml>/models/<model_name>.yml (unless model_name=default), then the\n"
            "key=value arguments; later wins. Changing a key the preset sets on the command line\n"
            "needs override_model_config=true.\n"
            "\n"
            "%-32s %-6s %-12s %-42s %s\n",
            "key", "type", "default", "allowed", "help");
    for (int k = 0; k < N_KEYS; k++) {
        const key_def_t *d = &KEYS[k];
        char allowed[400], a[256];
        allowed_text(k, a, sizeof a);
        if (d->type == KT_STR && !d->allowed) snprintf(a, sizeof a, "any");
        if (d->supported) {
            char s[128];
            list_text(d->supported, s, sizeof s);
            snprintf(allowed, sizeof allowed, "%s; supported now: %s", a, s);
        } else {
            snprintf(allowed, sizeof allowed, "%s", a);
        }
        fprintf(out, "%-32s %-6s %-12s %-42s %s\n", d->name, TYPE_NAMES[d->type],
                d->def[0] ? d->def : "\"\"", allowed, d->help);
    }
}

dtype_t config_mu_dtype(const config_t *cfg) {
    dtype_t d;
    return dtype_parse(cfg->mu_dtype, &d) ? d : cfg->weight_dtype; /* "": weight_dtype's */
}

const char *dtype_name(dtype_t d) {
    switch (d) {
    case DTYPE_FLOAT32: return "float32";
    case DTYPE_BFLOAT16: return "bfloat16";
    }
    return "unknown";
}
