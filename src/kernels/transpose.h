/* transpose: dst = srcᵀ for fp32 matrices with leading dimensions. oneDNN's fp32 matmul runs
 * the two gradient forms (dY·W and dYᵀ·X) at half its forward rate when the layer widens
 * (in > out: down_proj, o_proj), so the backward copies operands into transposed scratch
 * (one memory-bound pass each) and runs those products in the forward form. */
#ifndef STEPSCOPE_TRANSPOSE_H
#define STEPSCOPE_TRANSPOSE_H

#include <stdint.h>

#include "kernels/bf16.h"

/* src [rows, cols] with leading dim ld_src -> dst [cols, rows] with leading dim ld_dst.
 * Threaded with OpenMP over bands of 64 source columns. */
void transpose_f32(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);

/* The same on the calling thread only, for kernels that already run one task per thread
 * (attention's per-head blocks). */
void transpose_f32_serial(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);

/* dst [cols, rows] bf16 = srcᵀ rounded to bf16 (round to nearest even, as bf16_from_f32),
 * on the calling thread: transposing before the conversion lets the 16 × 16 fp32 tiles do it. */
void transpose_f32_to_bf16_serial(bf16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                                  int64_t cols);

#endif
