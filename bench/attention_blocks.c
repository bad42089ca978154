/* attention_blocks: the fp32 attention kernels (micro-GEMM block products, the path of oneDNN
 * builds) at several blockings, side by side in one process: each round calls every blocking's
 * forward and backward once, in an order rotated round by round, so the VM's drift (a quarter
 * within half an hour here) hits all alike. Prints, per blocking, the median forward and
 * backward time and the median (and quartiles) of its per-round speed against the first
 * blocking of the list, which is how ATTN_QBLOCK and ATTN_KCHUNK were chosen.
 * qwen3-0.6b's heads (H=16, KV=8, HD=128), batch 1.
 *   build/bench/attention_blocks [reps=15] [threads=2] [S=1024] [QBLOCKxKCHUNK ...]
 *   (blockings default 64x128 128x128 32x64 64x64 96x96; KCHUNK a multiple of 32) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/attention.h"
#include "benchutil.h"

enum { MAX_VARIANTS = 16, MAX_REPS = 64 };

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 15, threads = argc > 2 ? atoi(argv[2]) : 2;
    int64_t S = argc > 3 ? atoll(argv[3]) : 1024;
    int64_t qb[MAX_VARIANTS] = {64, 128, 32, 64, 96}, kc[MAX_VARIANTS] = {128, 128, 64, 64, 96};
    int nv = 5;
    if (argc > 4) {
        nv = 0;
        for (int i = 4; i < argc && nv < MAX_VARIANTS; i++, nv++)
            if (sscanf(argv[i], "%ldx%ld", (long *)&qb[nv], (long *)&kc[nv]) != 2 || qb[nv] < 1 || kc[nv] < 32 ||
                kc[nv] % 32) {
                fprintf(stderr, "attention_blocks: blocking '%s' is not QBLOCKxKCHUNK with QBLOCK >= 1 and KCHUNK a "
                                "multiple of 32 (e.g. 64x128)\n", argv[i]);
                return 2;
            }
    }
    if (reps < 2 || reps > MAX_REPS || threads < 1 || S < 1) {
        fprintf(stderr, "usage: attention_blocks [reps 2..%d] [threads>=1] [S>=1] [QBLOCKxKCHUNK ...]\n", MAX_REPS);
        return 2;
    }
    omp_set_num_threads(threads);
    attn_shape_t shape[MAX_VARIANTS];
    int64_t nscratch = 0;
    for (int i = 0; i < nv; i++) {
        shape[i] = (attn_shape_t){1, S, 16, 8, 128, qb[i], kc[i]};
        int64_t n = attention_scratch_floats(&shape[i], threads);
        nscratch = n > nscratch ? n : nscratch;
    }
    const attn_shape_t *a = &shape[0];
    int64_t T = a->B * a->S, QKV = (a->H + 2 * a->KV) * a->HD, ldo = a->H * a->HD;
    float *qkv = bench_filled(T * QKV, 1), *out = bench_filled(T * ldo, 2), *lse = bench_filled(a->B * a->H * a->S, 3);
    float *dout = bench_filled(T * ldo, 4), *dqkv = bench_filled(T * QKV, 5), *scratch = malloc((size_t)nscratch * sizeof(float));
    const float *q = qkv, *k = qkv + a->H * a->HD, *v = qkv + (a->H + a->KV) * a->HD;
    float *dq = dqkv, *dk = dqkv + a->H * a->HD, *dv = dqkv + (a->H + a->KV) * a->HD;
    static double tf[MAX_VARIANTS][MAX_REPS], tb[MAX_VARIANTS][MAX_REPS];
    for (int r = -1; r < reps; r++) /* round -1 warms up */
        for (int j = 0; j < nv; j++) {
            int i = (j + (r < 0 ? 0 : r)) % nv;
            double t0 = omp_get_wtime();
            attention_forward(out, ldo, lse, q, QKV, k, QKV, v, QKV, &shape[i], scratch, NULL);
            double t1 = omp_get_wtime();
            attention_backward(dq, QKV, dk, QKV, dv, QKV, dout, ldo, out, ldo, lse, q, QKV, k, QKV, v, QKV, &shape[i],
                               scratch, NULL);
            double t2 = omp_get_wtime();
            if (r >= 0) tf[i][r] = t1 - t0, tb[i][r] = t2 - t1;
        }
    printf("fp32 attention blockings, S=%lld H=16 KV=8 HD=128, batch 1, %d threads, %d rounds; speed = the first "
           "blocking's time / this one's, per round\n",
           (long long)S, threads, reps);
    printf("%-10s %9s %9s %24s %24s\n", "QBxKC", "fwd ms", "bwd ms", "fwd speed (q1 med q3)", "bwd speed (q1 med q3)");
    for (int i = 0; i < nv; i++) {
        double rf[MAX_REPS], rb[MAX_REPS], f1, f3, b1, b3;
        for (int r = 0; r < reps; r++) rf[r] = tf[0][r] / tf[i][r], rb[r] = tb[0][r] / tb[i][r];
        double f_speed = bench_sorted_median(rf, reps, &f1, &f3), b_speed = bench_sorted_median(rb, reps, &b1, &b3);
        double xf[MAX_REPS], xb[MAX_REPS]; /* copies: the first blocking's rounds stay in order for the others */
        for (int r = 0; r < reps; r++) xf[r] = tf[i][r], xb[r] = tb[i][r];
        double f_ms = 1e3 * bench_sorted_median(xf, reps, NULL, NULL), b_ms = 1e3 * bench_sorted_median(xb, reps, NULL, NULL);
        char name[32];
        snprintf(name, sizeof name, "%lldx%lld", (long long)qb[i], (long long)kc[i]);
        printf("%-10s %9.2f %9.2f    %.3f %.3fx %.3f       %.3f %.3fx %.3f\n", name, f_ms, b_ms, f1, f_speed, f3, b1,
               b_speed, b3);
    }
    free(qkv), free(out), free(lse), free(dout), free(dqkv), free(scratch);
    return 0;
}
