/* xent: the chunked cross-entropy kernel (forward and backward in one pass over a chunk of
 * logits) at the LM head's shape, as time per token and as memory bandwidth: it reads and
 * rewrites every logit once, so it is bound by memory, not arithmetic. Then a bf16 run's two
 * ways to a bf16 gradient, interleaved round by round: the fp32 kernel followed by a bf16
 * conversion of the chunk (before 2026-12-03), and xent_forward_backward_bf16 (the logits read
 * once, the bf16 gradient written), with streaming and with plain stores. Medians of `reps`.
 *   build/bench/xent [reps=7] [V=151936] [chunk=512] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/bf16.h"
#include "kernels/xent.h"
#include "benchutil.h"

static void fill(float *logits, int64_t n) {
    for (int64_t i = 0; i < n; i++) logits[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
}

static double median(double *t, int reps) {
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    return t[reps / 2];
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    int64_t V = argc > 2 ? atoll(argv[2]) : 151936, C = argc > 3 ? atoll(argv[3]) : 512;
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    if (reps < 1 || reps > 64 || V < 2 || C < 1 || threads < 1) {
        fprintf(stderr, "usage: xent [reps 1..64] [V>=2] [chunk>=1] [threads>=1]\n");
        return 2;
    }
    omp_set_num_threads(threads);
    const size_t n = (size_t)(C * V);
    float *logits = malloc(n * sizeof(float)), *loss = malloc((size_t)C * sizeof(float));
    float *lse = malloc((size_t)C * sizeof(float)), *rows = malloc((size_t)threads * (size_t)V * sizeof(float));
    /* On a 64-byte line, as the model's: the fused kernel streams its stores there. One element
     * further on, the rows miss the lines and it stores plainly (the third timing). */
    bf16_t *dy16 = aligned_alloc(64, ((n + 1) * sizeof(bf16_t) + 63) / 64 * 64);
    int32_t *targets = malloc((size_t)C * sizeof(int32_t));
    if (!logits || !loss || !lse || !targets || !rows || !dy16) {
        fprintf(stderr, "xent: out of memory for a %lld x %lld chunk\n", (long long)C, (long long)V);
        return 1;
    }
    for (int64_t i = 0; i < C; i++) targets[i] = (int32_t)((i * 7919) % V);
    double t_f32[64], t_two[64], t_fused[64], t_plain[64];
    for (int r = -1; r < reps; r++) {
        /* Fresh logits before each timing (outside it): the fp32 kernel overwrites them. */
        fill(logits, (int64_t)n);
        double t0 = omp_get_wtime();
        xent_forward_backward(logits, loss, lse, targets, C, V, 1.0f / (float)C, 0.0f);
        double t1 = omp_get_wtime();
        bf16_from_f32_array(dy16, logits, (int64_t)n);
        double t2 = omp_get_wtime();
        fill(logits, (int64_t)n);
        double t3 = omp_get_wtime();
        xent_forward_backward_bf16(logits, dy16, V, rows, loss, lse, targets, C, V, 1.0f / (float)C, 0.0f);
        double t4 = omp_get_wtime();
        xent_forward_backward_bf16(logits, dy16 + 1, V, rows, loss, lse, targets, C, V, 1.0f / (float)C, 0.0f);
        double t5 = omp_get_wtime();
        if (r >= 0) t_f32[r] = t1 - t0, t_two[r] = t2 - t0, t_fused[r] = t4 - t3, t_plain[r] = t5 - t4;
    }
    double s = median(t_f32, reps), two = median(t_two, reps), fused = median(t_fused, reps);
    double plain = median(t_plain, reps);
    double bytes = 2.0 * (double)C * (double)V * sizeof(float);
    printf("xent chunk %lld x %lld, %d threads, median of %d: %.2f ms, %.1f us per token, %.1f GB/s "
           "(one read + one write of the logits)\n",
           (long long)C, (long long)V, threads, reps, s * 1e3, s / (double)C * 1e6, bytes / s * 1e-9);
    printf("bf16 gradient: fp32 kernel + bf16 conversion %.2f ms; xent_forward_backward_bf16 %.2f ms streamed "
           "(%.2fx the two passes), %.2f ms with plain stores (%.2fx)\n",
           two * 1e3, fused * 1e3, two / fused, plain * 1e3, two / plain);
    free(logits), free(loss), free(lse), free(targets), free(rows), free(dy16);
    return 0;
}
