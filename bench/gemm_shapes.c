/* gemm_shapes: GFLOP/s of every matmul a qwen3-0.6b step makes at T tokens, in the three
 * forms the step uses (forward x·Wᵀ, weight gradient dYᵀ·X, input gradient dY·W), in fp32 and
 * with bf16 inputs, through the same gemm interface the model calls, for each matmul library
 * this machine has (oneDNN always, MKL where it loads: config key gemm_library). All variants
 * of a shape run interleaved round by round, so a noisy neighbour hits them alike; each prints
 * its median of `reps` calls and % of the peak of its dtype given on the command line, then
 * the MKL/oneDNN speed ratio per dtype.
 *   build/bench/gemm_shapes [T=1024] [reps=5] [fp32_peak_gflops=446] [bf16_peak_gflops=892] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/gemm.h"
#include "kernels/bf16.h"
#include "model/qwen3.h"

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
    const qwen3_dims_t dims = {.B = 1, .S = T, .V = V};
    const int64_t XC = qwen3_default_xent_chunk(&dims); /* the model's lm_head chunk at T tokens */
    linear_t lin[] = {{"qkv_proj", (H + 2 * KV) * HD, D}, {"o_proj", D, H * HD},
                      {"gate_up_proj", 2 * F, D},        {"down_proj", D, F},
                      {"lm_head chunk", V, D}};
    char err[256];
    gemm_ctx_t *g[2] = {gemm_create(GEMM_LIB_ONEDNN, err, sizeof err), NULL};
    if (!g[0]) { fprintf(stderr, "%s\n", err); return 1; }
    g[1] = gemm_create(GEMM_LIB_MKL, err, sizeof err);
    int nlib = g[1] ? 2 : 1;
    if (!g[1]) printf("MKL not measured: %s\n", err);
    bool bf16_ok[2] = {gemm_bf16_supported(g[0]), g[1] && gemm_bf16_supported(g[1])};
    printf("qwen3-0.6b matmuls at T=%lld tokens (lm_head: chunk of %lld), %d threads, median of %d; GFLOP/s (%% of peak)\n",
           (long long)T, (long long)XC, threads, reps);
    printf("%-14s %-16s %15s %15s %7s %15s %15s %7s\n", "matmul", "form", "fp32 onednn", "fp32 mkl", "mkl/dnn",
           "bf16 onednn", "bf16 mkl", "mkl/dnn");
    double sum[4] = {0}, flops = 0;
    for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
        int64_t out = lin[l].out, in = lin[l].in, t = strstr(lin[l].name, "lm_head") ? XC : T;
        float *x = filled(t * in), *W = filled(out * in), *dy = filled(t * out), *y = filled(t * out);
        float *dW = filled(out * in), *dx = filled(t * in);
        bf16_t *x16 = malloc((size_t)(t * in) * 2), *W16 = malloc((size_t)(out * in) * 2), *dy16 = malloc((size_t)(t * out) * 2);
        bf16_from_f32_array(x16, x, t * in);
        bf16_from_f32_array(W16, W, out * in);
        bf16_from_f32_array(dy16, dy, t * out);
        static const char *forms[] = {"fwd   y=x·Wᵀ", "wgrad dW+=dyᵀ·x", "dgrad dx=dy·W"};
        /* variant v: form v % 3, library (v / 3) % 2, bf16 when v >= 6 */
        double ts[12][64];
        for (int r = -1; r < reps; r++) /* r = -1 creates the primitives, untimed */
            for (int v = 0; v < 12; v++) {
                int lib = (v / 3) % 2;
                bool bf = v >= 6;
                if (lib >= nlib || (bf && !bf16_ok[lib])) continue;
                gemm_ctx_t *c = g[lib];
                double t0 = now();
                switch (v % 3) {
                case 0:
                    if (bf) gemm_bf16(c, false, true, t, out, in, x16, in, W16, in, y, out, false);
                    else gemm_f32(c, false, true, t, out, in, x, in, W, in, y, out, false);
                    break;
                case 1:
                    if (bf) gemm_bf16(c, true, false, out, in, t, dy16, out, x16, in, dW, in, true);
                    else gemm_f32(c, true, false, out, in, t, dy, out, x, in, dW, in, true);
                    break;
                case 2:
                    if (bf) gemm_bf16(c, false, false, t, in, out, dy16, out, W16, in, dx, in, false);
                    else gemm_f32(c, false, false, t, in, out, dy, out, W, in, dx, in, false);
                    break;
                }
                if (r >= 0) ts[v][r] = now() - t0;
            }
        double flop = 2.0 * (double)t * (double)out * (double)in;
        for (int f = 0; f < 3; f++) {
            double med[4] = {0}; /* fp32 onednn, fp32 mkl, bf16 onednn, bf16 mkl */
            char cell[4][32];
            for (int k = 0; k < 4; k++) {
                int v = f + 3 * (k % 2) + 6 * (k / 2), lib = k % 2;
                bool bf = k >= 2;
                if (lib >= nlib || (bf && !bf16_ok[lib])) {
                    snprintf(cell[k], sizeof cell[k], "-");
                    continue;
                }
                qsort(ts[v], (size_t)reps, sizeof(double), cmp_double);
                med[k] = ts[v][reps / 2];
                sum[k] += med[k];
                double gf = flop / med[k] * 1e-9;
                snprintf(cell[k], sizeof cell[k], "%.1f (%.0f%%)", gf, 100.0 * gf / (bf ? peak16 : peak32));
            }
            char r32[16] = "-", r16[16] = "-";
            if (med[1] > 0) snprintf(r32, sizeof r32, "%.2fx", med[0] / med[1]);
            if (med[3] > 0 && med[2] > 0) snprintf(r16, sizeof r16, "%.2fx", med[2] / med[3]);
            printf("%-14s %-16s %15s %15s %7s %15s %15s %7s\n", lin[l].name, forms[f], cell[0], cell[1], r32, cell[2],
                   cell[3], r16);
            flops += flop;
        }
        free(x16); free(W16); free(dy16);
        free(x); free(W); free(dy); free(y); free(dW); free(dx);
    }
    static const char *names[4] = {"fp32 onednn", "fp32 mkl", "bf16 onednn", "bf16 mkl"};
    printf("all matmuls of a step (each shape once per form):\n");
    for (int k = 0; k < 4; k++)
        if (sum[k] > 0)
            printf("  %-12s %7.1f GFLOP/s (%.1f%% of peak)\n", names[k], flops / sum[k] * 1e-9,
                   100 * flops / sum[k] * 1e-9 / (k >= 2 ? peak16 : peak32));
    if (sum[1] > 0) printf("  fp32: mkl %.2fx onednn\n", sum[0] / sum[1]);
    if (sum[3] > 0 && sum[2] > 0) printf("  bf16: mkl %.2fx onednn\n", sum[2] / sum[3]);
    if (sum[2] > 0) printf("  onednn: bf16 %.2fx fp32\n", sum[0] / sum[2]);
    if (sum[3] > 0) printf("  mkl: bf16 %.2fx fp32\n", sum[1] / sum[3]);
    gemm_destroy(g[0]);
    gemm_destroy(g[1]);
    return 0;
}
