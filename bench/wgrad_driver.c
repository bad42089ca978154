/* wgrad_driver: the fp32 weight-gradient products dW (+)= dYᵀ·X of a qwen3-0.6b step at T
 * tokens, on oneDNN's gemm driver in shape-fixed panels (what gemm_f32 runs on AVX512 CPUs:
 * gemm_set_weight_gradients_on_driver, on by default) against its brgemm matmul primitive (the
 * same context with that off), alternated call by call. The shapes are the ones the step runs
 * in this form: qkv_proj, o_proj and gate_up_proj (down_proj's gradients run in the transposed
 * forward form there) and the LM head's chunk (accumulated over the chunks, as in the step).
 * Prints each one's median GFLOP/s and % of the fp32 peak given, the ratio (brgemm time over
 * the driver's; > 1: the driver is faster), and the total weighted as a step runs the shapes.
 * On CPUs without AVX512 both contexts run the driver and the ratio reads ~1.
 *   build/bench/wgrad_driver [reps=7] [T=1024] [fp32_peak_gflops=232] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/gemm.h"
#include "model/qwen3.h"
#include "benchutil.h"

enum { MAX_REPS = 64 };

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    int64_t T = argc > 2 ? atoll(argv[2]) : 1024;
    double peak = argc > 3 ? atof(argv[3]) : 232.0;
    int threads = argc > 4 ? atoi(argv[4]) : 2;
    if (reps < 1 || reps > MAX_REPS || T < 1 || peak <= 0 || threads < 1) {
        fprintf(stderr, "usage: wgrad_driver [reps 1..%d] [T>=1] [fp32_peak_gflops>0] [threads>=1]\n", MAX_REPS);
        return 2;
    }
    omp_set_num_threads(threads);
    char err[256];
    gemm_ctx_t *g[2] = {gemm_create(GEMM_LIB_ONEDNN, err, sizeof err), gemm_create(GEMM_LIB_ONEDNN, err, sizeof err)};
    if (!g[0] || !g[1]) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    gemm_set_weight_gradients_on_driver(g[1], false);
    const int64_t V = 151936;
    const qwen3_dims_t dims = {.B = 1, .S = T, .V = V};
    const int64_t XC = qwen3_default_xent_chunk(&dims), chunks = (T + XC - 1) / XC;
    static const char *names[2] = {"gemm driver panels", "brgemm matmul"};
    struct { const char *name; int64_t out, in, t, times; bool acc; } shapes[] = {
        {"qkv_proj", 4096, 1024, T, 28, false},     {"o_proj", 1024, 2048, T, 28, false},
        {"gate_up_proj", 6144, 1024, T, 28, false}, {"lm_head chunk", V, 1024, XC, chunks, true}};
    printf("fp32 weight gradients dW = dYᵀ·X of qwen3-0.6b at T=%lld (lm_head: chunks of %lld), %d threads, median of %d;"
           " GFLOP/s (%% of %.0f)\n", (long long)T, (long long)XC, threads, reps, peak);
    printf("%-14s %-26s %20s %20s %14s\n", "matmul", "M x N x K", names[0], names[1], "brgemm/driver");
    double step[2] = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s].out, N = shapes[s].in, K = shapes[s].t;
        float *dy = bench_filled_aligned(K * M, 1), *x = bench_filled_aligned(K * N, 2), *dW = bench_filled_aligned(M * N, 3);
        if (!dy || !x || !dW) {
            fprintf(stderr, "wgrad_driver: out of memory for %s\n", shapes[s].name);
            return 1;
        }
        double t[2][MAX_REPS];
        for (int r = -1; r < reps; r++) /* r = -1 creates the primitives, untimed */
            for (int v = 0; v < 2; v++) {
                double t0 = bench_now();
                gemm_f32(g[v], true, false, M, N, K, dy, M, x, N, dW, N, shapes[s].acc);
                if (r >= 0) t[v][r] = bench_now() - t0;
            }
        double med[2], flop = 2.0 * (double)M * (double)N * (double)K;
        char cell[2][32];
        for (int v = 0; v < 2; v++) {
            med[v] = bench_sorted_median(t[v], reps, NULL, NULL);
            step[v] += (double)shapes[s].times * med[v];
            snprintf(cell[v], sizeof cell[v], "%.1f (%.0f%%)", flop / med[v] * 1e-9, 100.0 * flop / med[v] * 1e-9 / peak);
        }
        char dims_s[48];
        snprintf(dims_s, sizeof dims_s, "%lld x %lld x %lld", (long long)M, (long long)N, (long long)K);
        printf("%-14s %-26s %20s %20s %13.3fx\n", shapes[s].name, dims_s, cell[0], cell[1], med[1] / med[0]);
        free(dy), free(x), free(dW);
    }
    printf("a step's weight gradients in this form (28 layers, %lld head chunks): driver %.0f ms, brgemm %.0f ms: %.3fx\n",
           (long long)chunks, step[0] * 1e3, step[1] * 1e3, step[1] / step[0]);
    gemm_destroy(g[0]);
    gemm_destroy(g[1]);
    return 0;
}
