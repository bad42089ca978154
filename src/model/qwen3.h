/* qwen3: the Qwen3 decoder (Hugging Face's Qwen3ForCausalLM) as calls into the kernels:
 * the parameter layout, seeded init, safetensors loading, and one fused forward + loss +
 * backward that leaves gradients in the gradient buffer.
 *
 * Dimension letters: B batch, S sequence, T = B·S tokens, D model width, F MLP width,
 * L layers, H query heads, KV kv heads, HD head dim, V vocab. */
#ifndef STEPSCOPE_QWEN3_H
#define STEPSCOPE_QWEN3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/bf16.h"
#include "kernels/gemm.h"
#include "profile/trace.h"

typedef struct qwen3_dims {
    int64_t B, S, D, F, L, H, KV, HD, V;
    bool tied;     /* LM head is the token embedding */
    bool qk_norm;
    double rope_theta, eps;
} qwen3_dims_t;

/* The per-layer tensors, written once: field, Hugging Face name suffix, rows, columns (0 for a
 * vector), init, present. q/k/v are adjacent and so form one [(H+2KV)·HD, D] matrix, and
 * gate/up one [2F, D] matrix: each pair runs as a single GEMM. */
#define QWEN3_LAYER_TENSORS(X, d)                                                              \
    X(input_norm, "input_layernorm.weight", (d)->D, 0, QWEN3_INIT_ONES, true)                  \
    X(q_proj, "self_attn.q_proj.weight", (d)->H *(d)->HD, (d)->D, QWEN3_INIT_NORMAL, true)     \
    X(k_proj, "self_attn.k_proj.weight", (d)->KV *(d)->HD, (d)->D, QWEN3_INIT_NORMAL, true)    \
    X(v_proj, "self_attn.v_proj.weight", (d)->KV *(d)->HD, (d)->D, QWEN3_INIT_NORMAL, true)    \
    X(q_norm, "self_attn.q_norm.weight", (d)->HD, 0, QWEN3_INIT_ONES, (d)->qk_norm)            \
    X(k_norm, "self_attn.k_norm.weight", (d)->HD, 0, QWEN3_INIT_ONES, (d)->qk_norm)            \
    X(o_proj, "self_attn.o_proj.weight", (d)->D, (d)->H *(d)->HD, QWEN3_INIT_NORMAL, true)     \
    X(post_norm, "post_attention_layernorm.weight", (d)->D, 0, QWEN3_INIT_ONES, true)          \
    X(gate_proj, "mlp.gate_proj.weight", (d)->F, (d)->D, QWEN3_INIT_NORMAL, true)              \
    X(up_proj, "mlp.up_proj.weight", (d)->F, (d)->D, QWEN3_INIT_NORMAL, true)                  \
    X(down_proj, "mlp.down_proj.weight", (d)->D, (d)->F, QWEN3_INIT_NORMAL, true)

typedef enum { QWEN3_INIT_NORMAL, QWEN3_INIT_ONES } qwen3_init_t;

typedef struct qwen3_layer_params {
#define QWEN3_FIELD(field, name, rows, cols, init, present) float *field;
    QWEN3_LAYER_TENSORS(QWEN3_FIELD, (qwen3_dims_t *)0)
#undef QWEN3_FIELD
} qwen3_layer_params_t;

typedef struct qwen3_params {
    float *embed;      /* [V, D] */
    qwen3_layer_params_t *layers; /* [L] */
    float *final_norm; /* [D] */
    float *lm_head;    /* [V, D]; equals embed when tied */
} qwen3_params_t;

/* The same layout's views into a bf16 buffer: the matmuls' weights in bf16 runs (the copy of
 * the fp32 master weights, or with weight_dtype=bfloat16 the weights themselves). */
typedef struct qwen3_layer_params16 {
#define QWEN3_FIELD16(field, name, rows, cols, init, present) const bf16_t *field;
    QWEN3_LAYER_TENSORS(QWEN3_FIELD16, (qwen3_dims_t *)0)
#undef QWEN3_FIELD16
} qwen3_layer_params16_t;

typedef struct qwen3_params16 {
    const bf16_t *embed;
    qwen3_layer_params16_t *layers;
    const bf16_t *final_norm, *lm_head;
} qwen3_params16_t;

typedef struct qwen3_tensor_info {
    char hf_name[96];
    int64_t offset;    /* floats from the start of the parameter buffer */
    int64_t rows, cols; /* cols == 0: a vector of rows numbers */
    qwen3_init_t init;
} qwen3_tensor_info_t;

/* All parameters in load order; returns the count (fills `out` when non-NULL). */
int64_t qwen3_tensor_table(const qwen3_dims_t *d, qwen3_tensor_info_t *out);
int64_t qwen3_num_params(const qwen3_dims_t *d);
/* A fingerprint of the flat layout (every tensor's name, offset and shape, FNV-1a): state kept
 * as flat ranges of the parameter vector (a checkpoint's AdamW moments) is only read back into
 * a model whose layout has the same one. 0 where the table cannot be built (no memory). */
uint64_t qwen3_layout_hash(const qwen3_dims_t *d);

/* Typed views into a flat buffer laid out by the table. v->layers is allocated (free with
 * qwen3_params_free). Returns non-zero on allocation failure. */
int qwen3_params_view(qwen3_params_t *v, const qwen3_dims_t *d, float *base);
void qwen3_params_free(qwen3_params_t *v);
int qwen3_params16_view(qwen3_params16_t *v, const qwen3_dims_t *d, const bf16_t *base);
void qwen3_params16_free(qwen3_params16_t *v);

/* weight_dtype=bfloat16 keeps the parameters in bf16 only, and the norm weights' kernels read
 * fp32: the vectors (every norm weight, in the table's order) are widened into a compact fp32
 * buffer of qwen3_vector_floats numbers. qwen3_params_view_vectors binds a view's vector fields
 * there and leaves its matrices NULL. A model refreshes its buffer with qwen3_widen_norm_weights
 * (below); qwen3_widen_vectors derives the same numbers from the tensor table, for checks. */
int64_t qwen3_vector_floats(const qwen3_dims_t *d);
int qwen3_params_view_vectors(qwen3_params_t *v, const qwen3_dims_t *d, float *vectors);
void qwen3_widen_vectors(float *vectors, const qwen3_dims_t *d, const bf16_t *base);

/* Linear and embedding weights N(0, 0.02²), norm weights 1, as Hugging Face initialises Qwen3;
 * every number is a function of (seed, tensor, index) only. */
void qwen3_init_params(float *base, const qwen3_dims_t *d, uint64_t seed);

/* Load Hugging Face names from a safetensors file (F32/BF16/F16/F64). A missing, extra or
 * misshapen tensor, or a malformed file, fails with one line in err naming it. base NULL: the
 * same checks (the header, names, shapes, dtypes) and nothing copied, for a run to say before
 * its set-up that the file will not load. */
int qwen3_load_safetensors(float *base, const qwen3_dims_t *d, const char *path, char *err, size_t errlen);
int qwen3_save_safetensors(const float *base, const qwen3_dims_t *d, const char *path, char *err, size_t errlen);
/* The same from bf16 parameters (weight_dtype=bfloat16), as BF16 tensors. */
int qwen3_save_safetensors_bf16(const bf16_t *base, const qwen3_dims_t *d, const char *path, char *err, size_t errlen);

/* What backward recomputes rather than keeps (MaxText's remat_policy values):
 *   NONE     keeps every layer's matmul outputs and the normed, rotated q and k; backward
 *            recomputes only norm outputs and the SwiGLU product (cheap, elementwise);
 *   MINIMAL  keeps the matmul outputs only and recomputes q/k norm and rope too: saves
 *            (H+KV)·HD floats a token a layer (3072 of 16384 for qwen3-0.6b) for one extra
 *            elementwise pass a layer;
 *   FULL     keeps each layer's input only and reruns the layer's forward before its
 *            backward (one more forward's matmuls). */
typedef enum { QWEN3_REMAT_NONE, QWEN3_REMAT_MINIMAL, QWEN3_REMAT_FULL } qwen3_remat_t;

/* Activation and scratch sizes, in floats, for the plan. */
int64_t qwen3_saved_activation_floats(const qwen3_dims_t *d, qwen3_remat_t remat);
int64_t qwen3_scratch_floats(const qwen3_dims_t *d, int num_threads, int64_t xent_chunk, bool bf16, qwen3_remat_t remat);
/* The default chunk: at most as many tokens as keep one chunk of logits near 256 MiB, or 768
 * where that is more (768 for V=151936: 445 MiB), split into equal chunks of a multiple of 32
 * tokens (512 at 1024 tokens, 704 at 2048). The chunk is the M or K of the head's three GEMMs:
 * at 110 tokens (64 MiB) they ran 1.2x (fp32) to 1.5x (bf16) slower than at 256-512, at 352 the
 * input gradient left oneDNN's AVX2 copy kernels (qwen3.c), and a row count off the multiples of
 * 16 slowed MKL's bf16 (AMX) products (bench/gemm_shapes prints the head GEMMs at a chosen chunk). */
int64_t qwen3_default_xent_chunk(const qwen3_dims_t *d);

/* The row stride an activation `cols` wide takes where the model pads its rows: cols + 16 (64
 * bytes wider, off the 2 KiB multiples that every qwen3 width is). Every activation buffer is
 * sized for it on every CPU, so the plan does not depend on the layout; see qwen3.c. */
int64_t qwen3_padded_width(int64_t cols);

/* The activations' row layout (row_padding): AUTO pads every activation and activation gradient
 * (qwen3_padded_width) in fp32 at least as wide as the gemm library runs faster so
 * (gemm_pad_rows_from: every one on oneDNN's gemm driver, AVX2; q/k/v and gate/up on its matmul
 * primitive, AVX512), and keeps them dense elsewhere (MKL) and in bf16 runs; DENSE and PADDED
 * choose, for tests and side-by-side benchmarks. The weights and their gradients stay dense. */
typedef enum { QWEN3_ROWS_AUTO, QWEN3_ROWS_DENSE, QWEN3_ROWS_PADDED } qwen3_rows_t;

typedef struct qwen3_model qwen3_model_t;

typedef struct qwen3_options {
    int num_threads;
    qwen3_remat_t remat;
    qwen3_rows_t rows;
    int64_t xent_chunk;
    float z_loss;
    bool bf16;      /* matmuls take bf16 inputs (fp32 accumulation); see qwen3_create */
    bool weights_bf16; /* weight_dtype=bfloat16: the parameters are bf16 only; see qwen3_create */
    gemm_library_t gemm_library; /* for attention's per-thread contexts, where the library runs its blocks */
    trace_t *trace; /* may be NULL */
    /* Called (when set) during backward as soon as gradients [offset, offset+count) of the
     * gradient buffer are final, in the order backward finishes them: the head (final norm,
     * untied LM head), each layer from the last, then the embedding. Data parallelism starts
     * reducing them there, overlapping the rest of backward. */
    void (*grads_ready)(void *arg, int64_t offset, int64_t count);
    void *grads_ready_arg;
    /* bf16 runs: the layers' weight-gradient products also sum their squares where they can
     * (gemm_bf16_sumsq), for qwen3_grad_sum_squares. Only where the gradient buffer is the one
     * the norm is taken over: not under data parallelism, where ranks' gradients are summed
     * after. */
    bool grad_sumsq;
} qwen3_options_t;

/* Bind a model to buffers sized by the plan: params and grads (qwen3_num_params floats each),
 * acts (qwen3_saved_activation_floats), scratch (qwen3_scratch_floats). With opt->bf16,
 * params_bf16 (qwen3_num_params bf16 values, same layout) is the matmuls' copy of the weights
 * (bf16_weight_copy), which the caller keeps equal to bf16(params) (adamw_update writes it), or
 * NULL: the matmuls then round params as they pack them (gemm_bf16_b32), the same values. With
 * opt->weights_bf16 (which needs opt->bf16) params_bf16 are the weights themselves and params
 * is the compact fp32 buffer of the norm weights (qwen3_vector_floats, kept equal to them by
 * qwen3_widen_norm_weights). */
qwen3_model_t *qwen3_create(const qwen3_dims_t *d, const qwen3_options_t *opt, float *params,
                            const bf16_t *params_bf16, float *grads, float *acts, float *scratch,
                            gemm_ctx_t *gemm, char *err, size_t errlen);
void qwen3_destroy(qwen3_model_t *m);

/* Where attention's block products run, in words for the log: AMX tiles (bf16 where the CPU
 * has them), the matmul library, or our micro-GEMM (fp32; AVX-512 or AVX2). */
const char *qwen3_attention_blocks(const qwen3_model_t *m);

/* Whether every activation's rows run padded (qwen3_rows_t); and the layout in words, for the
 * log (dense, every activation padded, or only the wide ones). */
bool qwen3_rows_padded(const qwen3_model_t *m);
const char *qwen3_rows_detail(const qwen3_model_t *m);

/* Forward, mean cross-entropy over the B·S targets, and backward: the matmul weights'
 * gradients are written by their first product of the step; the norm weights' gradients and an
 * untied embedding's are added into the gradient buffer, which must hold zeros there (see
 * qwen3_zero_accumulated_grads; a tied head's embedding gradient adds onto the head's).
 * tokens: [B, S+1], row stride S+1; inputs are tokens[:, 0:S], targets tokens[:, 1:S+1].
 * Returns the loss. */
double qwen3_forward_backward(qwen3_model_t *m, const int32_t *tokens);
/* The same for micro-batch `micro` of `micros` (gradient accumulation): micro 0 as above; the
 * others add every gradient onto the earlier ones' (so the buffer ends with the sum of the
 * micro-batches' mean-loss gradients); opt.grads_ready hears of final gradients in the last
 * one only, and with opt.grad_sumsq its weight-gradient products take their sums of squares. */
double qwen3_forward_backward_micro(qwen3_model_t *m, const int32_t *tokens, int64_t micro, int64_t micros);

/* Σ g² over the whole gradient buffer after qwen3_forward_backward, for the gradient norm: with
 * opt.grad_sumsq, the sums the weight-gradient products took as they wrote them and one read of
 * the rest (grad_sumsq.h); otherwise one read of all (adamw_sum_squares, the same bits).
 * partials: adamw_norm_partials(qwen3_num_params) doubles. */
double qwen3_grad_sum_squares(qwen3_model_t *m, double *partials);
/* The gradient floats the next qwen3_grad_sum_squares reads (the rest were summed as written). */
int64_t qwen3_grad_sum_squares_reads(const qwen3_model_t *m);

/* weight_dtype=bfloat16: widens the bf16 norm weights into the fp32 buffer their kernels read,
 * through the model's views (no allocation: it runs after every update). No-op otherwise. */
void qwen3_widen_norm_weights(qwen3_model_t *m);

/* Zeroes the gradients qwen3_forward_backward adds into rather than writes: the norm weights'
 * (D or HD floats each) and, untied, the embedding's [V, D]. The gradient buffer's other
 * entries are overwritten by the next backward. */
void qwen3_zero_accumulated_grads(qwen3_model_t *m);

/* Forward and loss only (no gradients): for evaluation and finite-difference tests. */
double qwen3_forward_loss(qwen3_model_t *m, const int32_t *tokens);

#endif
