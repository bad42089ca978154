/* bf16: rounding fp32 to bfloat16 (round to nearest even, as AVX512-BF16's vcvtne2ps2bf16 and
 * torch's .to(torch.bfloat16) do) for the matmul inputs of dtype=bfloat16 runs. Master weights,
 * gradients, optimizer state and every non-matmul kernel stay fp32. */
#ifndef STEPSCOPE_BF16_H
#define STEPSCOPE_BF16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t bf16_t;

/* NaN stays a (quiet) NaN; everything else rounds to nearest even. */
static inline bf16_t bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

/* Stochastic rounding: up with probability (f's distance from the bf16 value below it) / (the
 * gap to the one above), from 16 random bits r: unbiased, E[bf16] = f. NaN as above. */
static inline bf16_t bf16_from_f32_stochastic(float f, uint32_t r) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    return (bf16_t)((u + (r & 0xffffu)) >> 16);
}

/* 32 well-mixed bits of x (Chris Wellons' lowbias32): the draws of stochastic rounding, by
 * index, so that they depend on neither threads nor shards. */
static inline uint32_t bf16_hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline float bf16_to_f32(bf16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* dst[n] = bf16(src[n]); threaded with OpenMP. */
void bf16_from_f32_array(bf16_t *dst, const float *src, int64_t n);

/* The same on the calling thread only, for kernels that fuse it into their own loops. */
void bf16_from_f32_block(bf16_t *dst, const float *src, int64_t n);

/* The same with streaming stores where dst is on a 64-byte line and n a multiple of 32 (else as
 * bf16_from_f32_block): for outputs read back from memory anyway, whose lines need not be read
 * for ownership first. The caller fences with _mm_sfence before another thread reads them. */
void bf16_from_f32_block_streamed(bf16_t *dst, const float *src, int64_t n);

/* dst[r·ld_dst + c] = bf16(src[r·ld_src + c]) for rows × cols; threaded with OpenMP. */
void bf16_from_f32_rows(bf16_t *dst, int64_t ld_dst, const float *src, int64_t ld_src, int64_t rows, int64_t cols);

#endif
