/* swiglu: h = silu(gate) · up, the Qwen3 MLP's nonlinearity. gate and up sit side by side in
 * one [T, 2F] buffer because their weights are adjacent in the parameter layout and run as
 * one GEMM: columns [0, F) are gate, [F, 2F) are up. */
#ifndef STEPSCOPE_SWIGLU_H
#define STEPSCOPE_SWIGLU_H

#include <stdint.h>

#include "kernels/bf16.h"

/* h[T, F] with rows ld_h apart (≥ F), gate_up[T, 2F] with rows ld_gate_up apart (≥ 2F): the
 * model pads its activations' strides off 2 KiB multiples where its matmuls run faster so
 * (qwen3_padded_width). Columns past F (2F) are neither read nor written. */
void swiglu_forward(float *h, int64_t ld_h, const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F);
/* The same with h rounded to bf16 (as bf16_from_f32 rounds it), for the down projection's bf16
 * input: the fp32 h is never written and read back. h rows ld_h apart (≥ F). */
void swiglu_forward_bf16(bf16_t *h, int64_t ld_h, const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F);
/* dgate_up[T, 2F] (written) and gate_up[T, 2F], each with its own row stride (≥ 2F); dh[T, F]
 * with rows ld_dh apart (≥ F) */
void swiglu_backward(float *dgate_up, int64_t ld_dgate_up, const float *dh, int64_t ld_dh, const float *gate_up,
                     int64_t ld_gate_up, int64_t T, int64_t F);
/* The same with dgate_up rounded to bf16, the output gradient of the gate/up projection's bf16
 * products; its rows ld_dgate_up apart (≥ 2F). */
void swiglu_backward_bf16(bf16_t *dgate_up, int64_t ld_dgate_up, const float *dh, int64_t ld_dh,
                          const float *gate_up, int64_t ld_gate_up, int64_t T, int64_t F);

#endif
