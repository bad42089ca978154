#include "kernels/bf16.h"

#include <immintrin.h>
#include <stdint.h>

#include "kernels/vecmath.h"

void bf16_from_f32_block(bf16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512BF16__
    for (; i + 32 <= n; i += 32) {
        _mm512_storeu_si512((void *)(dst + i), bf16x32_from_ps(_mm512_loadu_ps(src + i), _mm512_loadu_ps(src + i + 16)));
    }
#elif VF_LANES
    for (; i + VF_LANES <= n; i += VF_LANES) vf_store_bf16(dst + i, vf_load(src + i));
#endif
    for (; i < n; i++) dst[i] = bf16_from_f32(src[i]);
}

void bf16_from_f32_block_streamed(bf16_t *dst, const float *src, int64_t n) {
#ifdef __AVX512BF16__
    if (n % 32 == 0 && ((uintptr_t)dst & 63) == 0) {
        for (int64_t i = 0; i < n; i += 32)
            _mm512_stream_si512((void *)(dst + i), bf16x32_from_ps(_mm512_loadu_ps(src + i), _mm512_loadu_ps(src + i + 16)));
        return;
    }
#endif
    bf16_from_f32_block(dst, src, n);
}

void bf16_from_f32_array(bf16_t *dst, const float *src, int64_t n) {
    /* Fixed blocks keep the split independent of the thread count. */
    const int64_t block = 4096;
    int64_t nblocks = (n + block - 1) / block;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t i = b * block;
        bf16_from_f32_block(dst + i, src + i, i + block < n ? block : n - i);
    }
}

void bf16_from_f32_rows(bf16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols) {
    if (ld_dst == cols && ld_src == cols) {
        bf16_from_f32_array(dst, src, rows * cols);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) bf16_from_f32_block(dst + r * ld_dst, src + r * ld_src, cols);
}
