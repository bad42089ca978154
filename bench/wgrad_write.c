/* wgrad_write: what it costs a weight-gradient product to add into dW (dW += dYᵀ·X, reading the
 * zeros the optimizer left) rather than write it (dW = dYᵀ·X, what the step runs for a linear
 * layer's one gradient product per step), at qwen3-0.6b's four layer shapes and T tokens. Each
 * shape's operands come in 8 sets in huge-page arenas, as the model's, used in turn so dW is
 * cold as in a step; the two forms alternate round by round. Prints each form's median GFLOP/s,
 * the median and range of the per-round time ratios (add / write; > 1: writing is faster) and
 * their flop-weighted mean over the shapes.
 *   build/bench/wgrad_write [reps=9] [T=1024] [threads=2] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"
#include "util/arena.h"
#include "benchutil.h"

enum { SETS = 8 };

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9, threads = argc > 3 ? atoi(argv[3]) : 2;
    int64_t T = argc > 2 ? atoll(argv[2]) : 1024;
    if (reps < 1 || reps > 64 || T < 1 || threads < 1) {
        fprintf(stderr, "usage: wgrad_write [reps 1..64] [T>=1] [threads>=1]\n");
        return 2;
    }
    static const struct {
        const char *name;
        int64_t in, out;
    } shapes[] = {{"qkv_proj", 1024, 4096}, {"o_proj", 2048, 1024}, {"gate_up_proj", 1024, 6144}, {"down_proj", 3072, 1024}};
    char err[256];
    gemm_ctx_t *g = gemm_create(GEMM_LIB_AUTO, err, sizeof err);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    omp_set_num_threads(threads);
    gemm_reserve(g, threads, false, false);
    printf("weight-gradient products dW = dYᵀ·X (write) and dW += dYᵀ·X (add), T=%lld, %d threads, %s, median of %d\n",
           (long long)T, threads, gemm_library_detail(g), reps);
    printf("%-14s %12s %12s %22s\n", "matmul", "write GFLOP/s", "add GFLOP/s", "add/write time (range)");
    double weighted = 0, total_flops = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t in = shapes[si].in, out = shapes[si].out;
        size_t wbytes = (size_t)(out * in) * 4, xbytes = (size_t)(T * in) * 4, ybytes = (size_t)(T * out) * 4;
        float *dW[SETS], *x[SETS], *dy[SETS];
        for (int s = 0; s < SETS; s++) {
            dW[s] = arena_alloc(wbytes, "dW", err, sizeof err);
            x[s] = arena_alloc(xbytes, "x", err, sizeof err);
            dy[s] = arena_alloc(ybytes, "dy", err, sizeof err);
            if (!dW[s] || !x[s] || !dy[s]) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            float *fx = bench_filled(T * in, 1), *fy = bench_filled(T * out, 2);
            memcpy(x[s], fx, xbytes);
            memcpy(dy[s], fy, ybytes);
            free(fx), free(fy);
        }
        double t[2][64], ratio[64];
        int set = 0;
        for (int r = -1; r < reps; r++) /* r = -1 creates the primitives, untimed */
            for (int add = 0; add < 2; add++) {
                double sum = 0;
                for (int c = 0; c < SETS; c++, set = (set + 1) % SETS) {
                    double t0 = omp_get_wtime();
                    gemm_f32(g, true, false, out, in, T, dy[set], out, x[set], in, dW[set], in, add);
                    sum += omp_get_wtime() - t0;
                }
                if (r >= 0) t[add][r] = sum / SETS;
            }
        for (int r = 0; r < reps; r++) ratio[r] = t[1][r] / t[0][r];
        double flops = 2.0 * (double)T * (double)in * (double)out;
        double mr = bench_sorted_median(ratio, reps, NULL, NULL);
        double tw = bench_sorted_median(t[0], reps, NULL, NULL), ta = bench_sorted_median(t[1], reps, NULL, NULL);
        printf("%-14s %12.1f %12.1f %10.3f (%.3f-%.3f)\n", shapes[si].name, flops / tw * 1e-9, flops / ta * 1e-9, mr,
               ratio[0], ratio[reps - 1]);
        weighted += mr * flops;
        total_flops += flops;
        for (int s = 0; s < SETS; s++) arena_free(dW[s], wbytes), arena_free(x[s], xbytes), arena_free(dy[s], ybytes);
    }
    printf("flop-weighted add/write time: %.3f\n", weighted / total_flops);
    gemm_destroy(g);
    return 0;
}
