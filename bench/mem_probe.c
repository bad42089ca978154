/* mem_probe: what the memory bus delivers right now, as a STREAM-style triad (a = b + s·c) over
 * three arrays of 256 MiB each (far past the L3) on every thread, best of its rounds. On this
 * shared VM the bus moves with the neighbours as the FMA units do with theirs, and the two do
 * not move together: an engine whose step is mostly bandwidth-bound work (casts, elementwise,
 * an allocator's copies) slows with the bus, one bound by its matmuls with the FMA units.
 * bench/vs_torch.py runs this beside build/bench/fma_probe before and after every run, so that a
 * round's speed-up can be read against both (docs/speed.md, "What moves the bf16 ratio").
 * Bytes are counted as STREAM counts them: 12 bytes an element (two reads, one write; the write's
 * read-for-ownership not counted).
 *   build/bench/mem_probe [threads=2] [seconds=0.5]
 * Prints one line: "mem_probe_gbs <GB/s> threads <n> seconds <s> rounds <r>". */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "benchutil.h"
#include "util/arena.h"

enum { ELEMENTS = 64 << 20, MIN_ROUNDS = 3 }; /* 256 MiB of floats an array */

/* a[n] = b[n] + s · c[n] on `threads` threads, static halves so each thread keeps its pages. */
static void triad(float *a, const float *b, const float *c, float s, int64_t n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double seconds = argc > 2 ? atof(argv[2]) : 0.5;
    if (threads < 1 || threads > 1024 || !(seconds > 0 && seconds <= 60) || argc > 3) {
        fprintf(stderr, "usage: mem_probe [threads 1..1024] [seconds (0, 60]]\n");
        return 2;
    }
    char err[256];
    const size_t bytes = (size_t)ELEMENTS * sizeof(float);
    float *a = arena_alloc(bytes, "mem_probe a", err, sizeof err), *b = arena_alloc(bytes, "mem_probe b", err, sizeof err),
          *c = arena_alloc(bytes, "mem_probe c", err, sizeof err);
    if (!a || !b || !c) { /* err's hint is the step's (batch, sequence): not this probe's */
        fprintf(stderr, "mem_probe: cannot map 3 x 256 MiB for the triad; free some memory and run it again\n");
        return 1;
    }
    triad(a, b, c, 0.5f, ELEMENTS, threads); /* one untimed pass: the values (the arena's zeros) do not matter */
    double best = 0.0, start = bench_now();
    int rounds = 0;
    while (rounds < MIN_ROUNDS || bench_now() - start < seconds) {
        double t0 = bench_now();
        triad(a, b, c, 0.5f, ELEMENTS, threads);
        double gbs = 3.0 * (double)bytes / (bench_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
        rounds++;
    }
    printf("mem_probe_gbs %.2f threads %d seconds %g rounds %d\n", best, threads, seconds, rounds);
    arena_free(a, bytes);
    arena_free(b, bytes);
    arena_free(c, bytes);
    return 0;
}
