/* bf16_blocked: whole bf16 matrix products (the model's linear layers and LM head) on our own
 * kernel, blocked for the caches in the GotoBLAS manner: each thread packs a KC × NC block of B
 * and MC × KC blocks of A into amx.h's tile layout and runs block products over them (or reads a
 * row-major A's tiles in place), on AMX tiles where the CPU has them (amx_tile_product) and on
 * AVX512-BF16 dot products otherwise (dpbf16_tile_product: AMD Zen 4 and 5).
 * On the Intel Xeon (AMX) VM, MKL's cblas_gemm_bf16bf16f32 ran qwen3-0.6b's products at 10-30%
 * of the tile unit's peak; this kernel ran a step's worth of them 1.04-1.15x as fast in
 * bench/gemm_shapes (interleaved call by call, five runs) and the step's matmuls 1.3x as fast in
 * two of three profiled runs. On the AMD EPYC Zen 4 (AVX512-BF16, no AMX) its dot-product tiles
 * ran a step's worth 1.04-1.09x oneDNN's bf16 matmul primitive (gemm_shapes, three runs,
 * 2026-12-02), and whole bf16 training steps 1.05-1.08x (bench/step_ab; docs/speed.md); on the
 * Zen 5, a step's worth 1.11x oneDNN's (gemm_shapes, 2026-12-03, with the tile's two-level K loop
 * of dpbf16.c).
 *
 * The contract is gemm_bf16's (kernels/gemm.h): C[M,N] (+)= op(A)[M,K] · op(B)[K,N], A and B
 * bf16 row-major, C fp32. M and N must be multiples of 32 (bf16_blocked_fits); K is any,
 * though fits() leaves very deep products to the library on AMX.
 * Each element of C sums its products in the same order whatever the thread count. */
#ifndef STEPSCOPE_BF16_BLOCKED_H
#define STEPSCOPE_BF16_BLOCKED_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/bf16.h"

/* The deepest K it takes on AMX: the LM head's input gradient (K = the vocabulary, 151936) ran
 * at 0.72-0.98x MKL's rate there (four interleaved runs), so it stays with the library. On
 * AVX512-BF16 dot products it takes any K, with deeper slices of K past this depth
 * (bf16_blocked.c, k_slice). */
enum { BF16_BLOCKED_K_MAX_AMX = 8192 };

/* Whether bf16_blocked_gemm takes this shape (the caller also checks amx_available() or
 * dpbf16_available()): M and N multiples of 32, and on AMX K at most BF16_BLOCKED_K_MAX_AMX. */
bool bf16_blocked_fits(int64_t M, int64_t N, int64_t K);

/* bf16 elements of packing space each thread needs; the caller gives threads × this. */
int64_t bf16_blocked_workspace_elems(void);

/* Runs on up to `threads` OpenMP threads (fewer inside a parallel region), thread t using
 * workspace + t · bf16_blocked_workspace_elems(). tile_sumsq: NULL, or (on AVX512-BF16 dot
 * products only, not AMX: bf16_blocked_sums_squares, with K > 0) M/8 × N/32 floats that receive
 * each 8 × 32 tile's Σ C² over the C written (dpbf16_tile_product), tile (i, j) at i · N/32 + j:
 * taken from the registers of the last K slice's tiles, so the sums cost no pass over C, and,
 * each tile summed by one thread in one order, the thread count changes no bit. */
void bf16_blocked_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                       const bf16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                       int threads, float *tile_sumsq);

/* bf16_blocked_gemm with B in fp32, rounded to bf16 (nearest even) as it is packed: the same bits
 * as bf16_blocked_gemm over bf16(B), without a bf16 copy of B (weights kept in fp32 only). */
void bf16_blocked_gemm_b32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                           int threads);

/* Whether bf16_blocked_gemm takes tile_sumsq on this CPU and build (dot products, no AMX). */
bool bf16_blocked_sums_squares(void);

#endif
