/* rng: counter-based random numbers. Element i of stream s under seed k is a pure function of
 * (k, s, i), so any thread can fill any range and the result never depends on the thread
 * count or the fill order. */
#ifndef STEPSCOPE_RNG_H
#define STEPSCOPE_RNG_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t rng_mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    return rng_mix64(rng_mix64(seed * 0x9e3779b97f4a7c15ULL + stream) ^ (index * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
}

/* Uniform in (0, 1): 53 random bits, never 0, so log() is safe. */
static inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return ((double)(rng_u64(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* ln(u) for a normal float u > 0, from its exponent and a degree-8 polynomial of the mantissa
 * reduced to [√2/2, √2) (Cephes' logf, within about an ulp). Only +, ×, fmaf and bit moves:
 * IEEE-exact operations, so a lane of a vectorised loop and a scalar call give the same bits.
 * No statement has a product and a sum a compiler could fuse on its own: the fused ones are
 * the explicit fmaf, so the bits are the same under gcc (fp-contract off in ISO C) and clang. */
static inline float rng_logf_(float u) {
    uint32_t b;
    memcpy(&b, &u, sizeof b);
    int32_t e = (int32_t)(b >> 23) - 127;
    uint32_t mb = (b & 0x7fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &mb, sizeof m);
    const int big = m > 1.41421356f;
    m = big ? 0.5f * m : m;
    e += big;
    const float x = m - 1.0f, z = x * x, fe = (float)e;
    float p = 7.0376836292e-2f;
    p = fmaf(p, x, -1.1514610310e-1f);
    p = fmaf(p, x, 1.1676998740e-1f);
    p = fmaf(p, x, -1.2420140846e-1f);
    p = fmaf(p, x, 1.4249322787e-1f);
    p = fmaf(p, x, -1.6668057665e-1f);
    p = fmaf(p, x, 2.0000714765e-1f);
    p = fmaf(p, x, -2.4999993993e-1f);
    p = fmaf(p, x, 3.3333331174e-1f);
    float y = x * z * p;
    y = fmaf(fe, -2.12194440e-4f, y);
    y = fmaf(-0.5f, z, y);
    return fmaf(fe, 0.693359375f, x + y);
}

/* Two standard normals, elements 2·pair and 2·pair + 1, by Box-Muller in float: one hash
 * gives both uniforms (24 bits each, u1 never 0, so |z| ≤ 5.9: tails past 5.9σ, about 4e-9
 * of draws, are cut, which an initialiser does not miss). The angle's top two bits pick its
 * quadrant and the other 22 place it within (-π/4, π/4) around the quadrant's axis, where
 * Cephes' sinf and cosf polynomials hold to about an ulp without range reduction; with
 * rng_logf_ the whole draw is arithmetic a compiler vectorises, the same bits in any lane.
 * glibc's scalar logf and sincosf per pair made qwen3-0.6b's init take 2.0 s on 2 threads
 * (Zen 5, 2026-12-07), most of a warm start-up. */
static inline void rng_normal_pair(uint64_t seed, uint64_t stream, uint64_t pair, float *z0, float *z1) {
    const uint64_t h = rng_u64(seed, stream, pair);
    const float u1 = ((float)(uint32_t)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
    const uint32_t v = (uint32_t)(h >> 8) & 0xffffffu, quadrant = v >> 22;
    const float r = sqrtf(-2.0f * rng_logf_(u1));
    /* fmaf, not a·b − c, which a compiler that contracts (clang's default) would fuse anyway */
    const float x = fmaf((float)(v & 0x3fffffu) + 0.5f, 1.57079632679f / 4194304.0f, -0.785398163397f);
    const float x2 = x * x;
    float sp = fmaf(-1.9515295891e-4f, x2, 8.3321608736e-3f);
    sp = fmaf(sp, x2, -1.6666654611e-1f);
    const float sin_x = fmaf(x * x2, sp, x);
    float cp = fmaf(2.443315711809948e-5f, x2, -1.388731625493765e-3f);
    cp = fmaf(cp, x2, 4.166664568298827e-2f);
    const float cos_x = fmaf(x2 * x2, cp, fmaf(-0.5f, x2, 1.0f));
    /* θ = quadrant·π/2 + x: (cos θ, sin θ) is (c, s), (-s, c), (-c, -s) or (s, -c). */
    const int odd = (int)(quadrant & 1u);
    const float c = odd ? sin_x : cos_x, s = odd ? cos_x : sin_x;
    const int neg_c = (int)(((quadrant + 1u) >> 1) & 1u), neg_s = (int)(quadrant >> 1);
    *z0 = r * (neg_c ? -c : c);
    *z1 = r * (neg_s ? -s : s);
}

#endif
