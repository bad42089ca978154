#include "kernels/amx_gemm.h"

#include <immintrin.h>
#include <omp.h>
#include <string.h>

#include "kernels/amx.h"

/* Block extents, for a core's 2 MiB L2. Per KC-deep slice of K, a thread reads a row-major A
 * in place (a_read_in_place) or packs the narrower operand of its part of C whole (up to FULL
 * rows or columns, 2 MiB) and the other MC rows or NC columns at a time; a tile product then
 * covers at most NC columns, whose B part (1 MiB) stays in L2 while its rows go by. KC = 1024
 * covers each linear's K of qwen3-0.6b in one pass but the output and down projections' (2048,
 * 3072), where C is loaded and stored again per slice. KC = 512 with FULL = 2048 measured
 * alike within the VM's noise. */
enum { MC = 256, NC = 512, KC = 1024, FULL = 1024, BLK = (MC > NC ? MC : NC) * KC };

/* K ≤ 8 KC: the LM head's input gradient (K = the vocabulary, 151936) ran at 0.72-0.98x MKL's
 * rate here, in four interleaved runs; every other qwen3-0.6b product ran faster. */
bool amx_gemm_bf16_fits(int64_t M, int64_t N, int64_t K) {
    return M > 0 && N > 0 && M % 32 == 0 && N % 32 == 0 && K <= 8 * KC;
}

int64_t amx_gemm_workspace_elems(void) { return (int64_t)FULL * KC + BLK; }

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__)
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* 16 rows of 16 32-bit words, transposed in place: four rounds, each swapping the off-diagonal
 * b × b blocks of every 2b × 2b block (b = 8, 4, 2, 1). */
static void transpose16x16_epi32(__m512i r[16]) {
    for (int b = 8; b >= 1; b /= 2) {
        int lo_idx[16], hi_idx[16];
        for (int l = 0; l < 16; l++) {
            lo_idx[l] = (l & b) ? 16 + l - b : l; /* row i: its own low block, then row i+b's */
            hi_idx[l] = (l & b) ? 16 + l : l + b; /* row i+b: row i's high block, then its own */
        }
        const __m512i lo = _mm512_loadu_si512(lo_idx), hi = _mm512_loadu_si512(hi_idx);
        for (int i = 0; i < 16; i++) {
            if (i & b) continue;
            __m512i x = r[i], y = r[i + b];
            r[i] = _mm512_permutex2var_epi32(x, lo, y);
            r[i + b] = _mm512_permutex2var_epi32(x, hi, y);
        }
    }
}

/* Up to 32 bf16 from p (n of them; the rest zero). */
static inline __m512i load_row32(const bf16_t *p, int64_t n) {
    return n >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16((__mmask32)((1ull << (n > 0 ? n : 0)) - 1), p);
}

/* 32 columns of the row pair (r0, r1) (NULL: a row of zeros) as (r0[c], r1[c]) words: columns
 * 0-15 in *lo, 16-31 in *hi. Whole 64-byte lines are read, so a pack that walks down K reads
 * each source line once. */
static inline void pair_words32(const bf16_t *r0, const bf16_t *r1, __m512i *lo, __m512i *hi) {
    static const int16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const int16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    __m512i a = r0 ? _mm512_loadu_si512(r0) : _mm512_setzero_si512();
    __m512i b = r1 ? _mm512_loadu_si512(r1) : _mm512_setzero_si512();
    *lo = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(lo_idx), b);
    *hi = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(hi_idx), b);
}

/* The A block of rows [0, mw) and K columns [0, kw) of op(A), as tiles: [mw/32][kwp/32][2][16][32]
 * (the two 16-row tiles of a 32-row block and K step side by side). kw ≤ kwp = round32(kw). */
static void pack_a(bf16_t *dst, bool trans, const bf16_t *A, int64_t lda, int64_t mw, int64_t kw, int64_t kwp) {
    if (!trans) {
        for (int64_t m0 = 0; m0 < mw; m0 += 32)
            for (int64_t k0 = 0; k0 < kwp; k0 += 32) {
                bf16_t *tiles = dst + ((m0 / 32) * (kwp / 32) + k0 / 32) * 1024;
                for (int r = 0; r < 32; r++) _mm512_storeu_si512(tiles + r * 32, load_row32(A + (m0 + r) * lda + k0, kw - k0));
            }
        return;
    }
    /* op(A)[m][k] = A[k][m]: word j of a tile row is the pair (A[k0+2j][m], A[k0+2j+1][m]).
     * Build those words for 32 rows from each source row pair, then transpose. 32 source rows
     * at a time, across the whole block: walking down K one 64-byte column at a time instead
     * touched the rows at strides of 8 and 12 KiB (qkv_proj's and gate_up_proj's output
     * gradients), which share cache sets, and their weight gradients ran at 0.66-0.86x MKL's. */
    for (int64_t k0 = 0; k0 < kwp; k0 += 32)
        for (int64_t m0 = 0; m0 < mw; m0 += 32) {
            bf16_t *tiles = dst + ((m0 / 32) * (kwp / 32) + k0 / 32) * 1024;
            __m512i upper[16], lower[16];
            for (int j = 0; j < 16; j++) {
                int64_t k = k0 + 2 * j;
                pair_words32(k < kw ? A + k * lda + m0 : NULL, k + 1 < kw ? A + (k + 1) * lda + m0 : NULL, &upper[j],
                             &lower[j]);
            }
            transpose16x16_epi32(upper);
            transpose16x16_epi32(lower);
            for (int r = 0; r < 16; r++) {
                _mm512_storeu_si512(tiles + r * 32, upper[r]);
                _mm512_storeu_si512(tiles + 512 + r * 32, lower[r]);
            }
        }
}

/* The B block of K rows [0, kw) and columns [0, nw) of op(B), packed (amx.h's layout with K
 * extent kwp): [nw/16][kwp/2][16][2]. */
static void pack_b(bf16_t *dst, bool trans, const bf16_t *B, int64_t ldb, int64_t nw, int64_t kw, int64_t kwp) {
    const int64_t panel = kwp / 2 * 32;
    if (trans) {
        /* op(B)[k][n] = B[n][k]: source row n holds the 16 pairs of column n, in order. */
        for (int64_t n0 = 0; n0 < nw; n0 += 16)
            for (int64_t k0 = 0; k0 < kwp; k0 += 32) {
                __m512i w[16];
                for (int c = 0; c < 16; c++) w[c] = load_row32(B + (n0 + c) * ldb + k0, kw - k0);
                transpose16x16_epi32(w);
                for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + (n0 / 16) * panel + k0 / 2 * 32 + j * 32, w[j]);
            }
        return;
    }
    /* Row pairs interleaved, whole source rows at a time (as pack_a's transposed case). */
    for (int64_t k0 = 0; k0 < kwp; k0 += 2)
        for (int64_t n0 = 0; n0 < nw; n0 += 32) {
            __m512i lo, hi;
            pair_words32(k0 < kw ? B + k0 * ldb + n0 : NULL, k0 + 1 < kw ? B + (k0 + 1) * ldb + n0 : NULL, &lo, &hi);
            bf16_t *row = dst + (n0 / 16) * panel + k0 / 2 * 32;
            _mm512_storeu_si512(row, lo);
            _mm512_storeu_si512(row + panel, hi);
        }
}

/* Whether tiles of A are loaded straight from it: row-major, with K blocks of whole tiles (a
 * tile would otherwise read past K into the next row), and a row stride off multiples of 4 KiB
 * (there a tile's 16 rows share one set of the L1 and the L2; the query-gradient product of
 * qkv_proj, stride 8 KiB, ran at 0.93x MKL's rate in place). */
static bool a_read_in_place(bool trans_a, int64_t K, int64_t lda) { return !trans_a && K % 32 == 0 && lda % 2048 != 0; }

/* C's rows [m_lo, m_hi) and columns [n_lo, n_hi) on the calling thread; no operand is packed
 * twice (see the block extents above). */
static void gemm_part(bool trans_a, bool trans_b, int64_t m_lo, int64_t m_hi, int64_t n_lo, int64_t n_hi, int64_t K,
                      const bf16_t *A, int64_t lda, const bf16_t *B, int64_t ldb, float *C, int64_t ldc,
                      bool accumulate, bf16_t *work) {
    bf16_t *full = work, *blk = work + (int64_t)FULL * KC;
    const int64_t mt = m_hi - m_lo, nt = n_hi - n_lo;
    const bool a_direct = a_read_in_place(trans_a, K, lda);
    const bool a_whole = !a_direct && mt <= FULL && mt <= nt, b_whole = !a_whole && nt <= FULL;
    const int64_t mstep = a_whole || a_direct ? mt : MC;
    bf16_t *Ap = a_whole ? full : blk, *Bp = a_whole ? blk : full;
    amx_configure_full_tiles();
    for (int64_t kc = 0; kc < K; kc += KC) {
        int64_t kw = min64(KC, K - kc), kwp = amx_round32(kw);
        bool load_c = accumulate || kc > 0;
        if (a_whole) pack_a(Ap, trans_a, trans_a ? A + kc * lda + m_lo : A + m_lo * lda + kc, lda, mt, kw, kwp);
        if (b_whole) pack_b(Bp, trans_b, trans_b ? B + n_lo * ldb + kc : B + kc * ldb + n_lo, ldb, nt, kw, kwp);
        if (!a_direct && !a_whole && !b_whole) { /* neither fits whole: GotoBLAS blocks */
            for (int64_t nc = n_lo; nc < n_hi; nc += NC) {
                int64_t nw = min64(NC, n_hi - nc);
                pack_b(full, trans_b, trans_b ? B + nc * ldb + kc : B + kc * ldb + nc, ldb, nw, kw, kwp);
                for (int64_t mc = m_lo; mc < m_hi; mc += MC) {
                    int64_t mw = min64(MC, m_hi - mc);
                    pack_a(blk, trans_a, trans_a ? A + kc * lda + mc : A + mc * lda + kc, lda, mw, kw, kwp);
                    amx_tile_product(C + mc * ldc + nc, ldc, amx_a_packed(blk, kwp), full, kwp, mw, nw, kwp, load_c);
                }
            }
            continue;
        }
        /* B packed whole is walked NC columns at a time: with products over whole 1024-column
         * Bs (2 MiB, out of L2) the weight gradients ran at 0.5-0.6x MKL's rate. */
        const int64_t panel = kwp / 2 * 32;
        for (int64_t mc = m_lo; mc < m_hi; mc += mstep) {
            int64_t mw = min64(mstep, m_hi - mc);
            if (!a_whole && !a_direct) pack_a(Ap, trans_a, trans_a ? A + kc * lda + mc : A + mc * lda + kc, lda, mw, kw, kwp);
            amx_a_tiles_t at = a_direct ? amx_a_row_major(A + mc * lda + kc, lda)
                                        : amx_a_packed(a_whole ? Ap + ((mc - m_lo) / 32) * (kwp / 32) * 1024 : Ap, kwp);
            for (int64_t nc = n_lo; nc < n_hi; nc += NC) {
                int64_t nw = min64(NC, n_hi - nc);
                if (!b_whole) pack_b(Bp, trans_b, trans_b ? B + nc * ldb + kc : B + kc * ldb + nc, ldb, nw, kw, kwp);
                amx_tile_product(C + mc * ldc + nc, ldc, at, b_whole ? Bp + (nc - n_lo) / 16 * panel : Bp, kwp, mw, nw,
                                 kwp, load_c);
            }
        }
    }
    _tile_release();
}

void amx_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                   const bf16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                   int threads) {
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
    const double a_cost = a_read_in_place(trans_a, K, lda) ? 0.0 : (double)M * (double)K * (trans_a ? 3 : 1);
    const double b_cost = (double)N * (double)K * (trans_b ? 3 : 1);
    const bool split_n = M / 32 < threads || (N / 32 >= threads && a_cost <= b_cost);
    const int64_t blocks = (split_n ? N : M) / 32;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t lo = blocks * t / nt * 32, hi = blocks * (t + 1) / nt * 32;
        if (hi > lo)
            gemm_part(trans_a, trans_b, split_n ? 0 : lo, split_n ? M : hi, split_n ? lo : 0, split_n ? hi : N, K, A,
                      lda, B, ldb, C, ldc, accumulate, workspace + t * amx_gemm_workspace_elems());
    }
}
#else
void amx_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                   const bf16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                   int threads) {
    /* Unreachable: callers check amx_available(), false in a build without AMX. */
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C;
    (void)ldc, (void)accumulate, (void)workspace, (void)threads;
    __builtin_trap();
}
#endif
