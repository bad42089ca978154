/* amx: bf16 tile products on Intel AMX (Sapphire Rapids and later), for blocks that are too
 * small for a GEMM library to amortise its per-call packing: attention's [128 × S × 128]
 * block products ran at 6% of the tile unit's peak through MKL. Here the B operands (K, V,
 * and the probability strips) are packed once into the tile unit's layout by the caller and
 * each product is a plain loop of tile loads and dot products. bf16_blocked.h builds whole
 * matrix products (the linear layers) on the same tile product.
 *
 * Packed B layout ("vnni"): a K×N matrix B is stored as [N/16][Kp/2][16][2], where Kp is the
 * packed K extent: element (k, n) sits at ((n/16)·(Kp/2) + k/2)·32 + (n%16)·2 + k%2. One tile
 * (16 k-pairs × 16 columns, 1 KiB) is then contiguous. Kp and N are multiples of 32; padding
 * rows and columns hold zeros. */
#ifndef STEPSCOPE_AMX_H
#define STEPSCOPE_AMX_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/bf16.h"

/* Whether this build and CPU run AMX bf16 tiles and Linux granted the tile state to the
 * process (arch_prctl). Decided once per process; safe from any thread. */
bool amx_available(void);

static inline int64_t amx_round32(int64_t n) { return (n + 31) / 32 * 32; }

/* Where element (k, n) of a packed B with K extent Kp sits (the layout above). */
static inline int64_t amx_packed_index(int64_t Kp, int64_t k, int64_t n) {
    return ((n / 16) * (Kp / 2) + k / 2) * 32 + (n % 16) * 2 + k % 2;
}

/* B = srcᵀ packed: src is [N rows, K columns] (row stride ld), B[k][n] = src[n][k]; Kp =
 * amx_round32(K), and B is zero-padded to Kp × amx_round32(N), the elements dst holds. */
void amx_pack_bt(bf16_t *dst, const bf16_t *src, int64_t ld, int64_t N, int64_t K);

/* B = src packed: src is [K rows, N columns] (row stride ld), B[k][n] = src[k][n]; Kp =
 * amx_round32(K), zero-padded. */
void amx_pack_b(bf16_t *dst, const bf16_t *src, int64_t ld, int64_t K, int64_t N);

/* op(A)[M, K] as A tiles, [M/32][Kp/32][2][16][32] (the two 16-row tiles of a 32-row block and
 * K step side by side; amx_a_packed reads it): op(A) = A [M rows, K columns] (row stride lda),
 * or Aᵀ for A stored [K rows, M columns] (trans). M is a multiple of 32; Kp = amx_round32(K),
 * zero-padded. The packers need an AVX-512 build (amx_available() or dpbf16_available()). */
void amx_pack_a(bf16_t *dst, bool trans, const bf16_t *A, int64_t lda, int64_t M, int64_t K);

/* The same from fp32, rounding to bf16 (nearest even) on the way: src [K rows, N columns]. */
void amx_pack_b_f32(bf16_t *dst, const float *src, int64_t ld, int64_t K, int64_t N);

/* One packed row pair of that: rows k, k+1 (k even) of B from r0, r1 (NULL: a zero row), N
 * columns, zero-padded to Np; Kp is the packed K extent. For kernels that produce B a row
 * pair at a time and pack it while it is in cache. */
void amx_pack_b_f32_pair(bf16_t *dst, int64_t Kp, int64_t k, const float *r0, const float *r1, int64_t N,
                         int64_t Np);

/* amx_pack_bt from fp32, rounding to bf16 (nearest even, as bf16_from_f32) on the way: src is
 * [N rows, K columns]; the same bits as amx_pack_bt of the rounded rows. For weights kept in
 * fp32 only, which the products round as they pack them (gemm_bf16_b32). */
void amx_pack_bt_f32(bf16_t *dst, const float *src, int64_t ld, int64_t N, int64_t K);

/* Loads the tile configuration every kernel here uses: all eight tiles 16 rows × 64 bytes
 * (bf16 A and B tiles of 16 × 32, fp32 C tiles of 16 × 16), on the calling thread;
 * _tile_release() gives the state back. Requires amx_available(). */
void amx_configure_full_tiles(void);

/* Where a tile product finds A's 16 × 32 tiles: in a row-major bf16 A, or packed by amx_pack_a. */
typedef struct {
    const bf16_t *p;
    int64_t stride;    /* bytes between a tile's rows */
    int64_t lower;     /* elements from a 32-row block's upper tile to its lower one */
    int64_t k_step;    /* elements from one 32-deep K step to the next */
    int64_t row_block; /* elements from one 32-row block to the next */
} amx_a_tiles_t;

static inline amx_a_tiles_t amx_a_row_major(const bf16_t *A, int64_t lda) {
    return (amx_a_tiles_t){A, lda * (int64_t)sizeof(bf16_t), 16 * lda, 32, 32 * lda};
}
static inline amx_a_tiles_t amx_a_packed(const bf16_t *Ap, int64_t Kp) {
    return (amx_a_tiles_t){Ap, 64, 512, 1024, (Kp / 32) * 1024};
}

/* C[M, N] (+)= A · B over K, B packed with K extent Bk (≥ K), C fp32 (row stride ldc); M, N, K
 * multiples of 32. The tiles must be configured (amx_configure_full_tiles) on this thread.
 * stream_b: load B with the non-temporal hint, for a B read once per row block of A. */
void amx_tile_product(float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                      int64_t K, bool accumulate, bool stream_b);

/* C[M, N] (+)= A[M, K] · B, A bf16 row-major (row stride lda elements), B packed with K
 * extent Bk (≥ K), C fp32 (row stride ldc). M, N, K are multiples of 32. Runs on the calling
 * thread; requires amx_available(). */
void amx_gemm(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
              int64_t N, int64_t K, bool accumulate);

/* amx_gemm on tiles the caller configured (amx_configure_full_tiles) and gives back after its
 * run of products (amx_release_tiles): for kernels that make many block products in a row,
 * where amx_gemm would configure and release the tiles around each one. */
void amx_gemm_configured(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
                         int64_t N, int64_t K, bool accumulate);
void amx_release_tiles(void);

/* A block product over these packed operands with amx_gemm's contract: amx_gemm on AMX tiles,
 * or dpbf16_gemm (kernels/dpbf16.h) on AVX512-BF16 dot products. */
typedef void (*bf16_block_product_fn)(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B,
                                      int64_t Bk, int64_t M, int64_t N, int64_t K, bool accumulate);

#endif
