#include "kernels/bf16_blocked.h"

#include <omp.h>
#include <string.h>

#include "kernels/amx.h"
#include "kernels/dpbf16.h"

/* Block extents, for a core's L2 (2 MiB on the Intel Xeon, 1 MiB on the Zen 4) and L1 (48 and
 * 32 KiB). Per slice of K (k_slice), a thread reads a row-major A in place (a_read_in_place) or
 * packs the narrower operand of its part of C whole (up to FULL rows or columns) and the other MC
 * rows or NC columns at a time; a tile product then covers at most NC columns, whose B part stays
 * in L2 while its rows go by. The whole-packed operand's space holds FULL × KC elements, or on
 * AVX512-BF16 NC × DEEP_KC for the deep slices (k_slice). */
enum { MC = 256, NC = 512, KC = 1024, FULL = 1024, DEEP_KC = 4096, BLK = (MC > NC ? MC : NC) * KC };
/* The layers' deep products with A read in place, on AVX512-BF16 (takes_in_place_blocking):
 * slices and column blocks of their own. */
enum { IN_PLACE_KC = 1024, IN_PLACE_NC = 256 };
/* dpbf16_tile_product tells a deep slice by its depth alone (DPBF16_DEEP_K): the other slices
 * (512, IN_PLACE_KC, or KC on AMX) stay below it, and the deep ones (DEEP_KC) reach it. */
_Static_assert((int)KC < (int)DPBF16_DEEP_K && (int)IN_PLACE_KC < (int)DPBF16_DEEP_K &&
                   (int)DEEP_KC >= (int)DPBF16_DEEP_K,
               "bf16_blocked's slices and dpbf16.h's DPBF16_DEEP_K disagree");

/* The whole-packed operand's space: AMX takes no deep slices (bf16_blocked_fits). */
static int64_t whole_elems(void) {
    const int64_t shallow = (int64_t)FULL * KC, deep = (int64_t)NC * DEEP_KC;
    return amx_available() || shallow > deep ? shallow : deep;
}

bool bf16_blocked_fits(int64_t M, int64_t N, int64_t K) {
    return M > 0 && N > 0 && M % 32 == 0 && N % 32 == 0 && (K <= BF16_BLOCKED_K_MAX_AMX || !amx_available());
}

int64_t bf16_blocked_workspace_elems(void) { return whole_elems() + BLK; }

bool bf16_blocked_sums_squares(void) { return !amx_available() && dpbf16_available(); }

#if defined(__AVX512BW__)
/* A tile product on whichever unit runs them: AMX tiles, else AVX512-BF16 dot products. sums:
 * NULL, or where C's first tile's sum of squares goes, the next tile row sums_ld further (dot
 * products only; see bf16_blocked_gemm). */
static void block_product(bool amx, float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M,
                          int64_t N, int64_t K, bool accumulate, float *sums, int64_t sums_ld) {
    if (amx) amx_tile_product(C, ldc, A, B, Bk, M, N, K, accumulate, true);
    else dpbf16_tile_product(C, ldc, A, B, Bk, M, N, K, accumulate, sums, sums_ld);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Where the tile sums of C's block from row m, column n go (sums: NULL, or the sums of C's
 * first tile, tile rows sums_ld apart). */
static float *sums_at(float *sums, int64_t sums_ld, int64_t m, int64_t n) {
    return sums ? sums + m / DPBF16_TILE_ROWS * sums_ld + n / 32 : NULL;
}

/* The products whose A is read in place and whose K is 1024 or more and within a layer's
 * (qwen3-0.6b: o_proj's and down_proj's forwards, K = 2048 and 3072; gate_up_proj's and
 * qkv_proj's input gradients, K = 6144 and 4096; all N = 1024, so 512 columns a thread), on
 * AVX512-BF16. At 512-deep slices over 512 columns they reloaded C (2 MiB a thread, out of L2)
 * K/512 times, and in some VM phases ran at 0.86x the layers' other products (docs/speed.md, "Two
 * speeds"). They take 1024-deep slices in 256-column blocks instead: C is reloaded half as often,
 * a block's B part (1024 × 256, 512 KiB) stays in L2 while the rows go by, and an 8-row block of
 * A (16 KiB) in L1. Alternated call by call with the 512 × 512 blocking inside profiled qwen3-0.6b
 * bf16 steps (four runs on the Zen 5): 1.130x, 1.059x, 1.040x and 1.027x over those four forms,
 * each form 1.02-1.15x, in both of the VM's phases. Other slice depths × column blocks, one run
 * each: 1024 × 512 1.020x, 1024 × 128 0.967x, 1536 × 256 1.019x, 2048 × 256 1.001x, 2048 × 128
 * 1.013x, 512 × 128 1.032x. At K = 1024 (qkv_proj's and gate_up_proj's forwards, o_proj's and
 * down_proj's input gradients, the LM head's forward) one 1024-deep slice writes C once where two
 * of 512 had loaded it again: those five forms 1.026x, 1.051x and 1.016x in three runs of the same
 * harness (each 1.00-1.04x, the LM head's 1.02-1.16x); in 512-column blocks 1.032x, in 128 0.992x,
 * and 512-deep slices in 256-column blocks 0.989x (one run each). */
static bool takes_in_place_blocking(bool amx, int64_t K, bool a_direct) {
    /* Not on whether B is packed whole (a thread's columns at most FULL), which depends on the
     * thread count: the slices, and so C's bits, must not. */
    return !amx && a_direct && K >= IN_PLACE_KC && K <= BF16_BLOCKED_K_MAX_AMX;
}

/* The K slice of a product whose C has c_elems elements: 512 deep, so that a 32-row block of A
 * (32 KiB) stays in L1 while B's tiles stream past it (amx_tile_product loads them with the
 * non-temporal hint) and a whole-packed operand of 1024 rows (1 MiB) fits L2 beside a B block.
 * At 1024 deep both missed: the A block (64 KiB) was read from L2 for every 32 columns, and
 * qkv_proj's forward packed 2 MiB of A beside 1 MiB of B. Against the 1024-deep slices with
 * plain loads, interleaved call by call on a step's worth of products (a scratch probe, 16
 * rounds), each form ran 1.01-1.12x (round medians of the step-weighted total 1.05x; up to
 * 1.4x in the rounds where the VM's AMX ran fast). The C block is loaded and stored once more
 * per slice, which costs more than it saves where C is the traffic: the LM head's forward
 * (C = 352 × 151936 logits) ran 0.92x at 512, so a C over 8 M elements keeps KC. Slicing changes
 * C's bits (a slice's partial sums round at its depth before they are added to C), so the depth
 * follows the whole product's shape, never a thread's part of it (see the deep slices below): the
 * test had been a thread's mt × nt, so on AMX a C between 8 M and 16 M elements took 1024-deep
 * slices on one thread and 512 on two. */
static int64_t k_slice(bool amx, int64_t c_elems, int64_t K, bool a_direct) {
    if (takes_in_place_blocking(amx, K, a_direct)) return IN_PLACE_KC;
    /* AVX512-BF16 keeps 512 for every other C of the layers: its tiles fetch C's lines ahead
     * (dpbf16.c), and the LM head's forward ran 85% of the peak at 512 on the Zen 4. Where K is
     * deeper than any layer's (the LM head's input gradient, K = the vocabulary, 151936), the
     * C part (512 × 512 fp32 a thread, 1 MiB) would be loaded and stored once per 512 of K, 297
     * times: its deep slices (A read in place, B packed up to DEEP_KC deep, 4 MiB over 512
     * columns) ran that product 1.17x oneDNN's matmul at 4096 and 1.10-1.12x at 2048, against
     * 1.01-1.05x at 512 (a scratch probe on the Zen 4, call by call interleaved; docs/speed.md).
     * DEEP_KC whatever a thread's columns: a depth that followed them (the whole-packed space
     * over them, 2048 on one thread's 1024) made C's bits depend on the thread count (504834 of
     * 512 × 1024 differed between one and two threads at K = 16384); a thread with more columns
     * than the space holds at DEEP_KC packs B NC columns at a time instead (gemm_part). */
    if (!amx && K > BF16_BLOCKED_K_MAX_AMX && a_direct) return DEEP_KC;
    return amx && c_elems > ((int64_t)8 << 20) ? KC : 512;
}

/* B in bf16, or in fp32 (where b16 is NULL) rounded to bf16 as it is packed: the same packed
 * bits as from bf16(B). */
typedef struct {
    const bf16_t *b16;
    const float *f32;
    int64_t ld;
} b_operand_t;

/* K rows [k0, k0 + kw) and columns [n0, n0 + nw) of op(B), packed with K extent amx_round32(kw). */
static void pack_b(bf16_t *dst, bool trans, const b_operand_t *B, int64_t k0, int64_t n0, int64_t nw, int64_t kw) {
    const int64_t at = trans ? n0 * B->ld + k0 : k0 * B->ld + n0;
    if (B->b16) {
        if (trans) amx_pack_bt(dst, B->b16 + at, B->ld, nw, kw);
        else amx_pack_b(dst, B->b16 + at, B->ld, kw, nw);
    } else {
        if (trans) amx_pack_bt_f32(dst, B->f32 + at, B->ld, nw, kw);
        else amx_pack_b_f32(dst, B->f32 + at, B->ld, kw, nw);
    }
}

/* Whether tiles of A are loaded straight from it: row-major, with K blocks of whole tiles (a
 * tile would otherwise read past K into the next row), and a row stride off multiples of 2 KiB.
 * At such a stride a 32-row block's lines fall into two sets of the L1 (16 lines each, against
 * 12 ways): packing A instead made a step's worth of products 1.30x MKL's rate against 1.16x
 * in place (five interleaved gemm_shapes runs, every one in favour); strides of 4 KiB
 * multiples were already excluded (qkv_proj's query gradient ran at 0.93x MKL in place). */
static bool a_read_in_place(bool trans_a, int64_t K, int64_t lda) { return !trans_a && K % 32 == 0 && lda % 1024 != 0; }

/* The blocking that follows the whole product's shape, decided once for every thread's part:
 * whether A is read in place, the K slice (which sets C's bits, so never a thread's part's) and
 * the column block of a whole-packed B. */
typedef struct {
    bool a_direct;
    int64_t kslice, nc_step;
} blocking_t;

static blocking_t blocking_of(bool trans_a, int64_t M, int64_t N, int64_t K, int64_t lda) {
    const bool amx = amx_available(), a_direct = a_read_in_place(trans_a, K, lda);
    return (blocking_t){.a_direct = a_direct,
                        .kslice = k_slice(amx, M * N, K, a_direct),
                        .nc_step = takes_in_place_blocking(amx, K, a_direct) ? IN_PLACE_NC : NC};
}

/* C's rows [m_lo, m_hi) and columns [n_lo, n_hi) on the calling thread, as bk says (from the
 * whole product); no operand is packed twice (see the block extents above). */
static void gemm_part(bool trans_a, bool trans_b, int64_t m_lo, int64_t m_hi, int64_t n_lo, int64_t n_hi, int64_t K,
                      const blocking_t *bk, const bf16_t *A, int64_t lda, const b_operand_t *B, float *C,
                      int64_t ldc, bool accumulate, bf16_t *work, float *tile_sumsq, int64_t sums_ld) {
    const int64_t whole = whole_elems();
    bf16_t *full = work, *blk = work + whole;
    const int64_t mt = m_hi - m_lo, nt = n_hi - n_lo, kslice = bk->kslice, nc_step = bk->nc_step;
    const bool a_direct = bk->a_direct;
    const bool amx = amx_available();
    const bool a_whole = !a_direct && mt <= FULL && mt <= nt;
    const bool b_whole = !a_whole && nt <= FULL && nt * amx_round32(kslice) <= whole;
    const int64_t mstep = a_whole || a_direct ? mt : MC;
    bf16_t *Ap = a_whole ? full : blk, *Bp = a_whole ? blk : full;
    if (amx) amx_configure_full_tiles();
    for (int64_t kc = 0; kc < K; kc += kslice) {
        int64_t kw = min64(kslice, K - kc), kwp = amx_round32(kw);
        bool load_c = accumulate || kc > 0;
        /* the sums of squares come from the last slice's tiles, which store C's final values */
        float *sums = tile_sumsq && kc + kw >= K ? tile_sumsq : NULL;
        if (a_whole) amx_pack_a(Ap, trans_a, trans_a ? A + kc * lda + m_lo : A + m_lo * lda + kc, lda, mt, kw);
        if (b_whole) pack_b(Bp, trans_b, B, kc, n_lo, nt, kw);
        if (!a_direct && !a_whole && !b_whole) { /* neither fits whole: GotoBLAS blocks */
            for (int64_t nc = n_lo; nc < n_hi; nc += NC) {
                int64_t nw = min64(NC, n_hi - nc);
                pack_b(full, trans_b, B, kc, nc, nw, kw);
                for (int64_t mc = m_lo; mc < m_hi; mc += MC) {
                    int64_t mw = min64(MC, m_hi - mc);
                    amx_pack_a(blk, trans_a, trans_a ? A + kc * lda + mc : A + mc * lda + kc, lda, mw, kw);
                    block_product(amx, C + mc * ldc + nc, ldc, amx_a_packed(blk, kwp), full, kwp, mw, nw, kwp, load_c,
                                  sums_at(sums, sums_ld, mc, nc), sums_ld);
                }
            }
            continue;
        }
        /* B packed whole is walked NC (or IN_PLACE_NC) columns at a time: with products over
         * whole 1024-column Bs (2 MiB, out of L2) the weight gradients ran at 0.5-0.6x MKL's rate. */
        const int64_t panel = kwp / 2 * 32;
        for (int64_t mc = m_lo; mc < m_hi; mc += mstep) {
            int64_t mw = min64(mstep, m_hi - mc);
            if (!a_whole && !a_direct) amx_pack_a(Ap, trans_a, trans_a ? A + kc * lda + mc : A + mc * lda + kc, lda, mw, kw);
            amx_a_tiles_t at = a_direct ? amx_a_row_major(A + mc * lda + kc, lda)
                                        : amx_a_packed(a_whole ? Ap + ((mc - m_lo) / 32) * (kwp / 32) * 1024 : Ap, kwp);
            for (int64_t nc = n_lo; nc < n_hi; nc += nc_step) {
                int64_t nw = min64(nc_step, n_hi - nc);
                if (!b_whole) pack_b(Bp, trans_b, B, kc, nc, nw, kw);
                block_product(amx, C + mc * ldc + nc, ldc, at, b_whole ? Bp + (nc - n_lo) / 16 * panel : Bp, kwp, mw,
                              nw, kwp, load_c, sums_at(sums, sums_ld, mc, nc), sums_ld);
            }
        }
    }
    if (amx) amx_release_tiles();
}

static void blocked_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                         const b_operand_t *B, float *C, int64_t ldc, bool accumulate, bf16_t *workspace, int threads,
                         float *tile_sumsq) {
    if (K <= 0) {
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    /* Threads split C's columns (each then packs all of A) or its rows (each packs all of B):
     * whichever copies less. A row-major A with whole 32-column K blocks is read in place, for
     * nothing; a transposed operand costs about three times a plain one to pack (two source
     * rows interleaved, then a 16 × 16 transpose). Each element of C is computed by one thread
     * in one fixed order, so the thread count does not change a bit. */
    const blocking_t bk = blocking_of(trans_a, M, N, K, lda);
    const double a_cost = bk.a_direct ? 0.0 : (double)M * (double)K * (trans_a ? 3 : 1);
    /* (from fp32 the pack reads twice the bytes; the split is left as from bf16, so that the same
     * products run the same way either way) */
    const double b_cost = (double)N * (double)K * (trans_b ? 3 : 1);
    const bool split_n = M / 32 < threads || (N / 32 >= threads && a_cost <= b_cost);
    const int64_t blocks = (split_n ? N : M) / 32;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t lo = blocks * t / nt * 32, hi = blocks * (t + 1) / nt * 32;
        if (hi > lo)
            gemm_part(trans_a, trans_b, split_n ? 0 : lo, split_n ? M : hi, split_n ? lo : 0, split_n ? hi : N, K,
                      &bk, A, lda, B, C, ldc, accumulate, workspace + t * bf16_blocked_workspace_elems(),
                      tile_sumsq, N / 32);
    }
}

void bf16_blocked_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                       const bf16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                       int threads, float *tile_sumsq) {
    const b_operand_t b = {.b16 = B, .ld = ldb};
    blocked_gemm(trans_a, trans_b, M, N, K, A, lda, &b, C, ldc, accumulate, workspace, threads, tile_sumsq);
}

void bf16_blocked_gemm_b32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                           int threads) {
    const b_operand_t b = {.f32 = B, .ld = ldb};
    blocked_gemm(trans_a, trans_b, M, N, K, A, lda, &b, C, ldc, accumulate, workspace, threads, NULL);
}
#else
void bf16_blocked_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                       const bf16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                       int threads, float *tile_sumsq) {
    /* Unreachable: callers check amx_available() or dpbf16_available(), both false in a build
     * without AVX-512. */
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C;
    (void)ldc, (void)accumulate, (void)workspace, (void)threads, (void)tile_sumsq;
    __builtin_trap();
}

void bf16_blocked_gemm_b32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                           int threads) {
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C;
    (void)ldc, (void)accumulate, (void)workspace, (void)threads;
    __builtin_trap();
}
#endif
