#include "kernels/swiglu.h"

#include <math.h>

#include "kernels/vecmath.h"

/* sigmoid over n numbers: a vector at a time with the polynomial exp, the tail with expf. The
 * reciprocal is vf_recip: on AVX-512 rcp14 and one Newton step, as a 512-bit divide issuing
 * once per ~10 cycles was most of the loop. */
static void sigmoid_row(float *out, const float *x, int64_t n) {
    int64_t i = 0;
#if VF_LANES
    const vf one = vf_set1(1.0f);
    for (; i + VF_LANES <= n; i += VF_LANES)
        vf_store(out + i, vf_recip(vf_add(one, vf_exp(vf_sub(vf_zero(), vf_load(x + i))))));
#endif
    for (; i < n; i++) out[i] = 1.0f / (1.0f + expf(-x[i]));
}

enum { SWIGLU_TILE = 512 };

/* y[n] = silu(g)·u for n ≤ SWIGLU_TILE. */
static inline void swiglu_tile(float *y, const float *g, const float *u, int64_t n) {
    float sig[SWIGLU_TILE];
    sigmoid_row(sig, g, n);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j] = g[j] * sig[j] * u[j];
}

void swiglu_forward(float *h, int64_t ld_h, const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld_gate_up, *u = g + F;
        for (int64_t j0 = 0; j0 < F; j0 += SWIGLU_TILE)
            swiglu_tile(h + t * ld_h + j0, g + j0, u + j0, F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE);
    }
}

void swiglu_forward_bf16(bf16_t *h, int64_t ld_h, const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld_gate_up, *u = g + F;
        for (int64_t j0 = 0; j0 < F; j0 += SWIGLU_TILE) {
            int64_t n = F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE;
            float y[SWIGLU_TILE];
            swiglu_tile(y, g + j0, u + j0, n);
            bf16_from_f32_block(h + t * ld_h + j0, y, n);
        }
    }
}

/* dg[n], du[n] of the gate and up inputs for n ≤ SWIGLU_TILE. */
static inline void swiglu_backward_tile(float *dg, float *du, const float *g, const float *u, const float *dy,
                                        int64_t n) {
    float sig[SWIGLU_TILE];
    sigmoid_row(sig, g, n);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float x = g[j], s = sig[j];
        float silu = x * s;
        du[j] = dy[j] * silu;
        dg[j] = dy[j] * u[j] * s * (1.0f + x * (1.0f - s));
    }
}

void swiglu_backward(float *dgate_up, int64_t ld_dgate_up, const float *dh, int64_t ld_dh, const float *gate_up,
                     int64_t ld_gate_up, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld_gate_up, *u = g + F, *dy = dh + t * ld_dh;
        float *dg = dgate_up + t * ld_dgate_up, *du = dg + F;
        for (int64_t j0 = 0; j0 < F; j0 += SWIGLU_TILE)
            swiglu_backward_tile(dg + j0, du + j0, g + j0, u + j0, dy + j0, F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE);
    }
}

void swiglu_backward_bf16(bf16_t *dgate_up, int64_t ld_dgate_up, const float *dh, int64_t ld_dh,
                          const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld_gate_up, *u = g + F, *dy = dh + t * ld_dh;
        for (int64_t j0 = 0; j0 < F; j0 += SWIGLU_TILE) {
            int64_t n = F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE;
            float dg[SWIGLU_TILE], du[SWIGLU_TILE];
            swiglu_backward_tile(dg, du, g + j0, u + j0, dy + j0, n);
            bf16_from_f32_block(dgate_up + t * ld_dgate_up + j0, dg, n);
            bf16_from_f32_block(dgate_up + t * ld_dgate_up + F + j0, du, n);
        }
    }
}
