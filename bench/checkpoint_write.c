/* checkpoint_write: what a parameter checkpoint's write costs, two ways alternated round by
 * round in one process: plain fwrite with one closing fsync, and written through
 * (util/atomic_file.h, atomic_file_write_through: each 8 MiB piece handed to the disk as it is
 * written and dropped from the page cache 64 MiB later). A file of the size of qwen3-0.6b's
 * parameters by default (596049920 fp32 parameters, 2.22 GiB), in tensors of that model's sizes
 * cycled (the embedding's 622 MB, then the layers' 2-12 MB), written whole by atomic_write_with
 * (temporary file, fsync, rename) into the folder given. Prints each round's seconds, GB/s, the
 * CPU seconds the process spent (user + system: on a 2-core machine what a write beside a step
 * takes from it) and how much the page cache grew (/proc/meminfo's Cached), then the medians.
 *   build/bench/checkpoint_write [folder=out] [rounds=3] [million parameters=596.05] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "benchutil.h"
#include "util/atomic_file.h"

enum { PLAIN, THROUGH, MODES };

typedef struct {
    const float *params;
    int64_t n;
    int mode;
} writer_ctx_t;

/* qwen3-0.6b's tensor sizes in floats: the embedding, then one layer's q, k, v, o, gate, up, down
 * and its norms, cycled until n is written. */
static const int64_t SIZES[] = {155582464, 2097152, 1048576, 1048576, 2097152, 3145728, 3145728, 3145728, 128,
                                128, 1024, 1024};

static int write_params(FILE *f, void *ctx, char *err, size_t errlen) {
    const writer_ctx_t *w = ctx;
    int64_t at = 0;
    for (size_t i = 0; at < w->n; i = i + 1 == sizeof SIZES / sizeof SIZES[0] ? 1 : i + 1) {
        int64_t k = SIZES[i] < w->n - at ? SIZES[i] : w->n - at;
        size_t bytes = (size_t)k * sizeof(float);
        int ok = w->mode == PLAIN ? fwrite(w->params + at, 1, bytes, f) == bytes
                                  : atomic_file_write_through(f, w->params + at, bytes) == 0;
        if (!ok) {
            snprintf(err, errlen, "write failed");
            return -1;
        }
        at += k;
    }
    return 0;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static double cached_gib(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0.0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Cached: %lf kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib / 1048576.0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "out";
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int64_t n = (int64_t)((argc > 3 ? atof(argv[3]) : 596.04992) * 1e6);
    if (rounds < 1 || n < 1) {
        fprintf(stderr, "usage: checkpoint_write [folder=out] [rounds>=1] [million parameters>0]\n");
        return 2;
    }
    float *params = bench_filled(n, 7);
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/checkpoint_write.bench.safetensors", dir);
    if (!params || mkdir_p(dir) != 0) {
        fprintf(stderr, "checkpoint_write: no memory for %lld parameters, or cannot create %s\n", (long long)n, dir);
        return 1;
    }
    double bytes = (double)n * sizeof(float);
    double *secs[MODES], *cpu[MODES];
    for (int m = 0; m < MODES; m++) secs[m] = calloc((size_t)rounds, sizeof(double)), cpu[m] = calloc((size_t)rounds, sizeof(double));
    const char *names[MODES] = {"fwrite + closing fsync", "written through"};
    printf("checkpoint_write: %.3f GiB (%lld fp32 parameters) to %s, %d rounds, alternated\n", bytes / 1073741824.0,
           (long long)n, path, rounds);
    for (int r = 0; r < rounds; r++) {
        for (int m = 0; m < MODES; m++) {
            writer_ctx_t w = {params, n, m};
            double cache0 = cached_gib(), c0 = cpu_seconds(), t0 = bench_now();
            if (atomic_write_with(path, write_params, &w, err, sizeof err) != 0) {
                fprintf(stderr, "checkpoint_write: %s\n", err);
                return 1;
            }
            secs[m][r] = bench_now() - t0, cpu[m][r] = cpu_seconds() - c0;
            printf("  round %d %-24s %7.3f s  %6.3f GB/s  CPU %6.3f s  page cache %+7.3f GiB\n", r, names[m], secs[m][r],
                   bytes / secs[m][r] / 1e9, cpu[m][r], cached_gib() - cache0);
            unlink(path);
        }
    }
    double t[MODES];
    printf("medians:\n");
    for (int m = 0; m < MODES; m++) {
        t[m] = bench_sorted_median(secs[m], rounds, NULL, NULL);
        double c = bench_sorted_median(cpu[m], rounds, NULL, NULL);
        printf("  %-24s %7.3f s (%.3f GB/s), CPU %.3f s\n", names[m], t[m], bytes / t[m] / 1e9, c);
        free(secs[m]), free(cpu[m]);
    }
    printf("written through: %.2fx fwrite + closing fsync's speed\n", t[PLAIN] / t[THROUGH]);
    free(params);
    return 0;
}
