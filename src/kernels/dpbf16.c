#include "kernels/dpbf16.h"

#include <immintrin.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
bool dpbf16_available(void) { return __builtin_cpu_supports("avx512bf16"); }

/* Register tile: MR rows × two 16-column panels, 16 zmm accumulators, two B vectors and a
 * broadcast A pair (19 of 32 registers). Each k-pair step loads two B vectors and MR 4-byte A
 * words for 2·MR dot products: the FMA pipes, not the loads, bound it. */
enum { MR = DPBF16_TILE_ROWS };

static inline __m512bh a_pair(const bf16_t *p) {
    int32_t w;
    memcpy(&w, p, sizeof w); /* (A[r][k], A[r][k+1]): the low half is k, as the packed B pairs */
    return (__m512bh)_mm512_set1_epi32(w);
}

/* c[MR × 32] (+)= A's rows a (MR of them, each rs elements from the next within a 16-row tile)
 * · the two B panels. gemm: for the blocked GEMM, A in 32-deep steps k_step elements apart
 * (amx_a_tiles_t's layouts) and C fetched ahead; else (attention's blocks) A row-major. */
static inline __attribute__((always_inline)) void tile(float *c, int64_t ldc, const bf16_t *a, int64_t rs,
                                                       int64_t k_step, const bf16_t *b0, const bf16_t *b1, int64_t K,
                                                       bool accumulate, const bool gemm, float *sumsq) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    /* C's lines, fetched now so that the K loop hides their latency: loaded only at the end,
     * from L3 or DRAM where a blocked GEMM's C is wide, they stalled every tile (a step's worth
     * of bf16 products went from 0.84x oneDNN's rate to 1.01x with this, bench/gemm_shapes).
     * Attention's products fetch it where they add to it (the backward's dKᵀ and dVᵀ, 1 MiB of
     * fp32 a head, out of L2): its backward ran 1.01x at S = 1024, 1.06x at 2048 and 1.04x at
     * 4096 (medians of 15 interleaved calls on the Zen 4). */
    for (int r = 0; (gemm || accumulate) && r < MR; r++) {
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);
    }
    /* The blocked GEMM's A comes in 32-deep steps k_step apart, walked as a loop of steps with
     * a loop of 16 k pairs inside at fixed offsets: one loop whose A address took
     * (k >> 5) · k_step + (k & 31) each pair ran a block product at 74-78% of a Zen 5 core's
     * peak where this ran 90-96% (a scratch probe, 1024 × 512 × 512 blocks, A packed and in
     * place; docs/speed.md). Attention's products (A row-major) keep one k pair a step, as they
     * ran fastest (a loop of 32-deep steps with the pairs inside ran them 0.95-0.99x,
     * bench/bf16_blocks). */
    const int64_t step = gemm ? 32 : K;
    for (int64_t ks = 0; ks < K; ks += step) {
        const bf16_t *as = a + (gemm ? (ks >> 5) * k_step : 0), *bs0 = b0 + ks * 16, *bs1 = b1 + ks * 16;
#pragma GCC unroll 1
        for (int64_t k = 0; k < step; k += 2) {
            __m512bh x0 = (__m512bh)_mm512_loadu_si512(bs0 + k * 16), x1 = (__m512bh)_mm512_loadu_si512(bs1 + k * 16);
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                __m512bh y = a_pair(as + k + r * rs);
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], y, x0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], y, x1);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        if (accumulate) {
            acc[r][0] = _mm512_add_ps(acc[r][0], _mm512_loadu_ps(cr));
            acc[r][1] = _mm512_add_ps(acc[r][1], _mm512_loadu_ps(cr + 16));
        }
        _mm512_storeu_ps(cr, acc[r][0]);
        _mm512_storeu_ps(cr + 16, acc[r][1]);
    }
    if (sumsq) { /* Σ of the tile's squares from its registers, rows in order: C is not read again */
        __m512 sq = _mm512_setzero_ps();
        for (int r = 0; r < MR; r++) {
            sq = _mm512_fmadd_ps(acc[r][0], acc[r][0], sq);
            sq = _mm512_fmadd_ps(acc[r][1], acc[r][1], sq);
        }
        *sumsq = _mm512_reduce_add_ps(sq);
    }
}

void dpbf16_tile_product(float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                         int64_t K, bool accumulate, float *tile_sumsq, int64_t sumsq_ld) {
    const int64_t panel = Bk / 2 * 32, rs = A.stride / (int64_t)sizeof(bf16_t);
    /* Row blocks outside, as amx_tile_product: the MR rows of A (8 KiB at 512 deep) stay in L1
     * while the B panels go past them from L2. With the columns outside, A's rows streamed from
     * L3: a step's worth of products ran 1.01x oneDNN's rate where this order ran 1.11x
     * (bench/gemm_shapes, 512-deep slices, docs/speed.md). The deep slices (bf16_blocked.c's
     * k_slice: the LM head's input gradient, 4096 deep) are another matter: there B is 4 MiB, in
     * L3, and MR rows at a time streamed all of it once per 8 rows. They go DEEP_ROWS rows at a
     * time (512 KiB of A, in L2), each 32-column B panel (256 KiB) read once per block from L3
     * and then from L2 for the block's other rows: that product (512 x 1024 x 151936, A in place,
     * 2 threads) ran 1.065x (963 against 904 GFLOP/s, medians of 7 calls alternated with the
     * rows-outside order; 32-row blocks 1.065x, 128 1.05x, columns outside over all rows 1.045x)
     * on the Zen 5, the same bits. (Until 2026-12-06 one thread's slices were 2048 deep, which a
     * threshold of K > 2048 had left to the rows-outside order: 1.05-1.06x there with the row
     * blocks; the slices are now DEEP_KC on any number of threads, bf16_blocked.c.) */
    enum { DEEP_ROWS = 64 };
    const int64_t row_block = K >= DPBF16_DEEP_K ? DEEP_ROWS : MR; /* MR: the rows-outside order */
    /* A read in place (row-major: 32-deep steps 32 elements apart) comes from wherever its
     * producer left it, and each MR-row block's first tile had waited on its lines: in some VM
     * phases the layers' products with K past 1024 (their A 4-12 MiB) ran 0.86x their usual rate
     * in whole runs. So each column tile asks for its share of the next row block's lines (MR
     * rows × K/32), the first 32-deep steps first. Alternated call by call in profiled qwen3-0.6b
     * bf16 steps, those products ran 1.02-1.08x in that phase and level otherwise; a packed A,
     * which this thread has just written, gained nothing (docs/speed.md). */
    const bool prefetch_a = A.k_step == 32 && row_block == MR;
    const int64_t a_lines = MR * (K / 32), col_tiles = (N + 31) / 32;
    const int64_t lines_per_tile = (a_lines + col_tiles - 1) / col_tiles;
    for (int64_t mb = 0; mb < M; mb += row_block) {
        const int64_t m_end = mb + row_block < M ? mb + row_block : M;
        const bf16_t *a_next = NULL;
        if (prefetch_a && m_end < M)
            a_next = A.p + (m_end / 32) * A.row_block + (m_end % 32 / 16) * A.lower + (m_end % 16) * rs;
        int64_t line = 0;
        for (int64_t n0 = 0; n0 < N; n0 += 32) {
            const bf16_t *b0 = B + (n0 / 16) * panel;
            for (int64_t end = line + lines_per_tile; a_next && line < end && line < a_lines; line++)
                _mm_prefetch((const char *)(a_next + (line % MR) * rs + (line / MR) * 32), _MM_HINT_T0);
            for (int64_t m0 = mb; m0 < m_end; m0 += MR) {
                const bf16_t *a = A.p + (m0 / 32) * A.row_block + (m0 % 32 / 16) * A.lower + (m0 % 16) * rs;
                tile(C + m0 * ldc + n0, ldc, a, rs, A.k_step, b0, b0 + panel, K, accumulate, true,
                     tile_sumsq ? tile_sumsq + m0 / MR * sumsq_ld + n0 / 32 : NULL);
            }
        }
    }
}

void dpbf16_gemm(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
                 int64_t N, int64_t K, bool accumulate) {
    const int64_t panel = Bk / 2 * 32; /* elements per 16-column panel */
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
        const bf16_t *b0 = B + (n0 / 16) * panel;
        for (int64_t m0 = 0; m0 < M; m0 += MR)
            tile(C + m0 * ldc + n0, ldc, A + m0 * lda, lda, 32, b0, b0 + panel, K, accumulate, false, NULL);
    }
}
#else
bool dpbf16_available(void) { return false; }

void dpbf16_tile_product(float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                         int64_t K, bool accumulate, float *tile_sumsq, int64_t sumsq_ld) {
    (void)C, (void)ldc, (void)A, (void)B, (void)Bk, (void)M, (void)N, (void)K, (void)accumulate, (void)tile_sumsq,
        (void)sumsq_ld;
    __builtin_trap(); /* unreachable, as dpbf16_gemm below */
}

void dpbf16_gemm(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
                 int64_t N, int64_t K, bool accumulate) {
    /* Unreachable: callers check dpbf16_available(), false in a build without AVX512-BF16. */
    (void)C, (void)ldc, (void)A, (void)lda, (void)B, (void)Bk, (void)M, (void)N, (void)K, (void)accumulate;
    __builtin_trap();
}
#endif
