#include "kernels/amx.h"

#include <immintrin.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/vecmath.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
#if HAVE_AMX
    /* The build may target a CPU with AMX while running on one without (or under valgrind,
     * which hides it); and Linux hands out the 8 KiB tile state only on request. */
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return;
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

bool amx_available(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

void amx_pack_b_f32_pair(bf16_t *dst, int64_t Kp, int64_t k, const float *r0, const float *r1, int64_t N,
                         int64_t Np) {
    int64_t n = 0;
#if defined(__AVX512BF16__)
    /* 16 columns of both rows: convert them together (the low half of the result is r0, the
     * high half r1) and interleave them into the 16 (r0, r1) pairs of one packed tile row. */
    for (; r0 && r1 && n + 16 <= N; n += 16) {
        __m512i both = bf16x32_from_ps(_mm512_loadu_ps(r0 + n), _mm512_loadu_ps(r1 + n));
        _mm512_storeu_si512((void *)(dst + amx_packed_index(Kp, k, n)), bf16x32_interleave_halves(both));
    }
#endif
    for (; n < Np; n++) {
        bool in = n < N;
        dst[amx_packed_index(Kp, k, n)] = r0 && in ? bf16_from_f32(r0[n]) : 0;
        dst[amx_packed_index(Kp, k + 1, n)] = r1 && in ? bf16_from_f32(r1[n]) : 0;
    }
}

/* The packers need AVX-512 only: the bf16 attention kernel also packs for vdpbf16ps
 * products (kernels/dpbf16.h) on CPUs without AMX. */
#if defined(__AVX512BW__)
static inline void transpose16x16_epi32(__m512i r[16]) { transpose16x16_ps((__m512 *)r); }

/* Up to 32 bf16 from p (n of them; the rest, and a NULL p, zero). */
static inline __m512i load_row32(const bf16_t *p, int64_t n) {
    if (!p || n <= 0) return _mm512_setzero_si512();
    return n >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16((__mmask32)((1ull << n) - 1), p);
}

/* Up to 32 fp32 values from p (n of them; the rest, and a NULL p, zero), rounded to bf16 as
 * bf16_from_f32 rounds them, in order: what load_row32 reads from the bf16 copy of those values. */
static inline __m512i load_row32_f32(const float *p, int64_t n) {
    if (!p || n <= 0) return _mm512_setzero_si512();
#if defined(__AVX512BF16__)
    __m512 lo = n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
    __m512 hi = n >= 32   ? _mm512_loadu_ps(p + 16)
                : n > 16 ? _mm512_maskz_loadu_ps((__mmask16)((1u << (n - 16)) - 1), p + 16)
                         : _mm512_setzero_ps();
    return bf16x32_from_ps(lo, hi);
#else
    bf16_t row[32] = {0};
    for (int64_t i = 0; i < n && i < 32; i++) row[i] = bf16_from_f32(p[i]);
    return _mm512_loadu_si512(row);
#endif
}

/* 32 columns of a row pair (a, b), loaded, as (a[c], b[c]) words: columns 0-15 in *lo, 16-31
 * in *hi. pair_words32 loads up to 32 columns (n) of rows r0, r1 (NULL: a row of zeros) for it:
 * whole 64-byte lines, so a pack that walks across rows reads each source line once. */
static inline void pair_words32_of(__m512i a, __m512i b, __m512i *lo, __m512i *hi) {
    static const int16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    static const int16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
    *lo = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(lo_idx), b);
    *hi = _mm512_permutex2var_epi16(a, _mm512_loadu_si512(hi_idx), b);
}
static inline void pair_words32(const bf16_t *r0, const bf16_t *r1, int64_t n, __m512i *lo, __m512i *hi) {
    pair_words32_of(load_row32(r0, n), load_row32(r1, n), lo, hi);
}

/* amx_pack_bt from bf16 rows (src16) or from fp32 rows rounded on the way (src32, where src16
 * is NULL): inlined into each, so the row loader is a constant in both. */
static inline __attribute__((always_inline)) void pack_bt(bf16_t *dst, const bf16_t *src16, const float *src32,
                                                          int64_t ld, int64_t N, int64_t K) {
    const int64_t Kp = amx_round32(K), Np = amx_round32(N), panel = Kp / 2 * 32;
    /* Source row n holds the 16 (k, k+1) pairs of column n in order: 16 rows make a 16 × 16
     * block of 32-bit words, and its transpose is one packed tile. */
    for (int64_t n0 = 0; n0 < Np; n0 += 16)
        for (int64_t k0 = 0; k0 < Kp; k0 += 32) {
            __m512i w[16];
            /* The next panel's 16 rows, 64 bytes each, asked for ahead: the forward packs the
             * weights (Wᵀ) from memory, where the update has just written them, and the loads of
             * 16 rows a whole weight row apart waited there. In six pairs of profiled 28-layer
             * qwen3-0.6b bf16 runs alternated with and without it (Zen 5, 2026-12-06) the forward
             * products ran 1.00-1.04x and the step 1.001-1.022x, every pair in favour, most in
             * the VM's slower memory phase. From fp32, 128 bytes a row: both lines. */
            for (int c = 0; c < 16 && n0 + 16 + c < N; c++) {
                if (src16) {
                    _mm_prefetch((const char *)(src16 + (n0 + 16 + c) * ld + k0), _MM_HINT_T0);
                } else {
                    _mm_prefetch((const char *)(src32 + (n0 + 16 + c) * ld + k0), _MM_HINT_T0);
                    _mm_prefetch((const char *)(src32 + (n0 + 16 + c) * ld + k0 + 16), _MM_HINT_T0);
                }
            }
            for (int c = 0; c < 16; c++) {
                bool in = n0 + c < N;
                w[c] = src16 ? load_row32(in ? src16 + (n0 + c) * ld + k0 : NULL, K - k0)
                             : load_row32_f32(in ? src32 + (n0 + c) * ld + k0 : NULL, K - k0);
            }
            transpose16x16_epi32(w);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(dst + (n0 / 16) * panel + k0 / 2 * 32 + j * 32, w[j]);
        }
}

void amx_pack_bt(bf16_t *dst, const bf16_t *src, int64_t ld, int64_t N, int64_t K) { pack_bt(dst, src, NULL, ld, N, K); }

void amx_pack_bt_f32(bf16_t *dst, const float *src, int64_t ld, int64_t N, int64_t K) {
    pack_bt(dst, NULL, src, ld, N, K);
}

/* amx_pack_b from bf16 rows (src16) or from fp32 rows rounded on the way (src32, where src16
 * is NULL), as pack_bt. */
static inline __attribute__((always_inline)) void pack_b(bf16_t *dst, const bf16_t *src16, const float *src32,
                                                         int64_t ld, int64_t K, int64_t N) {
    const int64_t Kp = amx_round32(K), Np = amx_round32(N), panel = Kp / 2 * 32;
    /* Row pairs interleaved, 32 source rows at a time across the whole block, then the next 32:
     * walking down all of K one 64-byte column at a time touched rows 8-12 KiB apart that share
     * cache sets (qkv_proj's and gate_up_proj's output gradients), and their weight gradients
     * ran at 0.66-0.86x MKL's; one row pair at a time across the block stored each 64 bytes a
     * whole panel (16 KiB at K = 512) from the last, into one L1 set: a 512 × 512 pack from L2
     * took 35 us against 10-14 us this way, and 8-layer bf16 qwen3-0.6b steps ran 1.010x
     * (bench/step_ab-style toggle, 10 rounds all in favour, Zen 5; 64 rows: level with 32). */
    enum { ROWS = 32 };
    for (int64_t k0 = 0; k0 < Kp; k0 += ROWS)
        for (int64_t n0 = 0; n0 < Np; n0 += 32)
            for (int64_t k = k0; k < k0 + ROWS && k < Kp; k += 2) {
                __m512i lo, hi;
                if (src16)
                    pair_words32(k < K ? src16 + k * ld + n0 : NULL, k + 1 < K ? src16 + (k + 1) * ld + n0 : NULL,
                                 N - n0, &lo, &hi);
                else
                    pair_words32_of(load_row32_f32(k < K ? src32 + k * ld + n0 : NULL, N - n0),
                                    load_row32_f32(k + 1 < K ? src32 + (k + 1) * ld + n0 : NULL, N - n0), &lo, &hi);
                bf16_t *row = dst + (n0 / 16) * panel + k / 2 * 32;
                _mm512_storeu_si512(row, lo);
                _mm512_storeu_si512(row + panel, hi);
            }
}

void amx_pack_b(bf16_t *dst, const bf16_t *src, int64_t ld, int64_t K, int64_t N) { pack_b(dst, src, NULL, ld, K, N); }

void amx_pack_b_f32(bf16_t *dst, const float *src, int64_t ld, int64_t K, int64_t N) {
    pack_b(dst, NULL, src, ld, K, N);
}

void amx_pack_a(bf16_t *dst, bool trans, const bf16_t *A, int64_t lda, int64_t M, int64_t K) {
    const int64_t Kp = amx_round32(K);
    if (!trans) {
        for (int64_t m0 = 0; m0 < M; m0 += 32)
            for (int64_t k0 = 0; k0 < Kp; k0 += 32) {
                bf16_t *tiles = dst + ((m0 / 32) * (Kp / 32) + k0 / 32) * 1024;
                for (int r = 0; r < 32; r++) _mm512_storeu_si512(tiles + r * 32, load_row32(A + (m0 + r) * lda + k0, K - k0));
            }
        return;
    }
    /* op(A)[m][k] = A[k][m]: word j of a tile row is the pair (A[k0+2j][m], A[k0+2j+1][m]).
     * Build those words for 32 rows from each source row pair, then transpose; 32 source rows
     * at a time across the whole block, as amx_pack_b. */
    for (int64_t k0 = 0; k0 < Kp; k0 += 32)
        for (int64_t m0 = 0; m0 < M; m0 += 32) {
            bf16_t *tiles = dst + ((m0 / 32) * (Kp / 32) + k0 / 32) * 1024;
            __m512i upper[16], lower[16];
            for (int j = 0; j < 16; j++) {
                int64_t k = k0 + 2 * j;
                pair_words32(k < K ? A + k * lda + m0 : NULL, k + 1 < K ? A + (k + 1) * lda + m0 : NULL, 32, &upper[j],
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

#else
/* Unreachable: callers pack only where amx_available() or dpbf16_available(), both false in a
 * build without AVX-512. */
void amx_pack_bt(bf16_t *dst, const bf16_t *src, int64_t ld, int64_t N, int64_t K) {
    (void)dst, (void)src, (void)ld, (void)N, (void)K;
    __builtin_trap();
}

void amx_pack_b(bf16_t *dst, const bf16_t *src, int64_t ld, int64_t K, int64_t N) {
    (void)dst, (void)src, (void)ld, (void)K, (void)N;
    __builtin_trap();
}

void amx_pack_bt_f32(bf16_t *dst, const float *src, int64_t ld, int64_t N, int64_t K) {
    (void)dst, (void)src, (void)ld, (void)N, (void)K;
    __builtin_trap();
}

void amx_pack_b_f32(bf16_t *dst, const float *src, int64_t ld, int64_t K, int64_t N) {
    (void)dst, (void)src, (void)ld, (void)K, (void)N;
    __builtin_trap();
}

void amx_pack_a(bf16_t *dst, bool trans, const bf16_t *A, int64_t lda, int64_t M, int64_t K) {
    (void)dst, (void)trans, (void)A, (void)lda, (void)M, (void)K;
    __builtin_trap();
}
#endif

#if HAVE_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config_t;

/* A static object, not one built on the stack: gcc 12 does not see ldtilecfg read its operand
 * and dropped the stores of a local configuration in a function of its own (SIGILL at the
 * first tile load). */
static const tile_config_t full_tiles = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void amx_configure_full_tiles(void) { _tile_loadconfig(&full_tiles); }

/* Tiles 0-3: the 32×32 fp32 C block as four 16×16 quarters; 4-5: two 16×32 A tiles (rows
 * m0..m0+15, m0+16..m0+31); 6-7: two 16-pair × 16-column B tiles (columns n0.., n0+16..).
 * Row blocks outside: a 32-row A block stays in L1 while the B panels stream past it from L2;
 * the other order (a B panel in L1, A blocks streaming) ran 0.6-0.9x as fast in bf16_blocked.c.
 * stream_b loads B's tiles with the non-temporal hint (TILELOADDT1), which keeps them from
 * evicting that A block: the blocked GEMM's gain (bf16_blocked.c, k_slice). Attention's products,
 * whose packed K and V are read again by the next query block, ran 0.88x with it. */
static inline __attribute__((always_inline)) void tile_product(float *C, int64_t ldc, amx_a_tiles_t A,
                                                               const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                                                               int64_t K, bool accumulate, const bool stream_b) {
    const int64_t cs = ldc * (int64_t)sizeof(float);
    const int64_t b_panel = Bk / 2 * 32; /* elements per 16-column panel */
    for (int64_t m0 = 0; m0 < M; m0 += 32)
        for (int64_t n0 = 0; n0 < N; n0 += 32) {
            float *c = C + m0 * ldc + n0;
            if (accumulate) {
                _tile_loadd(0, c, cs);
                _tile_loadd(1, c + 16, cs);
                _tile_loadd(2, c + 16 * ldc, cs);
                _tile_loadd(3, c + 16 * ldc + 16, cs);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            const bf16_t *a = A.p + (m0 / 32) * A.row_block, *b = B + (n0 / 16) * b_panel;
            for (int64_t k0 = 0; k0 < K; k0 += 32, a += A.k_step) {
                _tile_loadd(4, a, A.stride);
                _tile_loadd(5, a + A.lower, A.stride);
                if (stream_b) {
                    _tile_stream_loadd(6, b + k0 * 16, 64);
                    _tile_stream_loadd(7, b + b_panel + k0 * 16, 64);
                } else {
                    _tile_loadd(6, b + k0 * 16, 64);
                    _tile_loadd(7, b + b_panel + k0 * 16, 64);
                }
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c, cs);
            _tile_stored(1, c + 16, cs);
            _tile_stored(2, c + 16 * ldc, cs);
            _tile_stored(3, c + 16 * ldc + 16, cs);
        }
}

void amx_tile_product(float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                      int64_t K, bool accumulate, bool stream_b) {
    if (stream_b) tile_product(C, ldc, A, B, Bk, M, N, K, accumulate, true);
    else tile_product(C, ldc, A, B, Bk, M, N, K, accumulate, false);
}

void amx_gemm_configured(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
                         int64_t N, int64_t K, bool accumulate) {
    amx_tile_product(C, ldc, amx_a_row_major(A, lda), B, Bk, M, N, K, accumulate, false);
}

void amx_release_tiles(void) { _tile_release(); }

void amx_gemm(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
              int64_t N, int64_t K, bool accumulate) {
    amx_configure_full_tiles();
    amx_gemm_configured(C, ldc, A, lda, B, Bk, M, N, K, accumulate);
    /* Leave the tile state unused between calls: the kernel saves 8 KiB more per context
     * switch while it is live. */
    amx_release_tiles();
}
#else
void amx_configure_full_tiles(void) { __builtin_trap(); /* unreachable, as amx_gemm below */ }

void amx_tile_product(float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                      int64_t K, bool accumulate, bool stream_b) {
    (void)C, (void)ldc, (void)A, (void)B, (void)Bk, (void)M, (void)N, (void)K, (void)accumulate, (void)stream_b;
    __builtin_trap();
}

void amx_gemm(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
              int64_t N, int64_t K, bool accumulate) {
    /* Unreachable: callers check amx_available(), false in a build without AMX. */
    (void)C, (void)ldc, (void)A, (void)lda, (void)B, (void)Bk, (void)M, (void)N, (void)K, (void)accumulate;
    __builtin_trap();
}

void amx_gemm_configured(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
                         int64_t N, int64_t K, bool accumulate) {
    amx_gemm(C, ldc, A, lda, B, Bk, M, N, K, accumulate); /* unreachable, as amx_gemm */
}

void amx_release_tiles(void) { __builtin_trap(); /* unreachable, as amx_gemm */ }
#endif
