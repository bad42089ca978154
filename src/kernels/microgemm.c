#include "kernels/microgemm.h"

#include <immintrin.h>

#if defined(__AVX512F__)
/* Tiles of 8 rows × 32 columns: 16 accumulators of 16 lanes, two B vectors and one broadcast
 * A value stay in registers (19 of 32). Each B row loaded from cache feeds 16 FMAs, so the
 * kernel is bound by the FMA pipes rather than by loads (a 4-row tile fed 8 and was not). */
enum { MR = 8 };

static inline __mmask16 lane_mask(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

void microgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
               int64_t csa, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t i0 = 0; i0 < M; i0 += MR) {
        int64_t mi = M - i0 < MR ? M - i0 : MR;
        /* Rows past M repeat row i0: computed, never stored, so the loop needs no branches. */
        const float *a[MR];
        for (int r = 0; r < MR; r++) a[r] = A + (i0 + (r < mi ? r : 0)) * rsa;
        for (int64_t j0 = 0; j0 < N; j0 += 32) {
            __mmask16 m0 = lane_mask(N - j0), m1 = lane_mask(N - j0 - 16);
            __m512 c[MR][2];
            for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm512_setzero_ps();
            const float *b = B + j0;
            for (int64_t k = 0; k < K; k++) {
                __m512 b0 = _mm512_maskz_loadu_ps(m0, b + k * ldb);
                __m512 b1 = _mm512_maskz_loadu_ps(m1, b + k * ldb + 16);
#pragma GCC unroll 8
                for (int r = 0; r < MR; r++) {
                    __m512 x = _mm512_set1_ps(a[r][k * csa]);
                    c[r][0] = _mm512_fmadd_ps(x, b0, c[r][0]);
                    c[r][1] = _mm512_fmadd_ps(x, b1, c[r][1]);
                }
            }
            /* Unrolled with constant r so the accumulators stay registers, not a stack array. */
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                if (r >= mi) break;
                float *cp = C + (i0 + r) * ldc + j0;
                __m512 o0 = _mm512_mul_ps(va, c[r][0]), o1 = _mm512_mul_ps(va, c[r][1]);
                if (accumulate) {
                    o0 = _mm512_add_ps(o0, _mm512_maskz_loadu_ps(m0, cp));
                    o1 = _mm512_add_ps(o1, _mm512_maskz_loadu_ps(m1, cp + 16));
                }
                _mm512_mask_storeu_ps(cp, m0, o0);
                _mm512_mask_storeu_ps(cp + 16, m1, o1);
            }
        }
    }
}
#else
void microgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
               int64_t csa, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += A[i * rsa + k * csa] * B[k * ldb + j];
            C[i * ldc + j] = alpha * acc + (accumulate ? C[i * ldc + j] : 0.0f);
        }
}
#endif
