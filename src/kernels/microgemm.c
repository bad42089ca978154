#include "kernels/microgemm.h"

#include "kernels/vecmath.h"

#if VF_LANES
/* Tiles of MR rows × two vectors of columns: 2·MR accumulators, two B vectors and one
 * broadcast A value stay in registers. AVX-512 (32 registers): 8 × 32, 19 of 32. AVX2 (16):
 * 6 × 16, 15 of 16, the shape of BLIS's Haswell kernel. Each B row loaded from cache feeds
 * 2·MR FMAs, so the kernel is bound by the FMA pipes rather than by loads (a 4-row tile on
 * AVX-512 fed 8 and was not). */
#if VF_LANES == 16
enum { MR = 8 };
const char *microgemm_kind(void) { return "AVX-512 micro-GEMM (8 x 32 register tiles)"; }
#else
enum { MR = 6 };
const char *microgemm_kind(void) { return "AVX2 micro-GEMM (6 x 16 register tiles)"; }
#endif
enum { NR = 2 * VF_LANES };

/* c += A rows a[0..MR) (k-th element at a[r][k·csa]) times B's columns [n0 | n1 lanes). */
static inline __attribute__((always_inline)) void tile_loop(vf c[MR][2], const float *const a[MR], int64_t csa,
                                                            const float *b, int64_t ldb, int64_t K, int64_t n0,
                                                            int64_t n1, bool masked) {
    /* Four k per branch. On AVX2 one k per branch ran at 0.73-0.85 of the FMA probe on the Zen 3,
     * unrolled 1.05-1.2x faster (operands in L1, alternated round by round). On AVX-512 the
     * Zen 5 ran the same either way (attention at S = 1024: forward 1.01-1.03x, backward
     * 0.99-1.00x), and the Intel Xeon (family 6 model 167) ran faster unrolled: the hot tile went
     * from 0.78 to 0.82 of the probe at 128x128x128 and from 0.735 to 0.845 at 128x32x1024
     * (bench/microgemm_probe), attention forward 1.05x and backward 1.04x (three alternated runs
     * of bench/attention). The arithmetic order is unchanged, so the results are bit-identical. */
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        vf b0 = masked ? vf_load_n(b + k * ldb, n0) : vf_load(b + k * ldb);
        vf b1 = masked ? vf_load_n(b + k * ldb + VF_LANES, n1) : vf_load(b + k * ldb + VF_LANES);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            vf x = vf_set1(a[r][k * csa]);
            c[r][0] = vf_fmadd(x, b0, c[r][0]);
            c[r][1] = vf_fmadd(x, b1, c[r][1]);
        }
    }
}

void microgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
               int64_t csa, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate) {
    const vf va = vf_set1(alpha);
    for (int64_t i0 = 0; i0 < M; i0 += MR) {
        int64_t mi = M - i0 < MR ? M - i0 : MR;
        /* Rows past M repeat row i0: computed, never stored, so the loop needs no branches. */
        const float *a[MR];
        for (int r = 0; r < MR; r++) a[r] = A + (i0 + (r < mi ? r : 0)) * rsa;
        for (int64_t j0 = 0; j0 < N; j0 += NR) {
            const int64_t n0 = N - j0, n1 = N - j0 - VF_LANES;
            const bool whole = n0 >= NR;
            vf c[MR][2];
            for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = vf_zero();
            const float *b = B + j0;
            /* Two copies of the loop (tile_loop inlined with a constant `masked`): on AVX2 a mask
             * is a register, and the 16 are all taken by a whole tile's 12 accumulators, 2 B
             * vectors and the broadcast; with the mask live, every k reloaded it from the stack. */
            if (whole) tile_loop(c, a, csa, b, ldb, K, n0, n1, false);
            else tile_loop(c, a, csa, b, ldb, K, n0, n1, true);
            /* Unrolled with constant r so the accumulators stay registers, not a stack array. */
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                if (r >= mi) break;
                float *cp = C + (i0 + r) * ldc + j0;
                vf o0 = vf_mul(va, c[r][0]), o1 = vf_mul(va, c[r][1]);
                if (whole) {
                    if (accumulate) o0 = vf_add(o0, vf_load(cp)), o1 = vf_add(o1, vf_load(cp + VF_LANES));
                    vf_store(cp, o0);
                    vf_store(cp + VF_LANES, o1);
                    continue;
                }
                if (accumulate) {
                    o0 = vf_add(o0, vf_load_n(cp, n0));
                    o1 = vf_add(o1, vf_load_n(cp + VF_LANES, n1));
                }
                vf_store_n(cp, o0, n0);
                vf_store_n(cp + VF_LANES, o1, n1);
            }
        }
    }
}
#else
const char *microgemm_kind(void) { return "scalar micro-GEMM (a build without AVX2)"; }

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
