/* gemm over oneDNN 2.x's matmul primitive (its brgemm kernels) or dnnl_sgemm in fixed panels
 * (where the primitive would take its gemm driver), or handed to MKL (gemm_mkl.c) when that is
 * the library; bf16 with no bf16 kernel here goes through gemm_widen.c. Every oneDNN call of
 * the project lives here: the 2.x C API (dnnl_matmul_desc_init, memory descs by strides)
 * changed in 3.x. */
#include "kernels/gemm.h"
#include "kernels/amx.h"
#include "kernels/bf16_blocked.h"
#include "kernels/dpbf16.h"
#include "kernels/gemm_mkl.h"
#include "kernels/gemm_widen.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gemm_entry {
    bool trans_a, trans_b, accumulate, bf16_inputs;
    int64_t M, N, K, lda, ldb, ldc;
    /* NULL where oneDNN would run the product on its gemm driver (or has no kernel for it), and
     * for the fp32 weight gradients sent there (weight_gradient_on_driver): fp32 then runs in
     * panels (run_panels), bf16 widened to fp32 (gemm_widen.h). */
    dnnl_primitive_t prim;
    dnnl_memory_t mem_a, mem_b, mem_c;
} gemm_entry_t;

struct gemm_ctx {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    gemm_entry_t *entries;
    int num_entries, cap_entries;
    int last_hit;
    const mkl_blas_t *mkl; /* set when MKL runs the products */
    bool mkl_panels;       /* ... in run_panels' shape-fixed panels, one sequential call each */
    bool wide_on_onednn;   /* ... but under gemm_library=auto the LM head's forward on oneDNN (VOCAB_WIDE) */
    bool bf16_tiles;       /* bf16 products of whole 32-blocks run on bf16_blocked.c (AMX or dpbf16) */
    bf16_t *tile_work;     /* its packing space, for tile_work_threads threads */
    int64_t tile_work_threads;
    double nocopy_threshold; /* run_panels' copy_kernels() */
    bool avx512;             /* oneDNN's ISA: fp32 products on its brgemm kernels */
    bool wgrad_on_driver;    /* ... but the weight gradients on its gemm driver (weight_gradient_on_driver) */
    bool bf16_widens;      /* no library runs bf16 products here: gemm_widen.h does */
    float *widen_work;     /* its scratch, GEMM_WIDEN_FLOATS */
    float *ksplit_work;    /* run_panels' second K half, KSPLIT_FLOATS */
    bf16_t *b32_work;      /* gemm_bf16_b32's rounded panel of B, b32_work_elems values */
    int64_t b32_work_elems;
    char detail[600], bf16_detail[400];
};

/* space grown to `want` units of unit_bytes (*have: how many it holds now), 64-byte aligned and
 * touched, so that no product faults it in: space itself where it holds enough, else a new
 * one (space freed); NULL (and *have 0) when out of memory. */
static void *grown_touched(void *space, int64_t *have, int64_t want, size_t unit_bytes) {
    if (want <= *have) return space;
    free(space);
    size_t bytes = ((size_t)want * unit_bytes + 63) / 64 * 64;
    void *grown = aligned_alloc(64, bytes);
    *have = grown ? want : 0;
    if (grown) memset(grown, 0, bytes);
    return grown;
}

/* Our blocked kernel's packing space for this many threads, allocated and touched once. */
static bool tile_work_for(gemm_ctx_t *g, int threads) {
    g->tile_work = grown_touched(g->tile_work, &g->tile_work_threads, threads,
                                 (size_t)bf16_blocked_workspace_elems() * sizeof(bf16_t));
    return g->tile_work != NULL;
}

/* A fixed-size space (1 unit of `bytes`), allocated and touched once. */
static void *once_touched(void *space, size_t bytes) {
    int64_t have = space ? 1 : 0;
    return grown_touched(space, &have, 1, bytes);
}

static bool widen_work_ready(gemm_ctx_t *g) {
    return (g->widen_work = once_touched(g->widen_work, GEMM_WIDEN_FLOATS * sizeof(float))) != NULL;
}

/* run_panels' space for the second K half of a product it splits over K, a product's M × N:
 * 4 MiB (the products that need it are bounded: see split_k). */
enum { KSPLIT_FLOATS = 1 << 20 };
static bool ksplit_work_ready(gemm_ctx_t *g) {
    return (g->ksplit_work = once_touched(g->ksplit_work, KSPLIT_FLOATS * sizeof(float))) != NULL;
}

static bool onednn_has_bf16(gemm_ctx_t *g);

int gemm_library_parse(const char *name) {
    return !strcmp(name, "auto") ? GEMM_LIB_AUTO : !strcmp(name, "onednn") ? GEMM_LIB_ONEDNN
           : !strcmp(name, "mkl") ? GEMM_LIB_MKL : -1;
}

gemm_ctx_t *gemm_create(gemm_library_t lib, char *err, size_t errlen) {
    gemm_ctx_t *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory creating the GEMM context");
        return NULL;
    }
    bool auto_wants_mkl = lib == GEMM_LIB_AUTO && __builtin_cpu_is("intel");
    if (lib == GEMM_LIB_MKL || auto_wants_mkl) {
        char mkl_err[400];
        g->mkl = mkl_blas_open(mkl_err, sizeof mkl_err);
        if (!g->mkl && lib == GEMM_LIB_MKL) {
            snprintf(err, errlen, "%s", mkl_err);
            free(g);
            return NULL;
        }
    }
    /* MKL's strict reproducible mode keeps a product's bits whatever the thread count only on
     * its AVX2 and AVX-512 code branches, which it takes on Intel CPUs alone: on the AMD Zen 3
     * it refused MKL_CBWR_AVX2 (unsupported branch), and under MKL_CBWR_AUTO | STRICT its
     * [16 × 32 × 20480] products (and one form of [8 × 8 × 65536]) differed at 3 threads from
     * 1. Elsewhere its products run in the panels oneDNN's gemm driver gets, each on one thread. */
    g->mkl_panels = g->mkl && !__builtin_cpu_is("intel");
    g->wide_on_onednn = g->mkl && !g->mkl_panels && lib == GEMM_LIB_AUTO;
    /* oneDNN registers each JIT kernel with VTune by default, and the first registration
     * dlopen()s libJitPI.so, which is not there: on whichever OpenMP thread first JIT-compiles
     * a kernel, glibc keeps that failure's message, and LeakSanitizer once reported it as a
     * 24-byte leak at exit (a sanitizer test's run then aborted). DNNL_JIT_PROFILE, where the
     * user sets it (2 writes the perf map that names the JIT kernels for `perf report`), wins. */
    if (!getenv("DNNL_JIT_PROFILE")) dnnl_set_jit_profiling_flags(DNNL_JIT_PROFILE_NONE);
    if (dnnl_engine_create(&g->engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags) != dnnl_success) {
        snprintf(err, errlen, "oneDNN could not create a CPU engine (is libdnnl2 installed?)");
        free(g);
        return NULL;
    }
    bool avx512 = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    g->nocopy_threshold = avx512 ? 0.00196 : 0.0038;
    g->avx512 = avx512;
    g->wgrad_on_driver = true;
    const bool mkl_bf16 = g->mkl && mkl_has_bf16(g->mkl);
    g->bf16_widens = !mkl_bf16 && !onednn_has_bf16(g);
    if (g->mkl)
        snprintf(g->detail, sizeof g->detail, "mkl (%s%s%s%s)", mkl_blas_path(g->mkl),
                 g->mkl_panels ? "; not an Intel CPU: each product in shape-fixed panels, one thread each, so the "
                                 "bits do not depend on the thread count"
                               : "",
                 g->wide_on_onednn ? "; the LM head's fp32 forward on oneDNN" : "",
                 mkl_has_bf16(g->mkl) ? ""
                 : g->bf16_widens     ? "; bf16 products widened to fp32"
                                      : "; bf16 products on oneDNN");
    else
        snprintf(g->detail, sizeof g->detail, "onednn (%s%s)", auto_wants_mkl ? "MKL not found; " : "",
                 avx512 ? "matmul primitive, fp32 weight gradients on its gemm driver in panels"
                        : "gemm driver in panels");
    /* Our blocked kernel beat MKL's bf16 products on qwen3-0.6b's shapes on AMX, where MKL beat
     * oneDNN's, and oneDNN's on AVX512-BF16 (the Zen 4; bf16_blocked.h); auto takes it. A
     * library named outright runs every product, so gemm_library=mkl or onednn is also how to
     * measure the kernel against one. An Intel CPU with AVX512-BF16 but no AMX (Cooper Lake)
     * keeps MKL's bf16, not measured against ours. */
    g->bf16_tiles = lib == GEMM_LIB_AUTO && (amx_available() || (dpbf16_available() && !mkl_bf16));
    char library_bf16[300];
    if (g->bf16_widens)
        snprintf(library_bf16, sizeof library_bf16, "emulated: bf16 operands widened to fp32, products in fp32 on %s "
                 "(%s; for numerics, not speed)", gemm_library_name(g),
                 __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16")
                     ? "oneDNN has no bf16 matmul at the ISA it is capped to"
                     : "this CPU has no bf16 dot-product unit");
    else
        snprintf(library_bf16, sizeof library_bf16, "%s", mkl_bf16 ? "mkl" : "onednn");
    if (g->bf16_tiles) {
        char k_limit[48] = "";
        if (amx_available()) snprintf(k_limit, sizeof k_limit, " and K at most %d", (int)BF16_BLOCKED_K_MAX_AMX);
        snprintf(g->bf16_detail, sizeof g->bf16_detail, "stepscope's blocked kernel on %s where M and N are "
                 "multiples of 32%s, else %s", amx_available() ? "AMX tiles" : "AVX512-BF16 dot products", k_limit,
                 library_bf16);
    } else {
        snprintf(g->bf16_detail, sizeof g->bf16_detail, "%s", library_bf16);
    }
    return g;
}

const char *gemm_library_name(const gemm_ctx_t *g) { return g->mkl ? "mkl" : "onednn"; }
const char *gemm_library_detail(const gemm_ctx_t *g) { return g->detail; }
const char *gemm_bf16_detail(const gemm_ctx_t *g) { return g->bf16_detail; }
/* Whether oneDNN's gemm driver runs this context's fp32 products, some of them staged
 * (gemm_widen.h): oneDNN without AVX512. */
static bool f32_stages(const gemm_ctx_t *g) { return !g->mkl && !g->avx512; }

static bool b32_work_for(gemm_ctx_t *g, int64_t elems);

bool gemm_reserve(gemm_ctx_t *g, int threads, bool bf16, bool weights32) {
    bool tiles = !bf16 || !g->bf16_tiles || tile_work_for(g, threads);
    /* gemm_bf16_b32's panels, where a library runs some bf16 products (a deeper K grows them) */
    if (bf16 && weights32 && (!g->bf16_tiles || amx_available()) && !b32_work_for(g, GEMM_B32_PANEL_ELEMS))
        return false;
    /* fp32 on the gemm driver (and bf16 widened into it) may split over K: see run_panels */
    bool panels = (g->mkl && !g->mkl_panels) || ksplit_work_ready(g);
    return tiles && panels && (!(bf16 ? g->bf16_widens : f32_stages(g)) || widen_work_ready(g));
}
bool gemm_bf16_tiles(const gemm_ctx_t *g) { return g->bf16_tiles; }
/* oneDNN's brgemm kernels (AVX512) ran those forms at half rate; its gemm driver (AVX2) and MKL
 * run them like the others (down_proj's gradients 148-164 GFLOP/s on 2 Zen 3 cores). */
bool gemm_wide_gradients_slow(const gemm_ctx_t *g) { return !g->mkl && g->avx512; }
bool gemm_suits_attention_blocks(const gemm_ctx_t *g) { return g->mkl != NULL; }
/* Measured in docs/speed.md ("Padded row strides"); see gemm.h. */
int64_t gemm_pad_rows_from(const gemm_ctx_t *g) {
    if (g->mkl) return INT64_MAX;
    return g->avx512 ? 4096 : 0;
}

void gemm_destroy(gemm_ctx_t *g) {
    if (!g) return;
    for (int i = 0; i < g->num_entries; i++) {
        gemm_entry_t *e = &g->entries[i];
        dnnl_memory_destroy(e->mem_a);
        dnnl_memory_destroy(e->mem_b);
        dnnl_memory_destroy(e->mem_c);
        dnnl_primitive_destroy(e->prim);
    }
    free(g->entries);
    free(g->tile_work);
    free(g->widen_work);
    free(g->ksplit_work);
    free(g->b32_work);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
    free(g);
}

int gemm_num_primitives(const gemm_ctx_t *g) { return g->num_entries; }


static void check(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) {
        /* Shapes come from the plan, so a failure here is a bug, not a user error. */
        fprintf(stderr, "stepscope: internal error: oneDNN %s failed (status %d)\n", what, (int)s);
        abort();
    }
}

static void matrix_desc(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                        bool transposed, dnnl_data_type_t type) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {ld, 1};
    if (transposed) { /* stored [cols, rows] */
        strides[0] = 1;
        strides[1] = ld;
    }
    check(dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides), "memory desc");
}

/* The matmul primitive descriptor for this shape, or NULL where oneDNN would run it on anything
 * but its brgemm kernels: its gemm driver ("gemm:jit", every fp32 product on AVX2-only CPUs)
 * splits products over K by thread count (small M·N, large K: the tiny model's 64x512:512x64
 * weight gradients moved in the 9th digit between 1 and 2 threads on a Zen 3), so those run
 * in panels of our own (run_panels); and where it has no bf16 kernel at all (CPUs without
 * AVX512) or only that driver's, bf16 products are widened to fp32 (gemm_widen.h). */
static dnnl_primitive_desc_t brgemm_pd(gemm_ctx_t *g, const gemm_entry_t *key) {
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_data_type_t in_type = key->bf16_inputs ? dnnl_bf16 : dnnl_f32;
    matrix_desc(&a_md, key->M, key->K, key->lda, key->trans_a, in_type);
    matrix_desc(&b_md, key->K, key->N, key->ldb, key->trans_b, in_type);
    matrix_desc(&c_md, key->M, key->N, key->ldc, false, dnnl_f32);
    dnnl_matmul_desc_t desc;
    check(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md), "matmul desc");
    dnnl_primitive_attr_t attr;
    check(dnnl_primitive_attr_create(&attr), "attr");
    if (key->accumulate) {
        dnnl_post_ops_t po;
        check(dnnl_post_ops_create(&po), "post ops");
        check(dnnl_post_ops_append_sum(po, 1.0f), "sum post op");
        check(dnnl_primitive_attr_set_post_ops(attr, po), "set post ops");
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, &desc, attr, g->engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) {
        if (!key->bf16_inputs) check(s, "matmul primitive desc");
        return NULL;
    }
    const char *impl = NULL;
    check(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl), "impl query");
    if (strncmp(impl, "brg:", 4) != 0) {
        dnnl_primitive_desc_destroy(pd);
        return NULL;
    }
    return pd;
}

static dnnl_memory_t memory_of(dnnl_primitive_desc_t pd, dnnl_query_t what, dnnl_engine_t engine) {
    dnnl_memory_t m;
    check(dnnl_memory_create(&m, dnnl_primitive_desc_query_md(pd, what, 0), engine, DNNL_MEMORY_NONE), "memory");
    return m;
}

static bool copy_kernels(const gemm_ctx_t *g, int64_t rows, int64_t cols);

/* fp32 weight gradients dYᵀ·X (A transposed, B not) go to the gemm driver in panels
 * (run_panels) where it takes its copy kernels: on the AVX-512 Zen 4 its panels ran qwen3-0.6b's
 * four such products 1.03-1.18x oneDNN's brgemm matmul (two interleaved runs of a scratch probe,
 * dense rows; the LM head's [151936 × 1024 × 512] 1.12-1.28x, the layers' 1.03-1.13x). */
static bool weight_gradient_on_driver(const gemm_ctx_t *g, const gemm_entry_t *key) {
    return g->avx512 && g->wgrad_on_driver && !key->bf16_inputs && key->trans_a && !key->trans_b &&
           copy_kernels(g, key->M, key->N);
}

void gemm_set_weight_gradients_on_driver(gemm_ctx_t *g, bool on) { g->wgrad_on_driver = on; }

static gemm_entry_t *create_entry(gemm_ctx_t *g, const gemm_entry_t *key) {
    if (g->num_entries == g->cap_entries) {
        int cap = g->cap_entries ? 2 * g->cap_entries : 32;
        gemm_entry_t *e = realloc(g->entries, (size_t)cap * sizeof *e);
        if (!e) {
            fprintf(stderr, "stepscope: out of memory caching GEMM primitives\n");
            abort();
        }
        g->entries = e;
        g->cap_entries = cap;
    }
    gemm_entry_t *e = &g->entries[g->num_entries];
    *e = *key;
    dnnl_primitive_desc_t pd = weight_gradient_on_driver(g, key) ? NULL : brgemm_pd(g, key);
    if (pd) {
        check(dnnl_primitive_create(&e->prim, pd), "matmul primitive");
        e->mem_a = memory_of(pd, dnnl_query_src_md, g->engine);
        e->mem_b = memory_of(pd, dnnl_query_weights_md, g->engine);
        e->mem_c = memory_of(pd, dnnl_query_dst_md, g->engine);
        dnnl_primitive_desc_destroy(pd);
    }
    g->num_entries++;
    return e;
}

/* Whether oneDNN runs bf16 products on its brgemm kernels here, judged on one square shape. */
static bool onednn_has_bf16(gemm_ctx_t *g) {
    gemm_entry_t probe = {.bf16_inputs = true, .M = 64, .N = 64, .K = 64, .lda = 64, .ldb = 64, .ldc = 64};
    dnnl_primitive_desc_t pd = brgemm_pd(g, &probe);
    bool has = pd != NULL;
    dnnl_primitive_desc_destroy(pd);
    return has;
}

static void widen_bf16(gemm_ctx_t *g, const gemm_entry_t *key, const uint16_t *A, const uint16_t *B, float *C) {
    if (!widen_work_ready(g)) {
        fprintf(stderr, "stepscope: out of memory for the bf16 widening space\n");
        abort();
    }
    gemm_bf16_widened(g, g->widen_work, key->trans_a, key->trans_b, key->M, key->N, key->K, A, key->lda, B, key->ldb,
                      C, key->ldc, key->accumulate);
}

static bool same_shape(const gemm_entry_t *a, const gemm_entry_t *b) {
    return a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->bf16_inputs == b->bf16_inputs &&
           a->accumulate == b->accumulate && a->M == b->M && a->N == b->N && a->K == b->K &&
           a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc;
}

static gemm_entry_t *find_entry(gemm_ctx_t *g, const gemm_entry_t *key) {
    /* Steps call the same shapes in the same order, so try the one after the last hit first. */
    for (int probe = 0; probe < g->num_entries; probe++) {
        int i = (g->last_hit + 1 + probe) % g->num_entries;
        if (same_shape(&g->entries[i], key)) {
            g->last_hit = i;
            return &g->entries[i];
        }
    }
    gemm_entry_t *e = create_entry(g, key);
    g->last_hit = g->num_entries - 1;
    return e;
}

/* Panels of C for the products oneDNN would run on its gemm driver: each runs as one
 * single-threaded dnnl_sgemm (oneDNN runs on one thread inside a parallel region, and where
 * its team is one thread), summing its whole K in the driver's own order, and the panels'
 * number and size follow from the shape alone, so the bits never depend on the thread count.
 * The longer side of a panel is halved (to a multiple of 16 rows or columns) while there are
 * at most PANELS_MAX panels, each of at least PANEL_MIN_FLOPS, and the halves stay on the
 * driver's packing ("copy") kernels wherever the whole was on them: for 1/rows + 1/cols at or
 * above a threshold (0.0038 with AVX2, 0.00196 with AVX512 in oneDNN 2.6's gemm_driver.cpp) it
 * takes its no-copy kernels, which ran the qwen3-0.6b shapes at half the rate (a [1024 × 1024 ×
 * 4096] product in 512 × 512 panels: 71-85 GFLOP/s on 2 Zen 3 cores, in 1024 × 512 ones 155-166). */
enum { PANELS_MAX = 16, PANEL_ALIGN = 16 };
static const double PANEL_MIN_FLOPS = 4e6;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static bool copy_kernels(const gemm_ctx_t *g, int64_t rows, int64_t cols) {
    return 1.0 / (double)rows + 1.0 / (double)cols < g->nocopy_threshold;
}

static void panel_grid(const gemm_ctx_t *g, int64_t M, int64_t N, int64_t K, int64_t *rows, int64_t *cols) {
    int64_t r = M, c = N;
    for (;;) {
        bool split_rows = r >= c;
        int64_t side = split_rows ? r : c;
        int64_t half = ceil_div(ceil_div(side, 2), PANEL_ALIGN) * PANEL_ALIGN;
        int64_t hr = split_rows ? half : r, hc = split_rows ? c : half;
        if (half >= side || ceil_div(M, hr) * ceil_div(N, hc) > PANELS_MAX ||
            2.0 * (double)hr * (double)hc * (double)K < PANEL_MIN_FLOPS ||
            (copy_kernels(g, r, c) && !copy_kernels(g, hr, hc)))
            break;
        r = hr, c = hc;
    }
    *rows = r, *cols = c;
}

/* A product the grid keeps whole, because halving its longer side would leave the copy kernels,
 * ran on one thread: 66 GFLOP/s where 2 Zen 3 cores ran 130 (512 × 1024 × 4096, the qkv and
 * gate_up input gradients at 512 tokens; 416 × 1024 × 151936, the LM head's input gradient in
 * the 416-token chunks of 2048 tokens and more). Its two halves of K stay on the copy kernels
 * (the driver chooses them by M and N) and ran at 119-132: C = (β·C + A₀·B₀) + A₁·B₁, the
 * second half into ksplit_work, so the product must fit it (such products are bounded: the
 * whole on copy kernels and half its longer side not, at most ~800 × 800 or ~300 × 4300 with
 * AVX2's threshold; larger ones with a side near 264 stay whole). Shape-fixed, as the panels. */
static int64_t split_k_at(gemm_ctx_t *g, const gemm_entry_t *key) {
    int64_t half = ceil_div(ceil_div(key->K, 2), PANEL_ALIGN) * PANEL_ALIGN;
    bool splits = key->M * key->N <= KSPLIT_FLOATS && half < key->K &&
                  2.0 * (double)key->M * (double)key->N * (double)(key->K - half) >= PANEL_MIN_FLOPS;
    return splits && ksplit_work_ready(g) ? half : 0;
}

/* op(A) and op(B) of key's product from element (i0, k0), resp. (k0, j0), on: key's operands
 * are fp32, or bf16 where MKL runs them in panels. */
static const void *a_at(const gemm_entry_t *key, const void *A, int64_t i0, int64_t k0) {
    int64_t at = key->trans_a ? k0 * key->lda + i0 : i0 * key->lda + k0;
    return (const char *)A + at * (key->bf16_inputs ? 2 : 4);
}
static const void *b_at(const gemm_entry_t *key, const void *B, int64_t k0, int64_t j0) {
    int64_t at = key->trans_b ? j0 * key->ldb + k0 : k0 * key->ldb + j0;
    return (const char *)B + at * (key->bf16_inputs ? 2 : 4);
}

/* C[m, n] (+)= op(a)·op(b) over k in one call of the library: a panel's, on the calling thread
 * where the caller's region has set one thread, or a whole product handed to MKL. */
static void panel_product(const gemm_ctx_t *g, const gemm_entry_t *key, int64_t m, int64_t n, int64_t k,
                          const void *a, const void *b, bool accumulate, float *c, int64_t ldc) {
    if (g->mkl && key->bf16_inputs)
        mkl_gemm_bf16(g->mkl, key->trans_a, key->trans_b, m, n, k, a, key->lda, b, key->ldb, c, ldc, accumulate);
    else if (g->mkl)
        mkl_sgemm(g->mkl, key->trans_a, key->trans_b, m, n, k, a, key->lda, b, key->ldb, c, ldc, accumulate);
    else
        check(dnnl_sgemm(key->trans_a ? 'T' : 'N', key->trans_b ? 'T' : 'N', m, n, k, 1.0f, a, key->lda, b, key->ldb,
                         accumulate ? 1.0f : 0.0f, c, ldc),
              "sgemm");
}

static void run_split_k(const gemm_ctx_t *g, const gemm_entry_t *key, int64_t k_half, const void *A,
                        const void *B, float *C) {
    const int64_t M = key->M, N = key->N;
    float *second = g->ksplit_work;
    int team = omp_in_parallel() || omp_get_max_threads() < 2 ? 1 : 2;
#pragma omp parallel num_threads(team)
    {
        omp_set_num_threads(1); /* as in run_panels */
#pragma omp for schedule(static)
        for (int half = 0; half < 2; half++) {
            int64_t k0 = half ? k_half : 0, k = half ? key->K - k_half : k_half;
            panel_product(g, key, M, N, k, a_at(key, A, 0, k0), b_at(key, B, k0, 0), half == 0 && key->accumulate,
                          half ? second : C, half ? N : key->ldc);
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++)
#pragma omp simd
            for (int64_t j = 0; j < N; j++) C[i * key->ldc + j] += second[i * N + j];
    }
}

static void run_panels(gemm_ctx_t *g, const gemm_entry_t *key, const void *A, const void *B, float *C) {
    int64_t rows, cols;
    panel_grid(g, key->M, key->N, key->K, &rows, &cols);
    int64_t grid_n = ceil_div(key->N, cols), panels = ceil_div(key->M, rows) * grid_n;
    int64_t k_half = panels == 1 ? split_k_at(g, key) : 0;
    if (k_half) {
        run_split_k(g, key, k_half, A, B, C);
        return;
    }
    int team = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (team > panels) team = (int)panels;
#pragma omp parallel num_threads(team)
    {
        /* This region's own setting: where it runs on one thread, oneDNN would otherwise size
         * its team from the caller's num_threads. */
        omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < panels; p++) {
            int64_t i0 = p / grid_n * rows, j0 = p % grid_n * cols;
            int64_t m = key->M - i0 < rows ? key->M - i0 : rows, n = key->N - j0 < cols ? key->N - j0 : cols;
            panel_product(g, key, m, n, key->K, a_at(key, A, i0, 0), b_at(key, B, 0, j0), key->accumulate,
                          C + i0 * key->ldc + j0, key->ldc);
        }
    }
}

/* A product MKL runs: whole on Intel CPUs, in shape-fixed panels elsewhere (mkl_panels). */
static void run_mkl(gemm_ctx_t *g, const gemm_entry_t *key, const void *A, const void *B, float *C) {
    if (g->mkl_panels) run_panels(g, key, A, B, C);
    else panel_product(g, key, key->M, key->N, key->K, A, B, key->accumulate, C, key->ldc);
}

/* fp32 products the gemm driver would run on its no-copy kernels with an operand's rows a
 * multiple of 2 KiB: those rows crowd a few L1 sets, and the LM head's input gradient (dlogits ·
 * W, 352 × 1024 at K = 151936, W's rows 4 KiB) ran at 72 GFLOP/s on 2 Zen 3 cores where the
 * same product staged in padded blocks ran at 143 (its bf16 twin, widened; gemm_shapes). The
 * staged blocks' rows are padded, so their own products are never staged again. */
static bool stage_f32(gemm_ctx_t *g, const gemm_entry_t *key) {
    return f32_stages(g) && !copy_kernels(g, key->M, key->N) && key->M >= PANEL_ALIGN && key->N >= PANEL_ALIGN &&
           (gemm_staged_pads(key->lda) || gemm_staged_pads(key->ldb)) && widen_work_ready(g);
}

static void run(gemm_ctx_t *g, const gemm_entry_t *key, const void *A, const void *B, float *C) {
    if (key->M == 0 || key->N == 0) return;
    if (key->K == 0) {
        if (!key->accumulate)
            for (int64_t i = 0; i < key->M; i++) memset(C + i * key->ldc, 0, (size_t)key->N * sizeof(float));
        return;
    }
    gemm_entry_t *e = find_entry(g, key);
    if (!e->prim) {
        if (key->bf16_inputs)
            widen_bf16(g, key, A, B, C);
        else if (stage_f32(g, key))
            gemm_f32_staged(g, g->widen_work, key->trans_a, key->trans_b, key->M, key->N, key->K, A, key->lda, B,
                            key->ldb, C, key->ldc, key->accumulate);
        else
            run_panels(g, key, A, B, C);
        return;
    }
    check(dnnl_memory_set_data_handle(e->mem_a, (void *)A), "set A");
    check(dnnl_memory_set_data_handle(e->mem_b, (void *)B), "set B");
    check(dnnl_memory_set_data_handle(e->mem_c, C), "set C");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->mem_a},
                               {DNNL_ARG_WEIGHTS, e->mem_b},
                               {DNNL_ARG_DST, e->mem_c}};
    check(dnnl_primitive_execute(e->prim, g->stream, 3, args), "matmul execute");
    check(dnnl_stream_wait(g->stream), "stream wait");
}

/* Whether an fp32 product MKL would run whole goes to oneDNN instead (gemm_library=auto only:
 * `mkl` keeps every product on MKL): the LM head's forward,
 * x·Wᵀ against a vocabulary's rows (151936 columns for every Qwen3; no layer is a tenth as
 * wide). On the Intel Xeon (AMX) VM, 2026-12-05, oneDNN's matmul primitive ran that product
 * (512 × 151936 × 1024) 1.10-1.11x MKL's rate (bench/gemm_shapes, two runs; a probe alternating
 * them call by call, 343 against 309 GFLOP/s; MKL split into column blocks, 315-332), while MKL
 * ran every other form of the step's products 1.0-1.2x oneDNN's. */
enum { VOCAB_WIDE = 65536 };
static bool onednn_runs_wide_forward(const gemm_ctx_t *g, const gemm_entry_t *key) {
    return g->wide_on_onednn && !key->trans_a && key->trans_b && key->N >= VOCAB_WIDE;
}

void gemm_f32(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              const float *A, int64_t lda, const float *B, int64_t ldb,
              float *C, int64_t ldc, bool accumulate) {
    gemm_entry_t key = {.trans_a = trans_a, .trans_b = trans_b, .accumulate = accumulate,
                        .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc};
    if (g->mkl && M > 0 && N > 0 && K > 0 && !onednn_runs_wide_forward(g, &key)) {
        run_mkl(g, &key, A, B, C);
        return;
    }
    run(g, &key, A, B, C);
}

/* The threads our blocked kernel runs a product on here, with their packing space ready. */
static int blocked_team(gemm_ctx_t *g) {
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (!tile_work_for(g, threads)) {
        fprintf(stderr, "stepscope: out of memory for %d threads' bf16 packing space\n", threads);
        abort();
    }
    return threads;
}

static void run_blocked(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                        const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                        bool accumulate, float *tile_sums) {
    const int threads = blocked_team(g);
    bf16_blocked_gemm(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, g->tile_work, threads, tile_sums);
}

/* Whether our blocked kernel (AMX tiles or AVX512-BF16 dot products) takes this product. */
static bool blocked_takes(const gemm_ctx_t *g, int64_t M, int64_t N, int64_t K) {
    return g->bf16_tiles && bf16_blocked_fits(M, N, K);
}

void gemm_bf16(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
               float *C, int64_t ldc, bool accumulate) {
    if (blocked_takes(g, M, N, K)) {
        run_blocked(g, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, NULL);
        return;
    }
    gemm_entry_t key = {.trans_a = trans_a, .trans_b = trans_b, .accumulate = accumulate, .bf16_inputs = true,
                        .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc};
    if (g->mkl && M > 0 && N > 0 && K > 0 && mkl_has_bf16(g->mkl)) {
        run_mkl(g, &key, A, B, C);
        return;
    }
    run(g, &key, A, B, C);
}

/* Columns of C per panel of gemm_bf16_b32 (a multiple of 32 short of N), and the panel's
 * values: GEMM_B32_PANEL_ELEMS or fewer, except 32 columns of a K deeper than that allows. */
static int64_t b32_panel_cols(int64_t N, int64_t K) {
    int64_t cols = K > 0 ? GEMM_B32_PANEL_ELEMS / K / 32 * 32 : N;
    if (cols < 32) cols = 32;
    return cols < N ? cols : N;
}

static bool b32_work_for(gemm_ctx_t *g, int64_t elems) {
    g->b32_work = grown_touched(g->b32_work, &g->b32_work_elems, elems, sizeof(bf16_t));
    return g->b32_work != NULL;
}

void gemm_bf16_b32(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   const uint16_t *A, int64_t lda, const float *B, int64_t ldb,
                   float *C, int64_t ldc, bool accumulate) {
    if (blocked_takes(g, M, N, K)) {
        const int threads = blocked_team(g);
        bf16_blocked_gemm_b32(trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, g->tile_work, threads);
        return;
    }
    const int64_t step = b32_panel_cols(N, K);
    if (!b32_work_for(g, step * (K > 0 ? K : 1))) {
        fprintf(stderr, "stepscope: out of memory for a %lld x %lld bf16 panel of a product's weights\n",
                (long long)step, (long long)K);
        abort();
    }
    for (int64_t n0 = 0; n0 < N; n0 += step) {
        const int64_t nw = N - n0 < step ? N - n0 : step;
        /* op(B)'s columns [n0, n0 + nw): rows of a stored Bᵀ, or a column block of B */
        if (trans_b) bf16_from_f32_rows(g->b32_work, K, B + n0 * ldb, ldb, nw, K);
        else bf16_from_f32_rows(g->b32_work, nw, B + n0, ldb, K, nw);
        gemm_bf16(g, trans_a, trans_b, M, nw, K, A, lda, g->b32_work, trans_b ? K : nw, C + n0, ldc, accumulate);
    }
}

int64_t gemm_sumsq_floats(int64_t M, int64_t N) { return (M / DPBF16_TILE_ROWS) * (N / 32); }

bool gemm_bf16_sumsq(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                     bool accumulate, float *tile_sums, int64_t tile_sums_floats, double *sumsq) {
    if (!(blocked_takes(g, M, N, K) && bf16_blocked_sums_squares() && K > 0 &&
          gemm_sumsq_floats(M, N) <= tile_sums_floats)) {
        gemm_bf16(g, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
        return false;
    }
    run_blocked(g, trans_a, trans_b, M, N, K, A, lda, B, ldb, C, ldc, accumulate, tile_sums);
    double sum = 0.0;
    for (int64_t i = 0, n = gemm_sumsq_floats(M, N); i < n; i++) sum += tile_sums[i];
    *sumsq = sum;
    return true;
}

void gemm_f32_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                    const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc, bool accumulate) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = trans_a ? A[k * lda + i] : A[i * lda + k];
                double b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
                acc += a * b;
            }
            C[i * ldc + j] = (float)(accumulate ? C[i * ldc + j] + acc : acc);
        }
}
