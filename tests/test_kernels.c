/* test_kernels: every kernel of src/kernels against a reference. Tuned kernels are compared
 * with their naive or double-precision references; every backward is compared with central
 * finite differences of L = Σ out ⊙ R for a fixed random R; the reductions that promise
 * thread-count independence are compared bit for bit at 1 and 2 threads. Fixed seeds; the
 * binary runs in well under ten seconds. TEST_VERBOSE=1 prints each measured error beside
 * its bound; TEST_FILTER=pattern runs only the matching tests.
 *
 * Tolerances, in units of the float epsilon ε = 2^-23 ≈ 1.2e-7 (a rounding is ≤ ε/2):
 *   - a float sum of n terms errs by at most ~n·ε/2 of Σ|terms|, typically √n·ε/2;
 *   - a central difference with step h errs by h²/6·|f'''| (truncation) plus
 *     ~δ/h, δ the rounding of the loss evaluated in float (cancellation).
 * Each bound below says which of these it rests on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/adamw.h"
#include "kernels/amx.h"
#include "kernels/bf16_blocked.h"
#include "kernels/attention.h"
#include "kernels/embed.h"
#include "kernels/bf16.h"
#include "kernels/dpbf16.h"
#include "kernels/gemm.h"
#include "kernels/microgemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "kernels/transpose.h"
#include "kernels/vecmath.h"
#include "kernels/xent.h"
#include "test_util.h"

/* A sentinel for padding and for outputs that must be written, not accumulated. */
static const float SENTINEL = 777.25f;

/* Fails with the measured value when it exceeds its bound (NaN fails too). */
#define CHECK_LE(what, value, bound)                                                           \
    do {                                                                                       \
        double v_ = (value), b_ = (bound);                                                     \
        report((what), v_, b_);                                                                \
        if (!(v_ <= b_)) fail_msg("%s: %.3e exceeds %.1e", (what), v_, b_);                    \
    } while (0)

/* The thread count in force when the binary started; tests that change it restore it. */
static int g_threads0;

/* fd_check on one thread: the finite differences call a forward kernel thousands of times
 * on tiny problems, where fork-join overhead (and spinning on a loaded machine) would cost
 * seconds. The gradients under test are computed at the normal thread count. */
static double fd_serial(float *x, const size_t *idx, size_t nidx, const float *grad, double h,
                        test_loss_fn loss, void *ctx) {
    int n0 = omp_get_max_threads();
    omp_set_num_threads(1);
    double e = fd_check(x, idx, nidx, grad, h, loss, ctx);
    omp_set_num_threads(n0);
    return e;
}

/* ================================ gemm ================================ */

/* The gemm tests run once per library (cmocka prestate: a gemm_library_t); MKL's are
 * skipped, saying so, where it is not installed. */
static const gemm_library_t LIB_ONEDNN = GEMM_LIB_ONEDNN, LIB_MKL = GEMM_LIB_MKL;
/* A test run once per library, named for it, so the two runs read apart in the output. */
#define TEST_WITH_LIB(f, lib, libname) {#f " (" libname ")", f, NULL, NULL, (void *)&(lib)}

static gemm_ctx_t *new_gemm_of(void **state) {
    gemm_library_t lib = *state ? *(const gemm_library_t *)*state : GEMM_LIB_AUTO;
    char err[512] = "";
    gemm_ctx_t *g = gemm_create(lib, err, sizeof err);
    if (!g && lib == GEMM_LIB_MKL) {
        print_message("[  SKIP    ] MKL not installed here: %s\n", err);
        skip();
    }
    if (!g) fail_msg("gemm_create: %s", err);
    if (lib != GEMM_LIB_AUTO) assert_string_equal(gemm_library_name(g), lib == GEMM_LIB_MKL ? "mkl" : "onednn");
    return g;
}


/* One gemm_f32 call against gemm_f32_naive on the same inputs: storage with leading dims
 * pad wider than the matrices, C padding filled with a sentinel that must survive, and for
 * accumulate a random starting C. Returns the relative Frobenius error. */
static double gemm_case_pads(gemm_ctx_t *g, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                             int64_t pad_a, int64_t pad_b, int64_t pad_c, bool acc, test_rng_t *rng) {
    int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + pad_a;
    int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + pad_b;
    int64_t ldc = N + pad_c;
    float *A = falloc((size_t)(a_rows * lda)), *B = falloc((size_t)(b_rows * ldb));
    float *C = falloc((size_t)(M * ldc)), *Cref = falloc((size_t)(M * ldc));
    fill_uniform(A, (size_t)(a_rows * lda), rng, -1.0f, 1.0f);
    fill_uniform(B, (size_t)(b_rows * ldb), rng, -1.0f, 1.0f);
    fill_const(C, (size_t)(M * ldc), SENTINEL);
    for (int64_t i = 0; i < M; i++) fill_uniform(C + i * ldc, (size_t)N, rng, -1.0f, 1.0f);
    memcpy(Cref, C, (size_t)(M * ldc) * sizeof(float));
    gemm_f32(g, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc);
    gemm_f32_naive(ta, tb, M, N, K, A, lda, B, ldb, Cref, ldc, acc);
    double err = rel_err_2d(C, ldc, Cref, ldc, M, N);
    if (!padding_intact(C, M, N, ldc, SENTINEL))
        fail_msg("gemm ta=%d tb=%d %ldx%ldx%ld wrote into C's padding", ta, tb, (long)M, (long)N, (long)K);
    free(A), free(B), free(C), free(Cref);
    return err;
}

static double gemm_case(gemm_ctx_t *g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad,
                        bool acc, test_rng_t *rng) {
    return gemm_case_pads(g, ta, tb, M, N, K, pad, pad, pad, acc, rng);
}

/* fp32 products summed over K ≤ 300 terms: the error per element is ~√K·ε/2 of Σ|a·b|, and
 * for random signs Σ|a·b| ≈ √K·|Σ a·b|, so the Frobenius error is ~K·ε/2 ≤ 2e-5 at worst
 * and ~1e-6 in practice (oneDNN blocks K); the naive reference sums in double. */
static void test_gemm_vs_naive(void **state) {
    static const int64_t shapes[][3] = {{37, 53, 29}, {1, 1, 1}, {64, 48, 300}, {17, 5, 3}, {3, 130, 64}};
    test_rng_t rng = {1};
    gemm_ctx_t *g = new_gemm_of(state);
    double worst = 0.0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++)
                    for (int64_t pad = 0; pad <= 7; pad += 7) {
                        double e = gemm_case(g, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, acc, &rng);
                        if (!(e < 1e-5))
                            fail_msg("gemm ta=%d tb=%d acc=%d pad=%ld %ldx%ldx%ld: rel err %.3e", ta, tb, acc,
                                     (long)pad, (long)shapes[s][0], (long)shapes[s][1], (long)shapes[s][2], e);
                        worst = e > worst ? e : worst;
                    }
    CHECK_LE("gemm vs naive, worst rel Frobenius", worst, 1e-5);
    gemm_destroy(g);
}

/* Each shape in the four transpose forms, accumulating on alternate forms, C's rows padded by
 * 3: the worst relative Frobenius error against the naive product must stay under bound. */
static void gemm_forms_vs_naive(void **state, const int64_t (*shapes)[3], size_t nshapes, unsigned seed,
                                const char *what, double bound) {
    test_rng_t rng = {seed};
    gemm_ctx_t *g = new_gemm_of(state);
    double worst = 0.0;
    for (size_t s = 0; s < nshapes; s++)
        for (int form = 0; form < 4; form++) {
            bool ta = form & 1, tb = form & 2, acc = (s + (size_t)form) % 2;
            double e = gemm_case_pads(g, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 0, 0, 3, acc, &rng);
            if (!(e < bound))
                fail_msg("gemm (%s) ta=%d tb=%d acc=%d %ldx%ldx%ld: rel err %.3e", what, ta, tb, acc,
                         (long)shapes[s][0], (long)shapes[s][1], (long)shapes[s][2], e);
            worst = e > worst ? e : worst;
        }
    char label[96];
    snprintf(label, sizeof label, "gemm on %s vs naive, worst rel Frobenius", what);
    CHECK_LE(label, worst, bound);
    gemm_destroy(g);
}

/* Products oneDNN's gemm driver would run on its no-copy kernels (a small side) with an
 * operand's rows a multiple of 2 KiB, which gemm_dnnl.c stages into padded blocks and K slices
 * (gemm_widen.h) on CPUs without AVX512: the LM head's input gradient's shape class, and one
 * deep enough for two K slices. K up to 8192 random-signed terms in fp32: the Frobenius error
 * grows like √K·ε ≈ 5e-6 at 8192 (the naive reference sums in double; 3e-7 measured, as the
 * libraries sum K in blocks); bound 2e-5. Elsewhere
 * (MKL, AVX512 oneDNN) the same shapes are plain products, held to the same bound. */
static void test_gemm_staged_vs_naive(void **state) {
    static const int64_t shapes[][3] = {{40, 48, 8192}, {96, 512, 2048}};
    gemm_forms_vs_naive(state, shapes, sizeof shapes / sizeof shapes[0], 6, "staged shapes", 2e-5);
}

/* Products that oneDNN's gemm driver runs on its copy kernels whole but not in halves of their
 * longer side, which gemm_dnnl.c splits over K on two threads (run_split_k; the qkv and gate_up
 * input gradients at 512 tokens): K even and ragged against the split's 16-alignment (37 = 32 +
 * 5), C padded. ≤ 64 random-signed fp32 terms: ~K·ε/2 ≤ 4e-6 worst; bound 1e-5, as
 * test_gemm_vs_naive. Elsewhere (MKL, AVX512 oneDNN) these are plain products, held to the same. */
static void test_gemm_split_k_vs_naive(void **state) {
    static const int64_t shapes[][3] = {{512, 1024, 64}, {520, 1000, 37}};
    gemm_forms_vs_naive(state, shapes, sizeof shapes / sizeof shapes[0], 7, "K-split shapes", 1e-5);
}

/* f[n] uniform in [-1, 1) and then rounded to bf16, h[n] the same values in bf16: operands
 * whose products a bf16 GEMM and the naive fp32 one compute exactly alike. */
/* fp32 bit patterns whose rounding to bf16 has edges: ties both ways, just off ties, a carry into
 * the exponent, the largest float, infinities, quiet and signalling NaNs of either sign, zero
 * and subnormals of either sign. */
static const uint32_t ROUNDING_EDGES[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf808000u,
                                          0x3f80ffffu, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                          0x7f800001u, 0xffbfffffu, 0x7fc00001u, 0xffa00000u, 0x80000000u,
                                          0x00000001u, 0x807fffffu, 0x00400000u};
enum { NUM_ROUNDING_EDGES = sizeof ROUNDING_EDGES / sizeof ROUNDING_EDGES[0] };

static void fill_bf16_exact(float *f, bf16_t *h, int64_t n, test_rng_t *rng) {
    fill_uniform(f, (size_t)n, rng, -1.0f, 1.0f);
    bf16_from_f32_array(h, f, n);
    for (int64_t i = 0; i < n; i++) f[i] = bf16_to_f32(h[i]);
}

/* gemm_bf16 against the naive fp32 gemm on the same values rounded to bf16: a product of two
 * bf16 values is exact in fp32 (8 + 8 significant bits), so what is left is fp32 summation
 * over K ≤ 300 terms, the same ~1e-6 as the fp32 case (bound 1e-5). All transposes,
 * accumulate and padded leading dims. */
static void test_gemm_bf16_vs_naive(void **state) {
    static const int64_t shapes[][3] = {{37, 53, 29}, {1, 1, 1}, {64, 48, 300}, {17, 5, 3}, {3, 130, 64}, {64, 96, 96}};
    test_rng_t rng = {2};
    gemm_ctx_t *g = new_gemm_of(state);
    /* A library named outright runs every product itself, also where our blocked kernel would
     * take the shape under gemm_library=auto (that kernel's test is test_bf16_blocked_vs_naive). */
    assert_false(gemm_bf16_tiles(g));
    double worst = 0.0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    int64_t M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2], pad = 5;
                    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb;
                    float *A = falloc((size_t)na), *B = falloc((size_t)nb);
                    float *C = falloc((size_t)(M * ldc)), *Cref = falloc((size_t)(M * ldc));
                    bf16_t *A16 = malloc((size_t)na * sizeof(bf16_t)), *B16 = malloc((size_t)nb * sizeof(bf16_t));
                    fill_bf16_exact(A, A16, na, &rng);
                    fill_bf16_exact(B, B16, nb, &rng);
                    fill_uniform(C, (size_t)(M * ldc), &rng, -1.0f, 1.0f);
                    memcpy(Cref, C, (size_t)(M * ldc) * sizeof(float));
                    gemm_bf16(g, ta, tb, M, N, K, A16, lda, B16, ldb, C, ldc, acc);
                    gemm_f32_naive(ta, tb, M, N, K, A, lda, B, ldb, Cref, ldc, acc);
                    double e = rel_err_2d(C, ldc, Cref, ldc, M, N);
                    if (!(e < 1e-5)) fail_msg("gemm_bf16 ta=%d tb=%d acc=%d %ldx%ldx%ld: rel err %.3e", ta, tb, acc,
                                              (long)M, (long)N, (long)K, e);
                    worst = e > worst ? e : worst;
                    free(A), free(B), free(C), free(Cref), free(A16), free(B16);
                }
    CHECK_LE("gemm_bf16 vs naive on bf16-rounded inputs, worst rel Frobenius", worst, 1e-5);
    gemm_destroy(g);
}

/* gemm_bf16 on shapes big enough for several blocks of op(A) and op(B) and several K slices
 * where the operands are widened (gemm_widen.c: up to 1024 rows and columns, K as deep as its
 * scratch allows), and for B's block kept across A's blocks, against gemm_f32 on the same
 * bf16-rounded values: only the fp32 sums' order differs, ~1e-6 relative. */
static void test_gemm_bf16_blocks_vs_f32(void **state) {
    static const int64_t shapes[][3] = {{1030, 1100, 1500}, {2100, 64, 1500}, {64, 2100, 3000}};
    test_rng_t rng = {4};
    gemm_ctx_t *g = new_gemm_of(state);
    double worst = 0.0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int form = 0; form < 4; form++) {
            bool ta = form & 1, tb = form & 2, acc = (sh + (size_t)form) % 2;
            int64_t M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
            int64_t na = M * K, nb = K * N, nc = M * N, lda = ta ? M : K, ldb = tb ? K : N;
            float *A = falloc((size_t)na), *B = falloc((size_t)nb), *C = falloc((size_t)nc), *Cref;
            bf16_t *A16 = malloc((size_t)na * sizeof(bf16_t)), *B16 = malloc((size_t)nb * sizeof(bf16_t));
            fill_bf16_exact(A, A16, na, &rng);
            fill_bf16_exact(B, B16, nb, &rng);
            fill_uniform(C, (size_t)nc, &rng, -1.0f, 1.0f);
            Cref = fdup(C, (size_t)nc);
            gemm_bf16(g, ta, tb, M, N, K, A16, lda, B16, ldb, C, N, acc);
            gemm_f32(g, ta, tb, M, N, K, A, lda, B, ldb, Cref, N, acc);
            double e = rel_err_2d(C, N, Cref, N, M, N);
            if (!(e < 1e-5)) fail_msg("gemm_bf16 ta=%d tb=%d acc=%d %ldx%ldx%ld: rel err %.3e against gemm_f32", ta, tb,
                                      acc, (long)M, (long)N, (long)K, e);
            worst = e > worst ? e : worst;
            free(A), free(B), free(C), free(Cref), free(A16), free(B16);
        }
    CHECK_LE("gemm_bf16 vs gemm_f32 on bf16-rounded inputs, blocked shapes, worst rel Frobenius", worst, 1e-5);
    gemm_destroy(g);
}

/* The same bits on 1 and 2 threads, in fp32 and bf16, all four transpose forms, with and
 * without accumulate, on shapes whose small M·N and large K oneDNN's gemm driver splits over
 * K by thread count (the tiny model's 64x512:512x64 weight gradient moved in the 9th digit on
 * an AVX2 CPU), and one big enough for several panels (gemm_dnnl.c's run_panels). */
static void test_gemm_thread_count_bits(void **state) {
    static const int64_t shapes[][3] = {{64, 64, 512}, {128, 64, 512}, {48, 64, 4096}, {16, 32, 20480}, {320, 256, 2048},
                                        {520, 1000, 37}};
    test_rng_t rng = {3};
    gemm_ctx_t *g = new_gemm_of(state);
    /* 3 threads as well: a team the panels do not divide evenly, and where MKL on its own (strict
     * reproducible mode, AMD Zen 3) changed the [16 × 32 × 20480] product's bits. */
    const int max_threads = 3;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int form = 0; form < 8; form++) {
            bool ta = form & 1, tb = form & 2, bf = form & 4, acc = sh % 2 == (size_t)ta;
            int64_t M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
            int64_t na = M * K, nb = K * N, nc = M * N, lda = ta ? M : K, ldb = tb ? K : N;
            float *A = falloc((size_t)na), *B = falloc((size_t)nb), *C0 = falloc((size_t)nc), *C[3] = {NULL, NULL, NULL};
            bf16_t *A16 = malloc((size_t)na * sizeof(bf16_t)), *B16 = malloc((size_t)nb * sizeof(bf16_t));
            fill_bf16_exact(A, A16, na, &rng);
            fill_bf16_exact(B, B16, nb, &rng);
            fill_uniform(C0, (size_t)nc, &rng, -1.0f, 1.0f);
            for (int t = 0; t < max_threads; t++) {
                omp_set_num_threads(t + 1);
                C[t] = fdup(C0, (size_t)nc);
                if (bf) gemm_bf16(g, ta, tb, M, N, K, A16, lda, B16, ldb, C[t], N, acc);
                else gemm_f32(g, ta, tb, M, N, K, A, lda, B, ldb, C[t], N, acc);
            }
            omp_set_num_threads(g_threads0);
            for (int t = 1; t < max_threads; t++)
                if (memcmp(C[0], C[t], (size_t)nc * sizeof(float)))
                    fail_msg("gemm_%s ta=%d tb=%d acc=%d %ldx%ldx%ld differs between 1 and %d threads",
                             bf ? "bf16" : "f32", ta, tb, acc, (long)M, (long)N, (long)K, t + 1);
            free(A), free(B), free(C0), free(C[0]), free(C[1]), free(C[2]), free(A16), free(B16);
        }
    gemm_destroy(g);
}

/* One bf16_blocked_gemm case against the naive fp32 gemm on the same bf16-rounded values, on
 * `threads` threads; C's row padding must stay untouched. Returns the relative Frobenius error
 * and leaves the result in *out (M × ldc) for comparisons across thread counts. */
static double bf16_blocked_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, bool acc, int threads,
                                test_rng_t *rng, float **out) {
    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb;
    float *A = falloc((size_t)na), *B = falloc((size_t)nb), *C = falloc((size_t)(M * ldc)), *Cref = falloc((size_t)(M * ldc));
    bf16_t *A16 = malloc((size_t)na * sizeof(bf16_t)), *B16 = malloc((size_t)nb * sizeof(bf16_t));
    bf16_t *work = aligned_alloc(64, (size_t)(threads * bf16_blocked_workspace_elems()) * sizeof(bf16_t));
    fill_bf16_exact(A, A16, na, rng);
    fill_bf16_exact(B, B16, nb, rng);
    fill_const(C, (size_t)(M * ldc), SENTINEL);
    for (int64_t i = 0; i < M; i++) fill_uniform(C + i * ldc, (size_t)N, rng, -1.0f, 1.0f);
    memcpy(Cref, C, (size_t)(M * ldc) * sizeof(float));
    bf16_blocked_gemm(ta, tb, M, N, K, A16, lda, B16, ldb, C, ldc, acc, work, threads, NULL);
    gemm_f32_naive(ta, tb, M, N, K, A, lda, B, ldb, Cref, ldc, acc);
    double err = rel_err_2d(C, ldc, Cref, ldc, M, N);
    if (!padding_intact(C, M, N, ldc, SENTINEL))
        fail_msg("bf16_blocked_gemm ta=%d tb=%d %ldx%ldx%ld wrote into C's padding", ta, tb, (long)M, (long)N, (long)K);
    *out = C;
    free(A), free(B), free(Cref), free(A16), free(B16), free(work);
    return err;
}

/* The blocked kernel behind gemm_bf16 on AMX CPUs (its AMX tiles) and AVX512-BF16 ones (its
 * dot-product tiles, dpbf16_tile_product), in all four transpose forms, with and
 * without accumulate, over shapes that take each of its paths: K not a multiple of 32 (A
 * packed, K zero-padded), K a multiple of 32 (A read in place), a row stride that is a multiple
 * of 2 KiB (A packed again), K deeper than one 512-deep slice (C carried across slices), an
 * operand packed whole over more than 512 rows (544 × 600: 557 KiB a slice), and C too wide
 * both ways for either operand to be packed whole (the GotoBLAS blocks), and K past
 * BF16_BLOCKED_K_MAX_AMX (on AVX512-BF16, 4096-deep slices: 4096 + 4096 + 1056, over 96 rows, so that
 * dpbf16_tile_product's 64-row blocks of a deep slice end in a partial one), and A in place past
 * 1024 deep (on AVX512-BF16 1024-deep slices in 256-column blocks: 1024 + 1024 + 32 deep, 256 +
 * 32 columns a thread on two threads; and 1056 columns, which one thread cannot pack whole and
 * two can, in the same slices; and deep slices over 1024 columns, bits only). Products of
 * bf16 values are exact in fp32, so the error is fp32 summation over K terms, at worst K·2⁻²⁴
 * relative (and ~1e-6 in practice); each case must also give the same bits on one and two
 * threads, since threads only split C. */
static void test_bf16_blocked_vs_naive(void **state) {
    (void)state;
    if (!amx_available() && !dpbf16_available()) {
        printf("blocked bf16 products not tested: this CPU or build has neither AMX nor AVX512-BF16\n");
        skip(); /* counted as skipped, not passed: nothing was checked */
    }
    static const int64_t cases[][4] = {/* M, N, K, pad */
                                       {32, 32, 1, 3},     {64, 96, 300, 5},  {96, 64, 320, 5},
                                       {64, 32, 2048, 0},  {32, 64, 2088, 7}, {1088, 1056, 40, 1},
                                       {544, 544, 600, 1}, {96, 64, 9248, 3}, {64, 544, 2080, 5},
                                       {32, 1056, 1056, 1}};
    test_rng_t rng = {4};
    double worst = 0.0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    const int64_t M = cases[c][0], N = cases[c][1], K = cases[c][2], pad = cases[c][3];
                    if (M * N > 65536 && (ta || tb || acc)) continue; /* the wide case: one form keeps it quick */
                    float *C1, *C2;
                    test_rng_t again = rng;
                    double e = bf16_blocked_case(ta, tb, M, N, K, pad, acc, 1, &rng, &C1);
                    bf16_blocked_case(ta, tb, M, N, K, pad, acc, 2, &again, &C2);
                    if (memcmp(C1, C2, (size_t)(M * (N + pad)) * sizeof(float)))
                        fail_msg("bf16_blocked_gemm ta=%d tb=%d %ldx%ldx%ld differs between 1 and 2 threads", ta, tb,
                                 (long)M, (long)N, (long)K);
                    double bound = fmax(1e-6, (double)K * 0x1p-24);
                    if (!(e < bound))
                        fail_msg("bf16_blocked_gemm ta=%d tb=%d acc=%d %ldx%ldx%ld: rel err %.3e over %.1e", ta, tb, acc,
                                 (long)M, (long)N, (long)K, e, bound);
                    worst = e > worst ? e : worst;
                    free(C1), free(C2);
                }
    CHECK_LE("bf16_blocked_gemm vs naive on bf16-rounded inputs, worst rel Frobenius", worst, 9248 * 0x1p-24);

    /* The deep slices over more columns than one thread's space packs whole at their depth
     * (1024 here; two threads take 512 each): the same bits on one and two threads, which a
     * slice depth that followed the thread's columns had broken. No naive reference: it is the
     * thread count alone that must not matter. */
    {
        const int64_t M = 32, N = 1024, K = 8224, lda = K + 1;
        bf16_t *A16 = malloc((size_t)(M * lda) * sizeof(bf16_t)), *B16 = malloc((size_t)(K * N) * sizeof(bf16_t));
        float *Af = falloc((size_t)(M * lda)), *Bf = falloc((size_t)(K * N));
        float *C[2] = {falloc((size_t)(M * N)), falloc((size_t)(M * N))};
        bf16_t *work = aligned_alloc(64, (size_t)(2 * bf16_blocked_workspace_elems()) * sizeof(bf16_t));
        fill_bf16_exact(Af, A16, M * lda, &rng);
        fill_bf16_exact(Bf, B16, K * N, &rng);
        for (int t = 0; t < 2; t++) bf16_blocked_gemm(false, false, M, N, K, A16, lda, B16, N, C[t], N, false, work, t + 1, NULL);
        if (memcmp(C[0], C[1], (size_t)(M * N) * sizeof(float)))
            fail_msg("bf16_blocked_gemm %ldx%ldx%ld (deep slices) differs between 1 and 2 threads", (long)M, (long)N, (long)K);
        free(A16), free(B16), free(Af), free(Bf), free(C[0]), free(C[1]), free(work);
    }

    /* gemm_library=auto hands such products to it through gemm_bf16, and says so. */
    char err[512] = "";
    gemm_ctx_t *g = gemm_create(GEMM_LIB_AUTO, err, sizeof err);
    if (!g) fail_msg("gemm_create: %s", err);
    assert_true(gemm_bf16_tiles(g));
    assert_non_null(strstr(gemm_bf16_detail(g), "stepscope's blocked kernel"));
    const int64_t M = 64, N = 96, K = 96;
    bf16_t *A16 = malloc((size_t)(M * K) * sizeof(bf16_t)), *B16 = malloc((size_t)(K * N) * sizeof(bf16_t));
    float *A = falloc((size_t)(M * K)), *B = falloc((size_t)(K * N)), *C = falloc((size_t)(M * N)), *Cref = falloc((size_t)(M * N));
    fill_bf16_exact(A, A16, M * K, &rng);
    fill_bf16_exact(B, B16, K * N, &rng);
    gemm_bf16(g, false, false, M, N, K, A16, K, B16, N, C, N, false);
    gemm_f32_naive(false, false, M, N, K, A, K, B, N, Cref, N, false);
    CHECK_LE("gemm_bf16 (auto: our blocked kernel) vs naive", rel_err_2d(C, N, Cref, N, M, N), K * 0x1p-24);
    free(A16), free(B16), free(A), free(B), free(C), free(Cref);
    gemm_destroy(g);
}

/* fp32 values whose rounding to bf16 has edges, among uniform ones: every seventh one of
 * ROUNDING_EDGES (subnormals: vcvtne2ps2bf16 flushes them; bf16_from_f32 keeps them). */
static void fill_rounding_edges(float *f, int64_t n, test_rng_t *rng) {
    fill_uniform(f, (size_t)n, rng, -2.0f, 2.0f);
    for (int64_t i = 0; i < n; i += 7) memcpy(&f[i], &ROUNDING_EDGES[(i / 7) % (int64_t)NUM_ROUNDING_EDGES], 4);
}

/* The packs from fp32 (amx_pack_bt_f32, amx_pack_b_f32) round each value as bf16_from_f32 does
 * and lay it out as the packs from bf16 do: the same bytes as packing bf16_from_f32 of the same
 * rows, over extents that are not multiples of 32 or 16 (zero padding) and row strides wider
 * than the rows. */
static void test_packs_from_fp32_are_packs_of_the_rounded(void **state) {
    (void)state;
    if (!amx_available() && !dpbf16_available()) {
        printf("bf16 packs not tested: this CPU or build has neither AMX nor AVX512-BF16\n");
        skip();
    }
    static const int64_t shapes[][2] = {{1, 1}, {16, 32}, {75, 90}, {33, 17}, {64, 1056}, {130, 31}};
    test_rng_t rng = {11};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        for (int trans = 0; trans < 2; trans++) {
            /* trans: src is [N rows, K columns]; else [K rows, N columns] */
            const int64_t K = shapes[c][0], N = shapes[c][1], rows = trans ? N : K, cols = trans ? K : N, ld = cols + 3;
            const size_t packed_elems = (size_t)(amx_round32(K) * amx_round32(N));
            float *src = falloc((size_t)(rows * ld));
            bf16_t *src16 = malloc((size_t)(rows * ld) * sizeof(bf16_t));
            bf16_t *want = malloc(packed_elems * sizeof(bf16_t)), *got = malloc(packed_elems * sizeof(bf16_t));
            fill_rounding_edges(src, rows * ld, &rng);
            for (int64_t i = 0; i < rows * ld; i++) src16[i] = bf16_from_f32(src[i]);
            memset(got, 0xa5, packed_elems * sizeof(bf16_t));
            if (trans) {
                amx_pack_bt(want, src16, ld, N, K);
                amx_pack_bt_f32(got, src, ld, N, K);
            } else {
                amx_pack_b(want, src16, ld, K, N);
                amx_pack_b_f32(got, src, ld, K, N);
            }
            if (memcmp(want, got, packed_elems * sizeof(bf16_t)))
                fail_msg("amx_pack_b%s_f32 %ldx%ld differs from packing the rounded values", trans ? "t" : "",
                         (long)K, (long)N);
            free(src), free(src16), free(want), free(got);
        }
}

/* gemm_bf16_b32 (B in fp32, rounded as it is packed) against gemm_bf16 over bf16(B): the same
 * bits on our blocked kernel (gemm_library=auto, shapes of 32-multiples, B packed whole and in
 * GotoBLAS blocks). Where the product goes to oneDNN in panels of rounded columns (auto with M
 * off the 32-multiples, and gemm_library=onednn), over a K deep enough for 32-column panels
 * (GEMM_B32_PANEL_ELEMS / 32 < K) and one split into several panels with a short last one, the
 * products are the same but oneDNN may sum a narrower panel over K in another order (it did at
 * 8 × 1100 × 8192): both are fp32 sums of K exact products, each within K·2⁻²⁴ of the exact
 * relative Frobenius error, so they differ by at most twice that. C's row padding stays
 * untouched. */
static void test_gemm_bf16_b32_is_gemm_bf16_of_the_rounded(void **state) {
    (void)state;
    static const int64_t cases[][3] = {/* M, N, K */
                                       {64, 96, 300},  {96, 1088, 40}, {24, 64, 80},
                                       {32, 96, (GEMM_B32_PANEL_ELEMS / 32) + 8}, {8, 1100, GEMM_B32_PANEL_ELEMS / 512}};
    test_rng_t rng = {12};
    double worst = 0.0;
    for (int lib = 0; lib < 2; lib++) {
        char err[512] = "";
        gemm_ctx_t *g = gemm_create(lib ? GEMM_LIB_ONEDNN : GEMM_LIB_AUTO, err, sizeof err);
        if (!g) fail_msg("gemm_create: %s", err);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int tb = 0; tb < 2; tb++)
                for (int acc = 0; acc < 2; acc++) {
                    const int64_t M = cases[c][0], N = cases[c][1], K = cases[c][2];
                    if (K > 4096 && (acc || lib)) continue; /* the deep cases once each: their operands are large */
                    const int64_t lda = K + 1, ldb = (tb ? K : N) + 2, ldc = N + 3, nb = (tb ? N : K) * ldb;
                    float *A = falloc((size_t)(M * lda)), *B = falloc((size_t)nb);
                    bf16_t *A16 = malloc((size_t)(M * lda) * sizeof(bf16_t)), *B16 = malloc((size_t)nb * sizeof(bf16_t));
                    float *C[2] = {falloc((size_t)(M * ldc)), falloc((size_t)(M * ldc))};
                    fill_bf16_exact(A, A16, M * lda, &rng);
                    fill_uniform(B, (size_t)nb, &rng, -1.0f, 1.0f);
                    for (int64_t i = 0; i < nb; i++) B16[i] = bf16_from_f32(B[i]);
                    fill_const(C[0], (size_t)(M * ldc), SENTINEL);
                    for (int64_t i = 0; i < M; i++) fill_uniform(C[0] + i * ldc, (size_t)N, &rng, -1.0f, 1.0f);
                    memcpy(C[1], C[0], (size_t)(M * ldc) * sizeof(float));
                    gemm_bf16(g, false, tb, M, N, K, A16, lda, B16, ldb, C[0], ldc, acc);
                    gemm_bf16_b32(g, false, tb, M, N, K, A16, lda, B, ldb, C[1], ldc, acc);
                    if (gemm_bf16_tiles(g) && bf16_blocked_fits(M, N, K)) {
                        if (memcmp(C[0], C[1], (size_t)(M * ldc) * sizeof(float)))
                            fail_msg("gemm_bf16_b32 (blocked) tb=%d acc=%d %ldx%ldx%ld differs from gemm_bf16 of the "
                                     "rounded B", tb, acc, (long)M, (long)N, (long)K);
                    } else {
                        double e = rel_err_2d(C[1], ldc, C[0], ldc, M, N), bound = fmax(1e-6, 2.0 * (double)K * 0x1p-24);
                        if (!(e <= bound))
                            fail_msg("gemm_bf16_b32 (%s) tb=%d acc=%d %ldx%ldx%ld: rel err %.3e against gemm_bf16 of "
                                     "the rounded B, over %.1e", gemm_library_name(g), tb, acc, (long)M, (long)N,
                                     (long)K, e, bound);
                        worst = e > worst ? e : worst;
                    }
                    if (!padding_intact(C[1], M, N, ldc, SENTINEL))
                        fail_msg("gemm_bf16_b32 %ldx%ldx%ld wrote into C's padding", (long)M, (long)N, (long)K);
                    free(A), free(B), free(A16), free(B16), free(C[0]), free(C[1]);
                }
        gemm_destroy(g);
    }
    printf("# gemm_bf16_b32 in oneDNN panels against gemm_bf16 of the rounded B: worst rel Frobenius %.2e\n", worst);
}

/* The weight gradients' sums of squares (bf16_blocked_gemm's tile_sumsq, gemm_bf16_sumsq): C
 * is the same to the bit as without them; each 8 × 32 tile's sum matches Σ C² over that tile in
 * double to 256 · 2⁻²⁴ ≈ 1.5e-5 relative (float sums of 256 positive terms; bound 2e-5); the
 * sums are the same bits on one and two threads; and gemm_bf16_sumsq's total over the tiles
 * matches Σ C² the same way, of C's final values where it adds onto C. Shapes over the kernel's paths: A packed (K off 32), A in place,
 * several 512-deep slices (the sums from the last), a transposed A (the weight gradient's form),
 * and the GotoBLAS blocks (C too wide both ways). */
static void test_bf16_blocked_sums_of_squares(void **state) {
    (void)state;
    char err[512] = "";
    gemm_ctx_t *g = gemm_create(GEMM_LIB_AUTO, err, sizeof err);
    if (!g) fail_msg("gemm_create: %s", err);
    if (!bf16_blocked_sums_squares()) {
        /* Elsewhere gemm_bf16_sumsq computes C alone and says so. */
        float C[32 * 32];
        bf16_t A16[32 * 32] = {0};
        double sq = -1.0;
        assert_false(gemm_bf16_sumsq(g, false, false, 32, 32, 32, A16, 32, A16, 32, C, 32, false,
                                     (float[4]){0}, 4, &sq));
        gemm_destroy(g);
        printf("tile sums of squares not tested: this CPU or build has no AVX512-BF16 dot products (or has AMX)\n");
        skip();
    }
    static const int64_t cases[][5] = {/* M, N, K, pad, trans_a */
                                       {64, 96, 300, 5, 0}, {96, 64, 320, 0, 0}, {64, 32, 2088, 7, 1},
                                       {320, 64, 1024, 0, 1}, {1088, 1056, 40, 1, 0}};
    test_rng_t rng = {91};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t M = cases[c][0], N = cases[c][1], K = cases[c][2], pad = cases[c][3];
        const bool ta = cases[c][4];
        int64_t lda = (ta ? M : K) + pad, ldb = N + pad, ldc = N + pad;
        int64_t na = (ta ? K : M) * lda, nb = K * ldb, tiles = gemm_sumsq_floats(M, N);
        float *A = falloc((size_t)na), *B = falloc((size_t)nb);
        float *C[3] = {falloc((size_t)(M * ldc)), falloc((size_t)(M * ldc)), falloc((size_t)(M * ldc))};
        float *sums[2] = {falloc((size_t)tiles), falloc((size_t)tiles)};
        bf16_t *A16 = malloc((size_t)na * sizeof(bf16_t)), *B16 = malloc((size_t)nb * sizeof(bf16_t));
        bf16_t *work = aligned_alloc(64, (size_t)(2 * bf16_blocked_workspace_elems()) * sizeof(bf16_t));
        fill_bf16_exact(A, A16, na, &rng);
        fill_bf16_exact(B, B16, nb, &rng);
        for (int t = 0; t < 2; t++)
            bf16_blocked_gemm(ta, false, M, N, K, A16, lda, B16, ldb, C[t], ldc, false, work, t + 1, sums[t]);
        bf16_blocked_gemm(ta, false, M, N, K, A16, lda, B16, ldb, C[2], ldc, false, work, 2, NULL);
        for (int64_t i = 0; i < M; i++)
            if (memcmp(C[0] + i * ldc, C[2] + i * ldc, (size_t)N * sizeof(float)) ||
                memcmp(C[1] + i * ldc, C[2] + i * ldc, (size_t)N * sizeof(float)))
                fail_msg("%ldx%ldx%ld: C with tile sums differs from C without", (long)M, (long)N, (long)K);
        if (memcmp(sums[0], sums[1], (size_t)tiles * sizeof(float)))
            fail_msg("%ldx%ldx%ld: tile sums differ between 1 and 2 threads", (long)M, (long)N, (long)K);
        double worst = 0.0, total = 0.0;
        for (int64_t ti = 0; ti < M / 8; ti++)
            for (int64_t tj = 0; tj < N / 32; tj++) {
                double want = 0.0;
                for (int64_t i = ti * 8; i < ti * 8 + 8; i++)
                    for (int64_t j = tj * 32; j < tj * 32 + 32; j++) want += (double)C[2][i * ldc + j] * C[2][i * ldc + j];
                double e = fabs(sums[0][ti * (N / 32) + tj] - want) / want;
                worst = e > worst ? e : worst;
                total += want;
            }
        CHECK_LE("bf16_blocked_gemm tile sums of squares vs double, worst rel", worst, 2e-5);
        double sq = -1.0;
        assert_true(gemm_bf16_sumsq(g, ta, false, M, N, K, A16, lda, B16, ldb, C[0], ldc, false, sums[0], tiles, &sq));
        CHECK_LE("gemm_bf16_sumsq total vs double sum of C squared, rel", fabs(sq - total) / total, 2e-5);
        for (int64_t i = 0; i < M; i++)
            if (memcmp(C[0] + i * ldc, C[2] + i * ldc, (size_t)N * sizeof(float)))
                fail_msg("%ldx%ldx%ld: gemm_bf16_sumsq's C differs from bf16_blocked_gemm's", (long)M, (long)N, (long)K);
        /* Accumulating (a gradient's last micro-batch): the same product added onto C = AB stores
         * 2AB, to the roundings of adding AB to each 512-deep slice's partial sum in turn (one
         * slice: exactly 2AB; at most K/512 + 1 additions, each within 2^-24 of sums twice C's
         * size, hence (K/512 + 2) · 2^-22), and its sums are of the stored values, 4 Σ C². */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[1][i * ldc + j] = 2.0f * C[2][i * ldc + j];
        sq = -1.0;
        assert_true(gemm_bf16_sumsq(g, ta, false, M, N, K, A16, lda, B16, ldb, C[0], ldc, true, sums[0], tiles, &sq));
        CHECK_LE("gemm_bf16_sumsq accumulating: C vs 2AB", rel_err_2d(C[0], ldc, C[1], ldc, M, N),
                 (double)(K / 512 + 2) * 0x1p-22);
        if (K <= 512)
            for (int64_t i = 0; i < M; i++)
                if (memcmp(C[0] + i * ldc, C[1] + i * ldc, (size_t)N * sizeof(float)))
                    fail_msg("%ldx%ldx%ld: gemm_bf16_sumsq accumulating in one slice: C is not 2AB", (long)M, (long)N,
                             (long)K);
        CHECK_LE("gemm_bf16_sumsq accumulating: total vs 4 x double sum of C squared, rel",
                 fabs(sq - 4.0 * total) / (4.0 * total), 2e-5);
        /* Scratch one tile short: C alone, the sums untouched past what was given. */
        memset(C[1], 0, (size_t)(M * ldc) * sizeof(float));
        const float canary = -1.0f;
        sums[1][tiles - 1] = canary;
        sq = -1.0;
        assert_false(gemm_bf16_sumsq(g, ta, false, M, N, K, A16, lda, B16, ldb, C[1], ldc, false, sums[1], tiles - 1,
                                     &sq));
        assert_true(sums[1][tiles - 1] == canary && sq == -1.0);
        for (int64_t i = 0; i < M; i++)
            if (memcmp(C[1] + i * ldc, C[2] + i * ldc, (size_t)N * sizeof(float)))
                fail_msg("%ldx%ldx%ld: gemm_bf16_sumsq with short scratch: C differs", (long)M, (long)N, (long)K);
        free(A), free(B), free(A16), free(B16), free(work);
        for (int i = 0; i < 3; i++) free(C[i]);
        free(sums[0]), free(sums[1]);
    }
    gemm_destroy(g);
}

/* A packed bf16 block product (amx_gemm's contract: A bf16 row-major at row stride lda, B packed
 * by amx.h) against the naive fp32 gemm on the same bf16-rounded values. B comes packed from bf16
 * rows as Bᵀ (amx_pack_bt), as B (amx_pack_b) and from fp32 (amx_pack_b_f32), from extents that
 * are not multiples of 32 (the packs zero-pad them); the product runs over a K shorter than the
 * packed extent, written and accumulated. Each k-pair's products are exact in fp32, so only the
 * order of fp32 additions over K = 64 terms differs (~1e-7; bound 1e-5). */
static void check_packed_product(const char *name, bf16_block_product_fn product, int64_t lda_extra, uint64_t seed) {
    test_rng_t rng = {seed};
    const int64_t M = 64, N = 96, K = 64, lda = K + lda_extra, Ksrc = 75, Nsrc = 90;
    const int64_t Kp = amx_round32(Ksrc), Np = amx_round32(Nsrc);
    float *A = calloc((size_t)(M * lda), sizeof(float)), *Bf = falloc((size_t)(Ksrc * Nsrc));
    float *C = falloc((size_t)(M * N)), *Cref = falloc((size_t)(M * N));
    bf16_t *A16 = calloc((size_t)(M * lda), sizeof(bf16_t)), *B16 = malloc((size_t)(Ksrc * Nsrc) * 2);
    bf16_t *Bt16 = malloc((size_t)(Nsrc * Ksrc) * 2), *packed = malloc((size_t)(Kp * Np) * 2);
    for (int64_t i = 0; i < M; i++) fill_bf16_exact(A + i * lda, A16 + i * lda, K, &rng);
    fill_uniform(Bf, (size_t)(Ksrc * Nsrc), &rng, -1.0f, 1.0f);
    bf16_from_f32_array(B16, Bf, Ksrc * Nsrc);
    for (int64_t k = 0; k < Ksrc; k++)
        for (int64_t n = 0; n < Nsrc; n++) Bt16[n * Ksrc + k] = B16[k * Nsrc + n];
    float *Bref = calloc((size_t)(K * N), sizeof(float)); /* columns n ≥ Nsrc: the packs' zero padding */
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < Nsrc; n++) Bref[k * N + n] = bf16_to_f32(B16[k * Nsrc + n]);
    for (int form = 0; form < 3; form++)
        for (int acc = 0; acc < 2; acc++) {
            if (form == 0) amx_pack_bt(packed, Bt16, Ksrc, Nsrc, Ksrc);
            else if (form == 1) amx_pack_b(packed, B16, Nsrc, Ksrc, Nsrc);
            else amx_pack_b_f32(packed, Bf, Nsrc, Ksrc, Nsrc);
            fill_uniform(C, (size_t)(M * N), &rng, -1.0f, 1.0f);
            memcpy(Cref, C, (size_t)(M * N) * sizeof(float));
            product(C, N, A16, lda, packed, Kp, M, N, K, acc);
            gemm_f32_naive(false, false, M, N, K, A, lda, Bref, N, Cref, N, acc);
            char what[96];
            snprintf(what, sizeof what, "%s (pack form %d, accumulate %d) vs naive", name, form, acc);
            CHECK_LE(what, rel_err_2d(C, N, Cref, N, M, N), 1e-5);
        }
    free(A), free(Bf), free(C), free(Cref), free(A16), free(B16), free(Bt16), free(packed), free(Bref);
}

/* AMX tile products; skipped where the CPU has no AMX. */
static void test_amx_gemm_vs_naive(void **state) {
    (void)state;
    if (!amx_available()) {
        printf("AMX tile products not tested: this CPU or build has no AMX\n");
        skip(); /* counted as skipped, not passed: nothing was checked */
    }
    check_packed_product("amx_gemm", amx_gemm, 0, 3);
}

/* AVX512-BF16 dot products (dpbf16_gemm), with a row stride wider than K to check that rows are
 * read at lda; skipped where the CPU or build has no AVX512-BF16. */
static void test_dpbf16_gemm_vs_naive(void **state) {
    (void)state;
    if (!dpbf16_available()) {
        printf("AVX512-BF16 block products not tested: this CPU or build has no AVX512-BF16\n");
        skip();
    }
    check_packed_product("dpbf16_gemm", dpbf16_gemm, 32, 5);
}

/* The vector conversion rounds to nearest even like the scalar one, ties included, and keeps
 * NaN a NaN: checked on ties (low 16 bits 0x8000, both parities), values just either side, and
 * random normal numbers, over a length that exercises the 32-wide body and the tail. */
static void test_bf16_rounding(void **state) {
    (void)state;
    const int64_t n = 1000;
    float *x = falloc((size_t)n);
    bf16_t *y = malloc((size_t)n * sizeof(bf16_t));
    test_rng_t rng = {3};
    fill_uniform(x, (size_t)n, &rng, -100.0f, 100.0f);
    /* inside the vector loops' reach */
    for (size_t i = 0; i < NUM_ROUNDING_EDGES; i++) memcpy(&x[40 + i], &ROUNDING_EDGES[i], 4);
    bf16_from_f32_array(y, x, n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(y[i], bf16_from_f32(x[i]));
    assert_int_equal(bf16_from_f32(1.0f + 1.0f / 256.0f), 0x3f80); /* tie, even below */
    assert_int_equal(bf16_from_f32(1.0f + 3.0f / 256.0f), 0x3f82); /* tie, even above */
    float nan = NAN;
    assert_true(isnan(bf16_to_f32(bf16_from_f32(nan))));
    free(x), free(y);
}

/* transpose: exact (a copy), over shapes that mix whole 16×16 tiles, 64-column bands and
 * ragged edges, with leading dims wider than the matrices and the destination's padding kept;
 * each shape also with a 64-byte aligned destination of a 16-float multiple leading dim, where
 * whole tiles go out as streaming stores. */
static void test_transpose(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {16, 16}, {37, 53}, {130, 203}, {64, 3}, {5, 70}};
    test_rng_t rng = {4};
    for (size_t i = 0; i < 2 * sizeof shapes / sizeof shapes[0]; i++) {
        const bool aligned = i % 2;
        int64_t R = shapes[i / 2][0], C = shapes[i / 2][1], lds = C + 3, ldd = aligned ? (R + 5 + 15) / 16 * 16 : R + 5;
        float *src = falloc((size_t)(R * lds));
        float *dst = aligned_alloc(64, ((size_t)(C * ldd) * sizeof(float) + 63) / 64 * 64);
        assert_non_null(dst);
        fill_uniform(src, (size_t)(R * lds), &rng, -1.0f, 1.0f);
        bf16_t *dst16 = malloc((size_t)(C * ldd) * sizeof(bf16_t));
        for (int serial = 0; serial < 2; serial++) {
            fill_const(dst, (size_t)(C * ldd), SENTINEL);
            (serial ? transpose_f32_serial : transpose_f32)(dst, ldd, src, lds, R, C);
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    if (dst[c * ldd + r] != src[r * lds + c])
                        fail_msg("transpose%s %ldx%ld: (%ld,%ld) wrong", serial ? "_serial" : "", (long)R, (long)C, (long)r, (long)c);
            assert_true(padding_intact(dst, C, R, ldd, SENTINEL));
        }
        /* bf16: each element rounded exactly as bf16_from_f32 rounds it; the padding untouched */
        for (int64_t e = 0; e < C * ldd; e++) dst16[e] = 0x7fc1;
        transpose_f32_to_bf16_serial(dst16, ldd, src, lds, R, C);
        for (int64_t c = 0; c < C; c++)
            for (int64_t r = 0; r < ldd; r++) {
                bf16_t want = r < R ? bf16_from_f32(src[r * lds + c]) : 0x7fc1;
                if (dst16[c * ldd + r] != want) fail_msg("transpose_f32_to_bf16 %ldx%ld: (%ld,%ld) wrong", (long)R, (long)C, (long)r, (long)c);
            }
        free(src), free(dst), free(dst16);
    }
}

/* K = 0: C = 0 when writing, untouched when accumulating (an empty sum). */
static void test_gemm_empty_k(void **state) {
    gemm_ctx_t *g = new_gemm_of(state);
    float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {0}, B[1] = {0};
    gemm_f32(g, false, false, 2, 3, 0, A, 1, B, 3, C, 3, true);
    for (int i = 0; i < 6; i++) assert_true(C[i] == (float)(i + 1));
    gemm_f32(g, false, false, 2, 3, 0, A, 1, B, 3, C, 3, false);
    for (int i = 0; i < 6; i++) assert_true(C[i] == 0.0f);
    gemm_destroy(g);
}

/* The cache: a repeated shape reuses its primitive (and still reads the new pointers); any
 * change of the key (shape, transposes, accumulate, leading dims) makes a new one. */
static void test_gemm_caches_primitives(void **state) {
    test_rng_t rng = {2};
    gemm_ctx_t *g = new_gemm_of(state);
    assert_int_equal(gemm_num_primitives(g), 0);
    gemm_case(g, false, true, 37, 53, 29, 0, false, &rng);
    assert_int_equal(gemm_num_primitives(g), 1);
    for (int rep = 0; rep < 3; rep++) { /* new buffers each time: results must still match */
        double e = gemm_case(g, false, true, 37, 53, 29, 0, false, &rng);
        assert_true(e < 1e-5);
    }
    assert_int_equal(gemm_num_primitives(g), 1);
    assert_true(gemm_case(g, false, true, 37, 53, 29, 0, true, &rng) < 1e-5); /* accumulate */
    assert_int_equal(gemm_num_primitives(g), 2);
    /* Each leading dim alone: a primitive baked for one stride must not serve another. */
    assert_true(gemm_case_pads(g, false, true, 37, 53, 29, 4, 0, 0, false, &rng) < 1e-5);
    assert_int_equal(gemm_num_primitives(g), 3);
    assert_true(gemm_case_pads(g, false, true, 37, 53, 29, 0, 4, 0, false, &rng) < 1e-5);
    assert_int_equal(gemm_num_primitives(g), 4);
    assert_true(gemm_case_pads(g, false, true, 37, 53, 29, 0, 0, 4, false, &rng) < 1e-5);
    assert_int_equal(gemm_num_primitives(g), 5);
    gemm_case(g, true, true, 37, 53, 29, 0, false, &rng); /* transpose */
    assert_int_equal(gemm_num_primitives(g), 6);
    gemm_case(g, false, true, 38, 53, 29, 0, false, &rng); /* shape */
    assert_int_equal(gemm_num_primitives(g), 7);
    /* Interleaved repeats of all of them: no growth, still right. */
    for (int rep = 0; rep < 2; rep++) {
        assert_true(gemm_case(g, false, true, 38, 53, 29, 0, false, &rng) < 1e-5);
        assert_true(gemm_case(g, false, true, 37, 53, 29, 0, false, &rng) < 1e-5);
        assert_true(gemm_case(g, true, true, 37, 53, 29, 0, false, &rng) < 1e-5);
        assert_true(gemm_case(g, false, true, 37, 53, 29, 0, true, &rng) < 1e-5);
        assert_true(gemm_case_pads(g, false, true, 37, 53, 29, 0, 0, 4, false, &rng) < 1e-5);
        assert_true(gemm_case_pads(g, false, true, 37, 53, 29, 0, 4, 0, false, &rng) < 1e-5);
        assert_true(gemm_case_pads(g, false, true, 37, 53, 29, 4, 0, 0, false, &rng) < 1e-5);
    }
    assert_int_equal(gemm_num_primitives(g), 7);
    gemm_destroy(g);
}

/* ============================== microgemm ============================== */

/* microgemm against a double loop. A is stored plainly ([M, K], row stride K+3) or
 * transposed ([K, M], row stride M+2, so rsa = 1, csa = M+2); C rows have 4 padding floats
 * that the masked tail stores must not touch. K ≤ 64 float FMAs per element: error
 * ≤ K·ε/2·Σ|a·b| ≈ 4e-6 of Σ|a·b| worst case, far less norm-wise; bound 1e-5. */
static double microgemm_case(int64_t M, int64_t N, int64_t K, float alpha, bool trans_a, bool acc,
                             test_rng_t *rng) {
    int64_t lda = trans_a ? M + 2 : K + 3, a_rows = trans_a ? K : M;
    int64_t rsa = trans_a ? 1 : lda, csa = trans_a ? lda : 1;
    int64_t ldb = N + 5, ldc = N + 4;
    float *A = falloc((size_t)(a_rows * lda)), *B = falloc((size_t)(K * ldb));
    float *C = falloc((size_t)(M * ldc)), *C0 = falloc((size_t)(M * ldc));
    double *ref = dalloc((size_t)(M * N));
    fill_uniform(A, (size_t)(a_rows * lda), rng, -1.0f, 1.0f);
    fill_uniform(B, (size_t)(K * ldb), rng, -1.0f, 1.0f);
    fill_const(C, (size_t)(M * ldc), SENTINEL);
    for (int64_t i = 0; i < M; i++) fill_uniform(C + i * ldc, (size_t)N, rng, -1.0f, 1.0f);
    memcpy(C0, C, (size_t)(M * ldc) * sizeof(float));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) s += (double)A[i * rsa + k * csa] * B[k * ldb + j];
            ref[i * N + j] = alpha * s + (acc ? C0[i * ldc + j] : 0.0);
        }
    microgemm(M, N, K, alpha, A, rsa, csa, B, ldb, C, ldc, acc);
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double d = C[i * ldc + j] - ref[i * N + j];
            num += d * d;
            den += ref[i * N + j] * ref[i * N + j];
        }
    if (!padding_intact(C, M, N, ldc, SENTINEL))
        fail_msg("microgemm M=%ld N=%ld K=%ld trans_a=%d wrote past N", (long)M, (long)N, (long)K, trans_a);
    free(A), free(B), free(C), free(C0), free(ref);
    return sqrt(num / den);
}

static void test_microgemm_vs_naive(void **state) {
    (void)state;
    /* M around the 6-row (AVX2) and 8-row (AVX-512) tiles and their doubles, N around the
     * vector widths (8, 16) and the tiles' widths (16, 32); K with every remainder of the k
     * loop's unroll by 4. */
    static const int64_t Ms[] = {1, 3, 5, 6, 7, 8, 9, 12, 13};
    static const int64_t Ns[] = {1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 50, 64, 70};
    static const int64_t Ks[] = {1, 2, 5, 7, 24};
    test_rng_t rng = {3};
    double worst = 0.0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
                for (int ta = 0; ta < 2; ta++)
                    for (int acc = 0; acc < 2; acc++) {
                        float alpha = acc ? 0.375f : 1.0f;
                        double e = microgemm_case(Ms[mi], Ns[ni], Ks[ki], alpha, ta, acc, &rng);
                        if (!(e < 1e-5))
                            fail_msg("microgemm M=%ld N=%ld K=%ld trans_a=%d acc=%d: rel err %.3e", (long)Ms[mi],
                                     (long)Ns[ni], (long)Ks[ki], ta, acc, e);
                        worst = e > worst ? e : worst;
                    }
    /* Attention-like blocks: a full query block against a ragged key extent. */
    for (int ta = 0; ta < 2; ta++) {
        double e = microgemm_case(64, 130, 64, 0.125f, ta, ta, &rng);
        worst = e > worst ? e : worst;
        e = microgemm_case(70, 24, 130, 1.0f, ta, !ta, &rng);
        worst = e > worst ? e : worst;
    }
    CHECK_LE("microgemm vs double, worst rel Frobenius", worst, 1e-5);
}

/* =============================== rmsnorm =============================== */

typedef struct rms_case {
    int64_t T, G, N, ld_in, ld_out, ld_dout, ld_dinp;
} rms_case_t;

static const rms_case_t RMS_CASES[] = {
    {5, 1, 130, 137, 133, 131, 139}, /* a layer norm: G = 1, N not a multiple of 16 */
    {4, 3, 16, 51, 53, 55, 49},      /* per-head norms: G = 3 heads of 16 in wider rows */
    {19, 2, 40, 83, 81, 85, 87},     /* 38 rows: dweight summed over chunks of 16, 16 and 6 rows */
};

typedef struct rms_ctx {
    const rms_case_t *c;
    float *out, *rstd, *inp, *weight, *R;
} rms_ctx_t;

static double rms_loss(void *p) {
    rms_ctx_t *x = p;
    const rms_case_t *c = x->c;
    rmsnorm_forward(x->out, c->ld_out, x->rstd, x->inp, c->ld_in, x->weight, c->T, c->G, c->N, 1e-6f);
    return dot_2d(x->out, c->ld_out, x->R, c->ld_dout, c->T, c->G * c->N);
}


/* The backwards with their partials scratch allocated for the call. */
static void rmsnorm_backward_scratch(float *dinp, int64_t ld_dinp, bool accumulate_dinp, float *dweight,
                                     const float *dout, int64_t ld_dout, const float *inp, int64_t ld_in,
                                     const float *weight, const float *rstd, int64_t T, int64_t G, int64_t N) {
    float *partials = falloc((size_t)rmsnorm_backward_partials(T, G, N));
    rmsnorm_backward(dinp, ld_dinp, accumulate_dinp, dweight, dout, ld_dout, inp, ld_in, weight, rstd, T, G, N,
                     partials);
    free(partials);
}
static void rmsnorm_rope_backward_scratch(float *dinp, int64_t ld_dinp, float *dweight, const float *dout,
                                          int64_t ld_dout, const float *inp, int64_t ld_in, const float *weight,
                                          const float *rstd, const float *cos_table, const float *sin_table, int64_t T,
                                          int64_t S, int64_t G, int64_t N) {
    float *partials = falloc((size_t)rmsnorm_backward_partials(T, G, N));
    rmsnorm_rope_backward(dinp, ld_dinp, dweight, dout, ld_dout, inp, ld_in, weight, rstd, cos_table, sin_table, T, S,
                          G, N, partials);
    free(partials);
}
/* Forward against double: mean(x²) sums N ≤ 130 float squares (≤ N·ε/2 ≈ 8e-6 relative,
 * half of it on rstd), then two roundings per output; bound 1e-5. */
static void test_rmsnorm_forward(void **state) {
    (void)state;
    test_rng_t rng = {10};
    for (size_t ci = 0; ci < sizeof RMS_CASES / sizeof RMS_CASES[0]; ci++) {
        const rms_case_t *c = &RMS_CASES[ci];
        int64_t T = c->T, G = c->G, N = c->N;
        float *inp = falloc((size_t)(T * c->ld_in)), *out = falloc((size_t)(T * c->ld_out));
        float *w = falloc((size_t)N), *rstd = falloc((size_t)(T * G));
        fill_uniform(inp, (size_t)(T * c->ld_in), &rng, -1.0f, 1.0f);
        fill_uniform(w, (size_t)N, &rng, 0.5f, 1.5f);
        fill_const(out, (size_t)(T * c->ld_out), SENTINEL);
        const float eps = 1e-6f;
        rmsnorm_forward(out, c->ld_out, rstd, inp, c->ld_in, w, T, G, N, eps);
        double num = 0, den = 0, rnum = 0, rden = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t g = 0; g < G; g++) {
                const float *x = inp + t * c->ld_in + g * N;
                double ss = 0;
                for (int64_t i = 0; i < N; i++) ss += (double)x[i] * x[i];
                double s = 1.0 / sqrt(ss / (double)N + eps);
                rnum += (rstd[t * G + g] - s) * (rstd[t * G + g] - s);
                rden += s * s;
                for (int64_t i = 0; i < N; i++) {
                    double y = x[i] * s * w[i], d = out[t * c->ld_out + g * N + i] - y;
                    num += d * d;
                    den += y * y;
                }
            }
        CHECK_LE("rmsnorm forward vs double", sqrt(num / den), 1e-5);
        CHECK_LE("rmsnorm rstd vs double", sqrt(rnum / rden), 1e-5);
        assert_true(padding_intact(out, T, G * N, c->ld_out, SENTINEL));
        free(inp), free(out), free(w), free(rstd);
    }
}

/* Backward against central differences of L = Σ out ⊙ R, for every input and weight.
 * h = 1e-2: truncation h²/6·|f'''| with |f'''| ~ rstd³ ≲ 10 for rms ≈ 0.58 gives ~2e-4 of
 * a gradient entry at worst; the float rounding of the ≤ 130 outputs a step moves adds
 * ~√130·ε/2·|R|/(2h) ≈ 3e-5. Bound 1e-3. The weight gradient is linear in w, so only the
 * rounding term applies there. Then the accumulate flags: dinp += and dweight +=. */
static void test_rmsnorm_backward_fd(void **state) {
    (void)state;
    test_rng_t rng = {11};
    for (size_t ci = 0; ci < sizeof RMS_CASES / sizeof RMS_CASES[0]; ci++) {
        const rms_case_t *c = &RMS_CASES[ci];
        int64_t T = c->T, G = c->G, N = c->N, W = G * N;
        rms_ctx_t x = {.c = c};
        x.inp = falloc((size_t)(T * c->ld_in));
        x.out = falloc((size_t)(T * c->ld_out));
        x.rstd = falloc((size_t)(T * G));
        x.weight = falloc((size_t)N);
        x.R = falloc((size_t)(T * c->ld_dout));
        fill_uniform(x.inp, (size_t)(T * c->ld_in), &rng, -1.0f, 1.0f);
        fill_uniform(x.weight, (size_t)N, &rng, 0.5f, 1.5f);
        fill_uniform(x.R, (size_t)(T * c->ld_dout), &rng, -1.0f, 1.0f);
        float *dinp = falloc((size_t)(T * c->ld_dinp)), *dw = falloc((size_t)N);
        fill_const(dinp, (size_t)(T * c->ld_dinp), SENTINEL);
        fill_const(dw, (size_t)N, 0.0f);
        rms_loss(&x); /* rstd for the backward */
        rmsnorm_backward_scratch(dinp, c->ld_dinp, false, dw, x.R, c->ld_dout, x.inp, c->ld_in, x.weight, x.rstd, T, G, N);
        assert_true(padding_intact(dinp, T, W, c->ld_dinp, SENTINEL));

        /* fd_check reads the gradient at the input's index: lay dinp out with ld_in. */
        float *g_in = falloc((size_t)(T * c->ld_in));
        for (int64_t t = 0; t < T; t++) memcpy(g_in + t * c->ld_in, dinp + t * c->ld_dinp, (size_t)W * sizeof(float));
        size_t n;
        size_t *idx = block_indices(T, W, c->ld_in, &n);
        CHECK_LE(G == 1 ? "rmsnorm dinp vs FD (G=1)" : "rmsnorm dinp vs FD (G>1)",
                 fd_serial(x.inp, idx, n, g_in, 1e-2, rms_loss, &x), 1e-3);
        free(idx);
        idx = block_indices(1, N, N, &n);
        CHECK_LE("rmsnorm dweight vs FD", fd_serial(x.weight, idx, n, dw, 1e-2, rms_loss, &x), 1e-3);
        free(idx);

        /* Accumulate flags: from random D0 and W0, dinp = D0 + grad and dweight = W0 + grad,
         * up to the one rounding of the final add (≤ ε/2 of the sum; bound 1e-6). */
        rms_loss(&x);
        float *D0 = falloc((size_t)(T * c->ld_dinp)), *dinp2 = falloc((size_t)(T * c->ld_dinp));
        float *W0 = falloc((size_t)N), *dw2 = falloc((size_t)N), *dw_ref = falloc((size_t)N);
        fill_uniform(D0, (size_t)(T * c->ld_dinp), &rng, -1.0f, 1.0f);
        fill_uniform(W0, (size_t)N, &rng, -1.0f, 1.0f);
        memcpy(dinp2, D0, (size_t)(T * c->ld_dinp) * sizeof(float));
        memcpy(dw2, W0, (size_t)N * sizeof(float));
        rmsnorm_backward_scratch(dinp2, c->ld_dinp, true, dw2, x.R, c->ld_dout, x.inp, c->ld_in, x.weight, x.rstd, T, G, N);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < c->ld_dinp; i++) {
                size_t k = (size_t)(t * c->ld_dinp + i);
                D0[k] = i < W ? D0[k] + dinp[k] : D0[k]; /* padding: untouched */
            }
        for (int64_t i = 0; i < N; i++) dw_ref[i] = W0[i] + dw[i];
        CHECK_LE("rmsnorm accumulate_dinp adds", rel_err(dinp2, D0, (size_t)(T * c->ld_dinp)), 1e-6);
        CHECK_LE("rmsnorm dweight accumulates", rel_err(dw2, dw_ref, (size_t)N), 1e-6);
        free(D0), free(dinp2), free(W0), free(dw2), free(dw_ref), free(g_in);
        free(x.inp), free(x.out), free(x.rstd), free(x.weight), free(x.R), free(dinp), free(dw);
    }
}

/* The bf16-output forms of the RMSNorm and SwiGLU forwards and of SwiGLU's backward (what a
 * bf16 run's matmul operands come from) must give exactly bf16_from_f32 of the fp32 forms'
 * outputs, and the same rstd: a ragged N, per-head groups, and N over one 512-element piece. */
static void test_forward_bf16_outputs(void **state) {
    (void)state;
    test_rng_t rng = {13};
    static const int64_t shapes[][3] = {{5, 1, 130}, {4, 3, 16}, {3, 1, 1100}}; /* T, G, N */
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t T = shapes[i][0], G = shapes[i][1], N = shapes[i][2], W = G * N, ld = W + 7;
        float *inp = falloc((size_t)(T * ld)), *w = falloc((size_t)N), *out = falloc((size_t)(T * W));
        float *rstd = falloc((size_t)(T * G)), *rstd16 = falloc((size_t)(T * G));
        bf16_t *out16 = malloc((size_t)(T * W) * sizeof(bf16_t));
        fill_uniform(inp, (size_t)(T * ld), &rng, -2.0f, 2.0f);
        fill_uniform(w, (size_t)N, &rng, 0.5f, 1.5f);
        rmsnorm_forward(out, W, rstd, inp, ld, w, T, G, N, 1e-6f);
        rmsnorm_forward_bf16(out16, W, rstd16, inp, ld, w, T, G, N, 1e-6f);
        assert_memory_equal(rstd, rstd16, (size_t)(T * G) * sizeof(float));
        for (int64_t e = 0; e < T * W; e++)
            if (out16[e] != bf16_from_f32(out[e])) fail_msg("rmsnorm_forward_bf16 T=%ld N=%ld: element %ld", (long)T, (long)N, (long)e);
        free(inp), free(w), free(out), free(rstd), free(rstd16), free(out16);
    }
    /* SwiGLU's outputs go to rows wider than they are (the model pads a matmul input's row
     * stride off 2 KiB multiples): every element as rounding the fp32 form, the padding left. */
    const int64_t T = 3, F = 1100, ldh = F + 32, ldg = 2 * F + 32; /* two full 512-column tiles and a ragged one */
    const bf16_t PAD = 0x7fc1;
    float *gate_up = falloc((size_t)(T * 2 * F)), *h = falloc((size_t)(T * F));
    bf16_t *h16 = malloc((size_t)(T * ldh) * sizeof(bf16_t));
    for (int64_t e = 0; e < T * ldh; e++) h16[e] = PAD;
    fill_uniform(gate_up, (size_t)(T * 2 * F), &rng, -6.0f, 6.0f);
    swiglu_forward(h, F, gate_up, 2 * F, T, F);
    swiglu_forward_bf16(h16, ldh, gate_up, 2 * F, T, F);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < ldh; j++)
            if (h16[t * ldh + j] != (j < F ? bf16_from_f32(h[t * F + j]) : PAD))
                fail_msg("swiglu_forward_bf16: row %ld column %ld", (long)t, (long)j);
    /* and the backward's bf16 dgate_up, from the same dh */
    float *dgu = falloc((size_t)(T * 2 * F));
    bf16_t *dgu16 = malloc((size_t)(T * ldg) * sizeof(bf16_t));
    for (int64_t e = 0; e < T * ldg; e++) dgu16[e] = PAD;
    fill_uniform(h, (size_t)(T * F), &rng, -1.0f, 1.0f);
    swiglu_backward(dgu, 2 * F, h, F, gate_up, 2 * F, T, F);
    swiglu_backward_bf16(dgu16, ldg, h, F, gate_up, 2 * F, T, F);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < ldg; j++)
            if (dgu16[t * ldg + j] != (j < 2 * F ? bf16_from_f32(dgu[t * 2 * F + j]) : PAD))
                fail_msg("swiglu_backward_bf16: row %ld column %ld", (long)t, (long)j);
    /* the plain rounding into such rows */
    for (int64_t e = 0; e < T * ldg; e++) dgu16[e] = PAD;
    bf16_from_f32_rows(dgu16, ldg, dgu, 2 * F, T, 2 * F);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < ldg; j++)
            if (dgu16[t * ldg + j] != (j < 2 * F ? bf16_from_f32(dgu[t * 2 * F + j]) : PAD))
                fail_msg("bf16_from_f32_rows: row %ld column %ld", (long)t, (long)j);
    free(gate_up), free(h), free(h16), free(dgu), free(dgu16);
}

/* In place (out == inp, dinp == dout, same row stride) runs the same arithmetic in the same
 * order as out of place, so the results are identical bit for bit. */
static void test_rmsnorm_in_place(void **state) {
    (void)state;
    test_rng_t rng = {12};
    for (size_t ci = 0; ci < sizeof RMS_CASES / sizeof RMS_CASES[0]; ci++) {
        const rms_case_t *c = &RMS_CASES[ci];
        int64_t T = c->T, G = c->G, N = c->N, ld = c->ld_in;
        size_t n = (size_t)(T * ld);
        float *inp = falloc(n), *out = falloc(n), *buf = falloc(n), *w = falloc((size_t)N);
        float *rstd = falloc((size_t)(T * G)), *rstd2 = falloc((size_t)(T * G));
        fill_uniform(inp, n, &rng, -1.0f, 1.0f);
        fill_uniform(w, (size_t)N, &rng, 0.5f, 1.5f);
        memcpy(out, inp, n * sizeof(float)); /* same padding in both */
        memcpy(buf, inp, n * sizeof(float));
        rmsnorm_forward(out, ld, rstd, inp, ld, w, T, G, N, 1e-6f);
        rmsnorm_forward(buf, ld, rstd2, buf, ld, w, T, G, N, 1e-6f);
        assert_memory_equal(out, buf, n * sizeof(float));
        assert_memory_equal(rstd, rstd2, (size_t)(T * G) * sizeof(float));

        float *dout = falloc(n), *dinp = falloc(n), *dw = falloc((size_t)N), *dw2 = falloc((size_t)N);
        fill_uniform(dout, n, &rng, -1.0f, 1.0f);
        memcpy(dinp, dout, n * sizeof(float));
        memcpy(buf, dout, n * sizeof(float));
        fill_const(dw, (size_t)N, 0.5f);
        fill_const(dw2, (size_t)N, 0.5f);
        rmsnorm_backward_scratch(dinp, ld, false, dw, dout, ld, inp, ld, w, rstd, T, G, N);
        rmsnorm_backward_scratch(buf, ld, false, dw2, buf, ld, inp, ld, w, rstd, T, G, N);
        assert_memory_equal(dinp, buf, n * sizeof(float));
        assert_memory_equal(dw, dw2, (size_t)N * sizeof(float));
        free(inp), free(out), free(buf), free(w), free(rstd), free(rstd2), free(dout), free(dinp), free(dw), free(dw2);
    }
}

/* The fused qk-norm + rope against the two kernels one after the other: the same bits in the
 * output, rstd, the input gradient (in place, as the model runs it) and dweight (added to
 * nonzero sums). B = 2 sequences of S = 5 (positions wrap), G = 3 heads of N = 16 and 128
 * (Qwen3's head_dim), rows padded (ld > G·N). */
static void test_rmsnorm_rope_fused_bits(void **state) {
    (void)state;
    test_rng_t rng = {60};
    static const int64_t Ns[] = {16, 128};
    for (int ni = 0; ni < 2; ni++) {
        const int64_t B = 2, S = 5, T = B * S, G = 3, N = Ns[ni], ld = G * N + 8;
        const size_t n = (size_t)(T * ld);
        float *x = falloc(n), *w = falloc((size_t)N), *ct = falloc((size_t)(S * N / 2)), *st = falloc((size_t)(S * N / 2));
        float *y_ref = falloc(n), *y = falloc(n), *r_ref = falloc((size_t)(T * G)), *r = falloc((size_t)(T * G));
        float *d_ref = falloc(n), *d = falloc(n), *dw_ref = falloc((size_t)N), *dw = falloc((size_t)N);
        fill_uniform(x, n, &rng, -2.0f, 2.0f);
        fill_uniform(w, (size_t)N, &rng, 0.5f, 1.5f);
        fill_uniform(d_ref, n, &rng, -1.0f, 1.0f);
        fill_uniform(dw_ref, (size_t)N, &rng, -1.0f, 1.0f);
        memcpy(d, d_ref, n * sizeof(float));
        memcpy(dw, dw_ref, (size_t)N * sizeof(float));
        rope_tables(ct, st, S, N, 10000.0);
        memset(y_ref, 0, n * sizeof(float)), memset(y, 0, n * sizeof(float));
        rmsnorm_forward(y_ref, ld, r_ref, x, ld, w, T, G, N, 1e-6f);
        rope_forward(y_ref, ld, ct, st, B, S, G, N);
        rmsnorm_rope_forward(y, ld, r, x, ld, w, ct, st, T, S, G, N, 1e-6f);
        assert_memory_equal(y, y_ref, n * sizeof(float));
        assert_memory_equal(r, r_ref, (size_t)(T * G) * sizeof(float));
        rope_backward(d_ref, ld, ct, st, B, S, G, N);
        rmsnorm_backward_scratch(d_ref, ld, false, dw_ref, d_ref, ld, x, ld, w, r_ref, T, G, N);
        rmsnorm_rope_backward_scratch(d, ld, dw, d, ld, x, ld, w, r, ct, st, T, S, G, N);
        assert_memory_equal(d, d_ref, n * sizeof(float));
        assert_memory_equal(dw, dw_ref, (size_t)N * sizeof(float));
        free(x), free(w), free(ct), free(st), free(y_ref), free(y), free(r_ref), free(r);
        free(d_ref), free(d), free(dw_ref), free(dw);
    }
}

/* ================================= rope ================================= */

/* The tables against the formula in double: angle p·base^(−2i/HD) exact to ~1e-16
 * relative (≲ 1e-12 absolute at p < 4096), then cos and sin rounded once to float
 * (≤ ε/2 ≈ 6e-8). Bound 1e-6 absolute, also at Qwen3's base 1e6 and HD 128. (Hugging Face
 * forms the angle in float32 instead, which moves cos/sin by up to 2.6e-4 at p ≈ 4096:
 * rope.h chooses the exact angle, so this test holds it to that.) */
static void test_rope_tables(void **state) {
    (void)state;
    static const struct {
        int64_t S, HD;
        double base;
    } cases[] = {{4096, 128, 1000000.0}, {512, 64, 10000.0}, {100, 16, 10000.0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t S = cases[ci].S, HD = cases[ci].HD, half = HD / 2, n = S * half;
        float *c = falloc((size_t)n), *s = falloc((size_t)n);
        rope_tables(c, s, S, HD, cases[ci].base);
        double worst = 0.0;
        for (int64_t i = 0; i < half; i++) {
            double inv_freq = pow(cases[ci].base, -2.0 * (double)i / (double)HD);
            for (int64_t p = 0; p < S; p++) {
                double angle = (double)p * inv_freq;
                double d = fmax(fabs(c[p * half + i] - cos(angle)), fabs(s[p * half + i] - sin(angle)));
                worst = d > worst ? d : worst;
            }
        }
        char what[96];
        snprintf(what, sizeof what, "rope_tables vs double formula (S=%ld HD=%ld)", (long)S, (long)HD);
        CHECK_LE(what, worst, 1e-6);
        free(c), free(s);
    }
}

typedef struct rope_ctx {
    int64_t B, S, G, HD, ld;
    const float *cos_t, *sin_t;
    float *x, *work, *R;
} rope_ctx_t;

static double rope_loss(void *p) {
    rope_ctx_t *c = p;
    size_t n = (size_t)(c->B * c->S * c->ld);
    memcpy(c->work, c->x, n * sizeof(float));
    rope_forward(c->work, c->ld, c->cos_t, c->sin_t, c->B, c->S, c->G, c->HD);
    return dot_2d(c->work, c->ld, c->R, c->ld, c->B * c->S, c->G * c->HD);
}

/* Forward against a double rotation with the same tables (two products and a sum per
 * output: ≤ 1.5ε of |x|; bound 1e-6 norm-wise); forward then backward returns x (the
 * rotation is orthogonal: 4 roundings, bound 1e-6); the backward against central
 * differences (L is linear, so only rounding: each step moves 2 outputs, ~ε·|R|/h ≈ 1e-5
 * per entry at h = 1e-2; bound 1e-4). Rows are wider than the heads; padding survives. */
static void test_rope_forward_backward(void **state) {
    (void)state;
    test_rng_t rng = {20};
    rope_ctx_t c = {.B = 2, .S = 5, .G = 3, .HD = 16};
    c.ld = c.G * c.HD + 3;
    int64_t T = c.B * c.S, W = c.G * c.HD, half = c.HD / 2;
    size_t n = (size_t)(T * c.ld);
    float *ct = falloc((size_t)(c.S * half)), *st = falloc((size_t)(c.S * half));
    rope_tables(ct, st, c.S, c.HD, 10000.0);
    c.cos_t = ct, c.sin_t = st;
    c.x = falloc(n), c.work = falloc(n), c.R = falloc(n);
    fill_uniform(c.x, n, &rng, -1.0f, 1.0f);
    for (int64_t t = 0; t < T; t++) fill_const(c.x + t * c.ld + W, (size_t)(c.ld - W), SENTINEL);
    fill_uniform(c.R, n, &rng, -1.0f, 1.0f);

    float *y = fdup(c.x, n);
    rope_forward(y, c.ld, ct, st, c.B, c.S, c.G, c.HD);
    assert_true(padding_intact(y, T, W, c.ld, SENTINEL));
    double num = 0, den = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t g = 0; g < c.G; g++)
            for (int64_t i = 0; i < half; i++) {
                int64_t p = t % c.S;
                const float *x = c.x + t * c.ld + g * c.HD;
                double co = ct[p * half + i], si = st[p * half + i];
                double y1 = x[i] * co - x[i + half] * si, y2 = x[i + half] * co + x[i] * si;
                const float *yy = y + t * c.ld + g * c.HD;
                num += (yy[i] - y1) * (yy[i] - y1) + (yy[i + half] - y2) * (yy[i + half] - y2);
                den += y1 * y1 + y2 * y2;
            }
    CHECK_LE("rope forward vs double rotation", sqrt(num / den), 1e-6);

    rope_backward(y, c.ld, ct, st, c.B, c.S, c.G, c.HD);
    CHECK_LE("rope backward(forward(x)) == x", rel_err_2d(y, c.ld, c.x, c.ld, T, W), 1e-6);

    float *d = fdup(c.R, n);
    rope_backward(d, c.ld, ct, st, c.B, c.S, c.G, c.HD);
    size_t ni;
    size_t *idx = block_indices(T, W, c.ld, &ni);
    CHECK_LE("rope backward vs FD", fd_serial(c.x, idx, ni, d, 1e-2, rope_loss, &c), 1e-4);
    free(idx), free(d), free(y), free(ct), free(st), free(c.x), free(c.work), free(c.R);
}

/* ================================ swiglu ================================ */

typedef struct swiglu_ctx {
    int64_t T, F;
    float *gu, *h, *R;
} swiglu_ctx_t;

static double swiglu_loss(void *p) {
    swiglu_ctx_t *c = p;
    swiglu_forward(c->h, c->F, c->gu, 2 * c->F, c->T, c->F);
    return dot_2d(c->h, c->F, c->R, c->F, c->T, c->F);
}

/* Forward against double over F = 531 (a 512-column tile plus a tail of 19, not a multiple
 * of 16) with gates in [-6, 6] and a few far out (±30, ±100, where exp clamps). silu·up is
 * three roundings plus the polynomial exp (< 2e-7): bound 1e-6 norm-wise. */
static void test_swiglu_forward(void **state) {
    (void)state;
    test_rng_t rng = {30};
    int64_t T = 3, F = 531;
    float *gu = falloc((size_t)(T * 2 * F)), *h = falloc((size_t)(T * F));
    fill_uniform(gu, (size_t)(T * 2 * F), &rng, -6.0f, 6.0f);
    gu[3] = 30.0f, gu[4] = -30.0f, gu[5] = 100.0f, gu[6] = -100.0f, gu[2 * F + 520] = -95.0f;
    swiglu_forward(h, F, gu, 2 * F, T, F);
    double num = 0, den = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < F; j++) {
            double g = gu[t * 2 * F + j], u = gu[t * 2 * F + F + j];
            double ref = g / (1.0 + exp(-g)) * u, d = h[t * F + j] - ref;
            assert_true(isfinite(h[t * F + j]));
            num += d * d;
            den += ref * ref;
        }
    CHECK_LE("swiglu forward vs double", sqrt(num / den), 1e-6);
    free(gu), free(h);
}

/* Backward against central differences over every gate and up input. dgate_up starts as a
 * sentinel (it must be written). Each step moves one output: rounding ~ε·|h|/h_step ≈ 1e-5
 * at h = 1e-2, truncation h²/6·|silu'''| ≤ 2e-5 (|silu'''| < 1); bound 1e-3. */
static void test_swiglu_backward_fd(void **state) {
    (void)state;
    test_rng_t rng = {31};
    static const int64_t Fs[] = {37, 531};
    for (size_t fi = 0; fi < 2; fi++) {
        swiglu_ctx_t c = {.T = 2, .F = Fs[fi]};
        size_t n = (size_t)(c.T * 2 * c.F);
        c.gu = falloc(n), c.h = falloc((size_t)(c.T * c.F)), c.R = falloc((size_t)(c.T * c.F));
        fill_uniform(c.gu, n, &rng, -4.0f, 4.0f);
        fill_uniform(c.R, (size_t)(c.T * c.F), &rng, -1.0f, 1.0f);
        float *dgu = falloc(n);
        fill_const(dgu, n, SENTINEL);
        swiglu_backward(dgu, 2 * c.F, c.R, c.F, c.gu, 2 * c.F, c.T, c.F);
        size_t ni;
        size_t *idx = block_indices(1, (int64_t)n, (int64_t)n, &ni);
        CHECK_LE("swiglu dgate_up vs FD", fd_serial(c.gu, idx, ni, dgu, 1e-2, swiglu_loss, &c), 1e-3);
        free(idx), free(dgu), free(c.gu), free(c.h), free(c.R);
    }
}

/* The model may pad every activation's row stride (qwen3_padded_width): at such strides every
 * kernel gives the same bits as on dense rows, in fp32 and bf16, reads nothing of the padding
 * (NaN there in gate_up and dh) and writes none of it (sentinels there in h and dgate_up stay). */
static void test_swiglu_strided_rows(void **state) {
    (void)state;
    test_rng_t rng = {32};
    const int64_t T = 3, F = 531, ld = 2 * F + 16, ldf = F + 16, ldh16 = F + 32;
    float *gu = falloc((size_t)(T * 2 * F)), *gu_pad = falloc((size_t)(T * ld)), *dh = falloc((size_t)(T * F));
    float *dh_pad = falloc((size_t)(T * ldf));
    fill_uniform(gu, (size_t)(T * 2 * F), &rng, -6.0f, 6.0f);
    fill_uniform(dh, (size_t)(T * F), &rng, -1.0f, 1.0f);
    fill_const(gu_pad, (size_t)(T * ld), NAN);
    fill_const(dh_pad, (size_t)(T * ldf), NAN);
    for (int64_t t = 0; t < T; t++) {
        memcpy(gu_pad + t * ld, gu + t * 2 * F, (size_t)(2 * F) * sizeof(float));
        memcpy(dh_pad + t * ldf, dh + t * F, (size_t)F * sizeof(float));
    }
    float *h = falloc((size_t)(T * F)), *h_pad = falloc((size_t)(T * ldf));
    fill_const(h_pad, (size_t)(T * ldf), SENTINEL);
    swiglu_forward(h, F, gu, 2 * F, T, F);
    swiglu_forward(h_pad, ldf, gu_pad, ld, T, F);
    for (int64_t t = 0; t < T; t++) {
        assert_memory_equal(h + t * F, h_pad + t * ldf, (size_t)F * sizeof(float));
        for (int64_t j = F; j < ldf; j++) assert_true(h_pad[t * ldf + j] == SENTINEL);
    }
    bf16_t *h16 = malloc((size_t)(T * ldh16) * sizeof(bf16_t)), *h16_pad = malloc((size_t)(T * ldh16) * sizeof(bf16_t));
    swiglu_forward_bf16(h16, ldh16, gu, 2 * F, T, F);
    swiglu_forward_bf16(h16_pad, ldh16, gu_pad, ld, T, F);
    for (int64_t t = 0; t < T; t++)
        assert_memory_equal(h16 + t * ldh16, h16_pad + t * ldh16, (size_t)F * sizeof(bf16_t));
    float *dgu = falloc((size_t)(T * 2 * F)), *dgu_pad = falloc((size_t)(T * ld));
    fill_const(dgu_pad, (size_t)(T * ld), SENTINEL);
    swiglu_backward(dgu, 2 * F, dh, F, gu, 2 * F, T, F);
    swiglu_backward(dgu_pad, ld, dh_pad, ldf, gu_pad, ld, T, F);
    for (int64_t t = 0; t < T; t++) {
        assert_memory_equal(dgu + t * 2 * F, dgu_pad + t * ld, (size_t)(2 * F) * sizeof(float));
        for (int64_t j = 2 * F; j < ld; j++) assert_true(dgu_pad[t * ld + j] == SENTINEL);
    }
    bf16_t *d16 = malloc((size_t)(T * 2 * F) * sizeof(bf16_t)), *d16_pad = malloc((size_t)(T * 2 * F) * sizeof(bf16_t));
    swiglu_backward_bf16(d16, 2 * F, dh, F, gu, 2 * F, T, F);
    swiglu_backward_bf16(d16_pad, 2 * F, dh_pad, ldf, gu_pad, ld, T, F);
    assert_memory_equal(d16, d16_pad, (size_t)(T * 2 * F) * sizeof(bf16_t));
    /* and rounding rows read at a padded stride */
    bf16_from_f32_rows(d16_pad, 2 * F, dgu_pad, ld, T, 2 * F);
    for (int64_t e = 0; e < T * 2 * F; e++) assert_true(d16_pad[e] == bf16_from_f32(dgu[e]));
    free(gu), free(gu_pad), free(dh), free(dh_pad), free(h), free(h_pad), free(h16), free(h16_pad), free(dgu), free(dgu_pad);
    free(d16), free(d16_pad);
}

/* ================================ embed ================================= */

typedef struct embed_ctx {
    int64_t B, S, D, ld_tok;
    const int32_t *tok;
    float *table, *out, *R;
} embed_ctx_t;

static double embed_loss(void *p) {
    embed_ctx_t *c = p;
    embed_forward(c->out, c->D, c->tok, c->ld_tok, c->table, c->B, c->S, c->D);
    return dot_2d(c->out, c->D, c->R, c->D, c->B * c->S, c->D);
}

/* Token rows carry S+1 ids (the targets' shift), so ld_tokens = S+1; ids repeat. Forward
 * is a copy (exact); the backward adds into a random starting dtable, checked against a
 * double scatter (≤ 6 float adds per entry: bound 1e-6) and central differences (L is
 * linear in the table: rounding only, ~ε·|R|/h ≈ 1e-5 at h = 1e-2; bound 1e-4). */
static void test_embed(void **state) {
    (void)state;
    test_rng_t rng = {40};
    embed_ctx_t c = {.B = 2, .S = 9, .D = 70, .ld_tok = 10};
    const int64_t V = 11, T = c.B * c.S;
    int32_t tok[20];
    for (int i = 0; i < 20; i++) tok[i] = (int32_t)rng_below(&rng, V);
    tok[0] = tok[1] = tok[2] = tok[11] = 7; /* repeated within and across rows */
    tok[9] = 99;                             /* position S of row 0: never read */
    c.tok = tok;
    c.table = falloc((size_t)(V * c.D)), c.out = falloc((size_t)(T * c.D)), c.R = falloc((size_t)(T * c.D));
    fill_uniform(c.table, (size_t)(V * c.D), &rng, -1.0f, 1.0f);
    fill_uniform(c.R, (size_t)(T * c.D), &rng, -1.0f, 1.0f);
    embed_forward(c.out, c.D, tok, c.ld_tok, c.table, c.B, c.S, c.D);
    for (int64_t t = 0; t < T; t++)
        assert_memory_equal(c.out + t * c.D, c.table + tok[(t / c.S) * c.ld_tok + t % c.S] * c.D,
                            (size_t)c.D * sizeof(float));
    /* From a bf16 table: the rows widened exactly (weight_dtype=bfloat16). */
    bf16_t *table16 = malloc((size_t)(V * c.D) * sizeof(bf16_t));
    float *out16 = falloc((size_t)(T * c.D));
    bf16_from_f32_array(table16, c.table, V * c.D);
    embed_forward_bf16(out16, c.D, tok, c.ld_tok, table16, c.B, c.S, c.D);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < c.D; j++)
            if (out16[t * c.D + j] != bf16_to_f32(table16[tok[(t / c.S) * c.ld_tok + t % c.S] * c.D + j]))
                fail_msg("embed_forward_bf16: row %ld column %ld is not the table's widened", (long)t, (long)j);
    free(table16), free(out16);

    float *d0 = falloc((size_t)(V * c.D)), *dt = falloc((size_t)(V * c.D));
    double *ref = dalloc((size_t)(V * c.D));
    fill_uniform(d0, (size_t)(V * c.D), &rng, -1.0f, 1.0f);
    memcpy(dt, d0, (size_t)(V * c.D) * sizeof(float));
    for (int64_t i = 0; i < V * c.D; i++) ref[i] = d0[i];
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < c.D; j++) ref[tok[(t / c.S) * c.ld_tok + t % c.S] * c.D + j] += c.R[t * c.D + j];
    embed_backward(dt, c.R, c.D, tok, c.ld_tok, c.B, c.S, c.D);
    CHECK_LE("embed backward (accumulating) vs double", rel_err_fd(dt, ref, (size_t)(V * c.D)), 1e-6);

    float *grad = falloc((size_t)(V * c.D));
    fill_const(grad, (size_t)(V * c.D), 0.0f);
    embed_backward(grad, c.R, c.D, tok, c.ld_tok, c.B, c.S, c.D);
    size_t ni;
    size_t *idx = block_indices(V, c.D, c.D, &ni);
    CHECK_LE("embed dtable vs FD", fd_serial(c.table, idx, ni, grad, 1e-2, embed_loss, &c), 1e-4);
    free(idx), free(grad), free(d0), free(dt), free(ref), free(c.table), free(c.out), free(c.R);
}

/* At a padded row stride (the model's residual stream, qwen3_padded_width) the forward writes
 * the same rows and none of the padding (sentinels stay), and the backward gives the same bits
 * reading none of it (NaN there). */
static void test_embed_strided_rows(void **state) {
    (void)state;
    test_rng_t rng = {41};
    const int64_t B = 2, S = 5, D = 70, ld = D + 16, V = 7, T = B * S;
    int32_t tok[12];
    for (int i = 0; i < 12; i++) tok[i] = (int32_t)rng_below(&rng, V);
    float *table = falloc((size_t)(V * D)), *out = falloc((size_t)(T * D)), *out_pad = falloc((size_t)(T * ld));
    fill_uniform(table, (size_t)(V * D), &rng, -1.0f, 1.0f);
    fill_const(out_pad, (size_t)(T * ld), SENTINEL);
    embed_forward(out, D, tok, S + 1, table, B, S, D);
    embed_forward(out_pad, ld, tok, S + 1, table, B, S, D);
    for (int64_t t = 0; t < T; t++) {
        assert_memory_equal(out + t * D, out_pad + t * ld, (size_t)D * sizeof(float));
        for (int64_t j = D; j < ld; j++) assert_true(out_pad[t * ld + j] == SENTINEL);
    }
    float *dout = out, *dout_pad = out_pad, *dt = falloc((size_t)(V * D)), *dt_pad = falloc((size_t)(V * D));
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = D; j < ld; j++) dout_pad[t * ld + j] = NAN;
    fill_const(dt, (size_t)(V * D), 0.25f);
    fill_const(dt_pad, (size_t)(V * D), 0.25f);
    embed_backward(dt, dout, D, tok, S + 1, B, S, D);
    embed_backward(dt_pad, dout_pad, ld, tok, S + 1, B, S, D);
    assert_memory_equal(dt, dt_pad, (size_t)(V * D) * sizeof(float));
    free(table), free(out), free(out_pad), free(dt), free(dt_pad);
}

/* ================================= xent ================================= */

typedef struct xent_ctx {
    int64_t C, V;
    float grad_scale, z;
    const int32_t *tgt;
    float *logits, *work, *loss, *lse;
} xent_ctx_t;

/* grad_scale · Σ row_loss: the objective whose gradient xent leaves in the logits. */
static double xent_loss(void *p) {
    xent_ctx_t *c = p;
    memcpy(c->work, c->logits, (size_t)(c->C * c->V) * sizeof(float));
    xent_forward_backward(c->work, c->loss, c->lse, c->tgt, c->C, c->V, c->grad_scale, c->z);
    double s = 0;
    for (int64_t r = 0; r < c->C; r++) s += c->loss[r];
    return s * c->grad_scale;
}

/* The in-place gradient against central differences of grad_scale · Σ row_loss, without
 * and with z-loss (z = 0.1, large enough that its term moves the gradient by ~1.8×).
 * V = 37: two 16-wide vector chunks and a scalar tail. h = 1e-2: the row loss (~4) rounds
 * to float with error ≤ 2.4e-7, giving ~1e-5·grad_scale per entry; truncation is
 * h²/6·|lse'''| ≤ 2e-6. Norm-wise (the target entries, ~1, dominate) that is ≲ 1e-4; bound
 * 1e-3. */
static void test_xent_backward_fd(void **state) {
    (void)state;
    test_rng_t rng = {50};
    xent_ctx_t c = {.C = 3, .V = 37, .grad_scale = 1.0f / 3.0f};
    int32_t tgt[3] = {0, 36, 17};
    c.tgt = tgt;
    size_t n = (size_t)(c.C * c.V);
    c.logits = falloc(n), c.work = falloc(n), c.loss = falloc(3), c.lse = falloc(3);
    fill_uniform(c.logits, n, &rng, -3.0f, 3.0f);
    float *grad = falloc(n), *grad_noz = falloc(n);
    for (int zi = 0; zi < 2; zi++) {
        c.z = zi ? 0.1f : 0.0f;
        memcpy(grad, c.logits, n * sizeof(float));
        xent_forward_backward(grad, c.loss, c.lse, tgt, c.C, c.V, c.grad_scale, c.z);
        if (!zi) memcpy(grad_noz, grad, n * sizeof(float));
        size_t ni;
        size_t *idx = block_indices(1, (int64_t)n, (int64_t)n, &ni);
        CHECK_LE(zi ? "xent gradient vs FD (z_loss 0.1)" : "xent gradient vs FD (no z_loss)",
                 fd_serial(c.logits, idx, ni, grad, 1e-2, xent_loss, &c), 1e-3);
        free(idx);
    }
    assert_true(rel_err(grad, grad_noz, n) > 0.1); /* the z term did change the gradient */
    free(grad), free(grad_noz), free(c.logits), free(c.work), free(c.loss), free(c.lse);
}

/* Loss, lse and gradient against double for a small and Qwen3's full vocabulary. The lse
 * sums exps (polynomial, < 2e-7 each) in 16 float lanes flushed to double every 4096
 * columns, so ≤ 256 float adds per lane: ≤ 256·ε/2 ≈ 1.5e-5 relative on the sum and so
 * ≤ 1.5e-5 absolute on lse, typically ~1e-6; bound 2e-5 absolute on lse and loss (plus
 * the final float rounding of a value ≲ 30: 1e-6). Gradient: softmax·(1+2z·lse)/sum ·
 * grad_scale, a few roundings beyond the sum's error; bound 2e-5 norm-wise. */
static void test_xent_vs_double(void **state) {
    (void)state;
    test_rng_t rng = {51};
    static const int64_t Vs[] = {1000, 151936};
    for (int vi = 0; vi < 2; vi++) {
        int64_t V = Vs[vi], C = vi ? 1 : 2;
        const float gs = 0.5f, z = 1e-4f;
        size_t n = (size_t)(C * V);
        float *l = falloc(n), *g = falloc(n), loss[2], lse[2];
        double *ref = dalloc(n);
        int32_t tgt[2] = {(int32_t)(V - 1), 5};
        fill_uniform(l, n, &rng, -8.0f, 8.0f);
        l[17] = 20.0f; /* a confident row */
        memcpy(g, l, n * sizeof(float));
        xent_forward_backward(g, loss, lse, tgt, C, V, gs, z);
        double lse_err = 0, loss_err = 0;
        for (int64_t r = 0; r < C; r++) {
            const float *x = l + r * V;
            double m = -INFINITY, s = 0;
            for (int64_t i = 0; i < V; i++) m = fmax(m, x[i]);
            for (int64_t i = 0; i < V; i++) s += exp(x[i] - m);
            double lse_ref = m + log(s), loss_ref = lse_ref - x[tgt[r]] + z * lse_ref * lse_ref;
            lse_err = fmax(lse_err, fabs(lse[r] - lse_ref));
            loss_err = fmax(loss_err, fabs(loss[r] - loss_ref));
            for (int64_t i = 0; i < V; i++)
                ref[r * V + i] = gs * ((exp(x[i] - m) / s) * (1.0 + 2.0 * z * lse_ref) - (i == tgt[r]));
        }
        char what[80];
        snprintf(what, sizeof what, "xent lse vs double (V=%ld)", (long)V);
        CHECK_LE(what, lse_err, 2e-5);
        snprintf(what, sizeof what, "xent loss vs double (V=%ld)", (long)V);
        CHECK_LE(what, loss_err, 2e-5);
        snprintf(what, sizeof what, "xent gradient vs double (V=%ld)", (long)V);
        CHECK_LE(what, rel_err_fd(g, ref, n), 2e-5);
        free(l), free(g), free(ref);
    }
}

/* The bf16 run's variant against rounding the fp32 kernel's gradient: the same bits, the same
 * loss and lse, and the logits left as they were; and written over the logits themselves (row r
 * over the first half of row r, as the model runs it), the same bits again. V = 37 (a scalar
 * tail, the target in it) and Qwen3's vocabulary (the target in the last 512-wide piece and in
 * the first), with z-loss. */
static void test_xent_bf16_matches_rounded(void **state) {
    (void)state;
    test_rng_t rng = {52};
    static const int64_t Vs[] = {37, 151936};
    const int threads = omp_get_max_threads();
    for (int vi = 0; vi < 2; vi++) {
        const int64_t V = Vs[vi], C = 3;
        const size_t n = (size_t)(C * V);
        float *l = falloc(n), *kept = falloc(n), *g = falloc(n), *rows = falloc((size_t)threads * (size_t)V);
        bf16_t *want = malloc(n * sizeof(bf16_t)), *got = malloc(n * sizeof(bf16_t));
        float loss[3], lse[3], loss16[3], lse16[3];
        int32_t tgt[3] = {(int32_t)(V - 1), 0, (int32_t)(V / 2)};
        fill_uniform(l, n, &rng, -8.0f, 8.0f);
        memcpy(kept, l, n * sizeof(float));
        memcpy(g, l, n * sizeof(float));
        xent_forward_backward(g, loss, lse, tgt, C, V, 0.25f, 1e-4f);
        for (size_t i = 0; i < n; i++) want[i] = bf16_from_f32(g[i]);
        xent_forward_backward_bf16(l, got, V, rows, loss16, lse16, tgt, C, V, 0.25f, 1e-4f);
        assert_memory_equal(got, want, n * sizeof(bf16_t));
        assert_memory_equal(l, kept, n * sizeof(float));
        assert_memory_equal(loss16, loss, sizeof loss);
        assert_memory_equal(lse16, lse, sizeof lse);
        bf16_t *over = (bf16_t *)l;
        xent_forward_backward_bf16(l, over, 2 * V, rows, loss16, lse16, tgt, C, V, 0.25f, 1e-4f);
        for (int64_t r = 0; r < C; r++)
            if (memcmp(over + r * 2 * V, want + r * V, (size_t)V * sizeof(bf16_t)))
                fail_msg("xent_forward_backward_bf16 over its logits: row %ld differs (V=%ld)", (long)r, (long)V);
        assert_memory_equal(loss16, loss, sizeof loss);
        free(l), free(kept), free(g), free(rows), free(want), free(got);
    }
}

/* vf_exp against exp in double at 2^21 evenly spaced points of [-87, 88] plus the ends;
 * the header promises a relative error below 2e-7 (the final rounding alone is ≤ 6e-8). */
static void test_vf_exp_accuracy(void **state) {
    (void)state;
#if VF_LANES
    const int64_t n = 1 << 21;
    const double lo = -87.0, hi = 88.0;
    double worst = 0.0, worst_x = 0.0;
    float xs[VF_LANES], ys[VF_LANES];
    for (int64_t i0 = 0; i0 <= n; i0 += VF_LANES) {
        for (int j = 0; j < VF_LANES; j++) {
            int64_t i = i0 + j <= n ? i0 + j : n;
            xs[j] = (float)(lo + (hi - lo) * (double)i / (double)n);
        }
        vf_store(ys, vf_exp(vf_load(xs)));
        for (int j = 0; j < VF_LANES; j++) {
            double want = exp((double)xs[j]), e = fabs(ys[j] - want) / want;
            if (e > worst) worst = e, worst_x = xs[j];
        }
    }
    if (getenv("TEST_VERBOSE")) printf("    vf_exp (%d lanes) worst at x = %.7g\n", VF_LANES, worst_x);
    CHECK_LE("vf_exp max relative error on [-87, 88]", worst, 2e-7);
    /* Up to the top of the clamp it stays finite and accurate, where 2^128 alone is not a float. */
    for (int j = 0; j < VF_LANES; j++) xs[j] = 88.72283f - 0.01f * (float)j;
    vf_store(ys, vf_exp(vf_load(xs)));
    for (int j = 0; j < VF_LANES; j++) CHECK_LE("vf_exp near its top", fabs(ys[j] - exp((double)xs[j])) / exp((double)xs[j]), 2e-7);
    /* Below the clamp it flushes to 0, as expf does in float. */
    for (int j = 0; j < VF_LANES; j++) xs[j] = -88.0f - 10.0f * (float)j;
    vf_store(ys, vf_exp(vf_load(xs)));
    for (int j = 0; j < VF_LANES; j++) assert_true(ys[j] >= 0.0f && ys[j] < 1e-37f);
    /* Never a subnormal, which the attention kernels' bf16 roundings of its results
     * (bf16x16_from_normal_ps, vf_store_bf16_normal) rely on: every float of [-88, -87], where
     * the result crosses FLT_MIN, gives 0 or a normal float. */
    int64_t subnormal = 0;
    for (float x = -88.0f; x <= -87.0f;) {
        for (int j = 0; j < VF_LANES; j++, x = nextafterf(x, 0.0f)) xs[j] = x;
        vf_store(ys, vf_exp(vf_load(xs)));
        for (int j = 0; j < VF_LANES; j++) subnormal += ys[j] != 0.0f && ys[j] < FLT_MIN;
    }
    CHECK_LE("vf_exp results that are subnormal, over [-88, -87]", (double)subnormal, 0.0);
#else
    skip();
#endif
}

/* ================================ adamw ================================= */

/* torch.optim.AdamW after clip_grad_norm_, in double, for one step. */
static void adamw_ref_step(double *p, double *m, double *v, const float *g, int64_t n, int64_t step,
                           double scale, const adamw_hparams_t *h) {
    double bc1 = 1.0 - pow(h->b1, (double)step), bc2 = 1.0 - pow(h->b2, (double)step);
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i] * scale;
        m[i] = h->b1 * m[i] + (1.0 - h->b1) * gi;
        v[i] = h->b2 * v[i] + (1.0 - h->b2) * gi * gi;
        p[i] *= 1.0 - (double)h->lr * h->weight_decay;
        p[i] -= h->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + h->eps);
    }
}

/* Three steps, the first two clipped (‖g‖ ≈ 37 > clip 1), the third not: each step sums
 * squares, derives the clip factor, updates. Bounds: p moves by ~lr per step and is held in
 * float, so ≤ 3 roundings of |p| ≲ 1.1 plus ~ε of each update: 1e-6 absolute; m, v carry
 * a few roundings per step: 1e-5 norm-wise. g must come back as it was (the caller zeroes
 * only the gradients that accumulate). */
static void test_adamw_update(void **state) {
    (void)state;
    test_rng_t rng = {60};
    const int64_t n = 1037;
    const adamw_hparams_t hp = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n);
    double *pr = dalloc(n), *mr = dalloc(n), *vr = dalloc(n), part[1];
    bf16_t *p16 = malloc((size_t)n * sizeof(bf16_t));
    fill_uniform(p, n, &rng, -1.0f, 1.0f);
    fill_const(m, n, 0.0f), fill_const(v, n, 0.0f);
    for (int64_t i = 0; i < n; i++) pr[i] = p[i], mr[i] = 0, vr[i] = 0;
    for (int64_t step = 1; step <= 3; step++) {
        fill_uniform(g, n, &rng, -2.0f, 2.0f);
        double clip = step < 3 ? 1.0 : 1e9, ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
        double norm = sqrt(ss), ref_scale = norm > clip ? clip / (norm + 1e-6) : 1.0;
        float scale = adamw_clip_scale(sqrt(adamw_sum_squares(g, n, part)), clip);
        assert_true(fabs(scale - ref_scale) <= 1e-6 * ref_scale);
        adamw_ref_step(pr, mr, vr, g, n, step, ref_scale, &hp);
        float *g_before = fdup(g, (size_t)n);
        adamw_update(p, m, v, g, n, step, scale, &hp, step == 3 ? p16 : NULL);
        assert_memory_equal(g, g_before, (size_t)n * sizeof(float));
        free(g_before);
    }
    double perr = 0;
    for (int64_t i = 0; i < n; i++) perr = fmax(perr, fabs(p[i] - pr[i]));
    CHECK_LE("adamw p vs torch-style double (3 steps), max abs", perr, 1e-6);
    CHECK_LE("adamw m vs double", rel_err_fd(m, mr, n), 1e-5);
    CHECK_LE("adamw v vs double", rel_err_fd(v, vr, n), 1e-5);
    for (int64_t i = 0; i < n; i++) assert_int_equal(p16[i], bf16_from_f32(p[i])); /* the fused bf16 copy */
    free(p), free(m), free(v), free(g), free(pr), free(mr), free(vr), free(p16);
}

/* mu_dtype=bfloat16's update against the fp32 one from the same state: with m set to the
 * widened bf16 moment before each step, both compute the same fp32 arithmetic, so p, v and the
 * bf16 weight copy must agree to the bit, and the stored m16 must be the fp32 path's new m
 * rounded to nearest even. Three steps over a length past two of the update's 2048-parameter
 * blocks, and g untouched. */
static void test_adamw_update_m16(void **state) {
    (void)state;
    test_rng_t rng = {62};
    const int64_t n = 2 * 2048 + 901;
    const adamw_hparams_t hp = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n), *p2 = falloc(n), *v2 = falloc(n);
    bf16_t *m16 = calloc((size_t)n, sizeof(bf16_t)), *p16 = malloc((size_t)n * sizeof(bf16_t)),
           *p16b = malloc((size_t)n * sizeof(bf16_t));
    fill_uniform(p, n, &rng, -1.0f, 1.0f);
    fill_const(v, n, 0.0f);
    memcpy(p2, p, (size_t)n * sizeof(float)), memcpy(v2, v, (size_t)n * sizeof(float));
    for (int64_t step = 1; step <= 3; step++) {
        fill_uniform(g, n, &rng, -2.0f, 2.0f);
        for (int64_t i = 0; i < n; i++) m[i] = bf16_to_f32(m16[i]);
        float *g_before = fdup(g, (size_t)n);
        adamw_update(p, m, v, g, n, step, 0.5f, &hp, p16);
        adamw_update_m16(p2, m16, v2, g, n, step, 0.5f, &hp, p16b);
        assert_memory_equal(g, g_before, (size_t)n * sizeof(float));
        free(g_before);
        assert_memory_equal(p, p2, (size_t)n * sizeof(float));
        assert_memory_equal(v, v2, (size_t)n * sizeof(float));
        assert_memory_equal(p16, p16b, (size_t)n * sizeof(bf16_t));
        for (int64_t i = 0; i < n; i++)
            if (m16[i] != bf16_from_f32(m[i])) fail_msg("step %ld: m16[%ld] is not bf16(m)", (long)step, (long)i);
    }
    free(p), free(m), free(v), free(g), free(p2), free(v2), free(m16), free(p16), free(p16b);
}

/* adamw_update_w16 (weight_dtype=bfloat16) is adamw_update on the widened values, rounded: from
 * the same state, each of p, v (and m16) equals bf16 of the fp32 update's, and an fp32 m equals
 * it, to the bit, over 3 steps and 3 blocks (the fp32 update re-widened from the bf16 state each
 * step, since that is all the bf16 update keeps). The bf16 weights also take decay and steps
 * smaller than half their last place as nothing, as MaxText's bf16 parameters do: a weight of 1
 * stays 1 under a 1e-4 step. */
static void test_adamw_update_w16(void **state) {
    (void)state;
    test_rng_t rng = {63};
    const int64_t n = 2 * 2048 + 901;
    const adamw_hparams_t hp = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    float *p = falloc(n), *m = falloc(n), *v = falloc(n), *g = falloc(n), *m32 = falloc(n);
    bf16_t *p16 = malloc((size_t)n * sizeof(bf16_t)), *m16 = calloc((size_t)n, sizeof(bf16_t)),
           *v16 = calloc((size_t)n, sizeof(bf16_t)), *p16b = malloc((size_t)n * sizeof(bf16_t)),
           *v16b = calloc((size_t)n, sizeof(bf16_t));
    fill_uniform(p, n, &rng, -1.0f, 1.0f);
    bf16_from_f32_array(p16, p, n);
    memcpy(p16b, p16, (size_t)n * sizeof(bf16_t));
    fill_const(m32, n, 0.0f);
    for (int64_t step = 1; step <= 3; step++) {
        fill_uniform(g, n, &rng, -2.0f, 2.0f);
        for (int64_t i = 0; i < n; i++)
            p[i] = bf16_to_f32(p16[i]), m[i] = bf16_to_f32(m16[i]), v[i] = bf16_to_f32(v16[i]);
        float *g_before = fdup(g, (size_t)n), *v_fp32_m = falloc(n);
        adamw_update(p, m, v, g, n, step, 0.5f, &hp, NULL);
        adamw_update_w16(p16, NULL, m16, v16, g, n, step, 0.5f, &hp, NULL);
        assert_memory_equal(g, g_before, (size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            if (p16[i] != bf16_from_f32(p[i]) || m16[i] != bf16_from_f32(m[i]) || v16[i] != bf16_from_f32(v[i]))
                fail_msg("step %ld: p, m or v [%ld] is not bf16 of the fp32 update's", (long)step, (long)i);
        }
        /* m in fp32 beside bf16 p and v: the same, with m exactly the fp32 update's. */
        for (int64_t i = 0; i < n; i++)
            p[i] = bf16_to_f32(p16b[i]), v_fp32_m[i] = bf16_to_f32(v16b[i]), m[i] = m32[i];
        adamw_update(p, m, v_fp32_m, g, n, step, 0.5f, &hp, NULL);
        adamw_update_w16(p16b, m32, NULL, v16b, g, n, step, 0.5f, &hp, NULL);
        assert_memory_equal(m32, m, (size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            if (p16b[i] != bf16_from_f32(p[i]) || v16b[i] != bf16_from_f32(v_fp32_m[i]))
                fail_msg("step %ld, fp32 m: p or v [%ld] is not bf16 of the fp32 update's", (long)step, (long)i);
        free(g_before), free(v_fp32_m);
    }
    bf16_t one = bf16_from_f32(1.0f), mo = 0, vo = bf16_from_f32(1.0f);
    const float tiny_step = 1e-4f; /* below half of 1's last place in bf16 (2^-8 = 3.9e-3) */
    const adamw_hparams_t small = {.lr = 1e-4f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    adamw_update_w16(&one, NULL, &mo, &vo, &tiny_step, 1, 5, 1.0f, &small, NULL);
    assert_int_equal(one, bf16_from_f32(1.0f));
    free(p), free(m), free(v), free(g), free(m32), free(p16), free(m16), free(v16), free(p16b), free(v16b);
}

/* Stochastic rounding (stochastic_rounding=true): bf16_from_f32_stochastic truncates with r = 0,
 * rounds up with r = 0xffff unless the value is exact, keeps exact values and NaN whatever r. In
 * the update, weights of 1 given a step of 1.01e-4 (a fortieth of bf16's gap below 1, 2^-8)
 * stay 1 to nearest but move by the step on average: over 65536 weights each ends at 1 or
 * 1 - 2^-8, so the mean's standard deviation is 2^-8·sqrt(q(1-q)/65536) ≈ 2.4e-6 for q ≈ 0.026;
 * bound 1.5e-5 (6σ). The draws go by the global index: one call over all the weights and two over
 * shards (index0 = the second's first) store the same bits; another step draws anew. */
static void test_adamw_stochastic_rounding(void **state) {
    (void)state;
    const float exact = 1.5f, between = 1.0f + 0.3f / 128.0f; /* bf16 steps by 2^-7 in [1, 2) */
    for (uint32_t r = 0; r < 0x10000u; r += 0x3333u) assert_int_equal(bf16_from_f32_stochastic(exact, r), bf16_from_f32(exact));
    assert_int_equal(bf16_from_f32_stochastic(between, 0), bf16_from_f32(1.0f));
    assert_int_equal(bf16_from_f32_stochastic(between, 0xffffu), bf16_from_f32(1.0f + 1.0f / 128.0f));
    assert_true(isnan(bf16_to_f32(bf16_from_f32_stochastic(NAN, 0xffffu))));
    const int64_t n = 65536;
    const adamw_hparams_t hp = {.lr = 1e-4f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    bf16_t *p = malloc((size_t)n * sizeof(bf16_t)), *m = calloc((size_t)n, sizeof(bf16_t)),
           *v = calloc((size_t)n, sizeof(bf16_t)), *p2 = malloc((size_t)n * sizeof(bf16_t)),
           *m2 = calloc((size_t)n, sizeof(bf16_t)), *v2 = calloc((size_t)n, sizeof(bf16_t));
    float *g = falloc(n);
    fill_const(g, n, 1.0f);
    for (int64_t i = 0; i < n; i++) p[i] = p2[i] = bf16_from_f32(1.0f);
    adamw_rounding_t sr = {.stochastic = true, .seed = 12345, .index0 = 0};
    adamw_update_w16(p, NULL, m, v, g, n, 1, 1.0f, &hp, &sr);
    /* step 1: m̂ = g, v̂ = g², so the step is lr·(1/(1 + eps) + wd·1) */
    double mean = 0.0, want = 1.0 - 1e-4 * (1.0 / (1.0 + 1e-8) + 0.1);
    for (int64_t i = 0; i < n; i++) mean += bf16_to_f32(p[i]);
    mean /= (double)n;
    printf("# stochastic rounding: mean weight %.8f after a step to %.8f (|diff| %.2e, bound 1.5e-5)\n", mean, want,
           fabs(mean - want));
    CHECK_LE("stochastic rounding's mean against the fp32 update", fabs(mean - want), 1.5e-5);
    const int64_t k = 2048 * 3 + 77;
    adamw_rounding_t sr_hi = sr;
    sr_hi.index0 = k;
    adamw_update_w16(p2, NULL, m2, v2, g, k, 1, 1.0f, &hp, &sr);
    adamw_update_w16(p2 + k, NULL, m2 + k, v2 + k, g + k, n - k, 1, 1.0f, &hp, &sr_hi);
    assert_memory_equal(p, p2, (size_t)n * sizeof(bf16_t));
    /* to nearest, the same step leaves every weight at 1 */
    bf16_t *p3 = malloc((size_t)n * sizeof(bf16_t));
    for (int64_t i = 0; i < n; i++) p3[i] = bf16_from_f32(1.0f);
    memset(m2, 0, (size_t)n * sizeof(bf16_t)), memset(v2, 0, (size_t)n * sizeof(bf16_t));
    adamw_update_w16(p3, NULL, m2, v2, g, n, 1, 1.0f, &hp, NULL);
    for (int64_t i = 0; i < n; i++) assert_int_equal(p3[i], bf16_from_f32(1.0f));
    /* steps 2 and 3 from the same state draw other bits (b1 = b2 = 0: the same fp32 update at
     * every step, so the draws alone differ) */
    const adamw_hparams_t flat = {.lr = 1e-4f, .b1 = 0.0f, .b2 = 0.0f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int64_t i = 0; i < n; i++) p3[i] = bf16_from_f32(1.0f);
    memcpy(p2, p3, (size_t)n * sizeof(bf16_t));
    memset(m, 0, (size_t)n * sizeof(bf16_t)), memset(v, 0, (size_t)n * sizeof(bf16_t));
    memset(m2, 0, (size_t)n * sizeof(bf16_t)), memset(v2, 0, (size_t)n * sizeof(bf16_t));
    adamw_update_w16(p2, NULL, m, v, g, n, 2, 1.0f, &flat, &sr);
    adamw_update_w16(p3, NULL, m2, v2, g, n, 3, 1.0f, &flat, &sr);
    assert_true(memcmp(p2, p3, (size_t)n * sizeof(bf16_t)) != 0);
    free(p), free(m), free(v), free(p2), free(m2), free(v2), free(p3), free(g);
}

/* Σ g² over 3 full blocks and a partial one against double: each float partial sums 1024
 * squares in 16 lanes of 64 (≤ 64·ε/2 ≈ 4e-6 relative, all terms positive), the partials
 * add in double. Bound 1e-5. */
static void test_adamw_sum_squares(void **state) {
    (void)state;
    test_rng_t rng = {61};
    const int64_t n = 3 * ADAMW_NORM_BLOCK + 4321;
    float *g = falloc((size_t)n);
    double *part = dalloc((size_t)adamw_norm_partials(n)), ref = 0;
    assert_int_equal(adamw_norm_partials(n), 4);
    fill_uniform(g, (size_t)n, &rng, -1.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    CHECK_LE("adamw_sum_squares vs double", fabs(adamw_sum_squares(g, n, part) - ref) / ref, 1e-5);
    assert_true(adamw_sum_squares(g, 0, part) == 0.0);
    free(g), free(part);
}

/* clip_grad_norm_: coef = clip / (norm + 1e-6), applied only when below 1; clip ≤ 0: off. */
static void test_adamw_clip_scale(void **state) {
    (void)state;
    assert_true(adamw_clip_scale(10.0, 1.0) == (float)(1.0 / (10.0 + 1e-6)));
    assert_true(adamw_clip_scale(4.0, 2.0) == (float)(2.0 / (4.0 + 1e-6)));
    assert_true(adamw_clip_scale(0.5, 1.0) == 1.0f);
    assert_true(adamw_clip_scale(1.0, 1.0) == (float)(1.0 / (1.0 + 1e-6))); /* torch clips at equality too */
    assert_true(adamw_clip_scale(0.0, 1.0) == 1.0f);
    assert_true(adamw_clip_scale(1e6, 0.0) == 1.0f);
    assert_true(adamw_clip_scale(1e6, -1.0) == 1.0f);
}

/* =============================== attention ============================== */

/* One fused qkv buffer per row, as the model lays it out: [q (H·HD) | k (KV·HD) | v (KV·HD)
 * | 3 floats of padding]; out, dout and the gradients have their own padded strides. */
typedef struct attn_case {
    int64_t B, S, H, KV, HD;
} attn_case_t;

typedef struct attn_bufs {
    attn_shape_t a;
    int64_t T, ld, ld_out, ld_dout, qw, kw;
    float *qkv, *out, *lse, *R, *dqkv;
    const float *q, *k, *v;
    gemm_ctx_t **tg; /* block products: NULL = micro-GEMM, else one library context per thread */
} attn_bufs_t;

static void attn_alloc(attn_bufs_t *x, const attn_case_t *c, test_rng_t *rng) {
    x->a = (attn_shape_t){.B = c->B, .S = c->S, .H = c->H, .KV = c->KV, .HD = c->HD};
    x->T = c->B * c->S;
    x->qw = c->H * c->HD, x->kw = c->KV * c->HD;
    x->ld = x->qw + 2 * x->kw + 3, x->ld_out = x->qw + 5, x->ld_dout = x->qw + 2;
    x->qkv = falloc((size_t)(x->T * x->ld));
    x->dqkv = falloc((size_t)(x->T * x->ld));
    x->out = falloc((size_t)(x->T * x->ld_out));
    x->lse = falloc((size_t)(c->B * c->H * c->S));
    x->R = falloc((size_t)(x->T * x->ld_dout));
    fill_uniform(x->qkv, (size_t)(x->T * x->ld), rng, -1.0f, 1.0f);
    fill_uniform(x->R, (size_t)(x->T * x->ld_dout), rng, -1.0f, 1.0f);
    fill_const(x->out, (size_t)(x->T * x->ld_out), SENTINEL);
    x->q = x->qkv, x->k = x->qkv + x->qw, x->v = x->qkv + x->qw + x->kw;
    x->tg = NULL;
}

static void attn_free(attn_bufs_t *x) {
    free(x->qkv), free(x->dqkv), free(x->out), free(x->lse), free(x->R);
}

/* Filled with NaN: a kernel that reads scratch it has not written (the products skip the masked
 * part of the diagonal blocks, so the strips hold stale entries there) turns its outputs NaN. */
static float *attn_scratch(const attn_shape_t *a) {
    size_t n = (size_t)attention_scratch_floats(a, omp_get_max_threads());
    float *s = falloc(n);
    fill_const(s, n, NAN);
    return s;
}

static void attn_forward(attn_bufs_t *x) {
    float *scratch = attn_scratch(&x->a);
    attention_forward(x->out, x->ld_out, x->lse, x->q, x->ld, x->k, x->ld, x->v, x->ld, &x->a, scratch, x->tg);
    free(scratch);
}

/* dq, dk, dv into the fused dqkv buffer, which starts as the sentinel (they are written). */
static void attn_backward(attn_bufs_t *x) {
    float *scratch = attn_scratch(&x->a);
    fill_const(x->dqkv, (size_t)(x->T * x->ld), SENTINEL);
    float *dq = x->dqkv, *dk = x->dqkv + x->qw, *dv = x->dqkv + x->qw + x->kw;
    attention_backward(dq, x->ld, dk, x->ld, dv, x->ld, x->R, x->ld_dout, x->out, x->ld_out, x->lse, x->q, x->ld,
                       x->k, x->ld, x->v, x->ld, &x->a, scratch, x->tg);
    free(scratch);
}

/* Inputs for case c, then the fp32 forward and backward on them. */
/* The fp32 attention tests run twice (cmocka prestate): block products in the micro-GEMM
 * (NULL) and in MKL with a context per thread (skipped where MKL is not installed). */
static gemm_ctx_t **attn_thread_gemm(void **state) {
    if (!*state) return NULL;
    int n = omp_get_max_threads();
    gemm_ctx_t **tg = calloc((size_t)n, sizeof *tg);
    for (int t = 0; t < n; t++) tg[t] = new_gemm_of(state);
    return tg;
}

static void attn_thread_gemm_free(gemm_ctx_t **tg) {
    if (!tg) return;
    for (int t = 0; t < omp_get_max_threads(); t++) gemm_destroy(tg[t]);
    free(tg);
}

static void attn_run_fp32(attn_bufs_t *x, const attn_case_t *c, test_rng_t *rng, gemm_ctx_t **tg) {
    attn_alloc(x, c, rng);
    x->tg = tg;
    attn_forward(x);
    attn_backward(x);
}

static const attn_case_t ATTN_CASES[] = {
    {2, 70, 4, 2, 16},  /* GQA, S = one block + 6 */
    {2, 130, 4, 2, 24}, /* GQA, S = two blocks + 2, HD not a multiple of 16 */
    {2, 70, 2, 2, 24},  /* H = KV */
    {2, 130, 2, 2, 16}, /* H = KV */
};

/* Forward against the double reference (full score matrix): the flash kernel's scores are
 * HD ≤ 24-term float dots, its exps the polynomial (< 2e-7), its softmax sum and P·V
 * float sums over ≤ S = 130 keys (~√S·ε/2 typical): ~1e-6 relative; bound 1e-5 on out.
 * lse ≲ log S + max score ≈ 6: a float holds it to 5e-7; bound 1e-5 absolute. */
static void test_attention_forward(void **state) {
    gemm_ctx_t **tg = attn_thread_gemm(state);
    test_rng_t rng = {70};
    static const attn_case_t extra[] = {{1, 1, 2, 1, 16}, {2, 64, 4, 1, 16}, {1, 5, 2, 2, 24}};
    for (size_t ci = 0; ci < 4 + 3; ci++) {
        const attn_case_t *c = ci < 4 ? &ATTN_CASES[ci] : &extra[ci - 4];
        attn_bufs_t x;
        attn_alloc(&x, c, &rng);
        x.tg = tg;
        attn_forward(&x);
        assert_true(padding_intact(x.out, x.T, x.qw, x.ld_out, SENTINEL));
        float *ref = falloc((size_t)(x.T * x.ld_out)), *lse_ref = falloc((size_t)(c->B * c->H * c->S));
        attention_forward_naive(ref, x.ld_out, lse_ref, x.q, x.ld, x.k, x.ld, x.v, x.ld, &x.a);
        char what[96];
        snprintf(what, sizeof what, "attention out vs naive B%ld S%ld H%ld KV%ld HD%ld", (long)c->B, (long)c->S,
                 (long)c->H, (long)c->KV, (long)c->HD);
        CHECK_LE(what, rel_err_2d(x.out, x.ld_out, ref, x.ld_out, x.T, x.qw), 1e-5);
        CHECK_LE("  lse vs naive, max abs", max_abs_diff(x.lse, lse_ref, (size_t)(c->B * c->H * c->S)), 1e-5);
        free(ref), free(lse_ref);
        attn_free(&x);
    }
    attn_thread_gemm_free(tg);
}

/* Σ over query rows [i0, i1) of head h in batch b of out ⊙ R, in double from the float
 * inputs: what one perturbed input can change (q row i: that row only; k or v row j: rows
 * ≥ j of the heads reading that kv head), so the differences need only those rows. */
static double attn_ref_loss(const attn_bufs_t *x, int64_t b, int64_t h, int64_t i0, int64_t i1, double *w) {
    const int64_t S = x->a.S, HD = x->a.HD, kvh = h / (x->a.H / x->a.KV);
    const double scale = 1.0 / sqrt((double)HD);
    double L = 0.0;
    for (int64_t i = i0; i < i1; i++) {
        const float *qi = x->q + (b * S + i) * x->ld + h * HD;
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; j++) {
            const float *kj = x->k + (b * S + j) * x->ld + kvh * HD;
            double s = 0.0;
            for (int64_t d = 0; d < HD; d++) s += (double)qi[d] * kj[d];
            w[j] = s * scale;
            m = fmax(m, w[j]);
        }
        for (int64_t j = 0; j <= i; j++) sum += (w[j] = exp(w[j] - m));
        const float *r = x->R + (b * S + i) * x->ld_dout + h * HD;
        for (int64_t j = 0; j <= i; j++) {
            const float *vj = x->v + (b * S + j) * x->ld + kvh * HD;
            double pj = w[j] / sum, acc = 0.0;
            for (int64_t d = 0; d < HD; d++) acc += (double)vj[d] * r[d];
            L += pj * acc;
        }
    }
    return L;
}

/* Central difference of L = Σ out ⊙ R for qkv element (b·S + s, col), in double. */
static double attn_fd(attn_bufs_t *x, int64_t row, int64_t col, double h, double *w) {
    const int64_t S = x->a.S, HD = x->a.HD, group = x->a.H / x->a.KV, b = row / S, s = row % S;
    int64_t h0, h1, i0, i1 = S;
    if (col < x->qw) { /* q: one head, one row */
        h0 = col / HD, h1 = h0 + 1, i0 = s, i1 = s + 1;
    } else { /* k or v: the group's heads, rows from s on */
        int64_t kvh = ((col - x->qw) % x->kw) / HD;
        h0 = kvh * group, h1 = h0 + group, i0 = s;
    }
    float *p = x->qkv + row * x->ld + col, x0 = *p;
    float xp = (float)(x0 + h), xm = (float)(x0 - h);
    double lp = 0, lm = 0;
    *p = xp;
    for (int64_t hh = h0; hh < h1; hh++) lp += attn_ref_loss(x, b, hh, i0, i1, w);
    *p = xm;
    for (int64_t hh = h0; hh < h1; hh++) lm += attn_ref_loss(x, b, hh, i0, i1, w);
    *p = x0;
    return (lp - lm) / ((double)xp - (double)xm);
}

/* dq, dk, dv against central differences in double (h = 1e-3: truncation h²/6·|f'''| ~ 1e-7
 * relative, double rounding ~1e-13) at 40 elements per tensor: random ones plus rows at
 * the block edges (0, 63, 64, S−1). The analytic gradients are float sums over ≤ S keys or
 * queries times HD, each ~√n·ε/2 ≈ 1e-6 typical, ≤ 1e-5 worst; bound 1e-4 norm-wise. The
 * buffers start as the sentinel: written, not accumulated; padding survives. */
static void test_attention_backward_fd(void **state) {
    gemm_ctx_t **tg = attn_thread_gemm(state);
    test_rng_t rng = {71};
    for (size_t ci = 0; ci < sizeof ATTN_CASES / sizeof ATTN_CASES[0]; ci++) {
        const attn_case_t *c = &ATTN_CASES[ci];
        attn_bufs_t x;
        attn_run_fp32(&x, c, &rng, tg);
        assert_true(padding_intact(x.dqkv, x.T, x.qw + 2 * x.kw, x.ld, SENTINEL));
        double *w = dalloc((size_t)c->S);
        static const char *names[3] = {"dq", "dk", "dv"};
        for (int which = 0; which < 3; which++) {
            int64_t col0 = which == 0 ? 0 : which == 1 ? x.qw : x.qw + x.kw, width = which == 0 ? x.qw : x.kw;
            double num = 0, den = 0;
            for (int e = 0; e < 40; e++) {
                static const int64_t edge[4] = {0, 63, 64, -1};
                int64_t s = e < 4 ? (edge[e] < 0 ? c->S - 1 : edge[e]) : rng_below(&rng, c->S);
                if (s >= c->S) s = c->S - 1;
                int64_t row = rng_below(&rng, c->B) * c->S + s, col = col0 + rng_below(&rng, width);
                double fd = attn_fd(&x, row, col, 1e-3, w), d = x.dqkv[row * x.ld + col] - fd;
                num += d * d;
                den += fd * fd;
            }
            char what[96];
            snprintf(what, sizeof what, "attention %s vs FD B%ld S%ld H%ld KV%ld HD%ld", names[which], (long)c->B,
                     (long)c->S, (long)c->H, (long)c->KV, (long)c->HD);
            CHECK_LE(what, sqrt(num / den), 1e-4);
        }
        free(w);
        attn_free(&x);
    }
    attn_thread_gemm_free(tg);
}

/* A run's outputs kept to compare another run on the same inputs against. */
typedef struct attn_kept {
    float *out, *lse, *dqkv;
} attn_kept_t;

static attn_kept_t attn_keep(const attn_bufs_t *x) {
    attn_kept_t k = {fdup(x->out, (size_t)(x->T * x->ld_out)),
                     fdup(x->lse, (size_t)(x->a.B * x->a.H * x->a.S)), fdup(x->dqkv, (size_t)(x->T * x->ld))};
    return k;
}

static void attn_kept_free(attn_kept_t *k) { free(k->out), free(k->lse), free(k->dqkv); }

/* x's out (relative Frobenius, named what), lse (max abs) and dq, dk, dv (relative Frobenius)
 * against kept, each within bound. */
static void attn_check_vs_kept(const attn_bufs_t *x, const attn_kept_t *k, const char *what, double bound) {
    CHECK_LE(what, rel_err_2d(x->out, x->ld_out, k->out, x->ld_out, x->T, x->qw), bound);
    CHECK_LE("  lse, max abs", max_abs_diff(x->lse, k->lse, (size_t)(x->a.B * x->a.H * x->a.S)), bound);
    CHECK_LE("  dq", rel_err_2d(x->dqkv, x->ld, k->dqkv, x->ld, x->T, x->qw), bound);
    CHECK_LE("  dk", rel_err_2d(x->dqkv + x->qw, x->ld, k->dqkv + x->qw, x->ld, x->T, x->kw), bound);
    CHECK_LE("  dv", rel_err_2d(x->dqkv + x->qw + x->kw, x->ld, k->dqkv + x->qw + x->kw, x->ld, x->T, x->kw), bound);
}

/* Other blockings (bench/attention_blocks compares their speed) against the default on the
 * same inputs: a query block of 1 row, blocks that split S raggedly, one block past S, key
 * passes of 32 and 256. Every score and product element is the same float dot; only the
 * grouping of dQ's sum over key passes and dK/dV's over query blocks moves (≤ S = 130 float
 * terms, ~√n·ε/2 ≈ 1e-6 relative), so 1e-5 bounds them and a lost or doubled block (order 1)
 * fails. */
static void test_attention_blockings(void **state) {
    (void)state;
    test_rng_t rng = {74};
    static const int64_t blockings[][2] = {{1, 32}, {32, 32}, {48, 64}, {200, 256}, {ATTN_QBLOCK, 96}};
    for (size_t ci = 0; ci < 2; ci++) {
        const attn_case_t *c = &ATTN_CASES[ci + 1]; /* S = 130 and 70, GQA and H = KV */
        attn_bufs_t x;
        attn_run_fp32(&x, c, &rng, NULL);
        attn_kept_t ref = attn_keep(&x);
        for (size_t bi = 0; bi < sizeof blockings / sizeof blockings[0]; bi++) {
            x.a.qblock = blockings[bi][0], x.a.kchunk = blockings[bi][1];
            fill_const(x.out, (size_t)(x.T * x.ld_out), SENTINEL);
            attn_forward(&x);
            attn_backward(&x);
            assert_true(padding_intact(x.out, x.T, x.qw, x.ld_out, SENTINEL));
            assert_true(padding_intact(x.dqkv, x.T, x.qw + 2 * x.kw, x.ld, SENTINEL));
            char what[112];
            snprintf(what, sizeof what, "attention %ldx%ld blocks vs default, out, S%ld H%ld KV%ld",
                     (long)x.a.qblock, (long)x.a.kchunk, (long)c->S, (long)c->H, (long)c->KV);
            attn_check_vs_kept(&x, &ref, what, 1e-5);
        }
        attn_kept_free(&ref);
        attn_free(&x);
    }
}

/* The bf16 kernels against the fp32 ones on the same inputs. Rounding q, k, v, dO, P and dS
 * to bf16 (2^-9 relative each, ~1e-3 on average) perturbs scores by ~1e-3·|s| and outputs and
 * gradients by a few 1e-3 relative (measured 2-4e-3); bounds 1e-2 (out, gradients) and 1e-2 absolute (lse,
 * |lse| ≲ 6) leave room for that and catch any wrong operand, transpose or scale (order 1).
 * Outputs are written (not accumulated) and padding survives, as in fp32. */
static void test_attention_bf16_vs_fp32(void **state) {
    (void)state;
    test_rng_t rng = {72};
    int threads = omp_get_max_threads();
    char err[256];
    gemm_ctx_t **g = malloc((size_t)threads * sizeof *g);
    for (int t = 0; t < threads; t++) assert_non_null(g[t] = gemm_create(GEMM_LIB_AUTO, err, sizeof err));
    /* block products through the library, then in our packed kernel (AMX tiles or AVX512-BF16
     * dot products) where this CPU has either */
    int variants = attention_bf16_packed_available() ? 2 : 1;
    if (variants == 1) printf("bf16 attention in the packed kernel not tested: this CPU or build has neither AMX nor AVX512-BF16\n");
    /* ATTN_CASES pad every extent for the tiles; these two do not (HD and the query blocks
     * multiples of 32), where the AMX kernel stores its tiles straight into the outputs. */
    static const attn_case_t whole_tiles[] = {{1, 160, 4, 2, 32}, {2, 64, 2, 1, 64}};
    const size_t ncases = sizeof ATTN_CASES / sizeof ATTN_CASES[0], nwhole = sizeof whole_tiles / sizeof whole_tiles[0];
    for (int variant = 0; variant < variants; variant++)
        for (size_t ci = 0; ci < ncases + nwhole; ci++) {
            const attn_case_t *c = ci < ncases ? &ATTN_CASES[ci] : &whole_tiles[ci - ncases];
            gemm_ctx_t *const *blocks = variant == 0 ? g : NULL;
            attn_bufs_t x;
            attn_run_fp32(&x, c, &rng, NULL);
            attn_kept_t fp32 = attn_keep(&x);
            const size_t nscratch = (size_t)attention_bf16_scratch_floats(&x.a, threads);
            float *scratch = falloc(nscratch);
            /* NaN scratch: a product that read a strip or pack where nothing was written (the
             * packed kernel leaves the masked staircase's far side stale) turns outputs NaN. */
            fill_const(scratch, nscratch, NAN);
            fill_const(x.out, (size_t)(x.T * x.ld_out), SENTINEL);
            attention_forward_bf16(x.out, x.ld_out, x.lse, x.q, x.ld, x.k, x.ld, x.v, x.ld, &x.a, scratch, blocks);
            assert_true(padding_intact(x.out, x.T, x.qw, x.ld_out, SENTINEL));
            fill_const(x.dqkv, (size_t)(x.T * x.ld), SENTINEL);
            float *dq = x.dqkv, *dk = x.dqkv + x.qw, *dv = x.dqkv + x.qw + x.kw;
            attention_backward_bf16(dq, x.ld, dk, x.ld, dv, x.ld, x.R, x.ld_dout, x.out, x.ld_out, x.lse, x.q, x.ld,
                                    x.k, x.ld, x.v, x.ld, &x.a, scratch, blocks);
            assert_true(padding_intact(x.dqkv, x.T, x.qw + 2 * x.kw, x.ld, SENTINEL));
            char what[192];
            snprintf(what, sizeof what, "bf16 attention (%s) out vs fp32 B%ld S%ld H%ld KV%ld HD%ld",
                     variant ? attention_bf16_packed_kind() : "library", (long)c->B, (long)c->S, (long)c->H, (long)c->KV, (long)c->HD);
            attn_check_vs_kept(&x, &fp32, what, 1e-2);
            attn_kept_free(&fp32);
            free(scratch);
            attn_free(&x);
        }
    for (int t = 0; t < threads; t++) gemm_destroy(g[t]);
    free(g);
}

/* The scratch holds Kᵀ, Vᵀ ([HD, S] per kv head) and per-thread [group·qblock, S] strips:
 * linear in S, so doubling S at most doubles it (an S² term would nearly quadruple it). */
static void test_attention_scratch_linear(void **state) {
    (void)state;
    for (int threads = 1; threads <= 64; threads *= 4) {
        attn_shape_t a1 = {.B = 4, .S = 1024, .H = 16, .KV = 8, .HD = 128}, a2 = {.B = 4, .S = 2048, .H = 16, .KV = 8, .HD = 128};
        double f1 = (double)attention_scratch_floats(&a1, threads), f2 = (double)attention_scratch_floats(&a2, threads);
        assert_true(f1 > 0);
        CHECK_LE("attention scratch(S=2048) / scratch(S=1024)", f2 / f1, 2.0);
    }
}

/* ============================= determinism ============================== */

/* The kernels that promise sums in an order independent of the thread count give the same
 * bits at 1 and 2 threads: attention backward, rmsnorm backward's dweight, embed backward
 * (repeated ids) and adamw_sum_squares. */
static void test_thread_determinism(void **state) {
    (void)state;
    test_rng_t rng = {80};
    /* attention backward */
    attn_case_t c = {2, 130, 4, 2, 16};
    attn_bufs_t x;
    attn_alloc(&x, &c, &rng);
    size_t nd = (size_t)(x.T * x.ld);
    float *dqkv[2], *outs[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        attn_forward(&x);
        attn_backward(&x);
        dqkv[t] = fdup(x.dqkv, nd);
        outs[t] = fdup(x.out, (size_t)(x.T * x.ld_out));
    }
    assert_memory_equal(outs[0], outs[1], (size_t)(x.T * x.ld_out) * sizeof(float));
    assert_memory_equal(dqkv[0], dqkv[1], nd * sizeof(float));
    free(dqkv[0]), free(dqkv[1]), free(outs[0]), free(outs[1]);
    attn_free(&x);

    /* rmsnorm backward: dweight over 8 chunks of 16 rows, and dinp */
    const int64_t T = 64, G = 2, N = 300, W = G * N;
    float *inp = falloc((size_t)(T * W)), *dout = falloc((size_t)(T * W)), *w = falloc((size_t)N);
    float *out = falloc((size_t)(T * W)), *rstd = falloc((size_t)(T * G)), *dinp[2], *dw[2];
    fill_uniform(inp, (size_t)(T * W), &rng, -1.0f, 1.0f);
    fill_uniform(dout, (size_t)(T * W), &rng, -1.0f, 1.0f);
    fill_uniform(w, (size_t)N, &rng, 0.5f, 1.5f);
    rmsnorm_forward(out, W, rstd, inp, W, w, T, G, N, 1e-6f);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        dinp[t] = falloc((size_t)(T * W)), dw[t] = falloc((size_t)N);
        fill_const(dw[t], (size_t)N, 0.25f);
        rmsnorm_backward_scratch(dinp[t], W, false, dw[t], dout, W, inp, W, w, rstd, T, G, N);
    }
    assert_memory_equal(dw[0], dw[1], (size_t)N * sizeof(float));
    assert_memory_equal(dinp[0], dinp[1], (size_t)(T * W) * sizeof(float));
    free(dinp[0]), free(dinp[1]), free(dw[0]), free(dw[1]);

    /* embed backward: D = 300 (5 column blocks), ids drawn from 7 so most repeat */
    const int64_t V = 7, B = 2, S = 31, D = 300;
    int32_t tok[2 * 32];
    for (int i = 0; i < 64; i++) tok[i] = (int32_t)rng_below(&rng, V);
    float *dout_e = falloc((size_t)(B * S * D)), *dt[2];
    fill_uniform(dout_e, (size_t)(B * S * D), &rng, -1.0f, 1.0f);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        dt[t] = falloc((size_t)(V * D));
        fill_const(dt[t], (size_t)(V * D), 0.125f);
        embed_backward(dt[t], dout_e, D, tok, S + 1, B, S, D);
    }
    assert_memory_equal(dt[0], dt[1], (size_t)(V * D) * sizeof(float));
    free(dt[0]), free(dt[1]), free(dout_e);

    /* adamw_sum_squares over 5 blocks and a tail */
    const int64_t n = 5 * ADAMW_NORM_BLOCK + 17;
    float *g = falloc((size_t)n);
    double *part = dalloc((size_t)adamw_norm_partials(n)), ss[2];
    fill_uniform(g, (size_t)n, &rng, -1.0f, 1.0f);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        ss[t] = adamw_sum_squares(g, n, part);
    }
    assert_memory_equal(&ss[0], &ss[1], sizeof(double));
    free(g), free(part);
    free(inp), free(dout), free(w), free(out), free(rstd);
    omp_set_num_threads(g_threads0);
}

int main(void) {
    g_threads0 = omp_get_max_threads();
    const struct CMUnitTest tests[] = {
        TEST_WITH_LIB(test_gemm_vs_naive, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_vs_naive, LIB_MKL, "mkl"),
        TEST_WITH_LIB(test_gemm_staged_vs_naive, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_staged_vs_naive, LIB_MKL, "mkl"),
        TEST_WITH_LIB(test_gemm_split_k_vs_naive, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_split_k_vs_naive, LIB_MKL, "mkl"),
        TEST_WITH_LIB(test_gemm_empty_k, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_empty_k, LIB_MKL, "mkl"),
        cmocka_unit_test(test_transpose),
        TEST_WITH_LIB(test_gemm_bf16_vs_naive, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_bf16_vs_naive, LIB_MKL, "mkl"),
        TEST_WITH_LIB(test_gemm_bf16_blocks_vs_f32, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_bf16_blocks_vs_f32, LIB_MKL, "mkl"),
        TEST_WITH_LIB(test_gemm_thread_count_bits, LIB_ONEDNN, "onednn"),
        TEST_WITH_LIB(test_gemm_thread_count_bits, LIB_MKL, "mkl"),
        cmocka_unit_test(test_bf16_rounding),
        TEST_WITH_LIB(test_gemm_caches_primitives, LIB_ONEDNN, "onednn"),
        cmocka_unit_test(test_amx_gemm_vs_naive),
        cmocka_unit_test(test_dpbf16_gemm_vs_naive),
        cmocka_unit_test(test_bf16_blocked_vs_naive),
        cmocka_unit_test(test_packs_from_fp32_are_packs_of_the_rounded),
        cmocka_unit_test(test_gemm_bf16_b32_is_gemm_bf16_of_the_rounded),
        cmocka_unit_test(test_bf16_blocked_sums_of_squares),
        cmocka_unit_test(test_microgemm_vs_naive),
        cmocka_unit_test(test_rmsnorm_forward),
        cmocka_unit_test(test_rmsnorm_backward_fd),
        cmocka_unit_test(test_rmsnorm_in_place),
        cmocka_unit_test(test_forward_bf16_outputs),
        cmocka_unit_test(test_rope_tables),
        cmocka_unit_test(test_rope_forward_backward),
        cmocka_unit_test(test_swiglu_forward),
        cmocka_unit_test(test_swiglu_backward_fd),
        cmocka_unit_test(test_swiglu_strided_rows),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_embed_strided_rows),
        cmocka_unit_test(test_xent_backward_fd),
        cmocka_unit_test(test_xent_vs_double),
        cmocka_unit_test(test_xent_bf16_matches_rounded),
        cmocka_unit_test(test_rmsnorm_rope_fused_bits),
        cmocka_unit_test(test_vf_exp_accuracy),
        cmocka_unit_test(test_adamw_update),
        cmocka_unit_test(test_adamw_update_m16),
        cmocka_unit_test(test_adamw_update_w16),
        cmocka_unit_test(test_adamw_stochastic_rounding),
        cmocka_unit_test(test_adamw_sum_squares),
        cmocka_unit_test(test_adamw_clip_scale),
        {"test_attention_forward (micro-GEMM blocks)", test_attention_forward, NULL, NULL, NULL},
        TEST_WITH_LIB(test_attention_forward, LIB_MKL, "mkl"),
        {"test_attention_backward_fd (micro-GEMM blocks)", test_attention_backward_fd, NULL, NULL, NULL},
        TEST_WITH_LIB(test_attention_backward_fd, LIB_MKL, "mkl"),
        cmocka_unit_test(test_attention_blockings),
        cmocka_unit_test(test_attention_scratch_linear),
        cmocka_unit_test(test_attention_bf16_vs_fp32),
        cmocka_unit_test(test_thread_determinism),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER")); /* e.g. "test_attention*" */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
