#include "kernels/xent.h"

#include <float.h>
#include <math.h>
#include <omp.h>

#include "kernels/vecmath.h"

static float row_max(const float *x, int64_t n) {
    float m = -FLT_MAX;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* e[i] = exp(x[i] − shift) (e may be x); returns Σ e[i] (accumulated in double across vector
 * partials). */
static double exp_shift_sum(float *e, const float *x, int64_t n, float shift) {
    int64_t i = 0;
    double total = 0.0;
#if VF_LANES
    vf acc = vf_zero();
    const vf sh = vf_set1(shift);
    for (; i + VF_LANES <= n; i += VF_LANES) {
        vf ex = vf_exp(vf_sub(vf_load(x + i), sh));
        vf_store(e + i, ex);
        acc = vf_add(acc, ex);
        if ((i & 4095) == 4096 - VF_LANES) { /* flush the float partials now and then to keep precision */
            total += vf_reduce_add(acc);
            acc = vf_zero();
        }
    }
    total += vf_reduce_add(acc);
#endif
    for (; i < n; i++) {
        e[i] = expf(x[i] - shift);
        total += e[i];
    }
    return total;
}

/* One row's loss and lse, with exp(l − max) into e (which may be the row); returns the gradient's scale,
 * coef, so that the gradient is e·coef, less grad_scale at the target. */
static float row_loss_and_exp(float *e, const float *logits_row, int64_t V, int32_t tgt, float grad_scale, float z_loss,
                              float *row_loss, float *row_lse) {
    float target_logit = logits_row[tgt];
    float m = row_max(logits_row, V);
    double sum = exp_shift_sum(e, logits_row, V, m);
    double lse = (double)m + log(sum);
    *row_lse = (float)lse;
    *row_loss = (float)(lse - (double)target_logit + (double)z_loss * lse * lse);
    /* d/dl of lse is softmax; z-loss adds 2·z·lse·softmax. */
    return (float)((1.0 + 2.0 * (double)z_loss * lse) / sum) * grad_scale;
}

void xent_forward_backward(float *logits, float *row_loss, float *row_lse, const int32_t *targets,
                           int64_t C, int64_t V, float grad_scale, float z_loss) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < C; r++) {
        float *l = logits + r * V;
        int32_t tgt = targets[r];
        float coef = row_loss_and_exp(l, l, V, tgt, grad_scale, z_loss, &row_loss[r], &row_lse[r]);
#pragma omp simd
        for (int64_t i = 0; i < V; i++) l[i] *= coef;
        l[tgt] -= grad_scale;
    }
}

void xent_forward_backward_bf16(const float *logits, bf16_t *dlogits, int64_t ld_dlogits, float *row_scratch,
                                float *row_loss, float *row_lse, const int32_t *targets, int64_t C, int64_t V,
                                float grad_scale, float z_loss) {
    enum { PIECE = 512 };
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < C; r++) {
            float *e = row_scratch + (int64_t)omp_get_thread_num() * V;
            int32_t tgt = targets[r];
            float coef = row_loss_and_exp(e, logits + r * V, V, tgt, grad_scale, z_loss, &row_loss[r], &row_lse[r]);
            for (int64_t i0 = 0; i0 < V; i0 += PIECE) { /* scaled through L1 and rounded from there */
                int64_t n = V - i0 < PIECE ? V - i0 : PIECE;
                float g[PIECE];
#pragma omp simd
                for (int64_t i = 0; i < n; i++) g[i] = e[i0 + i] * coef;
                if (tgt >= i0 && tgt < i0 + n) g[tgt - i0] -= grad_scale;
                bf16_from_f32_block_streamed(dlogits + r * ld_dlogits + i0, g, n);
            }
        }
        _mm_sfence(); /* on every thread that streamed, before the region's closing barrier */
    }
}
