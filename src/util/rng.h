/* rng: counter-based random numbers. Element i of stream s under seed k is a pure function of
 * (k, s, i), so any thread can fill any range and the result never depends on the thread
 * count or the fill order. */
#ifndef STEPSCOPE_RNG_H
#define STEPSCOPE_RNG_H

#include <math.h>
#include <stdint.h>

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

/* Two standard normals, elements 2·pair and 2·pair + 1, by Box-Muller in float: one hash
 * gives both uniforms (24 bits each, u1 never 0, so |z| ≤ 5.9: tails past 5.9σ, about 4e-9
 * of draws, are cut, which an initialiser does not miss). Float math and using both
 * outputs make it several times cheaper than a double per value, which is what bounds a
 * large model's start-up. */
static inline void rng_normal_pair(uint64_t seed, uint64_t stream, uint64_t pair, float *z0, float *z1) {
    uint64_t h = rng_u64(seed, stream, pair);
    float u1 = ((float)(uint32_t)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = (float)(uint32_t)((h >> 8) & 0xffffffu) * (1.0f / 16777216.0f);
    float r = sqrtf(-2.0f * logf(u1)), theta = 6.2831853f * u2;
    *z0 = r * cosf(theta);
    *z1 = r * sinf(theta);
}

#endif
