/* microgemm: a small register-blocked GEMM for the blocks inside attention, where shapes
 * change with the causal extent and calls are too small for a library's per-call cost.
 * Runs on the calling thread (the caller parallelises over heads and blocks). */
#ifndef STEPSCOPE_MICROGEMM_H
#define STEPSCOPE_MICROGEMM_H

#include <stdbool.h>
#include <stdint.h>

/* C[M, N] = alpha · A·B, or C += alpha · A·B when accumulate.
 * A(i, k) = A[i·rsa + k·csa] (so a transposed A is rsa = 1, csa = its row stride);
 * B[K, N] with row stride ldb, contiguous along N; C[M, N] with row stride ldc. */
void microgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
               int64_t csa, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* The kernel this build runs, for the console: "AVX-512 micro-GEMM (8 x 32 tiles)", the AVX2
 * one, or the plain loop of a build without either. */
const char *microgemm_kind(void);

#endif
