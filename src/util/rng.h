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

/* Standard normal by Box-Muller on two independent uniforms. */
static inline double rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    double u1 = rng_uniform(seed, stream, 2 * index), u2 = rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
