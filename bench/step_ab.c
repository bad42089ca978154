/* step_ab: two configurations' training steps alternated in one process, step by step, so that
 * this VM's swings (a quarter within minutes) hit both alike: a change a few percent wide that
 * separate runs minutes apart cannot resolve shows here. Builds both train states from
 * configs/base.yml plus the shared overrides plus each side's own (both must fit in memory
 * together: an 8-layer qwen3-0.6b rather than all 28), runs one untimed step on each, then
 * ROUNDS rounds of one step each in the order AB, BA, AB, ... on the same synthetic batch, and
 * prints each step's seconds, A's time over B's per round (above 1: B faster), their median and
 * range, and the last losses (B's layout or kernel change should not move them beyond rounding).
 *   build/bench/step_ab ROUNDS THREADS "A overrides" "B overrides" [shared overrides ...]
 *   build/bench/step_ab 8 2 row_padding=dense row_padding=padded model_name=qwen3-0.6b \
 *       override_model_config=true base_num_decoder_layers=8 vocab_size=8192 \
 *       per_device_batch_size=1 max_target_length=1024 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "config/config.h"
#include "plan/plan.h"
#include "train/state.h"
#include "util/rng.h"

enum { MAX_ROUNDS = 64, MAX_OVERRIDES = 64 };

/* Splits `own` (space-separated key=value) after the shared overrides into argv; returns the
 * count. The strings point into `buf`, which must outlive them. */
static int gather(char **argv, char *buf, size_t bufsize, const char *own, int n_shared, char **shared) {
    int n = 0;
    for (int i = 0; i < n_shared && n < MAX_OVERRIDES; i++) argv[n++] = shared[i];
    snprintf(buf, bufsize, "%s", own);
    for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok && n < MAX_OVERRIDES; tok = strtok_r(NULL, " ", &save))
        argv[n++] = tok;
    return n;
}

static void make_state(train_state_t *s, const char *side, const char *own, int n_shared, char **shared, int threads) {
    char *argv[MAX_OVERRIDES + 1], buf[4096], err[512];
    int n = gather(argv, buf, sizeof buf, own, n_shared, shared);
    argv[n++] = "profiler=";
    config_t cfg;
    plan_t plan;
    if (config_load(&cfg, "configs/base.yml", n, argv, err, sizeof err) != 0 ||
        plan_build(&plan, &cfg, threads, 1, err, sizeof err) != 0 ||
        train_state_create(s, &cfg, &plan, NULL, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "step_ab: %s (%s): %s\n", side, own, err);
        exit(1);
    }
    printf("%s: %s (plan %.2f GiB)\n", side, own, (double)plan.total_bytes / 1073741824.0);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: step_ab ROUNDS THREADS \"A overrides\" \"B overrides\" [shared overrides ...]\n"
                        "  (run from the repository root: it reads configs/base.yml)\n");
        return 2;
    }
    int rounds = atoi(argv[1]), threads = atoi(argv[2]);
    if (rounds < 1 || rounds > MAX_ROUNDS || threads < 1) {
        fprintf(stderr, "step_ab: ROUNDS must be 1..%d and THREADS at least 1\n", MAX_ROUNDS);
        return 2;
    }
    omp_set_num_threads(threads);
    int n_shared = argc - 5;
    char **shared = argv + 5;
    train_state_t s[2];
    make_state(&s[0], "A", argv[3], n_shared, shared, threads);
    make_state(&s[1], "B", argv[4], n_shared, shared, threads);
    const qwen3_dims_t *d = &s[0].plan.dims;
    if (d->B != s[1].plan.dims.B || d->S != s[1].plan.dims.S || d->V != s[1].plan.dims.V) {
        fprintf(stderr, "step_ab: A and B must share batch, sequence and vocabulary (one batch feeds both)\n");
        return 2;
    }
    int64_t ntok = d->B * (d->S + 1);
    int32_t *tokens = malloc((size_t)ntok * sizeof(int32_t));
    if (!tokens) {
        fprintf(stderr, "step_ab: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < ntok; i++) tokens[i] = (int32_t)(rng_u64(1234, 0, (uint64_t)i) % (uint64_t)d->V);
    step_result_t r[2];
    for (int side = 0; side < 2; side++) train_step(&s[side], tokens, &r[side]); /* warm-up, untimed */
    double t[2][MAX_ROUNDS], ratio[MAX_ROUNDS];
    printf("round  order  A s      B s      A/B\n");
    for (int k = 0; k < rounds; k++) {
        for (int i = 0; i < 2; i++) {
            int side = (k % 2 == 0) ? i : 1 - i;
            double t0 = bench_now();
            train_step(&s[side], tokens, &r[side]);
            t[side][k] = bench_now() - t0;
        }
        ratio[k] = t[0][k] / t[1][k];
        printf("%5d  %s     %7.3f  %7.3f  %.3f\n", k, k % 2 == 0 ? "AB" : "BA", t[0][k], t[1][k], ratio[k]);
        fflush(stdout);
    }
    double med_a = bench_sorted_median(t[0], rounds, NULL, NULL), med_b = bench_sorted_median(t[1], rounds, NULL, NULL);
    double q1, q3, med_r = bench_sorted_median(ratio, rounds, &q1, &q3); /* sorts: ratio[0] is the least */
    printf("median step: A %.3f s, B %.3f s; A/B per round: median %.3f, quartiles %.3f-%.3f, range %.3f-%.3f, over %d "
           "rounds\n", med_a, med_b, med_r, q1, q3, ratio[0], ratio[rounds - 1], rounds);
    printf("last losses: A %.6f, B %.6f\n", r[0].loss, r[1].loss);
    free(tokens);
    train_state_destroy(&s[1]);
    train_state_destroy(&s[0]);
    return 0;
}
