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
/* The fp32 probe at 256 bits (12 chains of ymm FMAs) on an AVX-512 build, 0 on others: against
 * the 512-bit probe it says whether the CPU runs 512-bit FMAs at full width (about 2x the 256-bit
 * rate) or as two halves (1x), which is what an AVX2 library (MKL's path on AMD CPUs) loses or
 * not when the 512-bit rate halves. For bench/fma_probe. */
double peak_probe_fp32_256_tflops(int num_threads, double seconds);
/* One line describing the method, for the log. */
const char *peak_probe_method(bool bf16);

#endif
