#include "kernels/swiglu.h"

#include <immintrin.h>
#include <math.h>

#include "kernels/vecmath.h"

enum { SWIGLU_TILE = 512 };

/* The loops ask for their inputs' lines SWIGLU_AHEAD floats ahead in each stream (a row's gate,
 * up or dh columns, then the next row's), a line per stream every 16 floats: the rows are read
 * once, from memory, and with the hardware prefetcher alone the loop waited on them (a scratch
 * probe on the Zen 5 at qwen3-0.6b's [1024, 2 x 3072]: 19-21 GB/s). */
enum { SWIGLU_AHEAD = 2 * SWIGLU_TILE };

/* Where tile j0's lines SWIGLU_AHEAD on lie in a stream whose row is `row` and whose next row is
 * `next` (NULL after the last row), `cols` wide: a run of SWIGLU_TILE floats inside one of the
 * two rows, or else tile j0 itself (its lines are in cache: asking for them costs nothing), so
 * that no prefetch address leaves the buffer. */
static inline const float *ahead(const float *row, const float *next, int64_t j0, int64_t cols) {
    int64_t j = j0 + SWIGLU_AHEAD;
    if (j + SWIGLU_TILE <= cols) return row + j;
    if (next && j >= cols && j - cols + SWIGLU_TILE <= cols) return next + (j - cols);
    return row + j0;
}

typedef struct streams_ahead {
    const float *p[3];
} streams_ahead_t;

/* The gate and up streams of row t of gate_up, and of dh, ahead of tile j0; without dh (the
 * forward) the third is the gate's again, a repeat that costs a prefetch instruction. */
static inline streams_ahead_t streams_ahead(const float *gate_up, int64_t ld_gate_up, const float *dh, int64_t ld_dh,
                                            int64_t t, int64_t T, int64_t j0, int64_t F) {
    const float *g = gate_up + t * ld_gate_up, *gn = t + 1 < T ? g + ld_gate_up : NULL;
    const float *d = dh ? dh + t * ld_dh : g, *dn = dh && t + 1 < T ? d + ld_dh : NULL;
    return (streams_ahead_t){{ahead(g, gn, j0, F), ahead(g + F, gn ? gn + F : NULL, j0, F), ahead(d, dn, j0, F)}};
}

/* sigmoid over n numbers: a vector at a time with the polynomial exp, the tail with expf, asking
 * for the three streams' lines ahead as it goes. The reciprocal is vf_recip: on AVX-512 rcp14 and
 * one Newton step, as a 512-bit divide issuing once per ~10 cycles was most of the loop. */
static void sigmoid_row(float *out, const float *x, int64_t n, streams_ahead_t pf) {
    int64_t i = 0;
#if VF_LANES
    const vf one = vf_set1(1.0f);
    for (; i + VF_LANES <= n; i += VF_LANES) {
        if (i % 16 == 0)
            for (int s = 0; s < 3; s++) _mm_prefetch((const char *)(pf.p[s] + i), _MM_HINT_T0);
        vf_store(out + i, vf_recip(vf_add(one, vf_exp(vf_sub(vf_zero(), vf_load(x + i))))));
    }
#endif
    for (; i < n; i++) out[i] = 1.0f / (1.0f + expf(-x[i]));
}

/* y[n] = silu(g)·u for n ≤ SWIGLU_TILE. */
static inline void swiglu_tile(float *y, const float *g, const float *u, int64_t n, streams_ahead_t pf) {
    float sig[SWIGLU_TILE];
    sigmoid_row(sig, g, n, pf);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j] = g[j] * sig[j] * u[j];
}

void swiglu_forward(float *h, int64_t ld_h, const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld_gate_up, *u = g + F;
        for (int64_t j0 = 0; j0 < F; j0 += SWIGLU_TILE)
            swiglu_tile(h + t * ld_h + j0, g + j0, u + j0, F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE,
                        streams_ahead(gate_up, ld_gate_up, NULL, 0, t, T, j0, F));
    }
}

void swiglu_forward_bf16(bf16_t *h, int64_t ld_h, const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld_gate_up, *u = g + F;
        for (int64_t j0 = 0; j0 < F; j0 += SWIGLU_TILE) {
            int64_t n = F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE;
            float y[SWIGLU_TILE];
            swiglu_tile(y, g + j0, u + j0, n, streams_ahead(gate_up, ld_gate_up, NULL, 0, t, T, j0, F));
            bf16_from_f32_block(h + t * ld_h + j0, y, n);
        }
    }
}

/* dg[n], du[n] of the gate and up inputs for n ≤ SWIGLU_TILE. */
static inline void swiglu_backward_tile(float *dg, float *du, const float *g, const float *u, const float *dy,
                                        int64_t n, streams_ahead_t pf) {
    float sig[SWIGLU_TILE];
    sigmoid_row(sig, g, n, pf);
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
            swiglu_backward_tile(dg + j0, du + j0, g + j0, u + j0, dy + j0, F - j0 < SWIGLU_TILE ? F - j0 : SWIGLU_TILE,
                                 streams_ahead(gate_up, ld_gate_up, dh, ld_dh, t, T, j0, F));
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
            swiglu_backward_tile(dg, du, g + j0, u + j0, dy + j0, n, streams_ahead(gate_up, ld_gate_up, dh, ld_dh, t, T, j0, F));
            bf16_from_f32_block(dgate_up + t * ld_dgate_up + j0, dg, n);
            bf16_from_f32_block(dgate_up + t * ld_dgate_up + F + j0, du, n);
        }
    }
}
