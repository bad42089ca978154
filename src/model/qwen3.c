/* qwen3: forward, loss and backward of the decoder, as calls into the kernels. Forward names
 * each activation it saves; backward walks them in reverse. A matmul weight's gradient is
 * written (=) by its first product of the step (a linear layer's only one, the LM head's first
 * chunk); the head's later chunks add (+=) onto it, and the norm and embedding gradients onto
 * the zeros qwen3_zero_accumulated_grads leaves; activation gradients are written, so nothing
 * activation-sized is zeroed per step. With gradient accumulation, the micro-batches after the
 * first add every weight gradient (grads_accumulate). */
#include "model/qwen3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/embed.h"
#include "kernels/microgemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "kernels/transpose.h"
#include "kernels/xent.h"
#include "model/grad_sumsq.h"

/* What one layer's forward saves for its backward. x (the layer input) lives in the residual
 * stream buffer; everything here is per layer (remat none) or shared (remat full). */
typedef struct layer_acts {
    float *qkv;     /* [T, (H+2KV)·HD]  q, k, v projections before norm and rope; rows ld_qkv apart */
    float *qk;      /* [T, (H+KV)·HD]   q and k after qk-norm and rope: attention's inputs */
    float *attn;    /* [T, H·HD]        attention output (o_proj input); rows ld_hhd apart */
    float *x2;      /* [T, D]           residual after attention; rows ld_d apart */
    float *gate_up; /* [T, 2F]          gate and up projections; rows ld_gate_up apart */
    float *rstd1;   /* [T]              input norm statistics */
    float *rstd2;   /* [T]              post-attention norm statistics */
    float *qk_rstd; /* [T·(H+KV)]       q-norm then k-norm statistics */
    float *lse;     /* [B, H, S]        attention row log-sum-exp */
} layer_acts_t;

/* The row stride an activation `cols` wide takes where rows are padded: 64 bytes wider. On
 * oneDNN's gemm driver (AVX2) a product whose C, or whose transposed A, has rows a multiple of
 * 2 KiB apart (every qwen3 width) ran slower: on 2 Zen 3 cores, padding the q/k/v and gate/up
 * activations ran those products' forward (C = y) 1.00-1.10x and weight gradient (A = dyᵀ)
 * 1.02-1.13x faster, and in profiled steps their matmuls 1.041x relative to the others (median
 * of seven pairs); padding every activation ran the layer's twelve forms 1.029-1.048x dense,
 * against 1.003-1.028x for the q/k/v and gate/up ones alone (four runs of bench/row_strides,
 * alternated call by call), and whole 8-layer qwen3-0.6b steps 1.034x dense and 1.024x the
 * q/k/v and gate/up ones alone (medians of 10 and 12 rounds alternated step by step in one
 * process: bench/step_ab). Widths off 2 KiB multiples are padded too (unmeasured there): one
 * rule, and rows stay 64-byte aligned.
 * Buffers are always sized for it, so the plan does not depend on the CPU or on row_padding;
 * qwen3_create picks the strides a run uses. */
int64_t qwen3_padded_width(int64_t cols) { return cols + 16; }

/* The stride a run gives an activation `cols` wide: padded, or dense. */
/* Activations at least pad_from floats wide run padded (see qwen3_create). */
static int64_t row_stride(int64_t pad_from, int64_t cols) { return cols >= pad_from ? qwen3_padded_width(cols) : cols; }

/* Consecutive buffers out of one region; with base NULL it only counts, so each bind function
 * below both sizes its part of the plan and lays it out. */
typedef struct carver {
    float *base;
    int64_t used;
} carver_t;

static float *carve(carver_t *c, int64_t n) {
    float *p = c->base ? c->base + c->used : NULL;
    c->used += n;
    return p;
}

/* Under MINIMAL, qk is not saved: it points at one scratch buffer (shared_qk) that forward
 * fills for the layer at hand and backward refills from qkv. Returns the floats carved. */
static int64_t layer_acts_bind(layer_acts_t *a, const qwen3_dims_t *d, qwen3_remat_t remat, float *base,
                               float *shared_qk) {
    int64_t T = d->B * d->S;
    carver_t c = {base, 0};
    a->qkv = carve(&c, T * qwen3_padded_width((d->H + 2 * d->KV) * d->HD));
    a->qk = remat == QWEN3_REMAT_MINIMAL ? shared_qk : carve(&c, T * (d->H + d->KV) * d->HD);
    a->attn = carve(&c, T * qwen3_padded_width(d->H * d->HD));
    a->x2 = carve(&c, T * qwen3_padded_width(d->D));
    a->gate_up = carve(&c, T * qwen3_padded_width(2 * d->F));
    a->rstd1 = carve(&c, T);
    a->rstd2 = carve(&c, T);
    a->qk_rstd = carve(&c, T * (d->H + d->KV));
    a->lse = carve(&c, d->B * d->H * d->S);
    return c.used;
}

static int64_t layer_acts_floats(const qwen3_dims_t *d, qwen3_remat_t remat) {
    layer_acts_t sizing;
    return layer_acts_bind(&sizing, d, remat, NULL, NULL);
}

/* Floats of one layer input in the residual stream: [T, D] at the padded stride. */
static int64_t stream_floats(const qwen3_dims_t *d) { return d->B * d->S * qwen3_padded_width(d->D); }

int64_t qwen3_saved_activation_floats(const qwen3_dims_t *d, qwen3_remat_t remat) {
    int64_t stream = (d->L + 1) * stream_floats(d); /* every layer's input, and the final one */
    return stream + (remat == QWEN3_REMAT_FULL ? 1 : d->L) * layer_acts_floats(d, remat);
}

int64_t qwen3_default_xent_chunk(const qwen3_dims_t *d) {
    int64_t T = d->B * d->S;
    /* At most ~256 MiB of logits, or XENT_MIN_CAP tokens where that is more (445 MiB at V =
     * 151936), so that split chunks keep over 384 tokens each. Short chunks slowed the head's
     * matmuls on the AVX2 Zen 3: a 352-token chunk's input gradient (352 × 1024 at K = V) fell
     * under oneDNN's copy-kernel threshold (1/352 + 1/1024 ≥ 0.0038: no-copy, staged) and ran at
     * 91 GFLOP/s against 136 in 512-token chunks, and each of the head's products reads or
     * accumulates all of W [V, D] once per chunk: qwen3-0.6b steps of 1024 tokens took 33.3 and
     * 35.1 s in 512-token chunks against 38.3 and 41.5 s in 352 (two alternated rounds). */
    enum { XENT_MIN_CAP = 768 };
    int64_t cap = (256LL << 20) / (int64_t)sizeof(float) / d->V;
    if (cap < XENT_MIN_CAP) cap = XENT_MIN_CAP;
    if (T <= cap) return T;
    /* Equal chunks, a multiple of 32 tokens each: the head's matmuls run AMX tiles of 16 rows
     * (and AVX-512 blocks of 16 or 32), and a ragged row count cost the qwen3-0.6b bf16 step
     * 1.16x (441-token chunks, 7.8-8.0 s, against 352: 6.7-6.8 s, alternated). */
    int64_t cap32 = cap / 32 * 32, n = (T + cap32 - 1) / cap32;
    return ((T + n - 1) / n + 31) / 32 * 32; /* ≤ cap32: ceil(T/n) ≤ cap32, a multiple of 32 */
}

/* Scratch, reused by every layer: see the bind in qwen3_create. */
typedef struct scratch {
    float *ln;       /* [T, D]       a norm's output (recomputed in backward); final norm output */
    float *h;        /* [T, F]       swiglu output; then its gradient; rows ld_f apart */
    float *dres;     /* [T, D]       gradient of the residual stream */
    float *dln;      /* [T, D]       gradient of a norm's output (ln, dres, dln: rows ld_d apart) */
    float *dgate_up; /* [T, 2F]       rows ld_gate_up apart, as gate_up's */
    float *dattn;    /* [T, H·HD]     rows ld_hhd apart, as attn's */
    float *dqkv;     /* [T, (H+2KV)·HD] rows ld_qkv apart, as qkv's */
    float *rstd_final; /* [T] */
    float *norm_partials; /* the norm backwards' per-chunk dweight sums (rmsnorm_backward_partials) */
    float *logits;   /* [chunk, V]   one chunk of logits, then its gradient */
    float *row_loss, *row_lse; /* [chunk] */
    int32_t *targets; /* [chunk] */
    float *rope_cos, *rope_sin; /* [S, HD/2] */
    float *attention; /* attention_scratch_floats */
    bf16_t *in16;     /* bf16 matmul inputs (bf16 runs only): a linear's x, or an LM-head chunk */
    bf16_t *dy16;     /* bf16 output gradients: a linear's dy, or a chunk's logit gradients */
    float *xent_rows; /* [threads, V] bf16 runs: each thread's row of exponentials (xent_forward_backward_bf16) */
    float *qk;        /* [T, (H+KV)·HD] remat minimal only: the current layer's q and k */
    float *dy_t, *x_t, *w_t; /* fp32 widening layers (see wide_layer): dyᵀ [D, T], xᵀ [F, T], Wᵀ [F, D] */
    float *tile_sums; /* bf16 runs: a weight gradient's tile sums of squares (gemm_sumsq_floats) */
    int64_t tile_sums_floats;
} scratch_t;

/* oneDNN 2.6's fp32 matmul runs the two gradient forms of a layer that widens a lot (in > 2·out:
 * the MLP's down_proj, F = 3·D in Qwen3) at about half its forward rate; transposed copies turn
 * both into the forward form, measured 1.7-2x faster including the copies. o_proj (in = 2·out)
 * measured slower that way, hence the threshold. */
static bool wide_layer(int64_t out, int64_t in) { return in > 2 * out; }

static int64_t transpose_scratch_floats(const qwen3_dims_t *d, bool bf16) {
    int64_t T = d->B * d->S;
    return !bf16 && wide_layer(d->D, d->F) ? T * d->D + T * d->F + d->F * d->D : 0;
}

/* Row stride of a bf16 matmul input with `cols` columns in s.in16 or s.dy16 where our blocked
 * bf16 GEMM runs the products (pad; AMX or AVX512-BF16): off multiples of 2 KiB, so that it reads A's tiles in place instead
 * of packing them (bf16_blocked.c: a_read_in_place; at 2 KiB multiples a 32-row block's lines
 * crowd two L1 sets). Every qwen3 width is such a multiple; 64 bytes of padding ran the
 * forward products 1.02-1.04x (interleaved probe) and leave neither thread an A to pack. The
 * libraries keep dense rows: oneDNN's sums come out in another order at a padded stride. */
static int64_t ld16_for(bool pad, int64_t cols) { return pad && cols % 1024 == 0 ? cols + 32 : cols; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Floats that hold the bf16 conversion buffers: the largest x and dy any matmul takes. */
static void bf16_scratch_sizes(const qwen3_dims_t *d, int64_t *in16, int64_t *dy16) {
    int64_t T = d->B * d->S, QKV = (d->H + 2 * d->KV) * d->HD, HHD = d->H * d->HD;
    int64_t x_cols = max64(ld16_for(true, d->D), max64(ld16_for(true, HHD), ld16_for(true, d->F)));
    int64_t dy_cols = max64(ld16_for(true, QKV), max64(ld16_for(true, 2 * d->F), ld16_for(true, d->D)));
    /* (the LM head's bf16 gradient goes over its chunk's logits: head_forward_backward) */
    int64_t in = T * x_cols, dy = T * dy_cols;
    *in16 = (in + 1) / 2;
    *dy16 = (dy + 1) / 2;
}

/* Returns the floats carved; with base NULL only counts (qwen3_scratch_floats). */
static int64_t scratch_bind(scratch_t *s, const qwen3_dims_t *d, int num_threads, int64_t chunk, bool bf16,
                            qwen3_remat_t remat, float *base) {
    int64_t T = d->B * d->S, wD = qwen3_padded_width(d->D);
    attn_shape_t a = {.B = d->B, .S = d->S, .H = d->H, .KV = d->KV, .HD = d->HD};
    carver_t c = {base, 0};
    s->ln = carve(&c, T * wD);
    s->h = carve(&c, T * qwen3_padded_width(d->F));
    s->dres = carve(&c, T * wD);
    s->dln = carve(&c, T * wD);
    s->dgate_up = carve(&c, T * qwen3_padded_width(2 * d->F));
    s->dattn = carve(&c, T * qwen3_padded_width(d->H * d->HD));
    s->dqkv = carve(&c, T * qwen3_padded_width((d->H + 2 * d->KV) * d->HD));
    s->rstd_final = carve(&c, T);
    s->norm_partials = carve(&c, max64(rmsnorm_backward_partials(T, 1, d->D),
                                       max64(rmsnorm_backward_partials(T, d->H, d->HD),
                                             rmsnorm_backward_partials(T, d->KV, d->HD))));
    /* On a 64-byte line: in bf16 runs the cross-entropy streams its bf16 gradient over it (rows
     * 4V bytes apart stay on lines where V is a multiple of 16). */
    float *logits_space = carve(&c, chunk * d->V + 16);
    s->logits = logits_space ? (float *)((uintptr_t)(logits_space + 15) & ~(uintptr_t)63) : NULL;
    s->row_loss = carve(&c, chunk);
    s->row_lse = carve(&c, chunk);
    s->targets = (int32_t *)carve(&c, chunk);
    s->rope_cos = carve(&c, d->S * d->HD / 2);
    s->rope_sin = carve(&c, d->S * d->HD / 2);
    s->attention = carve(&c, bf16 ? attention_bf16_scratch_floats(&a, num_threads) : attention_scratch_floats(&a, num_threads));
    if (bf16) {
        int64_t in16, dy16;
        bf16_scratch_sizes(d, &in16, &dy16);
        s->in16 = (bf16_t *)carve(&c, in16);
        s->dy16 = (bf16_t *)carve(&c, dy16);
        s->xent_rows = carve(&c, (int64_t)num_threads * d->V);
        int64_t QKV = (d->H + 2 * d->KV) * d->HD;
        /* the four layer weight gradients' (linear_bwd_16); a product with more tiles than this
         * takes the norm's full pass instead (gemm_bf16_sumsq) */
        s->tile_sums_floats = max64(max64(gemm_sumsq_floats(QKV, d->D), gemm_sumsq_floats(d->D, d->H * d->HD)),
                                    max64(gemm_sumsq_floats(2 * d->F, d->D), gemm_sumsq_floats(d->D, d->F)));
        s->tile_sums = carve(&c, s->tile_sums_floats);
    }
    if (remat == QWEN3_REMAT_MINIMAL) s->qk = carve(&c, T * (d->H + d->KV) * d->HD);
    if (transpose_scratch_floats(d, bf16) > 0) {
        s->dy_t = carve(&c, T * d->D);
        s->x_t = carve(&c, T * d->F);
        s->w_t = carve(&c, d->F * d->D);
    }
    return c.used;
}

int64_t qwen3_scratch_floats(const qwen3_dims_t *d, int num_threads, int64_t xent_chunk, bool bf16,
                             qwen3_remat_t remat) {
    scratch_t sizing = {0};
    return scratch_bind(&sizing, d, num_threads, xent_chunk, bf16, remat, NULL);
}

/* Span names, interned once so the hot path passes integers. */
enum op {
    OP_EMBED, OP_NORM, OP_QKV, OP_QK_NORM, OP_ROPE, OP_ATTN, OP_O_PROJ, OP_GATE_UP, OP_SWIGLU,
    OP_DOWN, OP_FINAL_NORM, OP_LM_HEAD, OP_XENT, OP_RESIDUAL, OP_TO_BF16, OP_TRANSPOSE,
    OP_COUNT
};
typedef struct op_names {
    uint32_t fwd[OP_COUNT], bwd[OP_COUNT], wgrad[OP_COUNT];
    uint32_t forward, backward, *layer_fwd, *layer_bwd;
} op_names_t;

struct qwen3_model {
    qwen3_dims_t d;
    qwen3_options_t opt;
    qwen3_params_t w, dw;    /* with weights_bf16, w has the norm weights only (qwen3_params_view_vectors) */
    qwen3_params16_t w16;    /* bf16 runs: the matmuls' weights (bf16(w), kept current by the optimizer) */
    float *stream;        /* [L+1, T, D]: the input of every layer, then the final residual */
    float *acts_base;
    layer_acts_t *acts;   /* [L], or [1] under full remat */
    scratch_t s;
    gemm_ctx_t *gemm;
    gemm_ctx_t **thread_gemm; /* bf16 attention: one context per compute thread */
    trace_t *trace;
    op_names_t names;
    const int32_t *tokens;
    bool grads_accumulate; /* a micro-batch after the first: weight gradients add (+=) */
    bool grads_final;      /* the step's last micro-batch: the weight gradients written are final */
    grad_sumsq_t sumsq;    /* opt.grad_sumsq: the weight gradients' sums of squares this backward */
    /* Row strides (qwen3_padded_width, or dense): of the D-wide activations (the residual
     * stream, x2, ln, dres, dln), of attn and dattn, of h, of qkv and dqkv, of gate_up and
     * dgate_up. */
    int64_t ld_d, ld_hhd, ld_f, ld_qkv, ld_gate_up;
    char rows_detail[200]; /* those strides in words, for the console (set_row_strides) */
};

static float *layer_input(qwen3_model_t *m, int64_t l) { return m->stream + l * stream_floats(&m->d); }
static layer_acts_t *acts_of(qwen3_model_t *m, int64_t l) { return &m->acts[m->opt.remat == QWEN3_REMAT_FULL ? 0 : l]; }

/* Sets the strides of m's activations from one list of them, and describes them in words
 * (m->rows_detail): dense, every one padded, or which ones are, since the threshold (pad_from,
 * from gemm_pad_rows_from) and the widths vary by CPU and model. */
static void set_row_strides(qwen3_model_t *m, int64_t pad_from) {
    const qwen3_dims_t *d = &m->d;
    const struct { const char *name; int64_t *ld, cols; } acts[] = {
        {"residual stream", &m->ld_d, d->D},         {"attention output", &m->ld_hhd, d->H * d->HD},
        {"SwiGLU output", &m->ld_f, d->F},           {"q/k/v", &m->ld_qkv, (d->H + 2 * d->KV) * d->HD},
        {"gate/up", &m->ld_gate_up, 2 * d->F}};
    const int n = (int)(sizeof acts / sizeof acts[0]);
    for (int i = 0; i < n; i++) *acts[i].ld = row_stride(pad_from, acts[i].cols);
    char names[120] = "";
    int padded = 0;
    for (int i = 0; i < n; i++)
        if (*acts[i].ld != acts[i].cols) {
            size_t used = strlen(names);
            snprintf(names + used, sizeof names - used, "%s%s", padded++ ? ", " : "", acts[i].name);
        }
    if (!padded) snprintf(m->rows_detail, sizeof m->rows_detail, "dense");
    else if (padded == n) snprintf(m->rows_detail, sizeof m->rows_detail, "padded, 64 bytes wider than their width");
    else
        snprintf(m->rows_detail, sizeof m->rows_detail,
                 "padded where %lld floats or wider (%s, 64 bytes wider), the rest dense", (long long)pad_from, names);
}

/* ---- tracing helpers: one span per kernel call, with the FLOPs it does (matmuls and attention)
 * and the bytes it must move (every kernel; trace_event_t.bytes says what they count) ---- */
#define SPAN(m, name_id, flops, bytes, call)                                                    \
    do {                                                                                        \
        int64_t span_start_ = trace_begin((m)->trace);                                          \
        call;                                                                                   \
        trace_end((m)->trace, 0, (name_id), span_start_, (flops), (bytes));                     \
    } while (0)

static void intern_names(qwen3_model_t *m) {
    static const struct { const char *name; trace_category_t cat; const char *part; } ops[OP_COUNT] = {
        [OP_EMBED] = {"embed", TRACE_CAT_EMBED, "embed"},
        [OP_NORM] = {"rmsnorm", TRACE_CAT_NORM, "norms"},
        [OP_QKV] = {"matmul qkv_proj", TRACE_CAT_MATMUL, "attention"},
        [OP_QK_NORM] = {"qk_norm", TRACE_CAT_NORM, "attention"},
        [OP_ROPE] = {"rope", TRACE_CAT_ROPE, "attention"},
        [OP_ATTN] = {"flash_attention", TRACE_CAT_ATTENTION, "attention"},
        [OP_O_PROJ] = {"matmul o_proj", TRACE_CAT_MATMUL, "attention"},
        [OP_GATE_UP] = {"matmul gate_up_proj", TRACE_CAT_MATMUL, "mlp"},
        [OP_SWIGLU] = {"swiglu", TRACE_CAT_SWIGLU, "mlp"},
        [OP_DOWN] = {"matmul down_proj", TRACE_CAT_MATMUL, "mlp"},
        [OP_FINAL_NORM] = {"final_rmsnorm", TRACE_CAT_NORM, "norms"},
        [OP_LM_HEAD] = {"matmul lm_head", TRACE_CAT_MATMUL, "lm_head"},
        [OP_XENT] = {"cross_entropy", TRACE_CAT_XENT, "lm_head"},
        [OP_RESIDUAL] = {"residual_copy", TRACE_CAT_ELEMENTWISE, "norms"},
        [OP_TO_BF16] = {"to_bf16", TRACE_CAT_ELEMENTWISE, "bf16 casts"},
        [OP_TRANSPOSE] = {"transpose", TRACE_CAT_ELEMENTWISE, "mlp"},
    };
    trace_t *t = m->trace;
    const qwen3_dims_t *d = &m->d;
    int64_t T = d->B * d->S, QKV = (d->H + 2 * d->KV) * d->HD;
    /* Matmul names carry their shape (M×N×K) so a profile reads without the source. */
    int64_t shapes[OP_COUNT][3] = {
        [OP_QKV] = {T, QKV, d->D}, [OP_O_PROJ] = {T, d->D, d->H * d->HD},
        [OP_GATE_UP] = {T, 2 * d->F, d->D}, [OP_DOWN] = {T, d->D, d->F},
        [OP_LM_HEAD] = {m->opt.xent_chunk, d->V, d->D},
    };
    char buf[128];
    for (int op = 0; op < OP_COUNT; op++) {
        bool mm = ops[op].cat == TRACE_CAT_MATMUL;
        const char *kinds[3] = {"fwd", "dgrad", "wgrad"};
        uint32_t *dst[3] = {&m->names.fwd[op], &m->names.bwd[op], &m->names.wgrad[op]};
        for (int k = 0; k < 3; k++) {
            if (mm) snprintf(buf, sizeof buf, "%s %s [%lldx%lldx%lld]", ops[op].name, kinds[k],
                             (long long)shapes[op][0], (long long)shapes[op][1], (long long)shapes[op][2]);
            else snprintf(buf, sizeof buf, "%s %s", ops[op].name, k == 0 ? "fwd" : "bwd");
            *dst[k] = trace_intern(t, buf, ops[op].cat, ops[op].part);
        }
    }
    m->names.forward = trace_intern(t, "forward", TRACE_CAT_PHASE, NULL);
    m->names.backward = trace_intern(t, "backward", TRACE_CAT_PHASE, NULL);
    for (int64_t l = 0; l < d->L; l++) {
        snprintf(buf, sizeof buf, "layer %lld fwd", (long long)l);
        m->names.layer_fwd[l] = trace_intern(t, buf, TRACE_CAT_LAYER, NULL);
        snprintf(buf, sizeof buf, "layer %lld bwd", (long long)l);
        m->names.layer_bwd[l] = trace_intern(t, buf, TRACE_CAT_LAYER, NULL);
    }
}

qwen3_model_t *qwen3_create(const qwen3_dims_t *d, const qwen3_options_t *opt, float *params,
                            const bf16_t *params_bf16, float *grads, float *acts, float *scratch,
                            gemm_ctx_t *gemm, char *err, size_t errlen) {
    qwen3_model_t *m = calloc(1, sizeof *m);
    int64_t nacts = opt->remat == QWEN3_REMAT_FULL ? 1 : d->L;
    if (!m || !(m->acts = calloc((size_t)nacts, sizeof *m->acts)) ||
        !(m->names.layer_fwd = calloc((size_t)d->L, sizeof(uint32_t))) ||
        !(m->names.layer_bwd = calloc((size_t)d->L, sizeof(uint32_t))) ||
        (opt->weights_bf16 ? qwen3_params_view_vectors(&m->w, d, params) : qwen3_params_view(&m->w, d, params)) != 0 ||
        qwen3_params_view(&m->dw, d, grads) != 0 ||
        /* fp32 runs, and bf16 ones without a copy: a view of NULL weights, which their matmuls
         * do not read (gemm_weight16 rounds the fp32 ones as it packs them) */
        (params_bf16 ? qwen3_params16_view(&m->w16, d, params_bf16) != 0
                     : !(m->w16.layers = calloc((size_t)d->L, sizeof *m->w16.layers))) ||
        !grad_sumsq_init(&m->sumsq, (int)(4 * d->L))) { /* a layer's four weight-gradient products */
        snprintf(err, errlen, "out of memory creating the model");
        qwen3_destroy(m);
        return NULL;
    }
    m->d = *d;
    m->opt = *opt;
    m->gemm = gemm;
    m->trace = opt->trace;
    if ((opt->weights_bf16 && (!opt->bf16 || !params_bf16)) || (!opt->bf16 && params_bf16)) {
        snprintf(err, errlen, "internal error: bf16 weights need bf16 matmuls, and a bf16 weight copy a bf16 run");
        qwen3_destroy(m);
        return NULL;
    }
    const char *no_gemm_space = "out of memory for the matmuls' packing and widening space (a few MiB a "
                                "thread); lower num_threads";
    /* bf16 products read fp32 weights unless the run holds bf16 ones or keeps their bf16 copy */
    const bool weights32 = opt->bf16 && !opt->weights_bf16 && !params_bf16;
    if (!gemm_reserve(gemm, opt->num_threads, opt->bf16, weights32)) {
        snprintf(err, errlen, "%s", no_gemm_space);
        qwen3_destroy(m);
        return NULL;
    }
    /* Per-thread contexts for attention's block products, where the library runs them: in
     * bf16 unless the CPU has AMX tiles or AVX512-BF16 (our packed kernel,
     * attention_bf16_packed.c, is faster there: the library repacks both operands on every
     * block), in fp32 where the library beats our micro-GEMM on those blocks. */
    bool library_blocks = opt->bf16 ? !attention_bf16_packed_available() : gemm_suits_attention_blocks(gemm);
    if (library_blocks) {
        if (!(m->thread_gemm = calloc((size_t)opt->num_threads, sizeof *m->thread_gemm))) {
            snprintf(err, errlen, "out of memory creating the model");
            qwen3_destroy(m);
            return NULL;
        }
        /* Each runs its thread's block products alone (inside attention's parallel region), so
         * each reserves for one thread: without AMX its bf16 products are widened in its own
         * scratch. Their operands are activations, never weights. */
        for (int t = 0; t < opt->num_threads; t++) {
            if (!(m->thread_gemm[t] = gemm_create(opt->gemm_library, err, errlen))) {
                qwen3_destroy(m);
                return NULL;
            }
            if (!gemm_reserve(m->thread_gemm[t], 1, opt->bf16, false)) {
                snprintf(err, errlen, "%s", no_gemm_space);
                qwen3_destroy(m);
                return NULL;
            }
        }
    }
    /* Auto: fp32 only, where the library runs faster so (bf16 runs' products read bf16 copies
     * with their own strides, ld16). */
    int64_t pad_from = opt->rows == QWEN3_ROWS_PADDED ? 0
                       : opt->rows == QWEN3_ROWS_AUTO && !opt->bf16 ? gemm_pad_rows_from(gemm)
                                                                    : INT64_MAX;
    set_row_strides(m, pad_from);
    m->stream = acts;
    m->acts_base = acts + (d->L + 1) * stream_floats(d);
    scratch_bind(&m->s, d, opt->num_threads, opt->xent_chunk, opt->bf16, opt->remat, scratch);
    for (int64_t l = 0; l < nacts; l++)
        layer_acts_bind(&m->acts[l], d, opt->remat, m->acts_base + l * layer_acts_floats(d, opt->remat), m->s.qk);
    rope_tables(m->s.rope_cos, m->s.rope_sin, d->S, d->HD, d->rope_theta);
    if (m->trace) intern_names(m);
    return m;
}

void qwen3_destroy(qwen3_model_t *m) {
    if (!m) return;
    if (m->thread_gemm)
        for (int t = 0; t < m->opt.num_threads; t++) gemm_destroy(m->thread_gemm[t]);
    free(m->thread_gemm);
    qwen3_params_free(&m->w);
    qwen3_params_free(&m->dw);
    qwen3_params16_free(&m->w16);
    grad_sumsq_free(&m->sumsq);
    free(m->acts);
    free(m->names.layer_fwd);
    free(m->names.layer_bwd);
    free(m);
}

bool qwen3_rows_padded(const qwen3_model_t *m) { return m->ld_d != m->d.D; }

const char *qwen3_rows_detail(const qwen3_model_t *m) { return m->rows_detail; }

const char *qwen3_attention_blocks(const qwen3_model_t *m) {
    if (m->thread_gemm) return "the matmul library, one context per thread";
    if (m->opt.bf16) return attention_bf16_packed_kind();
    static char fp32[96];
    snprintf(fp32, sizeof fp32, "stepscope's %s", microgemm_kind());
    return fp32;
}

/* ---- linear layers: y = x·Wᵀ with W [out, in] ---- */
static double linear_flops(int64_t M, int64_t N, int64_t K) { return 2.0 * (double)M * (double)N * (double)K; }

/* ---- the bytes each kernel must move, for its span (trace_event_t.bytes: operands read once,
 * results written once, in their stored dtypes; a result added onto is read as well) ---- */
enum { F32_BYTES = 4, BF16_BYTES = 2 };

/* C[M, N] fp32 (= or +=) A[M, K]·B[K, N] with A's and B's elements a_size and b_size bytes. */
static double matmul_bytes(int64_t M, int64_t N, int64_t K, int a_size, int b_size, bool accumulate) {
    return (double)M * (double)K * a_size + (double)K * (double)N * b_size +
           (double)M * (double)N * F32_BYTES * (accumulate ? 2 : 1);
}
/* RMSNorm over `rows` vectors of n: x read, y written (out_size bytes an element), the weight
 * read, one rstd a vector written. */
static double norm_fwd_bytes(int64_t rows, int64_t n, int out_size) {
    return (double)rows * (double)n * (F32_BYTES + out_size) + (double)(n + rows) * F32_BYTES;
}
/* Its backward: dy, x and rstd read, dx written (read too where it adds onto the residual
 * stream's gradient), the weight read and its gradient written. */
static double norm_bwd_bytes(int64_t rows, int64_t n, bool accumulate_dx) {
    return (double)rows * (double)n * F32_BYTES * (accumulate_dx ? 4 : 3) + (double)(2 * n + rows) * F32_BYTES;
}
/* The rope tables, cos and sin [S, HD/2]. */
static double rope_table_bytes(const qwen3_dims_t *d) { return (double)d->S * (double)d->HD * F32_BYTES; }
/* Attention over q [T, H·HD], k and v [T, KV·HD]: forward reads q, k, v and writes the output and
 * one log-sum-exp a head and row; backward reads dO, O, q, k, v and lse and writes dq, dk, dv. */
static double attention_bytes(const qwen3_dims_t *d, bool backward) {
    double T = (double)(d->B * d->S), q = T * (double)(d->H * d->HD), kv = T * (double)(d->KV * d->HD);
    return ((backward ? 4 : 2) * q + (backward ? 4 : 2) * kv + T * (double)d->H) * F32_BYTES;
}
/* A cross-entropy chunk: n rows of fp32 logits read, their gradient written (grad_size bytes an
 * element), a target read and a loss and log-sum-exp written a row. */
static double xent_bytes(int64_t n, int64_t V, int grad_size) {
    return (double)n * (double)V * (F32_BYTES + grad_size) + 3.0 * (double)n * F32_BYTES;
}
/* The embedding: forward reads T tokens and their rows (row_size bytes an element) and writes the
 * fp32 residual stream; backward reads the tokens and the stream's gradient and adds it onto
 * their rows of the table's gradient (read and written). */
static double embed_bytes(const qwen3_dims_t *d, int row_size, bool backward) {
    double T = (double)(d->B * d->S), D = (double)d->D;
    return T * D * (backward ? 3 * F32_BYTES : F32_BYTES + row_size) + T * sizeof(int32_t);
}

static int64_t ld16(const qwen3_model_t *m, int64_t cols) { return ld16_for(gemm_bf16_tiles(m->gemm), cols); }

/* A matmul's weight: fp32 runs read f32, bf16 runs b16 where it is kept (f32 is NULL with
 * weight_dtype=bfloat16), else f32 rounded as the product packs it (gemm_weight16). */
typedef struct weight {
    const float *f32;
    const bf16_t *b16;
} weight_t;
#define LAYER_WEIGHT(m, l, field) ((weight_t){(m)->w.layers[l].field, (m)->w16.layers[l].field})

/* Bytes a bf16 product reads a weight element in. */
static int weight16_bytes(weight_t W) { return W.b16 ? BF16_BYTES : F32_BYTES; }

/* bf16 runs: C[M, N] (=) A · op(W), with A bf16 and W's bf16 values: from its bf16 copy where the
 * run keeps one, else from the fp32 weights rounded as the product packs them (the same values). */
static void gemm_weight16(qwen3_model_t *m, bool trans_w, int64_t M, int64_t N, int64_t K, const bf16_t *A,
                          int64_t lda, weight_t W, int64_t ldw, float *C, int64_t ldc, bool accumulate) {
    if (W.b16) gemm_bf16(m->gemm, false, trans_w, M, N, K, A, lda, W.b16, ldw, C, ldc, accumulate);
    else gemm_bf16_b32(m->gemm, false, trans_w, M, N, K, A, lda, W.f32, ldw, C, ldc, accumulate);
}

/* src [T, cols] (rows ld_src apart) into bf16 rows ld16(m, cols) apart: a matmul input in
 * s.in16 or s.dy16. */
static void to_bf16_rows(qwen3_model_t *m, bf16_t *dst, const float *src, int64_t ld_src, int64_t T, int64_t cols) {
    SPAN(m, m->names.fwd[OP_TO_BF16], 0, (double)T * (double)cols * (F32_BYTES + BF16_BYTES),
         bf16_from_f32_rows(dst, ld16(m, cols), src, ld_src, T, cols));
}

/* bf16 runs: y (= or +=) x·Wᵀ with x already in s.in16 (bf16 [T, in], rows ld16(m, in) apart), written there by its
 * producer (layer_norm_for_matmul, swiglu_for_matmul) or by to_bf16. */
static void linear_fwd_in16(qwen3_model_t *m, int op, float *y, int64_t ld_y, weight_t W, int64_t T, int64_t out,
                            int64_t in, bool accumulate) {
    SPAN(m, m->names.fwd[op], linear_flops(T, out, in), matmul_bytes(T, out, in, BF16_BYTES, weight16_bytes(W), accumulate),
         gemm_weight16(m, true, T, out, in, m->s.in16, ld16(m, in), W, in, y, ld_y, accumulate));
}

/* y[T, out] (rows ld_y apart) (= or +=) x[T, in] (rows ld_x apart) · W[out, in]ᵀ */
static void linear_fwd(qwen3_model_t *m, int op, float *y, int64_t ld_y, const float *x, int64_t ld_x,
                       weight_t W, int64_t T, int64_t out, int64_t in, bool accumulate) {
    if (m->opt.bf16) {
        to_bf16_rows(m, m->s.in16, x, ld_x, T, in);
        linear_fwd_in16(m, op, y, ld_y, W, T, out, in, accumulate);
        return;
    }
    SPAN(m, m->names.fwd[op], linear_flops(T, out, in), matmul_bytes(T, out, in, F32_BYTES, F32_BYTES, accumulate),
         gemm_f32(m->gemm, false, true, T, out, in, x, ld_x, W.f32, in, y, ld_y, accumulate));
}

/* bf16 runs: linear_bwd with x already in s.in16 and dy in s.dy16. With opt.grad_sumsq the
 * weight gradient's product sums its squares where it can, for the gradient norm: in the last
 * micro-batch, whose product adds onto the earlier ones' and so stores final values. */
static void linear_bwd_16(qwen3_model_t *m, int op, float *dx, int64_t ld_dx, float *dW, weight_t W, int64_t T,
                          int64_t out, int64_t in) {
    double sumsq = 0.0;
    bool summed = false;
    SPAN(m, m->names.wgrad[op], linear_flops(out, in, T), matmul_bytes(out, in, T, BF16_BYTES, BF16_BYTES, m->grads_accumulate), {
        if (m->opt.grad_sumsq && m->grads_final)
            summed = gemm_bf16_sumsq(m->gemm, true, false, out, in, T, m->s.dy16, ld16(m, out), m->s.in16,
                                     ld16(m, in), dW, in, m->grads_accumulate, m->s.tile_sums,
                                     m->s.tile_sums_floats, &sumsq);
        else
            gemm_bf16(m->gemm, true, false, out, in, T, m->s.dy16, ld16(m, out), m->s.in16, ld16(m, in), dW, in,
                      m->grads_accumulate);
    });
    if (summed) grad_sumsq_add(&m->sumsq, dW - m->dw.embed, out * in, sumsq); /* the embedding heads the buffer */
    SPAN(m, m->names.bwd[op], linear_flops(T, in, out), matmul_bytes(T, in, out, BF16_BYTES, weight16_bytes(W), false),
         gemm_weight16(m, false, T, in, out, m->s.dy16, ld16(m, out), W, in, dx, ld_dx, false));
}

/* bf16 runs: linear_bwd with x already in s.in16. */
static void linear_bwd_in16(qwen3_model_t *m, int op, float *dx, int64_t ld_dx, float *dW, const float *dy,
                            int64_t ld_dy, weight_t W, int64_t T, int64_t out, int64_t in) {
    to_bf16_rows(m, m->s.dy16, dy, ld_dy, T, out);
    linear_bwd_16(m, op, dx, ld_dx, dW, W, T, out, in);
}

/* dx = dy·W and dW = dyᵀ·x (both written: a linear layer's weight has this one gradient product
 * per step, so it need not read zeros first: the weight-gradient products 1.008-1.030x,
 * flop-weighted over qwen3-0.6b's four layer shapes in three runs of bench/wgrad_write); dx may
 * alias x (x is read first; then ld_dx == ld_x). dy's, x's and dx's rows are ld_dy, ld_x and
 * ld_dx apart. */
static void linear_bwd(qwen3_model_t *m, int op, float *dx, int64_t ld_dx, float *dW, const float *dy, int64_t ld_dy,
                       const float *x, int64_t ld_x, weight_t W, int64_t T, int64_t out, int64_t in) {
    if (m->opt.bf16) {
        to_bf16_rows(m, m->s.in16, x, ld_x, T, in);
        linear_bwd_in16(m, op, dx, ld_dx, dW, dy, ld_dy, W, T, out, in);
        return;
    }
    if (wide_layer(out, in) && m->s.x_t && gemm_wide_gradients_slow(m->gemm)) {
        scratch_t *s = &m->s;
        SPAN(m, m->names.fwd[OP_TRANSPOSE], 0, 2.0 * F32_BYTES * (double)(T * out + T * in + out * in), {
            transpose_f32(s->dy_t, T, dy, ld_dy, T, out);
            transpose_f32(s->x_t, T, x, ld_x, T, in);
            transpose_f32(s->w_t, out, W.f32, in, out, in);
        });
        SPAN(m, m->names.wgrad[op], linear_flops(out, in, T), matmul_bytes(out, in, T, F32_BYTES, F32_BYTES, m->grads_accumulate),
             gemm_f32(m->gemm, false, true, out, in, T, s->dy_t, T, s->x_t, T, dW, in, m->grads_accumulate));
        SPAN(m, m->names.bwd[op], linear_flops(T, in, out), matmul_bytes(T, in, out, F32_BYTES, F32_BYTES, false),
             gemm_f32(m->gemm, false, true, T, in, out, dy, ld_dy, s->w_t, out, dx, ld_dx, false));
        return;
    }
    SPAN(m, m->names.wgrad[op], linear_flops(out, in, T), matmul_bytes(out, in, T, F32_BYTES, F32_BYTES, m->grads_accumulate),
         gemm_f32(m->gemm, true, false, out, in, T, dy, ld_dy, x, ld_x, dW, in, m->grads_accumulate));
    SPAN(m, m->names.bwd[op], linear_flops(T, in, out), matmul_bytes(T, in, out, F32_BYTES, F32_BYTES, false),
         gemm_f32(m->gemm, false, false, T, in, out, dy, ld_dy, W.f32, in, dx, ld_dx, false));
}

/* A layer norm of x [T, D] for a matmul's input: fp32 into s.ln, or in bf16 runs straight into
 * s.in16 (the fp32 output would only be rounded there). */
static void layer_norm_for_matmul(qwen3_model_t *m, int op, float *rstd, const float *x, const float *w) {
    const qwen3_dims_t *d = &m->d;
    int64_t T = d->B * d->S;
    if (m->opt.bf16)
        SPAN(m, m->names.fwd[op], 0, norm_fwd_bytes(T, d->D, BF16_BYTES),
             rmsnorm_forward_bf16(m->s.in16, ld16(m, d->D), rstd, x, m->ld_d, w, T, 1, d->D, (float)d->eps));
    else
        SPAN(m, m->names.fwd[op], 0, norm_fwd_bytes(T, d->D, F32_BYTES),
             rmsnorm_forward(m->s.ln, m->ld_d, rstd, x, m->ld_d, w, T, 1, d->D, (float)d->eps));
}

/* h = swiglu(gate_up) for the down projection: fp32 into s.h, or bf16 into s.in16. */
static void swiglu_for_matmul(qwen3_model_t *m, const float *gate_up) {
    const qwen3_dims_t *d = &m->d;
    int64_t T = d->B * d->S;
    if (m->opt.bf16)
        SPAN(m, m->names.fwd[OP_SWIGLU], 0, (double)T * (double)d->F * (2 * F32_BYTES + BF16_BYTES),
             swiglu_forward_bf16(m->s.in16, ld16(m, d->F), gate_up, m->ld_gate_up, T, d->F));
    else SPAN(m, m->names.fwd[OP_SWIGLU], 0, (double)T * (double)d->F * 3 * F32_BYTES,
              swiglu_forward(m->s.h, m->ld_f, gate_up, m->ld_gate_up, T, d->F));
}

/* The matmul input a *_for_matmul producer left: y (= or +=) x·Wᵀ, and its backward. */
static void linear_fwd_produced(qwen3_model_t *m, int op, float *y, int64_t ld_y, const float *x_f32, int64_t ld_x,
                                weight_t W, int64_t T, int64_t out, int64_t in, bool accumulate) {
    if (m->opt.bf16) linear_fwd_in16(m, op, y, ld_y, W, T, out, in, accumulate);
    else linear_fwd(m, op, y, ld_y, x_f32, ld_x, W, T, out, in, accumulate);
}
static void linear_bwd_produced(qwen3_model_t *m, int op, float *dx, int64_t ld_dx, float *dW, const float *dy,
                                int64_t ld_dy, const float *x_f32, int64_t ld_x, weight_t W, int64_t T,
                                int64_t out, int64_t in) {
    if (m->opt.bf16) linear_bwd_in16(m, op, dx, ld_dx, dW, dy, ld_dy, W, T, out, in);
    else linear_bwd(m, op, dx, ld_dx, dW, dy, ld_dy, x_f32, ld_x, W, T, out, in);
}

static attn_shape_t attn_shape(const qwen3_dims_t *d) { return (attn_shape_t){.B = d->B, .S = d->S, .H = d->H, .KV = d->KV, .HD = d->HD}; }

static double attention_flops(const qwen3_dims_t *d, double passes) {
    /* Causal: half of the S² scores; 2 matmuls of 2·HD flops per score and head. */
    return passes * 2.0 * 2.0 * (double)d->B * (double)d->S * (double)d->S * (double)d->H * (double)d->HD / 2.0;
}

/* dst = src, two [T, D] residual-stream buffers at the same stride ld_d: one copy of all T·ld_d
 * floats (padding included, which nothing reads). */
static void copy_residual(qwen3_model_t *m, float *dst, const float *src) {
    int64_t n = m->d.B * m->d.S * m->ld_d;
    SPAN(m, m->names.fwd[OP_RESIDUAL], 0, 2.0 * F32_BYTES * (double)n, memcpy(dst, src, (size_t)n * sizeof(float)));
}

/* Whether qk-norm and rope run as one pass (rmsnorm_rope_forward and _backward): the bits of the
 * two kernels one after the other, without writing q and k between them and reading them back
 * (twice a [T, (H+KV)·HD] pass a layer, forward and backward). */
static bool qk_norm_rope_fused(const qwen3_dims_t *d) {
    return d->qk_norm && d->HD % 2 == 0 && d->HD <= ROPE_FUSED_MAX_N;
}

/* q and k for attention from the projections: qk-norm per head, then rope. */
static void qk_from_qkv(qwen3_model_t *m, const qwen3_layer_params_t *w, layer_acts_t *a) {
    const qwen3_dims_t *d = &m->d;
    int64_t T = d->B * d->S, ld_qkv = m->ld_qkv, QK = (d->H + d->KV) * d->HD;
    if (qk_norm_rope_fused(d)) {
        SPAN(m, m->names.fwd[OP_QK_NORM], 0, norm_fwd_bytes(T * (d->H + d->KV), d->HD, F32_BYTES) + rope_table_bytes(d), {
            rmsnorm_rope_forward(a->qk, QK, a->qk_rstd, a->qkv, ld_qkv, w->q_norm, m->s.rope_cos, m->s.rope_sin, T,
                                 d->S, d->H, d->HD, (float)d->eps);
            rmsnorm_rope_forward(a->qk + d->H * d->HD, QK, a->qk_rstd + T * d->H, a->qkv + d->H * d->HD, ld_qkv,
                                 w->k_norm, m->s.rope_cos, m->s.rope_sin, T, d->S, d->KV, d->HD, (float)d->eps);
        });
        return;
    }
    if (d->qk_norm) {
        SPAN(m, m->names.fwd[OP_QK_NORM], 0, norm_fwd_bytes(T * (d->H + d->KV), d->HD, F32_BYTES), {
            rmsnorm_forward(a->qk, QK, a->qk_rstd, a->qkv, ld_qkv, w->q_norm, T, d->H, d->HD, (float)d->eps);
            rmsnorm_forward(a->qk + d->H * d->HD, QK, a->qk_rstd + T * d->H, a->qkv + d->H * d->HD, ld_qkv,
                            w->k_norm, T, d->KV, d->HD, (float)d->eps);
        });
    } else {
        for (int64_t t = 0; t < T; t++) memcpy(a->qk + t * QK, a->qkv + t * ld_qkv, (size_t)QK * sizeof(float));
    }
    SPAN(m, m->names.fwd[OP_ROPE], 0, 2.0 * F32_BYTES * (double)(T * QK) + rope_table_bytes(d),
         rope_forward(a->qk, QK, m->s.rope_cos, m->s.rope_sin, d->B, d->S, d->H + d->KV, d->HD));
}

/* Norm the input, project q/k/v, qk-norm and rope q and k: fills a->qkv, a->qk, a->rstd1. */
static void attention_inputs(qwen3_model_t *m, int64_t l, layer_acts_t *a, const float *x) {
    const qwen3_dims_t *d = &m->d;
    const qwen3_layer_params_t *w = &m->w.layers[l];
    int64_t T = d->B * d->S, QKV = (d->H + 2 * d->KV) * d->HD;
    layer_norm_for_matmul(m, OP_NORM, a->rstd1, x, w->input_norm);
    linear_fwd_produced(m, OP_QKV, a->qkv, m->ld_qkv, m->s.ln, m->ld_d, LAYER_WEIGHT(m, l, q_proj), T, QKV, d->D, false);
    qk_from_qkv(m, w, a);
}

static void layer_forward(qwen3_model_t *m, int64_t l, const float *x, float *x_out) {
    const qwen3_dims_t *d = &m->d;
    const qwen3_layer_params_t *w = &m->w.layers[l];
    layer_acts_t *a = acts_of(m, l);
    int64_t T = d->B * d->S, ld_qkv = m->ld_qkv, QK = (d->H + d->KV) * d->HD, ld_d = m->ld_d;
    attn_shape_t as = attn_shape(d);
    attention_inputs(m, l, a, x);
    if (m->opt.bf16)
        SPAN(m, m->names.fwd[OP_ATTN], attention_flops(d, 1), attention_bytes(d, false),
             attention_forward_bf16(a->attn, m->ld_hhd, a->lse, a->qk, QK, a->qk + d->H * d->HD, QK,
                                    a->qkv + (d->H + d->KV) * d->HD, ld_qkv, &as, m->s.attention, m->thread_gemm));
    else
        SPAN(m, m->names.fwd[OP_ATTN], attention_flops(d, 1), attention_bytes(d, false),
             attention_forward(a->attn, m->ld_hhd, a->lse, a->qk, QK, a->qk + d->H * d->HD, QK,
                               a->qkv + (d->H + d->KV) * d->HD, ld_qkv, &as, m->s.attention, m->thread_gemm));
    copy_residual(m, a->x2, x);
    linear_fwd(m, OP_O_PROJ, a->x2, ld_d, a->attn, m->ld_hhd, LAYER_WEIGHT(m, l, o_proj), T, d->D, d->H * d->HD, true);
    layer_norm_for_matmul(m, OP_NORM, a->rstd2, a->x2, w->post_norm);
    linear_fwd_produced(m, OP_GATE_UP, a->gate_up, m->ld_gate_up, m->s.ln, ld_d, LAYER_WEIGHT(m, l, gate_proj), T, 2 * d->F, d->D, false);
    swiglu_for_matmul(m, a->gate_up);
    copy_residual(m, x_out, a->x2);
    linear_fwd_produced(m, OP_DOWN, x_out, ld_d, m->s.h, m->ld_f, LAYER_WEIGHT(m, l, down_proj), T, d->D, d->F, true);
}

/* On entry s.dres holds dL/d(layer output); on exit dL/d(layer input). */
static void layer_backward(qwen3_model_t *m, int64_t l, const float *x) {
    const qwen3_dims_t *d = &m->d;
    const qwen3_layer_params_t *w = &m->w.layers[l];
    qwen3_layer_params_t *dw = &m->dw.layers[l];
    layer_acts_t *a = acts_of(m, l);
    scratch_t *s = &m->s;
    int64_t T = d->B * d->S, QKV = (d->H + 2 * d->KV) * d->HD, ld_qkv = m->ld_qkv, QK = (d->H + d->KV) * d->HD, HHD = d->H * d->HD;
    int64_t ld_d = m->ld_d, ld_hhd = m->ld_hhd, ld_f = m->ld_f;
    attn_shape_t as = attn_shape(d);
    /* MLP: recompute the swiglu output and the normed input rather than saving them, each just
     * before the weight gradient that reads it (in bf16 runs both land in s.in16). */
    swiglu_for_matmul(m, a->gate_up);
    linear_bwd_produced(m, OP_DOWN, s->h, ld_f, dw->down_proj, s->dres, ld_d, s->h, ld_f, LAYER_WEIGHT(m, l, down_proj), T, d->D, d->F);
    if (m->opt.bf16) /* dgate_up goes straight to the products' bf16 dy */
        SPAN(m, m->names.bwd[OP_SWIGLU], 0, (double)T * (double)d->F * (3 * F32_BYTES + 2 * BF16_BYTES),
             swiglu_backward_bf16(s->dy16, ld16(m, 2 * d->F), s->h, ld_f, a->gate_up, m->ld_gate_up, T, d->F));
    else
        SPAN(m, m->names.bwd[OP_SWIGLU], 0, (double)T * (double)d->F * 5 * F32_BYTES,
             swiglu_backward(s->dgate_up, m->ld_gate_up, s->h, ld_f, a->gate_up, m->ld_gate_up, T, d->F));
    layer_norm_for_matmul(m, OP_NORM, a->rstd2, a->x2, w->post_norm);
    if (m->opt.bf16) linear_bwd_16(m, OP_GATE_UP, s->dln, ld_d, dw->gate_proj, LAYER_WEIGHT(m, l, gate_proj), T, 2 * d->F, d->D);
    else
        linear_bwd(m, OP_GATE_UP, s->dln, ld_d, dw->gate_proj, s->dgate_up, m->ld_gate_up, s->ln, ld_d, LAYER_WEIGHT(m, l, gate_proj), T,
                   2 * d->F, d->D);
    SPAN(m, m->names.bwd[OP_NORM], 0, norm_bwd_bytes(T, d->D, true),
         rmsnorm_backward(s->dres, ld_d, true, dw->post_norm, s->dln, ld_d, a->x2, ld_d, w->post_norm, a->rstd2, T, 1, d->D, s->norm_partials));
    /* Attention. */
    linear_bwd(m, OP_O_PROJ, s->dattn, ld_hhd, dw->o_proj, s->dres, ld_d, a->attn, ld_hhd, LAYER_WEIGHT(m, l, o_proj), T, d->D, HHD);
    if (m->opt.remat == QWEN3_REMAT_MINIMAL) qk_from_qkv(m, w, a); /* the shared buffer holds another layer's */
    if (m->opt.bf16)
        SPAN(m, m->names.bwd[OP_ATTN], attention_flops(d, 2), attention_bytes(d, true),
             attention_backward_bf16(s->dqkv, ld_qkv, s->dqkv + HHD, ld_qkv, s->dqkv + QK, ld_qkv, s->dattn, ld_hhd, a->attn, ld_hhd,
                                     a->lse, a->qk, QK, a->qk + HHD, QK, a->qkv + QK, ld_qkv, &as, s->attention,
                                     m->thread_gemm));
    else
        SPAN(m, m->names.bwd[OP_ATTN], attention_flops(d, 2), attention_bytes(d, true),
             attention_backward(s->dqkv, ld_qkv, s->dqkv + HHD, ld_qkv, s->dqkv + QK, ld_qkv, s->dattn, ld_hhd, a->attn, ld_hhd,
                                a->lse, a->qk, QK, a->qk + HHD, QK, a->qkv + QK, ld_qkv, &as, s->attention,
                                m->thread_gemm));
    if (qk_norm_rope_fused(d)) {
        SPAN(m, m->names.bwd[OP_QK_NORM], 0, norm_bwd_bytes(T * (d->H + d->KV), d->HD, false) + rope_table_bytes(d), {
            rmsnorm_rope_backward(s->dqkv, ld_qkv, dw->q_norm, s->dqkv, ld_qkv, a->qkv, ld_qkv, w->q_norm, a->qk_rstd,
                                  s->rope_cos, s->rope_sin, T, d->S, d->H, d->HD, s->norm_partials);
            rmsnorm_rope_backward(s->dqkv + HHD, ld_qkv, dw->k_norm, s->dqkv + HHD, ld_qkv, a->qkv + HHD, ld_qkv,
                                  w->k_norm, a->qk_rstd + T * d->H, s->rope_cos, s->rope_sin, T, d->S, d->KV, d->HD,
                                  s->norm_partials);
        });
    } else {
        SPAN(m, m->names.bwd[OP_ROPE], 0, 2.0 * F32_BYTES * (double)(T * QK) + rope_table_bytes(d),
             rope_backward(s->dqkv, ld_qkv, s->rope_cos, s->rope_sin, d->B, d->S, d->H + d->KV, d->HD));
    }
    if (d->qk_norm && !qk_norm_rope_fused(d)) {
        SPAN(m, m->names.bwd[OP_QK_NORM], 0, norm_bwd_bytes(T * (d->H + d->KV), d->HD, false), {
            rmsnorm_backward(s->dqkv, ld_qkv, false, dw->q_norm, s->dqkv, ld_qkv, a->qkv, ld_qkv, w->q_norm, a->qk_rstd, T, d->H, d->HD, s->norm_partials);
            rmsnorm_backward(s->dqkv + HHD, ld_qkv, false, dw->k_norm, s->dqkv + HHD, ld_qkv, a->qkv + HHD, ld_qkv, w->k_norm,
                             a->qk_rstd + T * d->H, T, d->KV, d->HD, s->norm_partials);
        });
    }
    layer_norm_for_matmul(m, OP_NORM, a->rstd1, x, w->input_norm);
    linear_bwd_produced(m, OP_QKV, s->dln, ld_d, dw->q_proj, s->dqkv, m->ld_qkv, s->ln, ld_d, LAYER_WEIGHT(m, l, q_proj), T, QKV, d->D);
    SPAN(m, m->names.bwd[OP_NORM], 0, norm_bwd_bytes(T, d->D, true),
         rmsnorm_backward(s->dres, ld_d, true, dw->input_norm, s->dln, ld_d, x, ld_d, w->input_norm, a->rstd1, T, 1, d->D, s->norm_partials));
}

/* Final norm, then the LM head and cross-entropy chunk by chunk: each chunk's logits become
 * their gradient in place and are folded into dL/dh and the head's weight gradient at once,
 * so no [T, V] buffer exists. With_grad false computes the loss only. */
static double head_forward_backward(qwen3_model_t *m, bool with_grad) {
    const qwen3_dims_t *d = &m->d;
    scratch_t *s = &m->s;
    int64_t T = d->B * d->S, C = m->opt.xent_chunk;
    const float *x = layer_input(m, d->L);
    layer_norm_for_matmul(m, OP_FINAL_NORM, s->rstd_final, x, m->w.final_norm); /* bf16: all T rows in s.in16 */
    double loss_sum = 0.0;
    float grad_scale = 1.0f / (float)T;
    const weight_t head = {m->w.lm_head, m->w16.lm_head};
    /* bf16: the chunk's gradient, rounded, over the first half of each row of its logits, which
     * the cross-entropy has read by then: no [C, V] buffer of its own (155 MB at qwen3-0.6b's
     * 512-token chunks). Its products read it at that stride. */
    bf16_t *dlogits16 = (bf16_t *)s->logits;
    const int64_t ld_dlogits16 = 2 * d->V;
    for (int64_t t0 = 0; t0 < T; t0 += C) {
        int64_t n = T - t0 < C ? T - t0 : C;
        for (int64_t i = 0; i < n; i++) {
            int64_t t = t0 + i;
            s->targets[i] = m->tokens[(t / d->S) * (d->S + 1) + t % d->S + 1];
        }
        const float *h = s->ln + t0 * m->ld_d;
        const bf16_t *h16 = s->in16 + t0 * ld16(m, d->D);
        if (m->opt.bf16) {
            SPAN(m, m->names.fwd[OP_LM_HEAD], linear_flops(n, d->V, d->D), matmul_bytes(n, d->V, d->D, BF16_BYTES, weight16_bytes(head), false),
                 gemm_weight16(m, true, n, d->V, d->D, h16, ld16(m, d->D), head, d->D, s->logits, d->V, false));
        } else {
            SPAN(m, m->names.fwd[OP_LM_HEAD], linear_flops(n, d->V, d->D), matmul_bytes(n, d->V, d->D, F32_BYTES, F32_BYTES, false),
                 gemm_f32(m->gemm, false, true, n, d->V, d->D, h, m->ld_d, m->w.lm_head, d->D, s->logits, d->V, false));
        }
        if (m->opt.bf16 && with_grad) /* the gradient straight into the products' bf16 dy */
            SPAN(m, m->names.fwd[OP_XENT], 0, xent_bytes(n, d->V, BF16_BYTES),
                 xent_forward_backward_bf16(s->logits, dlogits16, ld_dlogits16, s->xent_rows, s->row_loss, s->row_lse,
                                            s->targets, n, d->V, grad_scale, m->opt.z_loss));
        else
            SPAN(m, m->names.fwd[OP_XENT], 0, xent_bytes(n, d->V, F32_BYTES),
                 xent_forward_backward(s->logits, s->row_loss, s->row_lse, s->targets, n, d->V, grad_scale,
                                       m->opt.z_loss));
        for (int64_t i = 0; i < n; i++) loss_sum += s->row_loss[i];
        if (!with_grad) continue;
        if (m->opt.bf16) {
            SPAN(m, m->names.wgrad[OP_LM_HEAD], linear_flops(d->V, d->D, n),
                 matmul_bytes(d->V, d->D, n, BF16_BYTES, BF16_BYTES, t0 > 0 || m->grads_accumulate),
                 gemm_bf16(m->gemm, true, false, d->V, d->D, n, dlogits16, ld_dlogits16, h16, ld16(m, d->D),
                           m->dw.lm_head, d->D, t0 > 0 || m->grads_accumulate));
            SPAN(m, m->names.bwd[OP_LM_HEAD], linear_flops(n, d->D, d->V), matmul_bytes(n, d->D, d->V, BF16_BYTES, weight16_bytes(head), false),
                 gemm_weight16(m, false, n, d->D, d->V, dlogits16, ld_dlogits16, head, d->D, s->dln + t0 * m->ld_d,
                               m->ld_d, false));
            continue;
        }
        SPAN(m, m->names.wgrad[OP_LM_HEAD], linear_flops(d->V, d->D, n),
             matmul_bytes(d->V, d->D, n, F32_BYTES, F32_BYTES, t0 > 0 || m->grads_accumulate),
             gemm_f32(m->gemm, true, false, d->V, d->D, n, s->logits, d->V, h, m->ld_d, m->dw.lm_head, d->D,
                      t0 > 0 || m->grads_accumulate));
        SPAN(m, m->names.bwd[OP_LM_HEAD], linear_flops(n, d->D, d->V), matmul_bytes(n, d->D, d->V, F32_BYTES, F32_BYTES, false),
             gemm_f32(m->gemm, false, false, n, d->D, d->V, s->logits, d->V, m->w.lm_head, d->D, s->dln + t0 * m->ld_d, m->ld_d, false));
    }
    if (with_grad)
        SPAN(m, m->names.bwd[OP_FINAL_NORM], 0, norm_bwd_bytes(T, d->D, false),
             rmsnorm_backward(s->dres, m->ld_d, false, m->dw.final_norm, s->dln, m->ld_d, x, m->ld_d, m->w.final_norm, s->rstd_final, T, 1, d->D, s->norm_partials));
    return loss_sum / (double)T;
}

static double forward(qwen3_model_t *m, const int32_t *tokens, bool with_grad) {
    const qwen3_dims_t *d = &m->d;
    m->tokens = tokens;
    int64_t span = trace_begin(m->trace);
    if (m->opt.weights_bf16)
        SPAN(m, m->names.fwd[OP_EMBED], 0, embed_bytes(d, BF16_BYTES, false),
             embed_forward_bf16(layer_input(m, 0), m->ld_d, tokens, d->S + 1, m->w16.embed, d->B, d->S, d->D));
    else
        SPAN(m, m->names.fwd[OP_EMBED], 0, embed_bytes(d, F32_BYTES, false),
             embed_forward(layer_input(m, 0), m->ld_d, tokens, d->S + 1, m->w.embed, d->B, d->S, d->D));
    for (int64_t l = 0; l < d->L; l++)
        SPAN(m, m->names.layer_fwd[l], 0, 0, layer_forward(m, l, layer_input(m, l), layer_input(m, l + 1)));
    double loss = head_forward_backward(m, with_grad);
    trace_end(m->trace, 0, m->names.forward, span, 0, 0);
    return loss;
}

double qwen3_forward_loss(qwen3_model_t *m, const int32_t *tokens) { return forward(m, tokens, false); }

/* Gradients [lo, hi) are final: tell the grads_ready hook. */
static void grads_ready(qwen3_model_t *m, const float *lo, const float *hi) {
    if (m->opt.grads_ready) m->opt.grads_ready(m->opt.grads_ready_arg, lo - m->dw.embed, hi - lo);
}

int64_t qwen3_grad_sum_squares_reads(const qwen3_model_t *m) {
    return grad_sumsq_gap_floats(&m->sumsq, qwen3_num_params(&m->d));
}

double qwen3_grad_sum_squares(qwen3_model_t *m, double *partials) {
    return grad_sumsq_total(&m->sumsq, m->dw.embed, qwen3_num_params(&m->d), partials);
}

static void widen(float *dst, const bf16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

void qwen3_widen_norm_weights(qwen3_model_t *m) {
    if (!m->opt.weights_bf16) return;
    const qwen3_dims_t *d = &m->d;
    for (int64_t l = 0; l < d->L; l++) {
        qwen3_layer_params_t *w = &m->w.layers[l];
        const qwen3_layer_params16_t *w16 = &m->w16.layers[l];
#define QWEN3_WIDEN_VECTOR(field, name, rows, cols, init, present)                                 \
    if ((present) && (cols) == 0) widen(w->field, w16->field, rows);
        QWEN3_LAYER_TENSORS(QWEN3_WIDEN_VECTOR, d)
#undef QWEN3_WIDEN_VECTOR
    }
    widen(m->w.final_norm, m->w16.final_norm, d->D);
}

void qwen3_zero_accumulated_grads(qwen3_model_t *m) {
    const qwen3_dims_t *d = &m->d;
    for (int64_t l = 0; l < d->L; l++) {
        qwen3_layer_params_t *g = &m->dw.layers[l];
        /* the vectors of the layer's tensor list: its norm weights */
#define QWEN3_ZERO_VECTOR(field, name, rows, cols, init, present)                                  \
    if ((present) && (cols) == 0) memset(g->field, 0, (size_t)(rows) * sizeof(float));
        QWEN3_LAYER_TENSORS(QWEN3_ZERO_VECTOR, d)
#undef QWEN3_ZERO_VECTOR
    }
    memset(m->dw.final_norm, 0, (size_t)d->D * sizeof(float));
    if (!d->tied) memset(m->dw.embed, 0, (size_t)(d->V * d->D) * sizeof(float));
}

double qwen3_forward_backward(qwen3_model_t *m, const int32_t *tokens) {
    return qwen3_forward_backward_micro(m, tokens, 0, 1);
}

double qwen3_forward_backward_micro(qwen3_model_t *m, const int32_t *tokens, int64_t micro, int64_t micros) {
    const qwen3_dims_t *d = &m->d;
    const bool last = micro == micros - 1;
    m->grads_accumulate = micro > 0;
    m->grads_final = last;
    if (micro == 0) grad_sumsq_clear(&m->sumsq);
    double loss = forward(m, tokens, true);
    /* The embedding comes first in the buffer and the head last; a tied head is the embedding. */
    if (last) grads_ready(m, m->dw.final_norm, d->tied ? m->dw.final_norm + d->D : m->dw.lm_head + d->V * d->D);
    int64_t span = trace_begin(m->trace);
    for (int64_t l = d->L - 1; l >= 0; l--) {
        const float *x = layer_input(m, l);
        SPAN(m, m->names.layer_bwd[l], 0, 0, {
            if (m->opt.remat == QWEN3_REMAT_FULL) layer_forward(m, l, x, m->s.dln); /* refill the shared acts; output unused */
            layer_backward(m, l, x);
        });
        if (last)
            grads_ready(m, m->dw.layers[l].input_norm, l + 1 < d->L ? m->dw.layers[l + 1].input_norm : m->dw.final_norm);
    }
    SPAN(m, m->names.bwd[OP_EMBED], 0, embed_bytes(d, F32_BYTES, true),
         embed_backward(m->dw.embed, m->s.dres, m->ld_d, tokens, d->S + 1, d->B, d->S, d->D));
    if (last) grads_ready(m, m->dw.embed, m->dw.embed + d->V * d->D);
    m->grads_accumulate = m->grads_final = false;
    trace_end(m->trace, 0, m->names.backward, span, 0, 0);
    return loss;
}
