/* peak: the machine's arithmetic peak, for MFU. A short probe runs independent 512-bit FMA
 * chains on every compute thread (the same instruction mix as a GEMM's inner loop, with no
 * memory traffic), so MFU is measured against what this CPU can do right now, in the dtype the
 * matmuls run in. */
#ifndef STEPSCOPE_PEAK_H
#define STEPSCOPE_PEAK_H

#include <stdbool.h>

/* TFLOP/s of the matmuls' arithmetic on num_threads threads, measured over about `seconds`:
 * fp32 FMAs, or bf16 dot products (bf16 true; twice the fp32 rate on AVX512-BF16 parts). */
double peak_probe_tflops(bool bf16, int num_threads, double seconds);
/* One line describing the method, for the log. */
const char *peak_probe_method(bool bf16);

#endif
