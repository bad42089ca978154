#include "util/peak.h"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { PROBE_ITERS = 1 << 16 };

/* 12 independent accumulators cover FMA latency × pipes; returns flops done. */
static double fma_burst(float seed, float *sink) {
#if defined(__AVX512F__)
    __m512 a[12], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (int it = 0; it < PROBE_ITERS; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16.0 * 12.0 * PROBE_ITERS;
#else
    float a[12 * 8];
    for (int i = 0; i < 12 * 8; i++) a[i] = seed + (float)i;
    for (int it = 0; it < PROBE_ITERS; it++)
#pragma omp simd
        for (int i = 0; i < 12 * 8; i++) a[i] = a[i] * 0.999999f + 1e-7f;
    float s = 0;
    for (int i = 0; i < 12 * 8; i++) s += a[i];
    *sink = s;
    return 2.0 * 12.0 * 8.0 * PROBE_ITERS;
#endif
}

double peak_probe_fp32_tflops(int num_threads, double seconds) {
    double best = 0.0;
    /* Several short rounds, keep the best: a busy neighbour only ever lowers a round. */
    for (int round = 0; round < 5; round++) {
        double flops = 0.0, t0 = now_seconds();
        float sink = 0.0f;
#pragma omp parallel num_threads(num_threads) reduction(+ : flops)
        {
            float local = 0.0f;
            while (now_seconds() - t0 < seconds / 5) flops += fma_burst((float)omp_get_thread_num(), &local);
#pragma omp atomic
            sink += local;
        }
        double rate = flops / (now_seconds() - t0) / 1e12;
        if (rate > best && sink == sink) best = rate;
    }
    return best;
}

const char *peak_probe_method(void) {
#if defined(__AVX512F__)
    return "probe: 12 independent 512-bit fp32 FMA chains per compute thread, best of 5 rounds";
#else
    return "probe: vectorised fp32 multiply-add chains per compute thread, best of 5 rounds";
#endif
}
