/* dpbf16: bf16 block products on AVX512-BF16 dot products (vdpbf16ps: AMD Zen 4 and 5, Intel
 * Cooper Lake), for bf16 attention on CPUs that have them but no AMX tiles. Through the matmul
 * library (oneDNN) attention's [128 × S × 128] block products ran at 22-29% of the bf16 peak on
 * the Zen 5, slower than the fp32 kernel: each call reorders both operands. These take the
 * operands already packed, in the layout amx.h defines for its tile products (A bf16
 * row-major, B in the packed "vnni" layout of k-pairs), so the bf16 attention kernel packs K
 * and V once per head and runs either unit's product on them; the blocked GEMM of the
 * projections and LM head (bf16_blocked.h) runs its block products here too. */
#ifndef STEPSCOPE_DPBF16_H
#define STEPSCOPE_DPBF16_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/amx.h"
#include "kernels/bf16.h"

/* Whether this build and CPU run vdpbf16ps (a build targeting AVX512-BF16, on a CPU that
 * reports it: the build may run elsewhere, or under valgrind, which has no AVX-512). */
bool dpbf16_available(void);

/* C[M, N] (+)= A[M, K] · B: the contract of amx_gemm (kernels/amx.h). A bf16 row-major (row
 * stride lda elements), B packed with K extent Bk (≥ K), C fp32 (row stride ldc); M, N, K
 * multiples of 32. Runs on the calling thread; requires dpbf16_available(). */
void dpbf16_gemm(float *C, int64_t ldc, const bf16_t *A, int64_t lda, const bf16_t *B, int64_t Bk, int64_t M,
                 int64_t N, int64_t K, bool accumulate);

/* amx_tile_product's contract on these dot products: C[M, N] (+)= A · B over K, A's tiles in
 * either of amx.h's layouts (row-major or packed by amx_pack_a), B packed with K extent Bk;
 * M, N, K multiples of 32. For the blocked whole-matrix GEMM (bf16_blocked.h) on CPUs without AMX.
 * A K of DPBF16_DEEP_K or more is taken for one of that GEMM's deep slices (B in L3, not L2) and
 * walked in row blocks that keep A in L2 (dpbf16.c); shallower ones go 8 rows at a time.
 * With tile_sumsq, each MR × 32 tile of the C it stores (MR = DPBF16_TILE_ROWS rows from row i,
 * 32 columns from column j, both relative to C) also leaves Σ C² over it, summed in float in a
 * fixed order from the registers it stores from, in tile_sumsq[i / MR · sumsq_ld + j / 32]
 * (NULL: none). */
enum { DPBF16_DEEP_K = 2048, DPBF16_TILE_ROWS = 8 };
void dpbf16_tile_product(float *C, int64_t ldc, amx_a_tiles_t A, const bf16_t *B, int64_t Bk, int64_t M, int64_t N,
                         int64_t K, bool accumulate, float *tile_sumsq, int64_t sumsq_ld);

#endif
