/* attention: GFLOP/s of the flash-attention forward and backward kernels: fp32 with block
 * products in our micro-GEMM, fp32 with them in MKL (where it loads), bf16 with them in the
 * matmul library, and bf16 in our packed kernel (where the CPU has AMX tiles or AVX512-BF16:
 * what a dtype=bfloat16 step runs there); interleaved
 * round by round, at qwen3-0.6b's head shapes (H=16, KV=8, HD=128) for a list
 * of sequence lengths, median of `reps`; % of peak against the peak of each dtype.
 * FLOPs are counted as the model's op summary counts them: causal half of the S² scores,
 * 2 matmuls forward and 4 backward (the recomputed scores are not counted, as in MaxText).
 *   build/bench/attention [reps=5] [fp32_peak_gflops=446] [bf16_peak_gflops=892] [threads=2] [S ...]
 *   (S default 256 1024 4096) */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/attention.h"
#include "benchutil.h"

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    double peak[2] = {argc > 2 ? atof(argv[2]) : 446.0, argc > 3 ? atof(argv[3]) : 892.0};
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    if (reps < 1 || reps > 64 || threads < 1) {
        fprintf(stderr, "usage: attention [reps 1..64] [fp32_peak] [bf16_peak] [threads>=1] [S ...]\n");
        return 2;
    }
    char err[512];
    gemm_ctx_t **g = malloc((size_t)threads * sizeof *g), **gm = calloc((size_t)threads, sizeof *gm);
    for (int t = 0; t < threads; t++)
        if (!(g[t] = gemm_create(GEMM_LIB_AUTO, err, sizeof err))) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
    /* fp32 block products in MKL, beside our micro-GEMM, where MKL loads */
    bool have_mkl = true;
    for (int t = 0; t < threads && have_mkl; t++) have_mkl = (gm[t] = gemm_create(GEMM_LIB_MKL, err, sizeof err));
    if (!have_mkl) printf("fp32 with MKL block products not measured: %s\n", err);
    omp_set_num_threads(threads);
    int64_t seqs[16] = {256, 1024, 4096};
    int nseq = 3;
    if (argc > 5) {
        nseq = 0;
        for (int i = 5; i < argc && nseq < 16; i++) seqs[nseq++] = atoll(argv[i]);
    }
    printf("attention kernels, H=16 KV=8 HD=128, batch 1, %d threads, median of %d\n", threads, reps);
    printf("%6s %-17s %10s %9s %7s %10s %9s %7s\n", "S", "kernel", "fwd ms", "GFLOP/s", "%peak", "bwd ms", "GFLOP/s",
           "%peak");
    static const char *kernel_names[4] = {"fp32 micro-GEMM", "fp32 MKL blocks", "bf16 library", "bf16 packed"};
    bool have_packed = attention_bf16_packed_available();
    if (!have_packed) printf("bf16 packed kernel not measured: this CPU or build has neither AMX nor AVX512-BF16\n");
    else printf("bf16 packed kernel: %s\n", attention_bf16_packed_kind());
    printf("bf16 with library block products: %s\n", gemm_bf16_detail(g[0]));
    for (int si = 0; si < nseq; si++) {
        attn_shape_t a = {.B = 1, .S = seqs[si], .H = 16, .KV = 8, .HD = 128};
        int64_t T = a.B * a.S, QKV = (a.H + 2 * a.KV) * a.HD;
        float *qkv = bench_filled(T * QKV, 1), *out = bench_filled(T * a.H * a.HD, 2), *lse = bench_filled(a.B * a.H * a.S, 3);
        float *dout = bench_filled(T * a.H * a.HD, 4), *dqkv = bench_filled(T * QKV, 5);
        int64_t nscratch = attention_scratch_floats(&a, threads), n16 = attention_bf16_scratch_floats(&a, threads);
        float *scratch = malloc((size_t)(nscratch > n16 ? nscratch : n16) * sizeof(float));
        const float *q = qkv, *k = qkv + a.H * a.HD, *v = qkv + (a.H + a.KV) * a.HD;
        float *dq = dqkv, *dk = dqkv + a.H * a.HD, *dv = dqkv + (a.H + a.KV) * a.HD;
        int64_t ldo = a.H * a.HD;
        double tf[4][64], tb[4][64];
        for (int r = -1; r < reps; r++)
            for (int kind = 0; kind < 4; kind++) { /* interleaved, so noise hits all alike */
                if ((kind == 1 && !have_mkl) || (kind == 3 && !have_packed)) continue;
                double t0 = omp_get_wtime();
                if (kind >= 2)
                    attention_forward_bf16(out, ldo, lse, q, QKV, k, QKV, v, QKV, &a, scratch, kind == 2 ? g : NULL);
                else attention_forward(out, ldo, lse, q, QKV, k, QKV, v, QKV, &a, scratch, kind ? gm : NULL);
                double t1 = omp_get_wtime();
                if (kind >= 2)
                    attention_backward_bf16(dq, QKV, dk, QKV, dv, QKV, dout, ldo, out, ldo, lse, q, QKV, k, QKV, v, QKV,
                                            &a, scratch, kind == 2 ? g : NULL);
                else
                    attention_backward(dq, QKV, dk, QKV, dv, QKV, dout, ldo, out, ldo, lse, q, QKV, k, QKV, v, QKV, &a,
                                       scratch, kind ? gm : NULL);
                double t2 = omp_get_wtime();
                if (r >= 0) tf[kind][r] = t1 - t0, tb[kind][r] = t2 - t1;
            }
        double one = 2.0 * 2.0 * (double)a.B * (double)a.S * (double)a.S * (double)a.H * (double)a.HD / 2.0;
        for (int kind = 0; kind < 4; kind++) {
            if ((kind == 1 && !have_mkl) || (kind == 3 && !have_packed)) continue;
            int bf = kind >= 2;
            qsort(tf[kind], (size_t)reps, sizeof(double), bench_cmp_double);
            qsort(tb[kind], (size_t)reps, sizeof(double), bench_cmp_double);
            double f = tf[kind][reps / 2], b = tb[kind][reps / 2];
            printf("%6lld %-17s %10.2f %9.1f %6.1f%% %10.2f %9.1f %6.1f%%\n", (long long)a.S, kernel_names[kind],
                   f * 1e3, one / f * 1e-9, 100 * one / f * 1e-9 / peak[bf], b * 1e3, 2 * one / b * 1e-9,
                   100 * 2 * one / b * 1e-9 / peak[bf]);
        }
        free(qkv), free(out), free(lse), free(dout), free(dqkv), free(scratch);
    }
    for (int t = 0; t < threads; t++) gemm_destroy(g[t]), gemm_destroy(gm[t]);
    free(g);
    free(gm);
    return 0;
}
