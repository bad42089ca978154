#include "util/peak.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "kernels/amx.h"
#include "kernels/vecmath.h"
#include "util/clock.h"

enum { PROBE_ITERS = 1 << 16 };

/* 12 independent accumulators cover FMA latency × pipes (4 × 2 on AVX-512 parts, 4-5 × 2 on
 * Zen's AVX2); returns flops done. */
static double fma_burst(float seed, float *sink) {
#if VF_LANES
    vf a[12], x = vf_set1(0.999999f), y = vf_set1(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = vf_set1(seed + (float)i);
    for (int it = 0; it < PROBE_ITERS; it++)
        for (int i = 0; i < 12; i++) a[i] = vf_fmadd(a[i], x, y);
    vf s = a[0];
    for (int i = 1; i < 12; i++) s = vf_add(s, a[i]);
    *sink = vf_reduce_add(s);
    return 2.0 * VF_LANES * 12.0 * PROBE_ITERS;
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

/* The bf16 counterpart: vdpbf16ps multiplies 32 bf16 pairs and adds them into 16 fp32 lanes,
 * 64 flops per instruction by the usual 2-per-multiply-add count. 16 accumulators, not the
 * FMA probe's 12: its latency is longer than the FMA's, and on the Zen 5 12 chains read
 * 0.985 TFLOP/s on 2 threads where 16 read 1.067-1.071, twice the FMA rate as the unit's
 * width says (a scratch probe, 2026-12-06; 8 chains 0.71, 24 spill registers). The 12-chain
 * figure had overstated every bf16 MFU there by 8%. */
#define DP_CHAINS 16 /* a macro, so that peak_probe_method's text says it too */
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)
static double dpbf16_burst(float seed, float *sink) {
#if defined(__AVX512BF16__)
    __m512 a[DP_CHAINS];
    __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
    for (int i = 0; i < DP_CHAINS; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (int it = 0; it < PROBE_ITERS; it++)
        for (int i = 0; i < DP_CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], x, x);
    __m512 s = a[0];
    for (int i = 1; i < DP_CHAINS; i++) s = _mm512_add_ps(s, a[i]);
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 32.0 * DP_CHAINS * PROBE_ITERS;
#else
    return fma_burst(seed, sink); /* no bf16 dot product: bf16 runs at the fp32 rate */
#endif
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* Where the CPU has AMX tiles (Intel Sapphire Rapids and later), the bf16 matmuls run on them,
 * far above the vector units: probe them the same way, with four independent tile
 * accumulators (amx_available() also asks Linux for the tile state). */
static double amx_burst(float seed, float *sink) {
    amx_configure_full_tiles();
    /* Non-zero operands with varied bits: tiles of zeros ran 1.2-1.3x faster than real data on
     * the Intel VM measured (2.7-2.9 against 2.1-2.3 TFLOP/s a core), and a peak real products
     * cannot reach would understate MFU. Magnitudes ~1e-3: the sums stay far from overflow. */
    uint16_t operand[16 * 32 + 8]; /* two overlapping 16 × 32 tiles */
    for (int i = 0; i < 16 * 32 + 8; i++)
        operand[i] = (uint16_t)((i & 1 ? 0xba80u : 0x3a80u) + (uint16_t)((i * 37 + (int)seed) % 128));
    float out[16 * 16];
    _tile_loadd(4, operand, 64);
    _tile_loadd(5, operand + 8, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int it = 0; it < PROBE_ITERS / 16; it++) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    *sink = out[0] + seed;
    /* Each instruction: [16×32]·[32×16] bf16 into [16×16] fp32. */
    return 2.0 * 16.0 * 16.0 * 32.0 * 4.0 * (PROBE_ITERS / 16);
}
#endif

#if defined(__AVX512F__) && defined(__FMA__)
/* fma_burst's chains at half the width: where a CPU runs a 512-bit FMA as two 256-bit halves
 * (the Zen 4; the Zen 5 VM of MACHINE.md in its slow phases), the two read the same. */
static double fma256_burst(float seed, float *sink) {
    __m256 a[12], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(seed + (float)i);
    for (int it = 0; it < PROBE_ITERS; it++)
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], x, y);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    *sink = lanes[0] + lanes[7];
    return 2.0 * 8.0 * 12.0 * PROBE_ITERS;
}
#endif

static double (*probe_burst(bool bf16))(float, float *) {
    if (!bf16) return fma_burst;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (amx_available()) return amx_burst;
#endif
    return dpbf16_burst;
}

static double probe_with(double (*burst)(float, float *), int num_threads, double seconds) {
    double best = 0.0;
    /* Several short rounds, keep the best: a busy neighbour only ever lowers a round. */
    for (int round = 0; round < 5; round++) {
        double flops = 0.0, t0 = clock_seconds();
        float sink = 0.0f;
#pragma omp parallel num_threads(num_threads) reduction(+ : flops)
        {
            float local = 0.0f;
            while (clock_seconds() - t0 < seconds / 5) flops += burst((float)omp_get_thread_num(), &local);
#pragma omp atomic
            sink += local;
        }
        double rate = flops / (clock_seconds() - t0) / 1e12;
        if (rate > best && sink == sink) best = rate;
    }
    return best;
}

double peak_probe_tflops(bool bf16, int num_threads, double seconds) {
    return probe_with(probe_burst(bf16), num_threads, seconds);
}

double peak_probe_fp32_256_tflops(int num_threads, double seconds) {
#if defined(__AVX512F__) && defined(__FMA__)
    return probe_with(fma256_burst, num_threads, seconds);
#else
    (void)num_threads, (void)seconds;
    return 0.0;
#endif
}

const char *peak_probe_method(bool bf16) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (bf16 && amx_available()) return "probe: 4 independent AMX tile bf16 dot-product (tdpbf16ps) chains per compute thread, best of 5 rounds";
#endif
#if defined(__AVX512BF16__)
    if (bf16)
        return "probe: " STRINGIFY(DP_CHAINS) " independent 512-bit bf16 dot-product (vdpbf16ps) chains per compute thread, "
               "best of 5 rounds";
#endif
    /* Without a bf16 unit the bf16 products are widened to fp32 and run at its rate. */
#if defined(__AVX512F__)
#define FP32_PROBE "12 independent 512-bit fp32 FMA chains per compute thread, best of 5 rounds"
#elif VF_LANES
#define FP32_PROBE "12 independent 256-bit fp32 FMA chains per compute thread, best of 5 rounds"
#else
#define FP32_PROBE "vectorised fp32 multiply-add chains per compute thread, best of 5 rounds"
#endif
    return bf16 ? "probe: no bf16 unit, so the fp32 rate: " FP32_PROBE : "probe: " FP32_PROBE;
}
