/* rope: rotary position embedding in Hugging Face's rotate-half convention. For a head vector
 * x = [x1, x2] (halves of HD/2) at position p: y1 = x1·cos − x2·sin, y2 = x2·cos + x1·sin,
 * with angle p·base^(−2i/HD). Applied in place to G heads per row. */
#ifndef STEPSCOPE_ROPE_H
#define STEPSCOPE_ROPE_H

#include <stdint.h>

/* cos_table, sin_table: [S, HD/2]. Angles are computed in double and only cos/sin rounded to
 * float: Hugging Face forms the angle p·inv_freq in float32, which at p ~ 4096 already moves
 * it by ~1e-4 rad; the exact angle is what the maths asks for. */
void rope_tables(float *cos_table, float *sin_table, int64_t S, int64_t HD, double base);

/* One head vector [x1, x2] (halves of HD/2) rotated by the angles whose cos and sin are c and
 * sn (c, sn: one position's row of the tables; direction −1 rotates back), into y; y may be x. */
static inline void rope_rotate_head(float *y, const float *x, const float *c, const float *sn, int64_t HD,
                                    float direction) {
    const int64_t half = HD / 2;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half], si = direction * sn[i];
        y[i] = a * c[i] - b * si;
        y[i + half] = b * c[i] + a * si;
    }
}

/* x[B·S, G·HD] with row stride ld, rotated in place; row t has position t mod S. */
void rope_forward(float *x, int64_t ld, const float *cos_table, const float *sin_table,
                  int64_t B, int64_t S, int64_t G, int64_t HD);
/* dx = Rᵀ dy, in place on d[B·S, G·HD]. */
void rope_backward(float *d, int64_t ld, const float *cos_table, const float *sin_table,
                   int64_t B, int64_t S, int64_t G, int64_t HD);

#endif
