/* peak: the machine's arithmetic peak, for MFU. A short probe runs independent 512-bit FMA
 * chains on every compute thread (the same instruction mix as a GEMM's inner loop, with no
 * memory traffic), so MFU is measured against what this CPU can do right now. */
#ifndef STEPSCOPE_PEAK_H
#define STEPSCOPE_PEAK_H

/* fp32 TFLOP/s on num_threads threads, measured over about `seconds`. */
double peak_probe_fp32_tflops(int num_threads, double seconds);
/* One line describing the method, for the log. */
const char *peak_probe_method(void);

#endif
