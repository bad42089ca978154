/* gemm_widen: bf16 products where no bf16 matmul kernel can run them (CPUs without AVX512 or
 * AMX, or where oneDNN has only its gemm driver for bf16, whose K split follows the thread
 * count). A bf16 value is an fp32 with the low 16 bits zero and a product of two is exact in
 * fp32, so widening the operands and multiplying in fp32 IS "bf16 inputs, fp32 accumulation".
 * The operands are widened block by block into a fixed scratch (never a whole operand: the LM
 * head's weight would be 622 MB in fp32), and the blocks' sizes follow from the shape alone, so
 * the result is the same for any thread count and any context.
 * The same blocks serve fp32 products that oneDNN's gemm driver would run on its no-copy
 * kernels with an operand's rows a multiple of 2 KiB (the LM head's input gradient on AVX2,
 * dlogits · W with W's rows 4 KiB): copied into padded blocks they ran at twice the rate.
 *
 * The contract is gemm_bf16's or gemm_f32's (kernels/gemm.h). */
#ifndef STEPSCOPE_GEMM_WIDEN_H
#define STEPSCOPE_GEMM_WIDEN_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/gemm.h"

/* fp32 elements of scratch each call needs (4.1 MiB), given by the caller's context: the
 * blocks fill GEMM_WIDEN_BUDGET, their rows padded by at most 1/32. */
enum { GEMM_WIDEN_BUDGET = 1 << 20, GEMM_WIDEN_FLOATS = GEMM_WIDEN_BUDGET + GEMM_WIDEN_BUDGET / 32 };

/* C (+)= op(A)·op(B) through gemm_f32(g, ...) on widened blocks; the widening runs on the
 * OpenMP team outside a parallel region and on the calling thread inside one. */
void gemm_bf16_widened(gemm_ctx_t *g, float *scratch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                       bool accumulate);

/* The same with fp32 operands, copied into the padded blocks. */
void gemm_f32_staged(gemm_ctx_t *g, float *scratch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* Whether a row stride is one gemm_f32_staged pads (a multiple of 2 KiB). */
bool gemm_staged_pads(int64_t ld);

#endif
