/* gemm_mkl: Intel oneMKL's cblas_sgemm and cblas_gemm_bf16bf16f32, loaded at run time from
 * libmkl_rt (PyPI's `mkl` wheel puts it in the venv's lib/), so the build never depends on it
 * and a machine without it still runs on oneDNN. Used by gemm_dnnl.c when the gemm library
 * is MKL; the contracts are gemm.h's. */
#ifndef STEPSCOPE_GEMM_MKL_H
#define STEPSCOPE_GEMM_MKL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mkl_blas mkl_blas_t;

/* Loads libmkl_rt (the file STEPSCOPE_MKL_LIBRARY names if set; else first from the venv the
 * build saw, then the loader's search path) once per process, and sets its threading to GNU
 * OpenMP (the process's one OpenMP runtime) with dynamic thread counts off and strict
 * reproducible mode on, so a product's bits change neither from call to call nor, on Intel
 * CPUs, with the thread count (elsewhere gemm_dnnl.c runs it in shape-fixed panels). Every
 * caller shares the one loaded library (nothing to close). NULL with a message when it cannot
 * be loaded or set up. */
const mkl_blas_t *mkl_blas_open(char *err, size_t errlen);

/* The file it was loaded from. */
const char *mkl_blas_path(const mkl_blas_t *mkl);

void mkl_sgemm(const mkl_blas_t *mkl, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate);

/* Whether this MKL has cblas_gemm_bf16bf16f32 and the CPU runs it natively (AVX512-BF16 or AMX). */
bool mkl_has_bf16(const mkl_blas_t *mkl);
void mkl_gemm_bf16(const mkl_blas_t *mkl, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                   bool accumulate);

#endif
