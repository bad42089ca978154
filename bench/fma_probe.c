/* fma_probe: what the cores' FMA units deliver right now, measured as stepscope's start-up probe
 * does (src/util/peak.c: independent FMA chains on every thread, no memory traffic, best of 5
 * rounds). On a shared VM that moves by a quarter or more within minutes; bench/vs_torch.py runs
 * this before and after every run and prints it beside the timings, so a slow round can be told
 * from a slow engine.
 * With "bf16" it also runs the bf16 probe a dtype=bfloat16 run starts with (vdpbf16ps chains on
 * AVX512-BF16, AMX tiles where the CPU has them) and prints its ratio to the fp32 figure. With
 * "ymm" (AVX-512 builds) it also runs the fp32 chains at 256 bits and prints the 512-bit
 * figure's ratio to them: ~2 where the CPU runs 512-bit FMAs at full width, ~1 where it splits
 * them into halves (then an AVX2 library loses nothing to 512-bit code).
 *   build/bench/fma_probe [threads=2] [seconds=0.5] [bf16|ymm]
 * Prints one line: "fma_probe_tflops <TFLOP/s> threads <n> seconds <s>", and with bf16 a second:
 * "bf16_probe_tflops <TFLOP/s> threads <n> seconds <s> ratio_to_fp32 <x> (<method>)", with ymm:
 * "ymm_probe_tflops <TFLOP/s> threads <n> seconds <s> zmm_over_ymm <x>". */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/peak.h"

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double seconds = argc > 2 ? atof(argv[2]) : 0.5;
    bool bf16 = argc > 3 && strcmp(argv[3], "bf16") == 0, ymm = argc > 3 && strcmp(argv[3], "ymm") == 0;
    if (threads < 1 || threads > 1024 || !(seconds > 0 && seconds <= 60) || (argc > 3 && !bf16 && !ymm)) {
        fprintf(stderr, "usage: fma_probe [threads 1..1024] [seconds (0, 60]] [bf16|ymm]\n");
        return 2;
    }
    double fp32 = peak_probe_tflops(false, threads, seconds);
    printf("fma_probe_tflops %.4f threads %d seconds %g\n", fp32, threads, seconds);
    if (bf16) {
        double rate = peak_probe_tflops(true, threads, seconds);
        printf("bf16_probe_tflops %.4f threads %d seconds %g ratio_to_fp32 %.3f (%s)\n", rate, threads, seconds,
               rate / fp32, peak_probe_method(true));
    }
    if (ymm) {
        double rate = peak_probe_fp32_256_tflops(threads, seconds);
        if (rate <= 0) {
            fprintf(stderr, "fma_probe: ymm needs an AVX-512 build (its fp32 probe is then 256 bits wide already)\n");
            return 2;
        }
        printf("ymm_probe_tflops %.4f threads %d seconds %g zmm_over_ymm %.3f\n", rate, threads, seconds, fp32 / rate);
    }
    return 0;
}
