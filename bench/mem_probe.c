/* mem_probe: what the memory bus delivers right now: util/membw.h's probe (the one a profiled run
 * takes for its op summary's % of bandwidth) over arrays of 256 MiB each, far past the L3, on
 * every thread: the better of a STREAM triad with streaming stores and an in-place update. Until
 * 2026-12-07 this was a triad with plain stores, which counted 12 bytes an element while moving
 * 16 (the store's read for ownership): the figures in docs/speed.md and docs/performance_log.md
 * from before then are that triad's, and read lower than this probe's by its own share. On this
 * shared VM the bus moves with the neighbours as the FMA units do with theirs, and the two do
 * not move together: an engine whose step is mostly bandwidth-bound work (casts, elementwise,
 * an allocator's copies) slows with the bus, one bound by its matmuls with the FMA units.
 * bench/vs_torch.py runs this beside build/bench/fma_probe before and after every run, so that a
 * round's speed-up can be read against both (docs/speed.md, "What moves the bf16 ratio").
 *   build/bench/mem_probe [threads=2] [seconds=0.5]
 * Prints one line: "mem_probe_gbs <GB/s, the better> threads <n> seconds <s> triad <GB/s> update <GB/s>". */
#include <stdio.h>
#include <stdlib.h>

#include "util/membw.h"

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double seconds = argc > 2 ? atof(argv[2]) : 0.5;
    if (threads < 1 || threads > 1024 || !(seconds > 0 && seconds <= 60) || argc > 3) {
        fprintf(stderr, "usage: mem_probe [threads 1..1024] [seconds (0, 60]]\n");
        return 2;
    }
    membw_t bw = membw_probe(threads, (size_t)256 << 20, seconds);
    if (bw.best_gbs <= 0) {
        fprintf(stderr, "mem_probe: cannot map 3 x 256 MiB for the triad; free some memory and run it again\n");
        return 1;
    }
    printf("mem_probe_gbs %.2f threads %d seconds %g triad %.2f update %.2f\n", bw.best_gbs, threads, seconds,
           bw.triad_gbs, bw.update_gbs);
    return 0;
}
