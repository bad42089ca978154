#include "kernels/xent.h"

#include <float.h>
#include <math.h>

#include "kernels/vecmath.h"

static float row_max(const float *x, int64_t n) {
    float m = -FLT_MAX;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = exp(x[i] − shift); returns Σ x[i] (accumulated in double across vector partials). */
static double exp_shift_sum(float *x, int64_t n, float shift) {
    int64_t i = 0;
    double total = 0.0;
#if VF_LANES
    vf acc = vf_zero();
    const vf sh = vf_set1(shift);
    for (; i + VF_LANES <= n; i += VF_LANES) {
        vf e = vf_exp(vf_sub(vf_load(x + i), sh));
        vf_store(x + i, e);
        acc = vf_add(acc, e);
        if ((i & 4095) == 4096 - VF_LANES) { /* flush the float partials now and then to keep precision */
            total += vf_reduce_add(acc);
            acc = vf_zero();
        }
    }
    total += vf_reduce_add(acc);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - shift);
        total += x[i];
    }
    return total;
}

void xent_forward_backward(float *logits, float *row_loss, float *row_lse, const int32_t *targets,
                           int64_t C, int64_t V, float grad_scale, float z_loss) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < C; r++) {
        float *l = logits + r * V;
        int32_t tgt = targets[r];
        float target_logit = l[tgt];
        float m = row_max(l, V);
        double sum = exp_shift_sum(l, V, m); /* l now holds exp(l − m) */
        double lse = (double)m + log(sum);
        row_lse[r] = (float)lse;
        row_loss[r] = (float)(lse - (double)target_logit + (double)z_loss * lse * lse);
        /* d/dl of lse is softmax; z-loss adds 2·z·lse·softmax. */
        float coef = (float)((1.0 + 2.0 * (double)z_loss * lse) / sum) * grad_scale;
#pragma omp simd
        for (int64_t i = 0; i < V; i++) l[i] *= coef;
        l[tgt] -= grad_scale;
    }
}
