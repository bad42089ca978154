#include "kernels/transpose.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels/vecmath.h"

#if VF_LANES
/* One VF_LANES-square tile of src into registers, transposed: t[j] is column j. */
static inline __attribute__((always_inline)) void tile_regs(vf t[VF_LANES], const float *src, int64_t ld_src) {
    for (int i = 0; i < VF_LANES; i++) t[i] = vf_load(src + i * ld_src);
    vf_transpose(t);
}

/* dst rows are written whole vectors at a time, straight to memory (streaming stores) where
 * they are aligned: a transpose's destination rows are far apart (attention's dK and dV
 * rows 16 KiB, in the qkv gradient), each 64-byte piece its own page and read for ownership
 * before being overwritten. Columns outer, so a band of destination rows is finished
 * before the next: the attention backward's transposes ran 3.4x as fast (a probe, 8 heads of
 * [128 × 1024] into a 16 KiB stride: 3.6 -> 1.05 ms, AVX-512). Callers fence (transpose_done). */
static inline __attribute__((always_inline)) void tile(float *dst, int64_t ld_dst, const float *src, int64_t ld_src,
                                                       bool stream) {
    vf t[VF_LANES];
    tile_regs(t, src, ld_src);
    if (stream)
        for (int i = 0; i < VF_LANES; i++) vf_stream(dst + i * ld_dst, t[i]);
    else
        for (int i = 0; i < VF_LANES; i++) vf_store(dst + i * ld_dst, t[i]);
}
#endif

/* Columns [c0, c1) of src into rows [c0, c1) of dst, 16 × 16 tiles at a time (VF_LANES-square
 * register tiles inside them). */
static void transpose_band(float *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t c0,
                           int64_t c1) {
#if VF_LANES
    const int64_t L = VF_LANES;
    const bool stream = (uintptr_t)dst % (4 * L) == 0 && ld_dst % L == 0;
#endif
    for (int64_t c = c0; c < c1; c += 16)
        for (int64_t r0 = 0; r0 < rows; r0 += 16) {
#if VF_LANES
            if (r0 + 16 <= rows && c + 16 <= c1) {
                for (int64_t tc = 0; tc < 16; tc += L)
                    for (int64_t tr = 0; tr < 16; tr += L)
                        tile(dst + (c + tc) * ld_dst + r0 + tr, ld_dst, src + (r0 + tr) * ld_src + c + tc, ld_src, stream);
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
#if VF_LANES
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
#if VF_LANES
            if (r0 + 16 <= rows && c0 + 16 <= cols) {
                const int64_t L = VF_LANES;
                for (int64_t tc = 0; tc < 16; tc += L)
                    for (int64_t tr = 0; tr < 16; tr += L) {
                        vf t[VF_LANES];
                        tile_regs(t, src + (r0 + tr) * ld_src + c0 + tc, ld_src);
                        for (int i = 0; i < VF_LANES; i++) vf_store_bf16(dst + (c0 + tc + i) * ld_dst + r0 + tr, t[i]);
                    }
                continue;
            }
#endif
            int64_t re = r0 + 16 < rows ? r0 + 16 : rows, ce = c0 + 16 < cols ? c0 + 16 : cols;
            for (int64_t i = r0; i < re; i++)
                for (int64_t j = c0; j < ce; j++) dst[j * ld_dst + i] = bf16_from_f32(src[i * ld_src + j]);
        }
}
