/* fma_probe: what the cores' FMA units deliver right now, measured as stepscope's start-up probe
 * does (src/util/peak.c: independent FMA chains on every thread, no memory traffic, best of 5
 * rounds). On a shared VM that moves by a quarter or more within minutes; bench/vs_torch.py runs
 * this before and after every run and prints it beside the timings, so a slow round can be told
 * from a slow engine.
 *   build/bench/fma_probe [threads=2] [seconds=0.5]
 * Prints one line: "fma_probe_tflops <TFLOP/s> threads <n> seconds <s>". */
#include <stdio.h>
#include <stdlib.h>

#include "util/peak.h"

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double seconds = argc > 2 ? atof(argv[2]) : 0.5;
    if (threads < 1 || threads > 1024 || !(seconds > 0 && seconds <= 60)) {
        fprintf(stderr, "usage: fma_probe [threads 1..1024] [seconds (0, 60]]\n");
        return 2;
    }
    printf("fma_probe_tflops %.4f threads %d seconds %g\n", peak_probe_tflops(false, threads, seconds), threads,
           seconds);
    return 0;
}
