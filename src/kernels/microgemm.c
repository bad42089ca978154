#include "kernels/microgemm.h"

#include <immintrin.h>

#if defined(__AVX512F__)
/* Tiles of 4 rows × 32 columns: 8 accumulators of 16 lanes cover the FMA latency of two
 * pipes; B rows stream from cache, A values are broadcast. */
static inline __mmask16 lane_mask(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

void microgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
               int64_t csa, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (int64_t i0 = 0; i0 < M; i0 += 4) {
        int64_t mi = M - i0 < 4 ? M - i0 : 4;
        /* Rows past M repeat row i0: computed, never stored, so the loop needs no branches. */
        const float *a0 = A + i0 * rsa;
        const float *a1 = A + (i0 + (mi > 1 ? 1 : 0)) * rsa;
        const float *a2 = A + (i0 + (mi > 2 ? 2 : 0)) * rsa;
        const float *a3 = A + (i0 + (mi > 3 ? 3 : 0)) * rsa;
        for (int64_t j0 = 0; j0 < N; j0 += 32) {
            __mmask16 m0 = lane_mask(N - j0), m1 = lane_mask(N - j0 - 16);
            __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
            __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
            __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
            __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
            const float *b = B + j0;
            for (int64_t k = 0; k < K; k++) {
                __m512 b0 = _mm512_maskz_loadu_ps(m0, b + k * ldb);
                __m512 b1 = _mm512_maskz_loadu_ps(m1, b + k * ldb + 16);
                __m512 x;
                x = _mm512_set1_ps(a0[k * csa]);
                c00 = _mm512_fmadd_ps(x, b0, c00);
                c01 = _mm512_fmadd_ps(x, b1, c01);
                x = _mm512_set1_ps(a1[k * csa]);
                c10 = _mm512_fmadd_ps(x, b0, c10);
                c11 = _mm512_fmadd_ps(x, b1, c11);
                x = _mm512_set1_ps(a2[k * csa]);
                c20 = _mm512_fmadd_ps(x, b0, c20);
                c21 = _mm512_fmadd_ps(x, b1, c21);
                x = _mm512_set1_ps(a3[k * csa]);
                c30 = _mm512_fmadd_ps(x, b0, c30);
                c31 = _mm512_fmadd_ps(x, b1, c31);
            }
            __m512 rows[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
            for (int64_t r = 0; r < mi; r++) {
                float *c = C + (i0 + r) * ldc + j0;
                __m512 o0 = _mm512_mul_ps(va, rows[r][0]), o1 = _mm512_mul_ps(va, rows[r][1]);
                if (accumulate) {
                    o0 = _mm512_add_ps(o0, _mm512_maskz_loadu_ps(m0, c));
                    o1 = _mm512_add_ps(o1, _mm512_maskz_loadu_ps(m1, c + 16));
                }
                _mm512_mask_storeu_ps(c, m0, o0);
                _mm512_mask_storeu_ps(c + 16, m1, o1);
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
