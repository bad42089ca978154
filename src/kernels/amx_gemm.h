/* amx_gemm: whole bf16 matrix products (the model's linear layers and LM head) on AMX tiles,
 * blocked for the caches in the GotoBLAS manner: each thread packs a KC × NC block of B and
 * MC × KC blocks of A into the tile layout (kernels/amx.h) and runs 32 × 32 tile blocks over
 * them, or reads a row-major A's tiles in place. On the Intel Xeon (AMX) VM, MKL's
 * cblas_gemm_bf16bf16f32 ran qwen3-0.6b's products at 10-30% of the tile unit's peak; this
 * kernel ran a step's worth of them 1.04-1.15x as fast in bench/gemm_shapes (interleaved call
 * by call, five runs) and the step's matmuls 1.3x as fast in two of three profiled runs.
 *
 * The contract is gemm_bf16's (kernels/gemm.h): C[M,N] (+)= op(A)[M,K] · op(B)[K,N], A and B
 * bf16 row-major, C fp32. M and N must be multiples of 32 (amx_gemm_bf16_fits); K is any,
 * though fits() leaves very deep products to the library.
 * Each element of C sums its products in the same order whatever the thread count. */
#ifndef STEPSCOPE_AMX_GEMM_H
#define STEPSCOPE_AMX_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/bf16.h"

/* Whether amx_gemm_bf16 takes this shape (the caller also checks amx_available()). */
bool amx_gemm_bf16_fits(int64_t M, int64_t N, int64_t K);

/* bf16 elements of packing space each thread needs; the caller gives threads × this. */
int64_t amx_gemm_workspace_elems(void);

/* Runs on up to `threads` OpenMP threads (fewer inside a parallel region), thread t using
 * workspace + t · amx_gemm_workspace_elems(). */
void amx_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t *A, int64_t lda,
                   const bf16_t *B, int64_t ldb, float *C, int64_t ldc, bool accumulate, bf16_t *workspace,
                   int threads);

#endif
