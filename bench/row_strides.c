/* row_strides: qwen3-0.6b's twelve layer matmul forms (forward y = x·Wᵀ, weight gradient
 * dW = dyᵀ·x, input gradient dx = dy·W of qkv_proj, o_proj, gate_up_proj and down_proj) with
 * the activations' rows dense (row_padding=dense), against only the q/k/v and gate/up ones
 * padded (y and dy of qkv and gate_up, 4096 and 6144 floats wide, 64 bytes wider: the model's
 * layout from 2026-12-02 until every activation was padded), and against every activation padded
 * (x and dx as well, D, H·HD and F wide: qwen3_padded_width, the layout row_padding=auto runs on
 * oneDNN in fp32). Each variant runs through the same gemm_f32 the model calls, alternated
 * call by call so a noisy neighbour hits them alike; prints each form's median GFLOP/s and
 * speed-up over dense, and the twelve forms' sum.
 *   build/bench/row_strides [tokens=1024] [reps=7] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "kernels/gemm.h"
#include "model/qwen3.h"

enum { VARIANTS = 3, FORMS = 3, MAX_REPS = 64 };

static float *filled(int64_t n, unsigned seed) {
    float *p = bench_filled_aligned(n, seed);
    if (!p) {
        fprintf(stderr, "row_strides: out of memory\n");
        exit(1);
    }
    return p;
}

/* The row stride of an activation `cols` wide in variant v: 0 dense, 1 the qkv and gate_up
 * outputs only, 2 every activation at the model's padded width. */
static int64_t stride(int v, int64_t cols, bool model_pads) {
    return v == 2 || (v == 1 && model_pads) ? qwen3_padded_width(cols) : cols;
}

int main(int argc, char **argv) {
    int64_t T = argc > 1 ? atoll(argv[1]) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 7, threads = argc > 3 ? atoi(argv[3]) : 2;
    if (T < 1 || reps < 1 || reps > MAX_REPS || threads < 1) {
        fprintf(stderr, "usage: row_strides [tokens >= 1] [reps 1..%d] [threads >= 1]\n", MAX_REPS);
        return 2;
    }
    omp_set_num_threads(threads);
    char err[256];
    gemm_ctx_t *g = gemm_create(GEMM_LIB_ONEDNN, err, sizeof err);
    if (!g || !gemm_reserve(g, threads, false, false)) {
        fprintf(stderr, "row_strides: %s\n", g ? "out of memory" : err);
        return 1;
    }
    const struct {
        const char *name;
        int64_t out, in;
        bool pads; /* variant 1 pads this layer's y and dy */
    } layers[] = {{"qkv_proj", 4096, 1024, true}, {"o_proj", 1024, 2048, false},
                  {"gate_up_proj", 6144, 1024, true}, {"down_proj", 1024, 3072, false}};
    static const char *forms[FORMS] = {"fwd   y=x·Wᵀ", "wgrad dW=dyᵀ·x", "dgrad dx=dy·W"};
    printf("qwen3-0.6b layer matmuls at T=%lld tokens, %d threads, oneDNN, median of %d, alternated call by call;\n"
           "GFLOP/s with the activations' rows dense | qkv's and gate_up's y and dy padded | all padded (the model's)\n",
           (long long)T, threads, reps);
    double total[VARIANTS] = {0}, flops_all = 0;
    for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
        int64_t out = layers[l].out, in = layers[l].in;
        float *W = filled(out * in, 1), *dW = filled(out * in, 2);
        float *x[VARIANTS], *dx[VARIANTS], *y[VARIANTS], *dy[VARIANTS];
        int64_t ldx[VARIANTS], ldy[VARIANTS];
        for (int v = 0; v < VARIANTS; v++) {
            ldx[v] = stride(v, in, false), ldy[v] = stride(v, out, layers[l].pads);
            x[v] = filled(T * ldx[v], 3), dx[v] = filled(T * ldx[v], 4);
            y[v] = filled(T * ldy[v], 5), dy[v] = filled(T * ldy[v], 6);
        }
        double ts[VARIANTS][FORMS][MAX_REPS];
        for (int r = -1; r < reps; r++) /* r = -1 warms each shape up, untimed */
            for (int v = 0; v < VARIANTS; v++)
                for (int f = 0; f < FORMS; f++) {
                    double t0 = bench_now();
                    if (f == 0) gemm_f32(g, false, true, T, out, in, x[v], ldx[v], W, in, y[v], ldy[v], false);
                    if (f == 1) gemm_f32(g, true, false, out, in, T, dy[v], ldy[v], x[v], ldx[v], dW, in, false);
                    if (f == 2) gemm_f32(g, false, false, T, in, out, dy[v], ldy[v], W, in, dx[v], ldx[v], false);
                    if (r >= 0) ts[v][f][r] = bench_now() - t0;
                }
        double flop = 2.0 * (double)T * (double)out * (double)in;
        for (int f = 0; f < FORMS; f++) {
            double med[VARIANTS];
            for (int v = 0; v < VARIANTS; v++) {
                med[v] = bench_sorted_median(ts[v][f], reps, NULL, NULL);
                total[v] += med[v];
            }
            flops_all += flop;
            printf("%-13s %-15s %6.1f | %6.1f (%.3fx) | %6.1f (%.3fx)\n", layers[l].name, forms[f], flop / med[0] * 1e-9,
                   flop / med[1] * 1e-9, med[0] / med[1], flop / med[2] * 1e-9, med[0] / med[2]);
        }
        free(W), free(dW);
        for (int v = 0; v < VARIANTS; v++) free(x[v]), free(dx[v]), free(y[v]), free(dy[v]);
    }
    printf("all twelve forms: %.1f | %.1f (%.3fx) | %.1f (%.3fx) GFLOP/s\n", flops_all / total[0] * 1e-9,
           flops_all / total[1] * 1e-9, total[0] / total[1], flops_all / total[2] * 1e-9, total[0] / total[2]);
    gemm_destroy(g);
    return 0;
}
