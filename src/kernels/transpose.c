#include "kernels/transpose.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/vecmath.h"

#if defined(__AVX512F__)
/* One 16×16 tile of src into registers, transposed: t[j] is column j. */
static inline __attribute__((always_inline)) void tile16_regs(__m512 t[16], const float *src, int64_t ld_src) {
    for (int i = 0; i < 16; i++) t[i] = _mm512_loadu_ps(src + i * ld_src);
    transpose16x16_ps(t);
}

/* dst rows are written whole lines at a time, straight to memory (streaming stores) where
 * they are line-aligned: a transpose's destination rows are far apart (attention's dK and dV
 * rows 16 KiB, in the qkv gradient), each 64-byte piece its own page and read for ownership
 * before being overwritten. Columns outer, so a band of 16 destination rows is finished
 * before the next: the attention backward's transposes ran 3.4x as fast (a probe, 8 heads of
 * [128 × 1024] into a 16 KiB stride: 3.6 -> 1.05 ms). Callers fence (transpose_done). */
static inline __attribute__((always_inline)) void tile16(float *dst, int64_t ld_dst, const float *src, int64_t ld_src,
                                                         bool stream) {
    __m512 t[16];
    tile16_regs(t, src, ld_src);
    if (stream)
        for (int i = 0; i < 16; i++) _mm512_stream_ps(dst + i * ld_dst, t[i]);
    else
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ld_dst, t[i]);
}
#endif

/* Columns [c0, c1) of src into rows [c0, c1) of dst, 16 × 16 tiles at a time. */
static void transpose_band(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t c0,
                           int64_t c1) {
#if defined(__AVX512F__)
    const bool stream = (uintptr_t)dst % 64 == 0 && ld_dst % 16 == 0;
#endif
    for (int64_t c = c0; c < c1; c += 16)
        for (int64_t r0 = 0; r0 < rows; r0 += 16) {
#if defined(__AVX512F__)
            if (r0 + 16 <= rows && c + 16 <= c1) {
                tile16(dst + c * ld_dst + r0, ld_dst, src + r0 * ld_src + c, ld_src, stream);
                continue;
            }
#endif
            int64_t re = r0 + 16 < rows ? r0 + 16 : rows, ce = c + 16 < c1 ? c + 16 : c1;
            for (int64_t i = r0; i < re; i++)
                for (int64_t j = c; j < ce; j++) dst[j * ld_dst + i] = src[i * ld_src + j];
        }
}

/* Streaming stores are weakly ordered: fence them before another thread may read dst. */
static void transpose_done(void) {
#if defined(__AVX512F__)
    _mm_sfence();
#endif
}

void transpose_f32(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t c0 = 0; c0 < cols; c0 += 64)
            transpose_band(dst, ld_dst, src, ld_src, rows, c0, c0 + 64 < cols ? c0 + 64 : cols);
        transpose_done(); /* each thread its own stores, before the region's closing barrier */
    }
}

void transpose_f32_serial(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
    transpose_band(dst, ld_dst, src, ld_src, rows, 0, cols);
    transpose_done();
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
