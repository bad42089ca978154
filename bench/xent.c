/* xent: the chunked cross-entropy kernel (forward and backward in one pass over a chunk of
 * logits) at the LM head's shape, as time per token and as memory bandwidth: it reads and
 * rewrites every logit once, so it is bound by memory, not arithmetic. Median of `reps`.
 *   build/bench/xent [reps=7] [V=151936] [chunk=352] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/xent.h"
#include "benchutil.h"

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    int64_t V = argc > 2 ? atoll(argv[2]) : 151936, C = argc > 3 ? atoll(argv[3]) : 352;
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    if (reps < 1 || reps > 64 || V < 2 || C < 1 || threads < 1) {
        fprintf(stderr, "usage: xent [reps 1..64] [V>=2] [chunk>=1] [threads>=1]\n");
        return 2;
    }
    omp_set_num_threads(threads);
    float *logits = malloc((size_t)(C * V) * sizeof(float)), *loss = malloc((size_t)C * sizeof(float));
    float *lse = malloc((size_t)C * sizeof(float));
    int32_t *targets = malloc((size_t)C * sizeof(int32_t));
    if (!logits || !loss || !lse || !targets) {
        fprintf(stderr, "xent: out of memory for a %lld x %lld chunk\n", (long long)C, (long long)V);
        return 1;
    }
    for (int64_t i = 0; i < C; i++) targets[i] = (int32_t)((i * 7919) % V);
    double t[64];
    for (int r = -1; r < reps; r++) {
        /* Fresh logits each round (outside the timing): the kernel overwrites them. */
        for (int64_t i = 0; i < C * V; i++) logits[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        double t0 = omp_get_wtime();
        xent_forward_backward(logits, loss, lse, targets, C, V, 1.0f / (float)C, 0.0f);
        if (r >= 0) t[r] = omp_get_wtime() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    double s = t[reps / 2], bytes = 2.0 * (double)C * (double)V * sizeof(float);
    printf("xent chunk %lld x %lld, %d threads, median of %d: %.2f ms, %.1f us per token, %.1f GB/s "
           "(one read + one write of the logits)\n",
           (long long)C, (long long)V, threads, reps, s * 1e3, s / (double)C * 1e6, bytes / s * 1e-9);
    free(logits), free(loss), free(lse), free(targets);
    return 0;
}
