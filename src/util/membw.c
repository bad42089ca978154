#include "util/membw.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "util/arena.h"
#include "util/clock.h"

enum { MIN_ROUNDS = 3, VEC = 16 };

/* a = b + s · c over n floats (a multiple of VEC; the arrays 64-byte aligned), in static halves
 * so each thread keeps the pages it touched first. a's stores stream: a plain store first reads
 * its line for ownership, 4 bytes an element the count leaves out. */
static void triad(float *a, const float *b, const float *c, float s, int64_t n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i += VEC) {
#if defined(__AVX512F__)
        _mm512_stream_ps(a + i, _mm512_fmadd_ps(_mm512_set1_ps(s), _mm512_load_ps(c + i), _mm512_load_ps(b + i)));
#elif defined(__AVX__)
        for (int h = 0; h < VEC; h += 8)
            _mm256_stream_ps(a + i + h, _mm256_add_ps(_mm256_load_ps(b + i + h),
                                                      _mm256_mul_ps(_mm256_set1_ps(s), _mm256_load_ps(c + i + h))));
#else
        for (int h = 0; h < VEC; h++) a[i + h] = b[i + h] + s * c[i + h];
#endif
    }
    _mm_sfence(); /* the streaming stores, before the clock is read */
}

/* a += s · b over n floats: a's lines are read before they are written, so no store needs a
 * read for ownership. */
static void update(float *a, const float *b, float s, int64_t n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) a[i] += s * b[i];
}

membw_t membw_probe_in(int threads, float *a, float *b, float *c, size_t array_bytes, double seconds) {
    membw_t r = {0};
    array_bytes &= ~(size_t)(VEC * sizeof(float) - 1);
    if (a && b && c && array_bytes > 0) {
        const int64_t n = (int64_t)(array_bytes / sizeof(float));
        const double bytes = 3.0 * (double)array_bytes;
        triad(a, b, c, 0.5f, n, threads); /* untimed: caches and TLBs warm; the values (zeros) do not matter */
        double start = clock_seconds();
        for (int round = 0; round < MIN_ROUNDS || clock_seconds() - start < seconds; round++) {
            double t0 = clock_seconds();
            triad(a, b, c, 0.5f, n, threads);
            double t1 = clock_seconds();
            update(a, b, 0.5f, n, threads);
            double t2 = clock_seconds();
            if (bytes / (t1 - t0) / 1e9 > r.triad_gbs) r.triad_gbs = bytes / (t1 - t0) / 1e9;
            if (bytes / (t2 - t1) / 1e9 > r.update_gbs) r.update_gbs = bytes / (t2 - t1) / 1e9;
        }
        r.best_gbs = r.triad_gbs > r.update_gbs ? r.triad_gbs : r.update_gbs;
    }
    return r;
}

membw_t membw_probe(int threads, size_t array_bytes, double seconds) {
    char err[256];
    float *a = arena_alloc(array_bytes, "membw a", err, sizeof err);
    float *b = arena_alloc(array_bytes, "membw b", err, sizeof err);
    float *c = arena_alloc(array_bytes, "membw c", err, sizeof err);
    membw_t r = membw_probe_in(threads, a, b, c, array_bytes, seconds);
    arena_free(a, array_bytes);
    arena_free(b, array_bytes);
    arena_free(c, array_bytes);
    return r;
}
