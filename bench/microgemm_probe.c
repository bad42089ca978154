/* microgemm_probe: the fp32 micro-GEMM (src/kernels/microgemm.c) on operands that stay in L1/L2,
 * against the FMA probe on the same thread, alternated round by round: tells the register tile's
 * own rate from what attention's memory traffic costs it. One thread. Shapes are attention's
 * block products at qwen3-0.6b's head size: M stacked query rows, N keys (or head dims), K head
 * dims (or keys); B packed in 32-column panels [N/32][K][32] as attention.c packs K and V.
 *   build/bench/microgemm_probe [rounds=9] [M=128] [N=128] [K=128]
 * Prints, per form (A row-major; A transposed, as the dK/dV products read Q and dO), the median
 * GFLOP/s and its median ratio to the probe's per-thread FMA rate measured in the same round. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/microgemm.h"
#include "util/peak.h"
#include "benchutil.h"

enum { PANEL = 32, MAX_ROUNDS = 64 };

static double run_form(int64_t M, int64_t N, int64_t K, const float *A, int64_t rsa, int64_t csa, const float *Bp,
                       float *C, double seconds) {
    int64_t calls = 0;
    double t0 = bench_now(), t;
    do {
        for (int i = 0; i < 16; i++, calls++)
            for (int64_t j0 = 0; j0 < N; j0 += PANEL)
                microgemm(M, N - j0 < PANEL ? N - j0 : PANEL, K, 1.0f, A, rsa, csa, Bp + j0 / PANEL * K * PANEL,
                          PANEL, C + j0, N, true);
        t = bench_now();
    } while (t - t0 < seconds);
    return 2.0 * (double)M * (double)N * (double)K * (double)calls / (t - t0) * 1e-9;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 9;
    int64_t M = argc > 2 ? atoll(argv[2]) : 128, N = argc > 3 ? atoll(argv[3]) : 128, K = argc > 4 ? atoll(argv[4]) : 128;
    if (rounds < 1 || rounds > MAX_ROUNDS || M < 1 || N < 1 || K < 1 || M > 4096 || N > 4096 || K > 4096) {
        fprintf(stderr, "usage: microgemm_probe [rounds 1..%d] [M] [N] [K] (each 1..4096)\n", MAX_ROUNDS);
        return 2;
    }
    int64_t Np = (N + PANEL - 1) / PANEL * PANEL;
    float *A = bench_filled_aligned(M * K, 1), *At = bench_filled_aligned(K * M, 2);
    float *Bp = bench_filled_aligned(Np * K, 3), *C = bench_filled_aligned(M * N, 4);
    if (!A || !At || !Bp || !C) {
        fprintf(stderr, "microgemm_probe: out of memory\n");
        return 1;
    }
    static double probe[MAX_ROUNDS], rowm[MAX_ROUNDS], tran[MAX_ROUNDS], rrow[MAX_ROUNDS], rtran[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        probe[r] = 1e3 * peak_probe_tflops(false, 1, 0.2);
        rowm[r] = run_form(M, N, K, A, K, 1, Bp, C, 0.3);
        tran[r] = run_form(M, N, K, At, 1, M, Bp, C, 0.3);
        rrow[r] = rowm[r] / probe[r];
        rtran[r] = tran[r] / probe[r];
    }
    printf("microgemm_probe: %s, M=%ld N=%ld K=%ld, 1 thread, %d rounds\n", microgemm_kind(), (long)M, (long)N,
           (long)K, rounds);
    printf("  FMA probe           %7.1f GFLOP/s (median)\n", bench_sorted_median(probe, rounds, NULL, NULL));
    printf("  A row-major         %7.1f GFLOP/s, %.3f of the probe\n", bench_sorted_median(rowm, rounds, NULL, NULL),
           bench_sorted_median(rrow, rounds, NULL, NULL));
    printf("  A transposed        %7.1f GFLOP/s, %.3f of the probe\n", bench_sorted_median(tran, rounds, NULL, NULL),
           bench_sorted_median(rtran, rounds, NULL, NULL));
    free(A), free(At), free(Bp), free(C);
    return 0;
}
