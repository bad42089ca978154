/* bf16_blocks: the block products of the packed bf16 attention kernel (attention_bf16_packed.c)
 * on one thread, per product shape at qwen3-0.6b's heads (HD = 128, 128-query blocks), on
 * AVX512-BF16 dot products (dpbf16_gemm) and, where the CPU has them, AMX tiles (amx_gemm),
 * interleaved call by call. Operands stay hot as in the kernel: a block's q and strips are
 * reused by each product, the packed K and V by the next block. Prints each variant's median
 * of `reps` calls as GFLOP/s and % of the one-core bf16 peak given on the command line.
 *   build/bench/bf16_blocks [reps=21] [one_core_bf16_peak_gflops=446] [S=1024] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/amx.h"
#include "kernels/bf16.h"
#include "kernels/dpbf16.h"
#include "benchutil.h"

enum { MAX_REPS = 101, QB = 128, HD = 128 };

static bf16_t *bf16_filled(int64_t n, unsigned seed) {
    float *f = bench_filled(n, seed);
    bf16_t *h = aligned_alloc(64, (size_t)((n * 2 + 63) / 64 * 64));
    bf16_from_f32_array(h, f, n);
    free(f);
    return h;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 21;
    double peak = argc > 2 ? atof(argv[2]) : 446.0;
    int64_t S = argc > 3 ? atoll(argv[3]) : 1024;
    if (reps < 1 || reps > MAX_REPS || peak <= 0 || S < 32 || S % 32) {
        fprintf(stderr, "usage: bf16_blocks [reps 1..%d] [one_core_bf16_peak_gflops>0] [S, a multiple of 32]\n", MAX_REPS);
        return 2;
    }
    bf16_block_product_fn fns[2] = {dpbf16_gemm, amx_gemm};
    const char *names[2] = {"avx512-bf16", "amx"};
    bool have[2] = {dpbf16_available(), amx_available()};
    if (!have[0] && !have[1]) {
        printf("bf16 block products not measured: this CPU or build has neither AVX512-BF16 nor AMX\n");
        return 0;
    }
    /* The kernel's shapes: scores and dP = [QB × S] over K = HD (and dKᵀ, dVᵀ += [HD × S] over
     * K = QB, the same extents, accumulated); P·V and dS·K = [QB × HD] over K = S. */
    struct { const char *what; int64_t M, N, K; bool acc; } shapes[3] = {
        {"q.kT, dO.vT  [128 x S] over 128", QB, S, HD, false},
        {"dKT += QT.dS [128 x S] over 128", HD, S, QB, true},
        {"P.V, dS.K    [128 x 128] over S", QB, HD, S, false},
    };
    printf("bf16 block products at S=%ld, 1 thread, median of %d calls; GFLOP/s (%% of %.0f)\n", (long)S, reps, peak);
    printf("%-34s", "product");
    for (int v = 0; v < 2; v++)
        if (have[v]) printf(" %20s", names[v]);
    printf("\n");
    for (int si = 0; si < 3; si++) {
        const int64_t M = shapes[si].M, N = shapes[si].N, K = shapes[si].K, lda = K + 32, ldc = N + 16;
        bf16_t *A = bf16_filled(M * lda, 1), *B = bf16_filled(K * N, 2); /* B: any bits of the packed size */
        float *C = bench_filled(M * ldc, 3);
        double t[2][MAX_REPS];
        for (int r = 0; r < reps + 1; r++)
            for (int v = 0; v < 2; v++) {
                if (!have[v]) continue;
                if (v == 1) amx_configure_full_tiles();
                double t0 = bench_now();
                fns[v](C, ldc, A, lda, B, K, M, N, K, shapes[si].acc);
                if (r > 0) t[v][r - 1] = bench_now() - t0; /* the first call warms the caches */
            }
        printf("%-34s", shapes[si].what);
        for (int v = 0; v < 2; v++) {
            if (!have[v]) continue;
            double s = bench_sorted_median(t[v], reps, NULL, NULL), gf = 2.0 * (double)(M * N * K) / s * 1e-9;
            printf("   %8.1f (%5.1f%%)", gf, 100.0 * gf / peak);
        }
        printf("\n");
        free(A), free(B), free(C);
    }
    return 0;
}
