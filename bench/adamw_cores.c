/* adamw_cores: what bounds the AdamW update on this machine, each core or the shared memory bus,
 * and so whether running it on one core beside the next step's forward on the others would pay
 * (docs/speed.md, "AdamW beside the next forward"). Over n parameters in huge pages, as the step
 * allocates them (util/arena.h), rounds of:
 *   - adamw_update on all `threads` threads, and on one;
 *   - one thread's adamw_update while the others run a bf16 matmul at the gate_up projection's
 *     forward shape of qwen3-0.6b ([1024 × 1024] · [6144 × 1024]ᵀ, our blocked kernel, where the
 *     CPU has AVX512-BF16 or AMX), and that matmul alone on those threads. Its weights cycle
 *     through WEIGHTS matrices (96 MiB, past the L3) so that, as in a step's forward, they come
 *     from memory, freshly written by the update.
 * Prints GB/s (30 bytes a parameter: p, m, v, g read; p, m, v and the bf16 copy written) and
 * GFLOP/s, medians over the rounds. If one core's update runs near all cores' rate while the
 * matmul keeps its pace beside it, the bus bounds the update and the overlap gains about the
 * update's time; if one core runs at 1/threads of it, the cores bound it and the overlap gains
 * little. The estimate it prints is a bound: in a 28-layer qwen3-0.6b bf16 step on the Zen 5
 * (2026-12-06) the layers beside the update ran at 0.42 of their two-thread rate, not this
 * matmul's 0.48, and the overlap gained about 1% where this bench, in the same slow memory
 * phase (one thread's update 0.94 of two threads'), estimated 0.63 (docs/speed.md).
 *   build/bench/adamw_cores [threads=2] [rounds=5] [million parameters=150] */
#include <omp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "kernels/adamw.h"
#include "kernels/amx.h"
#include "kernels/bf16_blocked.h"
#include "kernels/dpbf16.h"

enum { MAX_ROUNDS = 64, WEIGHTS = 8 };

/* The gate_up forward [M × K] · [N × K]ᵀ on `threads` threads, with the call-th of the WEIGHTS
 * weight matrices. */
enum { M = 1024, N = 6144, K = 1024 };
static void gate_up_forward(const bf16_t *x, const bf16_t *w, float *y, bf16_t *work, int threads, int call) {
    bf16_blocked_gemm(false, true, M, N, K, x, K, w + (int64_t)(call % WEIGHTS) * N * K, K, y, N, false, work, threads, NULL);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 5;
    int64_t n = (argc > 3 ? atoll(argv[3]) : 150) * 1000000LL;
    if (threads < 2 || rounds < 1 || rounds > MAX_ROUNDS || n < 1000000) {
        fprintf(stderr, "usage: adamw_cores [threads >= 2] [rounds 1..%d] [million parameters >= 1]\n", MAX_ROUNDS);
        return 2;
    }
    float *p = bench_arena_alloc((size_t)n * sizeof(float), "parameters"), *m = bench_arena_alloc((size_t)n * sizeof(float), "m");
    float *v = bench_arena_alloc((size_t)n * sizeof(float), "v"), *g = bench_arena_alloc((size_t)n * sizeof(float), "gradients");
    bf16_t *p16 = bench_arena_alloc((size_t)n * sizeof(bf16_t), "bf16 copy");
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = (float)(i % 97) * 1e-2f, g[i] = (float)(i % 13) * 1e-3f;
    const adamw_hparams_t hp = {.lr = 1e-4f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    const double bytes = 30.0 * (double)n;

    const bool have_bf16 = amx_available() || dpbf16_available();
    bf16_t *x = NULL, *w = NULL, *work = NULL;
    float *y = NULL;
    if (have_bf16) {
        x = bench_arena_alloc((size_t)(M * K) * sizeof(bf16_t), "x");
        w = bench_arena_alloc((size_t)(WEIGHTS * N * K) * sizeof(bf16_t), "w");
        y = bench_arena_alloc((size_t)(M * N) * sizeof(float), "y");
        work = bench_arena_alloc((size_t)threads * (size_t)bf16_blocked_workspace_elems() * sizeof(bf16_t), "workspace");
        for (int64_t i = 0; i < M * K; i++) x[i] = (bf16_t)(0x3c00 + i % 7);
        for (int64_t i = 0; i < WEIGHTS * N * K; i++) w[i] = (bf16_t)(0x3c00 + i % 5);
    } else {
        printf("no bf16 matmul unit (AVX512-BF16 or AMX): the update beside a matmul is not measured\n");
    }
    const double flops = 2.0 * (double)M * (double)N * (double)K;

    double all[MAX_ROUNDS], one[MAX_ROUNDS], beside[MAX_ROUNDS], mm_beside[MAX_ROUNDS], mm_alone[MAX_ROUNDS];
    int64_t step = 0;
    for (int r = 0; r < rounds; r++) {
        omp_set_num_threads(threads);
        double t0 = bench_now();
        adamw_update(p, m, v, g, n, ++step, 1.0f, &hp, p16);
        all[r] = bytes / (bench_now() - t0) / 1e9;
        omp_set_num_threads(1);
        t0 = bench_now();
        adamw_update(p, m, v, g, n, ++step, 1.0f, &hp, p16);
        one[r] = bytes / (bench_now() - t0) / 1e9;
        if (!have_bf16) continue;
        /* The matmul alone on threads - 1, then beside one thread's update until it is done. */
        t0 = bench_now();
        int calls = 0;
        do gate_up_forward(x, w, y, work, threads - 1, calls++);
        while (bench_now() - t0 < 0.3);
        mm_alone[r] = flops * calls / (bench_now() - t0) / 1e9;
        double update_s = 0, mm_rate = 0;
        atomic_bool updated = false;
        const int64_t t = ++step;
        omp_set_max_active_levels(2);
#pragma omp parallel num_threads(2)
        {
            if (omp_get_thread_num() == 1) {
                omp_set_num_threads(1);
                double s = bench_now();
                adamw_update(p, m, v, g, n, t, 1.0f, &hp, p16);
                update_s = bench_now() - s;
                atomic_store(&updated, true);
            } else {
                double s = bench_now();
                int c = 0;
                do gate_up_forward(x, w, y, work, threads - 1, c++); /* whole calls, until the update is done */
                while (!atomic_load(&updated));
                mm_rate = flops * c / (bench_now() - s) / 1e9;
            }
        }
        omp_set_max_active_levels(1);
        beside[r] = bytes / update_s / 1e9;
        mm_beside[r] = mm_rate;
    }
    double a = bench_sorted_median(all, rounds, NULL, NULL), o = bench_sorted_median(one, rounds, NULL, NULL);
    printf("AdamW over %lld parameters (30 bytes each), medians of %d rounds:\n", (long long)n, rounds);
    printf("  %d threads: %.1f GB/s; 1 thread: %.1f GB/s (%.2f of %d threads)\n", threads, a, o, o / a, threads);
    if (have_bf16) {
        double b = bench_sorted_median(beside, rounds, NULL, NULL);
        double ma = bench_sorted_median(mm_alone, rounds, NULL, NULL);
        double mb = bench_sorted_median(mm_beside, rounds, NULL, NULL);
        printf("  1 thread beside a bf16 matmul on %d: %.1f GB/s (%.2f of %d threads); the matmul %.0f GFLOP/s beside "
               "it, %.0f alone (%.2f)\n", threads - 1, b, b / a, threads, mb, ma, mb / ma);
        /* The update's time saved a step, per second of it on all threads: the sequential update
         * (1) against the overlapped one's time less the forward work done beside it. */
        double overlapped = a / b * (1.0 - mb / ma * (threads - 1) / threads);
        printf("  overlap estimate: the update's cost would be %.2f of its time on %d threads (1 = no gain), if the "
               "whole forward kept this matmul's pace beside it\n", overlapped, threads);
    }
    arena_free(p, (size_t)n * sizeof(float)), arena_free(m, (size_t)n * sizeof(float));
    arena_free(v, (size_t)n * sizeof(float)), arena_free(g, (size_t)n * sizeof(float));
    arena_free(p16, (size_t)n * sizeof(bf16_t));
    if (have_bf16) {
        arena_free(x, (size_t)(M * K) * sizeof(bf16_t)), arena_free(w, (size_t)(WEIGHTS * N * K) * sizeof(bf16_t));
        arena_free(y, (size_t)(M * N) * sizeof(float));
        arena_free(work, (size_t)threads * (size_t)bf16_blocked_workspace_elems() * sizeof(bf16_t));
    }
    return 0;
}
