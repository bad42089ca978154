#include "kernels/gemm_widen.h"

#include <omp.h>
#include <string.h>

#include "kernels/bf16.h"

/* Blocks of up to BLOCK_MAX rows of op(A) and columns of op(B), so that each product is as
 * wide as [1024 × 1024] where the shape allows: at 512 × 512 oneDNN's gemm driver takes its
 * no-copy kernels, which ran such blocks at about half the rate on AVX2. K runs in equal
 * slices as deep as the scratch then allows (512 for two 1024-wide blocks), C carrying the
 * fp32 sum from slice to slice as the libraries' own K blocking does. */
enum { BLOCK_MAX = 1024, BLOCK_ALIGN = 16, WIDEN_PARALLEL_MIN = 1 << 15 };

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* n in equal blocks of at most max (a multiple of BLOCK_ALIGN): the block size, never above n. */
static int64_t even_block(int64_t n, int64_t max) {
    return min64(n, ceil_div(ceil_div(n, ceil_div(n, max)), BLOCK_ALIGN) * BLOCK_ALIGN);
}

/* The row stride of a widened block, 64 bytes wider where its rows are a multiple of 2 KiB
 * (every qwen3 width): at 4 KiB rows B's block crowded the L1 sets of oneDNN's no-copy kernels,
 * the LM head's input gradient (352 × 1024 blocks) ran at half the rate. At most 1/32 more. */
bool gemm_staged_pads(int64_t ld) { return ld % 512 == 0; }
static int64_t widened_ld(int64_t cols) { return gemm_staged_pads(cols) ? cols + 16 : cols; }

/* An operand: bf16 or fp32 elements, row stride ld. */
typedef struct {
    const void *base;
    bool bf16;
    int64_t ld;
} operand_t;

/* dst[rows × cols] (row stride widened_ld(cols)) = the block of src at row r0, column c0, in
 * fp32. */
static int64_t widen(float *dst, operand_t src, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
    int64_t ld_dst = widened_ld(cols);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols >= WIDEN_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t at = (r0 + r) * src.ld + c0;
        float *d = dst + r * ld_dst;
        if (!src.bf16) {
            memcpy(d, (const float *)src.base + at, (size_t)cols * sizeof(float));
            continue;
        }
        const bf16_t *s = (const bf16_t *)src.base + at;
        for (int64_t c = 0; c < cols; c++) d[c] = bf16_to_f32(s[c]);
    }
    return ld_dst;
}

static void staged(gemm_ctx_t *g, float *scratch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   operand_t A, operand_t B, float *C, int64_t ldc, bool accumulate) {
    int64_t mb = even_block(M, BLOCK_MAX), nb = even_block(N, BLOCK_MAX);
    int64_t kb = even_block(K, GEMM_WIDEN_BUDGET / (mb + nb) / BLOCK_ALIGN * BLOCK_ALIGN);
    float *wa = scratch, *wb = scratch + mb * kb + mb * kb / 32; /* past A's widest block, padding included */
    int64_t ld_a = 0, ld_b = 0;
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
        int64_t kc = min64(kb, K - k0);
        for (int64_t i0 = 0; i0 < M; i0 += mb) {
            int64_t mc = min64(mb, M - i0);
            /* Each block keeps its operand's orientation, so widening reads and writes rows. */
            ld_a = trans_a ? widen(wa, A, k0, i0, kc, mc) : widen(wa, A, i0, k0, mc, kc);
            for (int64_t j0 = 0; j0 < N; j0 += nb) {
                int64_t nc = min64(nb, N - j0);
                if (nb < N || i0 == 0) /* one block of B per slice: widened once */
                    ld_b = trans_b ? widen(wb, B, j0, k0, nc, kc) : widen(wb, B, k0, j0, kc, nc);
                gemm_f32(g, trans_a, trans_b, mc, nc, kc, wa, ld_a, wb, ld_b, C + i0 * ldc + j0, ldc,
                         accumulate || k0 > 0);
            }
        }
    }
}

void gemm_bf16_widened(gemm_ctx_t *g, float *scratch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                       bool accumulate) {
    staged(g, scratch, trans_a, trans_b, M, N, K, (operand_t){A, true, lda}, (operand_t){B, true, ldb}, C, ldc,
           accumulate);
}

void gemm_f32_staged(gemm_ctx_t *g, float *scratch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate) {
    staged(g, scratch, trans_a, trans_b, M, N, K, (operand_t){A, false, lda}, (operand_t){B, false, ldb}, C, ldc,
           accumulate);
}
