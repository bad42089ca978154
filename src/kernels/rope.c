#include "kernels/rope.h"

#include <math.h>

void rope_tables(float *cos_table, float *sin_table, int64_t S, int64_t HD, double base) {
    int64_t half = HD / 2;
    for (int64_t i = 0; i < half; i++) {
        double inv_freq = 1.0 / pow(base, (double)(2 * i) / (double)HD);
        for (int64_t p = 0; p < S; p++) {
            double angle = (double)p * inv_freq;
            cos_table[p * half + i] = (float)cos(angle);
            sin_table[p * half + i] = (float)sin(angle);
        }
    }
}

static void rotate(float *x, int64_t ld, const float *cos_table, const float *sin_table,
                   int64_t B, int64_t S, int64_t G, int64_t HD, float direction) {
    int64_t half = HD / 2;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * S; t++) {
        const float *c = cos_table + (t % S) * half;
        const float *s = sin_table + (t % S) * half;
        for (int64_t g = 0; g < G; g++) rope_rotate_head(x + t * ld + g * HD, x + t * ld + g * HD, c, s, HD, direction);
    }
}

void rope_forward(float *x, int64_t ld, const float *cos_table, const float *sin_table,
                  int64_t B, int64_t S, int64_t G, int64_t HD) {
    rotate(x, ld, cos_table, sin_table, B, S, G, HD, 1.0f);
}

void rope_backward(float *d, int64_t ld, const float *cos_table, const float *sin_table,
                   int64_t B, int64_t S, int64_t G, int64_t HD) {
    /* The rotation is orthogonal: its transpose is the rotation by −angle. */
    rotate(d, ld, cos_table, sin_table, B, S, G, HD, -1.0f);
}
