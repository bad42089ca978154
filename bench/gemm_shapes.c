/* gemm_shapes: GFLOP/s of every matmul a qwen3-0.6b step makes at T tokens, in the three
 * forms the step uses (forward x·Wᵀ, weight gradient dYᵀ·X, input gradient dY·W), in fp32 and
 * with bf16 inputs, through the same gemm interface the model calls, for each matmul library
 * this machine has (oneDNN always, MKL where it loads: config key gemm_library), and for bf16
 * our blocked kernel where the CPU has AMX or AVX512-BF16 (what gemm_bf16 runs there), with its
 * ratio to the library gemm_library=auto would run otherwise (MKL on Intel, else oneDNN). All variants of a
 * shape run interleaved call by call, so a noisy neighbour hits them alike; each prints its
 * median of `reps` calls and % of the peak of its dtype given on the command line, then the
 * speed ratios, per shape once and weighted as often as a step runs each shape. On our kernel it
 * also runs the forms that read the weights with them in fp32, rounded as they are packed
 * (gemm_bf16_b32: what a bf16 run does without bf16_weight_copy), with their time over the bf16
 * copy's ("W32/W16"; the weight gradient does not read the weights and runs as ours). Every operand's
 * rows are dense here; fp32 steps on AVX2 run qkv's and gate_up's activations at padded row
 * strides (qwen3_padded_width), which bench/row_strides measures against dense.
 *   build/bench/gemm_shapes [T=1024] [reps=5] [fp32_peak_gflops=446] [bf16_peak_gflops=892] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "kernels/bf16.h"
#include "model/qwen3.h"
#include "benchutil.h"

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
    /* Variants: fp32 onednn, fp32 mkl, bf16 onednn, bf16 mkl, bf16 on our blocked kernel
     * (bf16_blocked.h: what gemm_bf16 runs on AMX and AVX512-BF16 CPUs; the others have it off). */
    enum { NVAR = 6 };
    static const char *names[NVAR] = {"fp32 onednn", "fp32 mkl", "bf16 onednn", "bf16 mkl", "bf16 ours", "ours W32"};
    gemm_ctx_t *g[3] = {gemm_create(GEMM_LIB_ONEDNN, err, sizeof err), NULL, NULL};
    if (!g[0]) { fprintf(stderr, "%s\n", err); return 1; }
    g[1] = gemm_create(GEMM_LIB_MKL, err, sizeof err);
    if (!g[1]) printf("MKL not measured: %s\n", err);
    g[2] = gemm_create(GEMM_LIB_AUTO, err, sizeof err); /* our kernel; a named library runs all */
    if (!g[2]) { fprintf(stderr, "%s\n", err); return 1; }
    if (!gemm_bf16_tiles(g[2])) printf("our bf16 kernel not measured: this CPU or build has neither AMX nor AVX512-BF16\n");
    /* the library gemm_library=auto runs where our kernel does not: MKL on Intel, else oneDNN */
    const int lib16_var = g[1] && __builtin_cpu_is("intel") ? 3 : 2;
    gemm_ctx_t *ctx[NVAR] = {g[0], g[1], g[0], g[1], gemm_bf16_tiles(g[2]) ? g[2] : NULL, gemm_bf16_tiles(g[2]) ? g[2] : NULL};
    /* bf16 runs on every CPU: where it has no bf16 unit, widened to fp32 (gemm_widen.h). */
    bool on[NVAR] = {true, g[1] != NULL, true, g[1] != NULL, ctx[4] != NULL, ctx[5] != NULL};
    for (int k = 2; k < 4; k++)
        if (on[k]) printf("%s: %s\n", names[k], gemm_bf16_detail(ctx[k]));
    const int64_t chunks = (T + XC - 1) / XC;
    printf("qwen3-0.6b matmuls at T=%lld tokens (lm_head: chunk of %lld), %d threads, median of %d; GFLOP/s (%% of peak)\n",
           (long long)T, (long long)XC, threads, reps);
    printf("%-14s %-16s %15s %15s %7s %15s %15s %15s %7s %15s %7s\n", "matmul", "form", names[0], names[1], "mkl/dnn",
           names[2], names[3], names[4], "ours/lib", names[5], "W32/W16");
    /* sum: each shape once per form; step: as often as a step runs it (28 layers, the head's chunks) */
    double sum[NVAR] = {0}, step[NVAR] = {0}, flops = 0, step_flops = 0;
    for (size_t l = 0; l < sizeof lin / sizeof lin[0]; l++) {
        bool head = strstr(lin[l].name, "lm_head") != NULL;
        int64_t out = lin[l].out, in = lin[l].in, t = head ? XC : T, times = head ? chunks : 28;
        float *x = filled(t * in), *W = filled(out * in), *dy = filled(t * out), *y = filled(t * out);
        float *dW = filled(out * in), *dx = filled(t * in);
        bf16_t *x16 = malloc((size_t)(t * in) * 2), *W16 = malloc((size_t)(out * in) * 2), *dy16 = malloc((size_t)(t * out) * 2);
        bf16_from_f32_array(x16, x, t * in);
        bf16_from_f32_array(W16, W, out * in);
        bf16_from_f32_array(dy16, dy, t * out);
        /* the weight gradient as the step runs it: written by a layer's one product, added by
         * the head's later chunks */
        const char *forms[] = {"fwd   y=x·Wᵀ", head ? "wgrad dW+=dyᵀ·x" : "wgrad dW=dyᵀ·x", "dgrad dx=dy·W"};
        double ts[NVAR][3][64];
        for (int r = -1; r < reps; r++) /* r = -1 creates the primitives, untimed */
            for (int k = 0; k < NVAR; k++)
                for (int f = 0; f < 3; f++) {
                    if (!on[k]) continue;
                    gemm_ctx_t *c = ctx[k];
                    bool bf = k >= 2;
                    double t0 = bench_now();
                    switch (f) {
                    case 0:
                        if (k == 5) gemm_bf16_b32(c, false, true, t, out, in, x16, in, W, in, y, out, false);
                        else if (bf) gemm_bf16(c, false, true, t, out, in, x16, in, W16, in, y, out, false);
                        else gemm_f32(c, false, true, t, out, in, x, in, W, in, y, out, false);
                        break;
                    case 1:
                        if (bf) gemm_bf16(c, true, false, out, in, t, dy16, out, x16, in, dW, in, head);
                        else gemm_f32(c, true, false, out, in, t, dy, out, x, in, dW, in, head);
                        break;
                    case 2:
                        if (k == 5) gemm_bf16_b32(c, false, false, t, in, out, dy16, out, W, in, dx, in, false);
                        else if (bf) gemm_bf16(c, false, false, t, in, out, dy16, out, W16, in, dx, in, false);
                        else gemm_f32(c, false, false, t, in, out, dy, out, W, in, dx, in, false);
                        break;
                    }
                    if (r >= 0) ts[k][f][r] = bench_now() - t0;
                }
        double flop = 2.0 * (double)t * (double)out * (double)in;
        for (int f = 0; f < 3; f++) {
            double med[NVAR] = {0};
            char cell[NVAR][32];
            for (int k = 0; k < NVAR; k++) {
                if (!on[k]) {
                    snprintf(cell[k], sizeof cell[k], "-");
                    continue;
                }
                qsort(ts[k][f], (size_t)reps, sizeof(double), bench_cmp_double);
                med[k] = ts[k][f][reps / 2];
                sum[k] += med[k];
                step[k] += (double)times * med[k];
                double gf = flop / med[k] * 1e-9;
                snprintf(cell[k], sizeof cell[k], "%.1f (%.0f%%)", gf, 100.0 * gf / (k >= 2 ? peak16 : peak32));
            }
            char r32[16] = "-", r16[16] = "-", rw[16] = "-";
            if (med[5] > 0 && med[4] > 0) snprintf(rw, sizeof rw, "%.3fx", med[5] / med[4]);
            if (med[1] > 0) snprintf(r32, sizeof r32, "%.2fx", med[0] / med[1]);
            double lib16 = med[lib16_var];
            if (med[4] > 0 && lib16 > 0) snprintf(r16, sizeof r16, "%.2fx", lib16 / med[4]);
            printf("%-14s %-16s %15s %15s %7s %15s %15s %15s %7s %15s %7s\n", lin[l].name, forms[f], cell[0], cell[1],
                   r32, cell[2], cell[3], cell[4], r16, cell[5], rw);
            flops += flop;
            step_flops += (double)times * flop;
        }
        free(x16); free(W16); free(dy16);
        free(x); free(W); free(dy); free(y); free(dW); free(dx);
    }
    printf("all matmuls of a step, each shape once per form | weighted as a step runs them (28 layers, %lld head chunks):\n",
           (long long)chunks);
    for (int k = 0; k < NVAR; k++)
        if (sum[k] > 0)
            printf("  %-12s %7.1f GFLOP/s (%.1f%% of peak) | %7.1f GFLOP/s, %.0f ms a step\n", names[k],
                   flops / sum[k] * 1e-9, 100 * flops / sum[k] * 1e-9 / (k >= 2 ? peak16 : peak32),
                   step_flops / step[k] * 1e-9, step[k] * 1e3);
    if (sum[1] > 0) printf("  fp32: mkl %.2fx onednn\n", sum[0] / sum[1]);
    if (sum[3] > 0 && sum[2] > 0) printf("  bf16: mkl %.2fx onednn\n", sum[2] / sum[3]);
    if (sum[2] > 0) printf("  onednn: bf16 %.2fx fp32\n", sum[0] / sum[2]);
    if (sum[3] > 0) printf("  mkl: bf16 %.2fx fp32\n", sum[1] / sum[3]);
    double lib16 = step[lib16_var];
    if (step[4] > 0 && lib16 > 0)
        printf("  bf16, a step's worth: our kernel %.2fx %s\n", lib16 / step[4], names[lib16_var] + 5);
    if (step[5] > 0 && step[4] > 0)
        printf("  bf16 on our kernel, a step's worth: weights from fp32 (rounded as packed) %.3fx the time from the "
               "bf16 copy (%+.0f ms)\n", step[5] / step[4], (step[5] - step[4]) * 1e3);
    gemm_destroy(g[0]);
    gemm_destroy(g[1]);
    gemm_destroy(g[2]);
    return 0;
}
