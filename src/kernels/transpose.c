#include "kernels/transpose.h"

#include <immintrin.h>

#include "kernels/vecmath.h"

#if defined(__AVX512F__)
/* One 16×16 tile of src into registers, transposed: t[j] is column j. */
static inline __attribute__((always_inline)) void tile16_regs(__m512 t[16], const float *src, int64_t ld_src) {
    for (int i = 0; i < 16; i++) t[i] = _mm512_loadu_ps(src + i * ld_src);
    transpose16x16_ps(t);
}

static inline __attribute__((always_inline)) void tile16(float *dst, int64_t ld_dst, const float *src, int64_t ld_src) {
    __m512 t[16];
    tile16_regs(t, src, ld_src);
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld_dst, t[i]);
}
#endif

/* Columns [c0, c1) of src into rows [c0, c1) of dst, 16 × 16 tiles at a time. */
static void transpose_band(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t c0,
                           int64_t c1) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t c = c0; c < c1; c += 16) {
#if defined(__AVX512F__)
            if (r0 + 16 <= rows && c + 16 <= c1) {
                tile16(dst + c * ld_dst + r0, ld_dst, src + r0 * ld_src + c, ld_src);
                continue;
            }
#endif
            int64_t re = r0 + 16 < rows ? r0 + 16 : rows, ce = c + 16 < c1 ? c + 16 : c1;
            for (int64_t i = r0; i < re; i++)
                for (int64_t j = c; j < ce; j++) dst[j * ld_dst + i] = src[i * ld_src + j];
        }
}

void transpose_f32(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < cols; c0 += 64) transpose_band(dst, ld_dst, src, ld_src, rows, c0, c0 + 64 < cols ? c0 + 64 : cols);
}

void transpose_f32_serial(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
    transpose_band(dst, ld_dst, src, ld_src, rows, 0, cols);
}

void transpose_f32_to_bf16_serial(bf16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows,
                                  int64_t cols) {
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
        for (int64_t c0 = 0; c0 < cols; c0 += 16) {
#if defined(__AVX512BF16__)
            if (r0 + 16 <= rows && c0 + 16 <= cols) {
                __m512 t[16];
                tile16_regs(t, src + r0 * ld_src + c0, ld_src);
                for (int i = 0; i < 16; i++)
                    _mm256_storeu_si256((__m256i *)(dst + (c0 + i) * ld_dst + r0), (__m256i)_mm512_cvtneps_pbh(t[i]));
                continue;
            }
#endif
            int64_t re = r0 + 16 < rows ? r0 + 16 : rows, ce = c0 + 16 < cols ? c0 + 16 : cols;
            for (int64_t i = r0; i < re; i++)
                for (int64_t j = c0; j < ce; j++) dst[j * ld_dst + i] = bf16_from_f32(src[i * ld_src + j]);
        }
}
