/* gemm_shapes: GFLOP/s of every matmul a qwen3-0.6b step makes at T tokens, in the three
 * forms the step uses (forward x·Wᵀ, weight gradient dYᵀ·X, input gradient dY·W), in fp32 and
 * with bf16 inputs, through the same gemm interface the model calls. The six variants of a
 * shape run interleaved round by round, so a noisy neighbour hits them alike; each prints
 * its median of `reps` calls and % of the peak of its dtype given on the command line, then
 * the bf16/fp32 speed ratio.
 *   build/bench/gemm_shapes [T=1024] [reps=5] [fp32_peak_gflops=446] [bf16_peak_gflops=892] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/gemm.h"
#include "kernels/bf16.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *filled(int64_t n) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    return p;
}

typedef struct { const char *name; int64_t out, in; } linear_t;

int main(int argc, char **argv) {
    int64_t T = argc > 1 ? atoll(argv[1]) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 64) reps = 5;
    double peak32 = argc > 3 ? atof(argv[3]) : 446.0, peak16 = argc > 4 ? atof(argv[4]) : 892.0;
    int threads = argc > 5 ? atoi(argv[5]) : 2;
    omp_set_num_threads(threads);
    const int64_t D = 1024, F = 3072, H = 16, KV = 8, HD = 128, V = 151936;
    const int64_t XC = (256LL << 20) / 4 / V; /* the default chunk, qwen3_default_xent_chunk */
    linear_t lin[] = {{"qkv_proj", (H + 2 * KV) * HD, D}, {"o_proj", D, H * HD},
                      {"gate_up_proj", 2 * F, D},        {"down_proj", D, F},
                      {"lm_head chunk", V, D}};
    char err[256];
    gemm_ctx_t *g = gemm_create(err, sizeof err);
    if (!g) { fprintf(stderr, "%s\n", err); return 1; }
    printf("qwen3-0.6b matmuls at T=%lld tokens (lm_head: chunk of %lld), %d threads, median of %d\n",
           (long long)T, (long long)XC, threads, reps);
    printf("%-14s %-16s %9s %8s %7s %9s %8s %7s %7s\n", "matmul", "form", "fp32 ms", "GFLOP/s", "%peak",
           "bf16 ms", "GFLOP/s", "%peak", "speed");
    double sum32 = 0, sum16 = 0, flops = 0;
    for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
        int64_t out = lin[l].out, in = lin[l].in, t = strstr(lin[l].name, "lm_head") ? XC : T;
        float *x = filled(t * in), *W = filled(out * in), *dy = filled(t * out), *y = filled(t * out);
        float *dW = filled(out * in), *dx = filled(t * in);
        bf16_t *x16 = malloc((size_t)(t * in) * 2), *W16 = malloc((size_t)(out * in) * 2), *dy16 = malloc((size_t)(t * out) * 2);
        bf16_from_f32_array(x16, x, t * in);
        bf16_from_f32_array(W16, W, out * in);
        bf16_from_f32_array(dy16, dy, t * out);
        static const char *forms[] = {"fwd   y=x·Wᵀ", "wgrad dW+=dyᵀ·x", "dgrad dx=dy·W"};
        double ts[6][64];
        for (int r = -1; r < reps; r++) /* r = -1 creates the primitives, untimed */
            for (int f = 0; f < 6; f++) {
                double t0 = now();
                bool bf = f >= 3;
                switch (f % 3) {
                case 0:
                    if (bf) gemm_bf16(g, false, true, t, out, in, x16, in, W16, in, y, out, false);
                    else gemm_f32(g, false, true, t, out, in, x, in, W, in, y, out, false);
                    break;
                case 1:
                    if (bf) gemm_bf16(g, true, false, out, in, t, dy16, out, x16, in, dW, in, true);
                    else gemm_f32(g, true, false, out, in, t, dy, out, x, in, dW, in, true);
                    break;
                case 2:
                    if (bf) gemm_bf16(g, false, false, t, in, out, dy16, out, W16, in, dx, in, false);
                    else gemm_f32(g, false, false, t, in, out, dy, out, W, in, dx, in, false);
                    break;
                }
                if (r >= 0) ts[f][r] = now() - t0;
            }
        double flop = 2.0 * (double)t * (double)out * (double)in;
        for (int f = 0; f < 3; f++) {
            qsort(ts[f], (size_t)reps, sizeof(double), cmp_double);
            qsort(ts[f + 3], (size_t)reps, sizeof(double), cmp_double);
            double s32 = ts[f][reps / 2], s16 = ts[f + 3][reps / 2];
            printf("%-14s %-16s %9.2f %8.1f %6.1f%% %9.2f %8.1f %6.1f%% %6.2fx\n", lin[l].name, forms[f], s32 * 1e3,
                   flop / s32 * 1e-9, 100.0 * flop / s32 * 1e-9 / peak32, s16 * 1e3, flop / s16 * 1e-9,
                   100.0 * flop / s16 * 1e-9 / peak16, s32 / s16);
            sum32 += s32;
            sum16 += s16;
            flops += flop;
        }
        free(x16); free(W16); free(dy16);
        free(x); free(W); free(dy); free(y); free(dW); free(dx);
    }
    printf("all matmuls of a step (each shape once per form): fp32 %.1f GFLOP/s (%.1f%%), bf16 %.1f GFLOP/s (%.1f%%), "
           "bf16 %.2fx faster\n", flops / sum32 * 1e-9, 100 * flops / sum32 * 1e-9 / peak32, flops / sum16 * 1e-9,
           100 * flops / sum16 * 1e-9 / peak16, sum32 / sum16);
    gemm_destroy(g);
    return 0;
}
