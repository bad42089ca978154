/* gemm: the matrix multiplies of the step, behind one small interface so the library under
 * it (oneDNN today, cuBLAS for a GPU backend later) stays in one file.
 *
 * C[M,N] = op(A)[M,K] · op(B)[K,N]  (or C += ... when accumulate), all row-major fp32:
 *   op(A) = A [M,K] with leading dim lda, or Aᵀ where A is stored [K,M] (trans_a);
 *   op(B) = B [K,N] with leading dim ldb, or Bᵀ where B is stored [N,K] (trans_b).
 * A linear layer y = x·Wᵀ with W stored [out, in] (nn.Linear's layout) is trans_b. */
#ifndef STEPSCOPE_GEMM_H
#define STEPSCOPE_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gemm_ctx gemm_ctx_t;

/* Which library runs the products (config key gemm_library):
 *   ONEDNN  oneDNN's matmul primitive (Debian's libdnnl), on every x86-64 CPU; where it would
 *           run a product on its gemm driver rather than its brgemm kernels (every fp32 product
 *           without AVX512), and for the fp32 weight gradients dYᵀ·X with it (faster there on
 *           AVX512 too, gemm_dnnl.c), in panels of single-threaded dnnl_sgemm fixed by the shape, since
 *           that driver splits K by thread count (a product the panels cannot split without leaving
 *           the driver's copy kernels runs as two fixed halves of K instead), and those its no-copy
 *           kernels would take with rows a multiple of 2 KiB staged in padded blocks first
 *           (gemm_dnnl.c, gemm_widen.h);
 *   MKL     Intel oneMKL's cblas_sgemm / cblas_gemm_bf16bf16f32, loaded at run time (gemm_mkl.h);
 *           on CPUs other than Intel's, where its strict reproducible mode does not hold across
 *           thread counts, in the same shape-fixed panels, one sequential call each;
 *   AUTO    MKL on Intel CPUs where it loads, else oneDNN. On the Intel Xeon (AMX) VM MKL ran
 *           the qwen3-0.6b shapes 1.18x faster in fp32 and 1.42x in bf16 (bench/gemm_shapes);
 *           MKL's fast paths are Intel-only, so AMD keeps oneDNN (on the AVX2-only Zen 3 MKL's
 *           Zen kernels ran a step's worth 0.88-0.92x oneDNN's panels). On CPUs with AMX or
 *           AVX512-BF16, AUTO also runs bf16 products whose M and N are multiples of 32 on our
 *           blocked kernel (bf16_blocked.h), which beat MKL's on AMX and oneDNN's on the Zen 4. */
typedef enum { GEMM_LIB_AUTO, GEMM_LIB_ONEDNN, GEMM_LIB_MKL } gemm_library_t;

/* "auto" | "onednn" | "mkl" -> the enum; -1 for anything else. */
int gemm_library_parse(const char *name);

/* One context per compute thread team; it caches one primitive per distinct shape, so the
 * first call of a shape pays the library's set-up and later calls do not. NULL on failure,
 * with a one-line message (e.g. gemm_library=mkl where MKL is not installed). */
gemm_ctx_t *gemm_create(gemm_library_t lib, char *err, size_t errlen);
void gemm_destroy(gemm_ctx_t *g);

/* The library this context runs: "onednn" or "mkl", and a description for the console. */
const char *gemm_library_name(const gemm_ctx_t *g);
const char *gemm_library_detail(const gemm_ctx_t *g);

/* Whether the fp32 gradient forms dY·W and dYᵀ·X of a widening layer (in > 2·out) run at a
 * fraction of the forward form's rate, so the model should transpose into the forward form
 * first: oneDNN 2.x ran them at half rate; MKL does not need it. */
bool gemm_wide_gradients_slow(const gemm_ctx_t *g);

/* Whether fp32 weight gradients dYᵀ·X run on oneDNN's gemm driver in panels where it would
 * otherwise run them on its brgemm matmul (AVX512): on by default; bench/wgrad_driver turns it
 * off in a second context to measure the two side by side. Set it before the context's first
 * product: each shape keeps the choice made at its first call. */
void gemm_set_weight_gradients_on_driver(gemm_ctx_t *g, bool on);

/* The narrowest fp32 activation (C, and the transposed A of a weight gradient), in floats,
 * whose rows should run at a stride off the 2 KiB multiples (qwen3_padded_width;
 * row_padding=auto pads the activations at least this wide); INT64_MAX for none. oneDNN's gemm
 * driver (AVX2): every width, 1.03-1.05x on a qwen3 layer's products on the Zen 3. Its matmul
 * primitive (AVX512): 4096 and wider (qwen3-0.6b's q/k/v and gate/up outputs, 1.09x on the
 * layer's products on the Zen 4), since padding the 1024-wide residual stream as well slowed
 * the LM head's products (whole steps of 4 layers and the full vocabulary 0.82x). MKL: none
 * (not measured padded). */
int64_t gemm_pad_rows_from(const gemm_ctx_t *g);

/* Whether fp32 attention should run its block products (ATTN_QBLOCK queries × up to S keys × HD) in
 * this library rather than in our micro-GEMM: MKL's small-matrix kernels beat it; oneDNN's
 * per-shape primitives (a new one per key extent) do not. */
bool gemm_suits_attention_blocks(const gemm_ctx_t *g);

void gemm_f32(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
              const float *A, int64_t lda, const float *B, int64_t ldb,
              float *C, int64_t ldc, bool accumulate);

/* The same contract with A and B in bfloat16 (uint16_t bit patterns) and C in fp32; products
 * accumulate in fp32: on AMX tiles or AVX512-BF16 dot products where the CPU has them, else
 * with the operands widened to fp32 block by block (gemm_widen.h), on every x86-64 CPU. */
void gemm_bf16(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
               float *C, int64_t ldc, bool accumulate);

/* gemm_bf16 with B in fp32, rounded to bf16 (nearest even) on the way: the products of
 * gemm_bf16 over bf16(B), for weights kept in fp32 only (a bf16 run's master weights, with no
 * bf16 copy of them). Where our blocked kernel takes the product it rounds B as it packs it, so C
 * has the same bits as gemm_bf16's over a rounded copy; elsewhere (the libraries, shapes it does
 * not take) B is rounded into this context's scratch a panel of C's columns at a time (up to
 * GEMM_B32_PANEL_ELEMS values, or 32 columns where K is deeper), each panel one gemm_bf16. */
enum { GEMM_B32_PANEL_ELEMS = 4 << 20 };
void gemm_bf16_b32(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   const uint16_t *A, int64_t lda, const float *B, int64_t ldb,
                   float *C, int64_t ldc, bool accumulate);

/* gemm_bf16 that also gives Σ C² over the C it writes (with accumulate, of C's final values:
 * the last of several passes that add into a gradient), for a gradient norm without a pass over
 * the gradient: where the products run on our blocked kernel's AVX512-BF16 tiles, each 8 × 32
 * tile's squares are summed from the registers it is stored from (bf16_blocked_gemm) and the
 * tiles then in row-major tile order in double, so the thread count changes no bit; returns true and sets *sumsq. Elsewhere (AMX, the libraries, shapes our kernel
 * does not take, K = 0) it computes C alone and returns false. tile_sums: scratch of
 * tile_sums_floats floats; where that is fewer than gemm_sumsq_floats(M, N), it computes C
 * alone and returns false too, rather than write past them. */
int64_t gemm_sumsq_floats(int64_t M, int64_t N);
bool gemm_bf16_sumsq(gemm_ctx_t *g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                     const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                     bool accumulate, float *tile_sums, int64_t tile_sums_floats, double *sumsq);

/* Where gemm_bf16's products run, for the console; and whether our blocked kernel takes those
 * it can (GEMM_LIB_AUTO on a CPU with AMX or AVX512-BF16). */
const char *gemm_bf16_detail(const gemm_ctx_t *g);
bool gemm_bf16_tiles(const gemm_ctx_t *g);

/* Allocates and touches what this context's products need for a team of `threads` (with bf16,
 * our blocked kernel's packing space, 3 MiB a thread; with weights32, that is where the context
 * will run gemm_bf16_b32, and where a library runs some bf16 products, that call's panel, 8
 * MiB; the widening and staging scratch of gemm_widen.h, 4.1 MiB a context, where bf16 products
 * are widened or fp32 ones staged), so that no step allocates or faults it in; false when out
 * of memory. Without it the first product allocates. */
bool gemm_reserve(gemm_ctx_t *g, int threads, bool bf16, bool weights32);

/* Reference: the same contract in plain loops (float accumulation in double), for tests. */
void gemm_f32_naive(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                    const float *A, int64_t lda, const float *B, int64_t ldb,
                    float *C, int64_t ldc, bool accumulate);

/* Number of primitives created so far (tests check that shapes are cached). */
int gemm_num_primitives(const gemm_ctx_t *g);

#endif
