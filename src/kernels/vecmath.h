/* vecmath: 16-wide exp for the softmax, cross-entropy and SiLU loops. glibc vectorises expf
 * only under -ffast-math, which would also loosen every other loop, so the hot exponentials
 * use this one: 2^n · p(r) with a degree-6 polynomial, relative error below 2e-7. And a 16 × 16
 * transpose of 32-bit words in registers, for the fp32 transposes and the AMX packers. */
#ifndef STEPSCOPE_VECMATH_H
#define STEPSCOPE_VECMATH_H

#include <immintrin.h>
#include <math.h>

#if defined(__AVX512F__)
static inline __m512 exp512_ps(__m512 x) {
    /* Clamp so 2^n stays a normal float; below -87.3 the result flushes to 0 as expf's does
     * in float (what the softmax of a masked or tiny logit needs). */
    const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
    __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n·ln2 in two parts (Cody-Waite) keeps r exact enough for the polynomial. */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 r2 = _mm512_mul_ps(r, r);
    p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 result = _mm512_scalef_ps(p, n);
    return _mm512_maskz_mov_ps(~underflow, result);
}

/* r[0..16) as the rows of a 16 × 16 matrix of 32-bit words, transposed in place: pairs
 * interleaved, then 64-bit pairs, then the 128-bit lanes of the four row groups gathered, 64
 * shuffles with immediate or no indices (an index-table form built its tables on the stack at
 * every call and waited on the stores). */
static inline void transpose16x16_ps(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* Per 128-bit lane L, r[4g + j] now holds column 4L + j of rows 4g..4g+3: gather the lane
     * from the four row groups into one 16-row column. */
    for (int i = 0; i < 4; i++) {
        __m512 a = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x44), b = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x44);
        __m512 c = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xee), d = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xee);
        t[i] = _mm512_shuffle_f32x4(a, b, 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(a, b, 0xdd);
        t[8 + i] = _mm512_shuffle_f32x4(c, d, 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(c, d, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}
#endif

#endif
