/* adamw_mu: what mu_dtype=bfloat16 and weight_dtype=bfloat16 save in the AdamW update.
 * Alternates, call by call over the same n parameters in huge pages (util/arena.h, as the step
 * allocates them), the update with AdamW's first moment in fp32 (adamw_update: p, m, v, g read;
 * p, m, v and the bf16 weight copy written, 30 bytes a parameter), in bf16 (adamw_update_m16: 26
 * bytes), each writing the bf16 weight copy as a dtype=bfloat16 step does, and with the
 * parameters, m and v all in bf16 (adamw_update_w16, weight_dtype=bfloat16: 16 bytes, no copy), to
 * nearest and with the weights rounded stochastically (stochastic_rounding: a hash per weight).
 * Prints each one's milliseconds and GB/s (of its own bytes), medians over the rounds, and the
 * ratios of their times per round, whose medians are the comparison: all run in the same memory
 * phase of this shared VM.
 *   build/bench/adamw_mu [rounds=9] [million parameters=596 (qwen3-0.6b)] [threads=all] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "kernels/adamw.h"

enum { MAX_ROUNDS = 64 };

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 9;
    int64_t n = (argc > 2 ? atoll(argv[2]) : 596) * 1000000LL;
    int threads = argc > 3 ? atoi(argv[3]) : omp_get_num_procs();
    if (rounds < 1 || rounds > MAX_ROUNDS || n < 1000000 || threads < 1) {
        fprintf(stderr, "usage: adamw_mu [rounds 1..%d] [million parameters >= 1] [threads >= 1]\n", MAX_ROUNDS);
        return 2;
    }
    omp_set_num_threads(threads);
    const size_t nf = (size_t)n * sizeof(float), nh = (size_t)n * sizeof(bf16_t);
    float *p = bench_arena_alloc(nf, "parameters"), *m = bench_arena_alloc(nf, "m"), *v = bench_arena_alloc(nf, "v");
    float *g = bench_arena_alloc(nf, "gradients");
    bf16_t *m16 = bench_arena_alloc(nh, "bf16 m"), *p16 = bench_arena_alloc(nh, "bf16 copy");
    bf16_t *w16 = bench_arena_alloc(nh, "bf16 parameters"), *v16 = bench_arena_alloc(nh, "bf16 v");
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) p[i] = (float)(i % 97) * 1e-2f, g[i] = (float)(i % 13) * 1e-3f, w16[i] = bf16_from_f32(p[i]);
    const adamw_hparams_t hp = {.lr = 1e-4f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    double ms32[MAX_ROUNDS], ms16[MAX_ROUNDS], msw[MAX_ROUNDS], mssr[MAX_ROUNDS], ratio[MAX_ROUNDS],
        ratio_w[MAX_ROUNDS], ratio_sr[MAX_ROUNDS];
    const adamw_rounding_t sr = {.stochastic = true, .seed = 1, .index0 = 0};
    /* One call of each first, untimed: the pages' first touch by the update's own threads. */
    adamw_update(p, m, v, g, n, 1, 1.0f, &hp, p16);
    adamw_update_m16(p, m16, v, g, n, 1, 1.0f, &hp, p16);
    adamw_update_w16(w16, NULL, m16, v16, g, n, 1, 1.0f, &hp, NULL);
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
        adamw_update(p, m, v, g, n, r + 2, 1.0f, &hp, p16);
        double t1 = bench_now();
        adamw_update_m16(p, m16, v, g, n, r + 2, 1.0f, &hp, p16);
        double t2 = bench_now();
        adamw_update_w16(w16, NULL, m16, v16, g, n, r + 2, 1.0f, &hp, NULL);
        double t3 = bench_now();
        adamw_update_w16(w16, NULL, m16, v16, g, n, r + 2, 1.0f, &hp, &sr);
        double t4 = bench_now();
        ms32[r] = (t1 - t0) * 1e3, ms16[r] = (t2 - t1) * 1e3, msw[r] = (t3 - t2) * 1e3, mssr[r] = (t4 - t3) * 1e3;
        ratio[r] = ms32[r] / ms16[r], ratio_w[r] = ms32[r] / msw[r], ratio_sr[r] = mssr[r] / msw[r];
    }
    double q1, q3;
    double r = bench_sorted_median(ratio, rounds, &q1, &q3);
    double wq1, wq3;
    double rw = bench_sorted_median(ratio_w, rounds, &wq1, &wq3);
    double a = bench_sorted_median(ms32, rounds, NULL, NULL), b = bench_sorted_median(ms16, rounds, NULL, NULL);
    double c = bench_sorted_median(msw, rounds, NULL, NULL), e = bench_sorted_median(mssr, rounds, NULL, NULL);
    double sq1, sq3;
    double rs = bench_sorted_median(ratio_sr, rounds, &sq1, &sq3);
    printf("AdamW over %lld parameters on %d threads, writing the bf16 weight copy, medians of %d alternated rounds:\n",
           (long long)n, threads, rounds);
    printf("  m in fp32 (30 bytes a parameter): %.1f ms, %.1f GB/s\n", a, 30.0 * (double)n / a / 1e6);
    printf("  m in bf16 (26 bytes a parameter): %.1f ms, %.1f GB/s\n", b, 26.0 * (double)n / b / 1e6);
    printf("  bf16 m's speed-up: %.3fx (quartiles %.3f-%.3f; 30/26 = %.3f if the bytes alone bound both)\n", r, q1, q3,
           30.0 / 26.0);
    printf("  p, m and v in bf16 (weight_dtype=bfloat16, 16 bytes a parameter): %.1f ms, %.1f GB/s\n", c,
           16.0 * (double)n / c / 1e6);
    printf("  bf16 weights' speed-up over fp32 m: %.3fx (quartiles %.3f-%.3f; 30/16 = %.3f if the bytes alone bound "
           "both)\n", rw, wq1, wq3, 30.0 / 16.0);
    printf("  the same, weights rounded stochastically: %.1f ms, %.1f GB/s; its time over to-nearest's %.3fx "
           "(quartiles %.3f-%.3f)\n", e, 16.0 * (double)n / e / 1e6, rs, sq1, sq3);
    arena_free(p, nf), arena_free(m, nf), arena_free(v, nf), arena_free(g, nf);
    arena_free(m16, nh), arena_free(p16, nh), arena_free(w16, nh), arena_free(v16, nh);
    return 0;
}
