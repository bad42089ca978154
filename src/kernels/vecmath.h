/* vecmath: the CPU's widest float vector as one type, `vf` (16 lanes of AVX-512 or 8 of AVX2 +
 * FMA), so that each hot loop is written once and runs at full width on either ISA: loads,
 * stores (whole or the first n lanes), arithmetic, horizontal sums, a VF_LANES × VF_LANES
 * register transpose, bf16 rounding stores, and the exponential. glibc vectorises expf only
 * under -ffast-math, which would also loosen every other loop, so the hot exponentials use
 * vf_exp: 2^n · p(r) with a degree-6 polynomial, relative error below 2e-7, the same maths on
 * both ISAs. Without AVX2 (a plain x86-64 build) VF_LANES is 0 and callers run their scalar
 * loops. transpose16x16_ps, the 16 × 16 AVX-512 tile the AMX packers use, lives here too. */
#ifndef STEPSCOPE_VECMATH_H
#define STEPSCOPE_VECMATH_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kernels/bf16.h"

#if defined(__AVX512F__)
typedef __m512 vf;
typedef __m512i vi;
#define VF_LANES 16
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
/* Streaming store of a whole line-aligned vector (caller fences with _mm_sfence). */
static inline void vf_stream(float *p, vf x) { _mm512_stream_ps(p, x); }
static inline __mmask16 vf_mask_(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}
/* The first n lanes (n may be ≤ 0 or ≥ VF_LANES); the others read as 0, written not at all. */
static inline vf vf_load_n(const float *p, int64_t n) { return _mm512_maskz_loadu_ps(vf_mask_(n), p); }
static inline void vf_store_n(float *p, vf x, int64_t n) { _mm512_mask_storeu_ps(p, vf_mask_(n), x); }
static inline vf vf_keep_n(vf x, int64_t n) { return _mm512_maskz_mov_ps(vf_mask_(n), x); } /* rest 0 */
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }   /* a·b + c */
static inline vf vf_fmsub(vf a, vf b, vf c) { return _mm512_fmsub_ps(a, b, c); }   /* a·b − c */
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); } /* c − a·b */
static inline float vf_reduce_add(vf x) { return _mm512_reduce_add_ps(x); }
static inline float vf_reduce_max(vf x) { return _mm512_reduce_max_ps(x); }
static inline vf vf_round(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 1/d: rcp14 and one Newton step (relative error ~2⁻²⁸ before rounding, within an ulp of the
 * quotient), as a 512-bit divide issues once per ~10 cycles. */
static inline vf vf_recip(vf d) {
    vf r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}
/* p · 2^n for integral n in [-126, 128], rounded once. */
static inline vf vf_scale2_(vf p, vf n) { return _mm512_scalef_ps(p, n); }
/* x where keep, else 0, keep = x ≥ lo. */
static inline vf vf_zero_below_(vf x, vf v, vf lo) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, lo, _CMP_GE_OQ), x);
}
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vf;
typedef __m256i vi;
#define VF_LANES 8
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline void vf_stream(float *p, vf x) { _mm256_stream_ps(p, x); }
static inline __m256i vf_mask_(int64_t n) {
    int32_t k = n >= 8 ? 8 : n <= 0 ? 0 : (int32_t)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load_n(const float *p, int64_t n) { return _mm256_maskload_ps(p, vf_mask_(n)); }
static inline void vf_store_n(float *p, vf x, int64_t n) { _mm256_maskstore_ps(p, vf_mask_(n), x); }
static inline vf vf_keep_n(vf x, int64_t n) { return _mm256_and_ps(x, _mm256_castsi256_ps(vf_mask_(n))); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_fmsub(vf a, vf b, vf c) { return _mm256_fmsub_ps(a, b, c); }
static inline vf vf_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
static inline float vf_reduce_add(vf x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float vf_reduce_max(vf x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline vf vf_round(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* rcp_ps has 12 bits, one Newton step 23: a divide (one per ~3.5 cycles for 8 lanes on Zen 3)
 * is exact and costs little more. */
static inline vf vf_recip(vf d) { return _mm256_div_ps(_mm256_set1_ps(1.0f), d); }
/* p · 2^n as p · 2^⌊n/2⌋ · 2^(n−⌊n/2⌋): each factor a normal float for n in [-126, 128], the
 * first product exact, so the result is rounded once, as AVX-512's scalef rounds it. */
static inline vf vf_scale2_(vf p, vf n) {
    __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1), l = _mm256_sub_epi32(ni, h);
    const __m256i bias = _mm256_set1_epi32(127);
    vf ph = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
    vf pl = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(l, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, ph), pl);
}
static inline vf vf_zero_below_(vf x, vf v, vf lo) { return _mm256_and_ps(x, _mm256_cmp_ps(v, lo, _CMP_GE_OQ)); }
#else
#define VF_LANES 0
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
static inline vf vf_exp(vf x) {
    /* Clamp so 2^n stays a normal float; below -87.3 the result flushes to 0 as expf's does
     * in float (what the softmax of a masked or tiny logit needs). */
    const vf lo = vf_set1(-87.33654f), hi = vf_set1(88.72283f);
    vf xc = vf_min(vf_max(x, lo), hi);
    vf n = vf_round(vf_mul(xc, vf_set1(1.44269504088896341f)));
    /* r = x - n·ln2 in two parts (Cody-Waite) keeps r exact enough for the polynomial. */
    vf r = vf_fnmadd(n, vf_set1(0.693359375f), xc);
    r = vf_fnmadd(n, vf_set1(-2.12194440e-4f), r);
    vf p = vf_set1(1.9875691500e-4f);
    p = vf_fmadd(p, r, vf_set1(1.3981999507e-3f));
    p = vf_fmadd(p, r, vf_set1(8.3334519073e-3f));
    p = vf_fmadd(p, r, vf_set1(4.1665795894e-2f));
    p = vf_fmadd(p, r, vf_set1(1.6666665459e-1f));
    p = vf_fmadd(p, r, vf_set1(5.0000001201e-1f));
    p = vf_fmadd(p, vf_mul(r, r), vf_add(r, vf_set1(1.0f)));
    return vf_zero_below_(vf_scale2_(p, n), x, lo);
}

/* exp(scale·p[i] − shift) in the first n lanes (n may be ≤ 0 or ≥ VF_LANES), reading only those
 * floats; 0 in the rest: a row's last keys in one vector instead of a scalar tail of expf. */
static inline vf vf_exp_affine_n(const float *p, int64_t n, vf scale, vf shift) {
    return vf_keep_n(vf_exp(vf_fmsub(vf_load_n(p, n), scale, shift)), n);
}

#if defined(__AVX512F__)
/* x rounded to 16 bf16 the integer way (nearest even, NaN kept quiet): bf16_from_f32 on 16 lanes. */
static inline __m256i bf16x16_round_int_(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
#endif

#if defined(__AVX512BF16__)
/* vcvtneps2bf16 treats fp32 subnormal inputs as zero (measured on the Zen 5: 0x007fffff gave
 * 0x0000, not bf16_from_f32's 0x0080), where bf16_from_f32, like torch's conversion, rounds
 * them. The lanes with a zero exponent and a non-zero fraction, rare in practice, are redone
 * the integer way, so every path gives bf16_from_f32's bits. */
static inline __mmask16 bf16_subnormal_lanes_(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) & _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7fffff));
}
static inline __m256i bf16x16_from_ps(__m512 x) {
    __m256i r = (__m256i)_mm512_cvtneps_pbh(x);
    __mmask16 sub = bf16_subnormal_lanes_(x);
    if (__builtin_expect(sub != 0, 0)) r = _mm256_mask_mov_epi16(r, sub, bf16x16_round_int_(x));
    return r;
}
/* 32 bf16: lanes 0-15 from lo, 16-31 from hi (vcvtne2ps2bf16's order), subnormals as above. */
static inline __m512i bf16x32_from_ps(__m512 lo, __m512 hi) {
    __m512i r = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    __mmask32 sub = (__mmask32)bf16_subnormal_lanes_(lo) | (__mmask32)bf16_subnormal_lanes_(hi) << 16;
    if (__builtin_expect(sub != 0, 0)) {
        __m512i exact = _mm512_inserti64x4(_mm512_castsi256_si512(bf16x16_round_int_(lo)), bf16x16_round_int_(hi), 1);
        r = _mm512_mask_mov_epi16(r, sub, exact);
    }
    return r;
}
/* The same for inputs with no subnormal lanes, such as vf_exp's results (it gives 0 below
 * FLT_MIN): the rounding as it is, without the test. In the bf16 attention kernels' softmax the
 * test was a sixth of the work (the forward 1.035x without it, Zen 5, 2026-12-04). */
static inline __m256i bf16x16_from_normal_ps(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }
static inline __m512i bf16x32_from_normal_ps(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }
/* The 16 (lo[c], hi[c]) pairs of a bf16x32_from_ps(lo, hi) result, in column order: one row of
 * a packed tile (amx.h's layout), whose 32-bit words each hold a pair of rows' values. */
static inline __m512i bf16x32_interleave_halves(__m512i both) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, both);
}
#endif

/* Rounds x to bf16 (nearest even, NaN kept quiet, as bf16_from_f32) into dst[VF_LANES]. */
static inline void vf_store_bf16(bf16_t *dst, vf x) {
#if defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i *)dst, bf16x16_from_ps(x));
#elif defined(__AVX512F__)
    _mm256_storeu_si256((__m256i *)dst, bf16x16_round_int_(x));
#else
    __m256i u = _mm256_castps_si256(x);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                     _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    /* packus works within 128-bit lanes: pack, then bring the two lanes' low halves together. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(packed));
#endif
}
/* The same for x with no subnormal lanes (vf_exp's results). */
static inline void vf_store_bf16_normal(bf16_t *dst, vf x) {
#if defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i *)dst, bf16x16_from_normal_ps(x));
#else
    vf_store_bf16(dst, x);
#endif
}
#endif

#if defined(__AVX512F__)
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
static inline void vf_transpose(vf r[VF_LANES]) { transpose16x16_ps(r); }
#elif defined(__AVX2__) && defined(__FMA__)
/* The 8 × 8 form: pairs, 64-bit pairs, then the 128-bit halves swapped across rows 4 apart. */
static inline void vf_transpose(vf r[VF_LANES]) {
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}
#endif

#endif
