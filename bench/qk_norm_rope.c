/* qk_norm_rope: Qwen3's per-head q/k norm and rope at qwen3-0.6b's shape (16 query and 8 key
 * heads of 128, rows of the fused q/k/v projection 4096 floats apart), the two kernels one after
 * the other against the fused pass (rmsnorm_rope_forward, rmsnorm_rope_backward), forward and
 * backward, interleaved round by round with fresh inputs before each timing. Each side reads and
 * writes the same buffers the model's layer does; medians of `reps`, and unfused over fused.
 *   build/bench/qk_norm_rope [reps=15] [T=1024] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "benchutil.h"

enum { H = 16, KV = 8, HD = 128, QK = (H + KV) * HD, LD_QKV = (H + 2 * KV) * HD, MAX_REPS = 64 };

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    int64_t T = argc > 2 ? atoll(argv[2]) : 1024;
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    if (reps < 1 || reps > MAX_REPS || T < 1 || threads < 1) {
        fprintf(stderr, "usage: qk_norm_rope [reps 1..64] [T>=1] [threads>=1]\n");
        return 2;
    }
    omp_set_num_threads(threads);
    const int64_t S = T; /* one sequence: every position once */
    float *qkv = bench_filled_aligned(T * LD_QKV, 1), *dqkv = bench_filled_aligned(T * LD_QKV, 2);
    float *qk = bench_filled_aligned(T * QK, 3), *rstd = bench_filled_aligned(T * (H + KV), 4);
    float *wq = bench_filled_aligned(HD, 5), *wk = bench_filled_aligned(HD, 6), *dwq = bench_filled_aligned(HD, 7);
    float *dwk = bench_filled_aligned(HD, 8), *ct = bench_filled_aligned(S * HD / 2, 0), *st = bench_filled_aligned(S * HD / 2, 0);
    int64_t np = rmsnorm_backward_partials(T, H, HD), npk = rmsnorm_backward_partials(T, KV, HD);
    float *partials = bench_filled_aligned(np > npk ? np : npk, 9);
    if (!qkv || !dqkv || !qk || !rstd || !wq || !wk || !dwq || !dwk || !ct || !st || !partials) {
        fprintf(stderr, "qk_norm_rope: out of memory for T = %lld\n", (long long)T);
        return 1;
    }
    rope_tables(ct, st, S, HD, 1000000.0);
    double fwd[2][MAX_REPS], bwd[2][MAX_REPS];
    for (int r = -1; r < reps; r++)
        for (int fused = 0; fused < 2; fused++) {
            bench_fill_(qk, T * QK, 3);
            double t0 = bench_now();
            if (fused) {
                rmsnorm_rope_forward(qk, QK, rstd, qkv, LD_QKV, wq, ct, st, T, S, H, HD, 1e-6f);
                rmsnorm_rope_forward(qk + H * HD, QK, rstd + T * H, qkv + H * HD, LD_QKV, wk, ct, st, T, S, KV, HD, 1e-6f);
            } else {
                rmsnorm_forward(qk, QK, rstd, qkv, LD_QKV, wq, T, H, HD, 1e-6f);
                rmsnorm_forward(qk + H * HD, QK, rstd + T * H, qkv + H * HD, LD_QKV, wk, T, KV, HD, 1e-6f);
                rope_forward(qk, QK, ct, st, 1, S, H + KV, HD);
            }
            double t1 = bench_now();
            bench_fill_(dqkv, T * LD_QKV, 2);
            double t2 = bench_now();
            if (fused) {
                rmsnorm_rope_backward(dqkv, LD_QKV, dwq, dqkv, LD_QKV, qkv, LD_QKV, wq, rstd, ct, st, T, S, H, HD, partials);
                rmsnorm_rope_backward(dqkv + H * HD, LD_QKV, dwk, dqkv + H * HD, LD_QKV, qkv + H * HD, LD_QKV, wk,
                                      rstd + T * H, ct, st, T, S, KV, HD, partials);
            } else {
                rope_backward(dqkv, LD_QKV, ct, st, 1, S, H + KV, HD);
                rmsnorm_backward(dqkv, LD_QKV, false, dwq, dqkv, LD_QKV, qkv, LD_QKV, wq, rstd, T, H, HD, partials);
                rmsnorm_backward(dqkv + H * HD, LD_QKV, false, dwk, dqkv + H * HD, LD_QKV, qkv + H * HD, LD_QKV, wk,
                                 rstd + T * H, T, KV, HD, partials);
            }
            double t3 = bench_now();
            if (r >= 0) fwd[fused][r] = t1 - t0, bwd[fused][r] = t3 - t2;
        }
    double f0 = bench_sorted_median(fwd[0], reps, NULL, NULL), f1 = bench_sorted_median(fwd[1], reps, NULL, NULL);
    double b0 = bench_sorted_median(bwd[0], reps, NULL, NULL), b1 = bench_sorted_median(bwd[1], reps, NULL, NULL);
    printf("qk-norm + rope, T = %lld, %d+%d heads of %d, %d threads, medians of %d:\n", (long long)T, H, KV, HD, threads,
           reps);
    printf("  forward:  two kernels %.3f ms, fused %.3f ms: %.2fx\n", f0 * 1e3, f1 * 1e3, f0 / f1);
    printf("  backward: two kernels %.3f ms, fused %.3f ms: %.2fx\n", b0 * 1e3, b1 * 1e3, b0 / b1);
    printf("  a 28-layer step saves %.1f ms\n", 28.0 * (f0 - f1 + b0 - b1) * 1e3);
    free(qkv), free(dqkv), free(qk), free(rstd), free(wq), free(wk), free(dwq), free(dwk), free(ct), free(st), free(partials);
    return 0;
}
