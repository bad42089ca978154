/* bf16 attention on our own block products over pre-packed operands: AMX tiles (kernels/amx.h)
 * where the CPU has them, else AVX512-BF16 dot products (kernels/dpbf16.h), the two taking the
 * same packed operands. The flash-style blocking of attention_bf16.c, with K and V packed once
 * per (batch, kv head) into the layout each product reads them in, so no product repacks its
 * operands. Through the matmul library these [128 × S × 128] products ran at about 6% of the
 * tile unit's peak through MKL (Intel), and at 22-29% of the bf16 peak through oneDNN on the
 * Zen 5 (slower than the fp32 kernel there), most of it packing.
 *
 * Every extent a block product sees is padded to a multiple of 32 (queries of a block, keys,
 * HD) with zeros, which add nothing to any sum; only the first nq rows and HD columns of a
 * result are copied out. The backward computes dKᵀ = Qᵀ·dS and dVᵀ = dOᵀ·P, so the large
 * [queries × keys] strips serve as packed B operands (packed while converting to bf16) and
 * only the small [queries × HD] blocks are transposed. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/amx.h"
#include "kernels/attention.h"
#include "kernels/attention_internal.h"
#include "kernels/transpose.h"
#include "kernels/vecmath.h"

enum { QB = ATTN_QBLOCK_BF16 };

/* The causal staircase at the products' granularity: a block's queries go in sub-blocks of 32
 * rows, and the queries from r0 of the block starting at i0 see keys [0, i0 + r0 + 32) at most.
 * Products over keys stop there, row sub-block by row sub-block, and the key gradients' products
 * start each 32-key column block of the diagonal at the first query that sees it. Over whole
 * 128-query blocks, the diagonal block's masked half was computed and thrown away: 11% of the
 * products at S = 1024 (1 / (S/128 + 1)); at 32 rows a quarter of that remains. Skipped terms
 * are zeros (masked P and dS), leading or trailing in each sum, so no bit changes. On AMX each
 * task configures the tiles once for its products (bf16_block_unit_t): the backward makes 22
 * products a block this way, where amx_gemm would configure and release around each. */
enum { SUB = 32 };
static int64_t keys_seen(int64_t i0, int64_t r0) { return i0 + r0 + SUB; }

/* C[nqp × keys] = A[nqp × HDp] · B (B packed from the keys, K extent HDp) on the staircase: the
 * keys before the block in one product, for the reuse of B across all the block's rows, then the
 * diagonal by row sub-blocks. Against row sub-blocks over all their keys this ran 1.01x forward
 * and 1.05x backward at S = 4096, level at 256 and 1024 (medians of 21 interleaved pairs). Each
 * element is one HDp-long sum either way. */
static void diagonal_scores(bf16_block_product_fn product, float *C, int64_t ldc, const bf16_t *A, const bf16_t *B,
                            int64_t HDp, int64_t nqp) {
    for (int64_t r0 = 0; r0 < nqp; r0 += SUB)
        product(C + r0 * ldc, ldc, A + r0 * HDp, HDp, B, HDp, SUB, r0 + SUB, HDp, false);
}

static void staircase_scores(bf16_block_product_fn product, float *C, int64_t ldc, const bf16_t *A, const bf16_t *B,
                             int64_t HDp, int64_t i0, int64_t nqp) {
    if (i0 > 0) product(C, ldc, A, HDp, B, HDp, nqp, i0, HDp, false);
    diagonal_scores(product, C + i0, ldc, A, B + i0 * HDp, HDp, nqp); /* C + i0: key i0's column */
}

/* C[rows × N] = A[rows × keys] · B (B packed with the keys as its K, extent Bk) on the staircase:
 * each 32-row sub-block's sum stops at the last key it sees (its row of A is zeros past it). */
static void staircase_over_keys(bf16_block_product_fn product, float *C, int64_t ldc, const bf16_t *A, int64_t lda,
                                const bf16_t *B, int64_t Bk, int64_t N, int64_t i0, int64_t rows) {
    for (int64_t r0 = 0; r0 < rows; r0 += SUB)
        product(C + r0 * ldc, ldc, A + r0 * lda, lda, B, Bk, SUB, N, keys_seen(i0, r0), false);
}

/* The backward takes the keys before a query block KCHUNK at a time, from their scores to their
 * part of dKᵀ and dVᵀ, so that each chunk's fp32 strips (64 KiB each) and packed P and dS stay
 * in L1 and L2 between the products that write and read them: over whole [QB × S] strips (1 MiB
 * of fp32 at S = 1024, beside 1 MiB of dKᵀ and dVᵀ) the P and dS pass and the products read
 * them from L3. A multiple of 32 (the products' key tiles) that divides QB, so every chunk
 * before the diagonal is whole (i0 is a multiple of QB). */
enum { KCHUNK = QB };
_Static_assert(KCHUNK % 32 == 0 && QB % KCHUNK == 0, "KCHUNK: a multiple of 32 that divides QB");

/* Row strides: padded off multiples of 4 KiB, where 16 rows of a tile would share a cache set. */
static int64_t s_pad(const attn_shape_t *a) { return amx_round32(a->S); }
static int64_t ld_f32(const attn_shape_t *a) { return s_pad(a) + 16; }
static int64_t ld_b16(const attn_shape_t *a) { return s_pad(a) + 32; }
static int64_t hd_pad(const attn_shape_t *a) { return amx_round32(a->HD); }
static int64_t ld_chunk(void) { return KCHUNK + 16; }

/* Scratch, in floats (bf16 regions take half a float an element):
 *   shared: the four packed K/V forms per (batch, kv head), each hd_pad × s_pad bf16;
 *   per thread: fp32 strips P [QB, ld_f32] (the forward's scores; a chunk's in the backward) and
 *   dP [QB, ld_chunk]; bf16 strips dS (row-major) [QB, ld_b16],
 *   P and dS packed [s_pad × QB]; q, dO [QB, hd_pad] and their transposes [hd_pad, QB] in
 *   bf16; a [QB, hd_pad] fp32 result block; dKᵀ and dVᵀ [hd_pad, ld_f32] fp32; and the
 *   bf16 rows [s_pad, hd_pad] that K and V are packed from. */
static int64_t pack_elems(const attn_shape_t *a) { return hd_pad(a) * s_pad(a); }
static int64_t shared_floats(const attn_shape_t *a) { return a->B * a->KV * 4 * pack_elems(a) / 2; }
static int64_t per_thread_floats(const attn_shape_t *a) {
    int64_t HDp = hd_pad(a);
    return QB * ld_f32(a) + QB * ld_chunk() + QB * ld_b16(a) / 2 + s_pad(a) * QB + 2 * QB * HDp + QB * HDp + 2 * HDp * ld_f32(a) +
           s_pad(a) * HDp / 2;
}

int64_t attention_packed_scratch_floats(const attn_shape_t *a, int num_threads) {
    return shared_floats(a) + (int64_t)num_threads * per_thread_floats(a);
}

typedef struct {
    bf16_t *kt, *k, *vt, *v; /* Kᵀ-as-B (for Q·Kᵀ), K-as-B (dS·K), Vᵀ-as-B (dO·Vᵀ), V-as-B (P·V) */
} kv_packs_t;

static kv_packs_t kv_packs(float *scratch, const attn_shape_t *a, int64_t b, int64_t kvh) {
    bf16_t *base = (bf16_t *)scratch + (b * a->KV + kvh) * 4 * pack_elems(a);
    int64_t n = pack_elems(a);
    return (kv_packs_t){base, base + n, base + 2 * n, base + 3 * n};
}

typedef struct {
    float *p, *dp, *res, *dkt, *dvt;
    bf16_t *ds16, *p_packed, *ds_packed, *q16, *do16, *qt16, *dot16, *kv_rows;
} packed_bufs_t;

static packed_bufs_t packed_bufs(float *scratch, const attn_shape_t *a) {
    const int64_t HDp = hd_pad(a);
    float *f = scratch + shared_floats(a) + (int64_t)omp_get_thread_num() * per_thread_floats(a);
    packed_bufs_t t;
    t.p = f, f += QB * ld_f32(a);
    t.dp = f, f += QB * ld_chunk();
    t.res = f, f += QB * HDp;
    t.dkt = f, f += HDp * ld_f32(a);
    t.dvt = f, f += HDp * ld_f32(a);
    bf16_t *h = (bf16_t *)f;
    t.ds16 = h, h += QB * ld_b16(a);
    t.p_packed = h, h += s_pad(a) * QB;
    t.ds_packed = h, h += s_pad(a) * QB;
    t.q16 = h, h += QB * HDp;
    t.do16 = h, h += QB * HDp;
    t.qt16 = h, h += HDp * QB;
    t.dot16 = h, h += HDp * QB;
    t.kv_rows = h;
    return t;
}

/* The zero padding of a transposed operand [HDp, QB]: columns nq..nqp of its HD rows, and the
 * whole of rows HD..HDp, up to column nqp. */
static void zero_transposed_padding(bf16_t *dst, int64_t nq, int64_t nqp, int64_t HD, int64_t HDp) {
    for (int64_t d = 0; d < HDp; d++) {
        int64_t from = d < HD ? nq : 0;
        memset(dst + d * QB + from, 0, (size_t)(nqp - from) * sizeof(bf16_t));
    }
}

/* A backward block's operands from its rows of q, dO and O (each row HD floats; rows a whole
 * activation row apart, 16 KiB for qwen3-0.6b's q): q and dO in bf16 row-major [nqp, HDp] (A of
 * the scores and dP) and transposed [HDp, QB] (A of dKᵀ and dVᵀ), zero-padded, and Di = Σ dO·O
 * per row (0 for the padding rows). One pass over the rows, 16 at a time: each row is read from
 * memory once, with the next rows asked for ahead, and a band's transposes read it from L1. Taken
 * as four passes (two roundings, two transposes, and Di reading dO a third time) every pass
 * waited on memory again: the rows are each on their own page, where the hardware prefetcher
 * starts over. The same bits: the same roundings and the same Di sums. */
static void backward_block_operands(const packed_bufs_t *t, float *di, const float *qp, int64_t ld_q, const float *dop,
                                    int64_t ld_dout, const float *op, int64_t ld_out, int64_t nq, int64_t nqp,
                                    int64_t HD, int64_t HDp) {
    enum { BAND = 16, AHEAD = 8 };
    for (int64_t r0 = 0; r0 < nq; r0 += BAND) {
        const int64_t r1 = r0 + BAND < nq ? r0 + BAND : nq;
        for (int64_t r = r0; r < r1; r++) {
            if (r + AHEAD < nq) {
                attention_prefetch_row(qp + (r + AHEAD) * ld_q, HD);
                attention_prefetch_row(dop + (r + AHEAD) * ld_dout, HD);
                attention_prefetch_row(op + (r + AHEAD) * ld_out, HD);
            }
            bf16_from_f32_block(t->q16 + r * HDp, qp + r * ld_q, HD);
            bf16_from_f32_block(t->do16 + r * HDp, dop + r * ld_dout, HD);
            di[r] = attention_row_dot(dop + r * ld_dout, op + r * ld_out, HD);
        }
        transpose_f32_to_bf16_serial(t->qt16 + r0, QB, qp + r0 * ld_q, ld_q, r1 - r0, HD);
        transpose_f32_to_bf16_serial(t->dot16 + r0, QB, dop + r0 * ld_dout, ld_dout, r1 - r0, HD);
    }
    for (int64_t r = 0; r < nqp; r++) {
        const int64_t from = r < nq ? HD : 0;
        memset(t->q16 + r * HDp + from, 0, (size_t)(HDp - from) * sizeof(bf16_t));
        memset(t->do16 + r * HDp + from, 0, (size_t)(HDp - from) * sizeof(bf16_t));
    }
    for (int64_t r = nq; r < nqp; r++) di[r] = 0.0f;
    zero_transposed_padding(t->qt16, nq, nqp, HD, HDp);
    zero_transposed_padding(t->dot16, nq, nqp, HD, HDp);
}

/* The four packed forms of this (batch, kv head)'s K and V, through a bf16 row-major copy. */
static void pack_kv(float *scratch, const attn_shape_t *a, const float *k, int64_t ld_k, const float *v,
                    int64_t ld_v, bool backward) {
    const int64_t S = a->S, HD = a->HD, HDp = hd_pad(a);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t kvh = 0; kvh < a->KV; kvh++) {
            kv_packs_t pk = kv_packs(scratch, a, b, kvh);
            bf16_t *rows = packed_bufs(scratch, a).kv_rows;
            attention_rows_to_bf16(rows, HDp, k + b * S * ld_k + kvh * HD, ld_k, S, S, HD);
            amx_pack_bt(pk.kt, rows, HDp, S, HDp);
            if (backward) amx_pack_b(pk.k, rows, HDp, S, HDp);
            attention_rows_to_bf16(rows, HDp, v + b * S * ld_v + kvh * HD, ld_v, S, S, HD);
            if (backward) amx_pack_bt(pk.vt, rows, HDp, S, HDp);
            else amx_pack_b(pk.v, rows, HDp, S, HDp);
        }
}

/* P and dS = scale·P∘(dP − di) over rows [0, nqp) and keys [j_lo, j_hi) (each row pair stopping
 * at keys_seen), from the raw scores in t->p and dP in t->dp (strips of the chunk's keys: column
 * j − j_lo, row stride lc), straight into the three bf16 forms the products read: dS row-major
 * (A of dQ = dS·K, global key columns) and dS and P packed as B operands (of dKᵀ = Qᵀ·dS and
 * dVᵀ = dOᵀ·P, K extent nqp: a chunk of keys is one contiguous run of that layout). Two rows at
 * a time, since a packed tile row interleaves a pair of rows, so neither P nor dS is written in
 * fp32 and read back: the exponentials, the dS rows, two roundings and two packs had each made a
 * pass over [QB, kp] fp32 strips, 25% of this kernel (perf). Rows nq..nqp belong to the zero
 * padding queries: P 0 there. The softmax's 1/sqrt(HD) is folded into dS for dQ and dK. Past a
 * row pair's keys_seen, the packed P and dS hold stale values that no product reads (see
 * keys_seen). With AVX512-BF16, 16 keys of both rows go through registers at once, each vector
 * converted once for its row-major and its packed form: against attention_p_ds_chunk's PD_CHUNK
 * keys through L1 (still the path without it), the backward ran 1.019x (median of seven
 * interleaved runs at S = 1024 on the Zen 4, 0.998-1.043x), with the same bits: the same
 * exponentials (vf_exp on whole vectors, expf past a row's last whole vector), products and
 * roundings. */
static void p_ds_and_pack(const packed_bufs_t *t, int64_t lc, int64_t lb, int64_t i0, int64_t nq, int64_t nqp,
                          float scale, const float *row_lse, const float *di, int64_t j_lo, int64_t j_hi) {
#if defined(__AVX512BF16__)
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < nqp; r += 2) {
        const int64_t seen = keys_seen(i0, r / SUB * SUB), kr = seen < j_hi ? seen : j_hi; /* whole vectors */
        int64_t visible[2];
        float lse[2];
        for (int i = 0; i < 2; i++) {
            visible[i] = r + i < nq ? i0 + r + i + 1 : 0;
            lse[i] = r + i < nq ? row_lse[i0 + r + i] : 0.0f;
        }
        for (int64_t j = j_lo; j < kr; j += 16) {
            __m512 p[2], ds[2];
            for (int i = 0; i < 2; i++) {
                const float *scores = t->p + (r + i) * lc + (j - j_lo);
                const int64_t n = visible[i] - j;
                /* Past the row's last key (n < 16, or ≤ 0) the lanes are zeros, not exponentials
                 * of whatever the strip holds there. */
                p[i] = vf_exp_affine_n(scores, n, sc, _mm512_set1_ps(lse[i]));
                /* Masked keys' dP is selected away, not multiplied by a zero P. */
                const __m512 dp = _mm512_loadu_ps(t->dp + (r + i) * lc + (j - j_lo));
                const __m512 d = _mm512_mul_ps(_mm512_mul_ps(sc, p[i]), _mm512_sub_ps(dp, _mm512_set1_ps(di[r + i])));
                ds[i] = _mm512_maskz_mov_ps(vf_mask_(n), d);
            }
            const __m512i p16 = bf16x32_from_normal_ps(p[0], p[1]), ds16 = bf16x32_from_ps(ds[0], ds[1]);
            _mm256_storeu_si256((__m256i *)(t->ds16 + r * lb + j), _mm512_castsi512_si256(ds16));
            _mm256_storeu_si256((__m256i *)(t->ds16 + (r + 1) * lb + j), _mm512_extracti64x4_epi64(ds16, 1));
            const int64_t at = amx_packed_index(nqp, r, j); /* keys j.., query pair r in the packed B */
            _mm512_storeu_si512((void *)(t->ds_packed + at), bf16x32_interleave_halves(ds16));
            _mm512_storeu_si512((void *)(t->p_packed + at), bf16x32_interleave_halves(p16));
        }
    }
#else
    float p[2][PD_CHUNK], ds[2][PD_CHUNK];
    for (int64_t r = 0; r < nqp; r += 2) {
        const int64_t seen = keys_seen(i0, r / SUB * SUB), kr = seen < j_hi ? seen : j_hi;
        for (int64_t j0 = j_lo; j0 < kr; j0 += PD_CHUNK) {
            const int64_t n = kr - j0 < PD_CHUNK ? kr - j0 : PD_CHUNK;
            for (int i = 0; i < 2; i++) {
                const int64_t row = r + i;
                /* attention_p_ds_chunk indexes the rows by global key: the strips' origin is j_lo */
                attention_p_ds_chunk(p[i], ds[i], t->p + row * lc - j_lo, t->dp + row * lc - j_lo, j0, n,
                                     row < nq ? i0 + row + 1 : 0, scale, row < nq ? row_lse[i0 + row] : 0.0f, scale,
                                     di[row]);
                bf16_from_f32_block(t->ds16 + row * lb + j0, ds[i], n);
            }
            const int64_t panels = amx_packed_index(nqp, 0, j0);
            amx_pack_b_f32_pair(t->ds_packed + panels, nqp, r, ds[0], ds[1], n, n);
            amx_pack_b_f32_pair(t->p_packed + panels, nqp, r, p[0], p[1], n, n);
        }
    }
#endif
}

void attention_forward_bf16_packed(float *out, int64_t ld_out, float *lse, const float *q, int64_t ld_q,
                                   const float *k, int64_t ld_k, const float *v, int64_t ld_v, const attn_shape_t *a,
                                   float *scratch, bf16_block_unit_t unit) {
    const bf16_block_product_fn product = unit.product;
    const int64_t B = a->B, S = a->S, H = a->H, HD = a->HD, HDp = hd_pad(a), group = a->H / a->KV;
    const int64_t qblocks = (S + QB - 1) / QB, Sp = s_pad(a), lf = ld_f32(a), lb = ld_b16(a);
    const float scale = 1.0f / sqrtf((float)HD);
    pack_kv(scratch, a, k, ld_k, v, ld_v, false);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * qblocks; task++) {
        int64_t qb = qblocks - 1 - task % qblocks, bh = task / qblocks;
        int64_t b = bh / H, h = bh % H;
        int64_t i0 = qb * QB, nq = S - i0 < QB ? S - i0 : QB, kend = i0 + nq;
        int64_t nqp = amx_round32(nq), kp = amx_round32(kend);
        kv_packs_t pk = kv_packs(scratch, a, b, h / group);
        packed_bufs_t t = packed_bufs(scratch, a);
        if (unit.amx_tiles) amx_configure_full_tiles();
        attention_rows_to_bf16(t.q16, HDp, q + (b * S + i0) * ld_q + h * HD, ld_q, nq, nqp, HD);
        staircase_scores(product, t.p, lf, t.q16, pk.kt, HDp, i0, nqp); /* scores = q·kᵀ */
        float inv_sum[QB];
        bf16_t *p16 = t.ds16;
        attention_softmax_rows_to_bf16(p16, lb, t.p, lf, i0, nq, kp, scale, lse + (b * H + h) * S, inv_sum);
        /* rows nq..nqp belong to the zero query rows: zeros, whose products are dropped below */
        for (int64_t r = nq; r < nqp; r++) memset(p16 + r * lb, 0, (size_t)kp * sizeof(bf16_t));
        float *op = out + (b * S + i0) * ld_out + h * HD;
        if (nq == nqp && HD == HDp) { /* the usual case: tiles straight into the output */
            staircase_over_keys(product, op, ld_out, p16, lb, pk.v, Sp, HD, i0, nq);
            attention_scale_rows(op, ld_out, nq, HD, inv_sum);
        } else {
            staircase_over_keys(product, t.res, HDp, p16, lb, pk.v, Sp, HDp, i0, nqp);
            for (int64_t r = 0; r < nq; r++)
                for (int64_t d = 0; d < HD; d++) op[r * ld_out + d] = t.res[r * HDp + d] * inv_sum[r];
        }
        if (unit.amx_tiles) amx_release_tiles();
    }
}

void attention_backward_bf16_packed(float *dq, int64_t ld_dq, float *dk, int64_t ld_dk, float *dv, int64_t ld_dv,
                                    const float *dout, int64_t ld_dout, const float *out, int64_t ld_out,
                                    const float *lse, const float *q, int64_t ld_q, const float *k, int64_t ld_k,
                                    const float *v, int64_t ld_v, const attn_shape_t *a, float *scratch,
                                    bf16_block_unit_t unit) {
    const bf16_block_product_fn product = unit.product;
    const int64_t B = a->B, S = a->S, H = a->H, KV = a->KV, HD = a->HD, HDp = hd_pad(a), group = a->H / a->KV;
    const int64_t qblocks = (S + QB - 1) / QB, Sp = s_pad(a), lf = ld_f32(a), lb = ld_b16(a), lc = ld_chunk();
    const float scale = 1.0f / sqrtf((float)HD);
    pack_kv(scratch, a, k, ld_k, v, ld_v, true);
    /* One task per (batch, kv head): it alone accumulates that head's dKᵀ, dVᵀ, in an order
     * that does not depend on the thread count. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KV; task++) {
        int64_t b = task / KV, kvh = task % KV;
        kv_packs_t pk = kv_packs(scratch, a, b, kvh);
        packed_bufs_t t = packed_bufs(scratch, a);
        memset(t.dkt, 0, (size_t)(HDp * lf) * sizeof(float));
        memset(t.dvt, 0, (size_t)(HDp * lf) * sizeof(float));
        if (unit.amx_tiles) amx_configure_full_tiles();
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *row_lse = lse + (b * H + h) * S;
            for (int64_t qb = 0; qb < qblocks; qb++) {
                int64_t i0 = qb * QB, nq = S - i0 < QB ? S - i0 : QB;
                int64_t nqp = amx_round32(nq);
                const float *dop = dout + (b * S + i0) * ld_dout + h * HD, *op = out + (b * S + i0) * ld_out + h * HD;
                const float *qp = q + (b * S + i0) * ld_q + h * HD;
                /* Rows nq..nqp of P and dP are zero (zero q and dO rows): as K rows of the dKᵀ
                 * and dVᵀ products they add nothing. */
                float di[QB];
                backward_block_operands(&t, di, qp, ld_q, dop, ld_dout, op, ld_out, nq, nqp, HD, HDp);
                /* The keys before the block, KCHUNK at a time, each seen by every query: its
                 * scores and dP, then P and dS, then dKᵀ += Qᵀ·dS and dVᵀ += dOᵀ·P over it. */
                for (int64_t j0 = 0; j0 < i0; j0 += KCHUNK) {
                    product(t.p, lc, t.q16, HDp, pk.kt + j0 * HDp, HDp, nqp, KCHUNK, HDp, false);  /* q·kᵀ */
                    product(t.dp, lc, t.do16, HDp, pk.vt + j0 * HDp, HDp, nqp, KCHUNK, HDp, false); /* dO·Vᵀ */
                    p_ds_and_pack(&t, lc, lb, i0, nq, nqp, scale, row_lse, di, j0, j0 + KCHUNK);
                    product(t.dkt + j0, lf, t.qt16, QB, t.ds_packed + j0 * nqp, nqp, HDp, KCHUNK, nqp, true);
                    product(t.dvt + j0, lf, t.dot16, QB, t.p_packed + j0 * nqp, nqp, HDp, KCHUNK, nqp, true);
                }
                /* The diagonal, keys [i0, i0 + nqp): scores and dP by row sub-blocks up to the
                 * keys each sees; dKᵀ and dVᵀ by 32-key column blocks from the first query that
                 * sees each (c0 on). */
                diagonal_scores(product, t.p, lc, t.q16, pk.kt + i0 * HDp, HDp, nqp);
                diagonal_scores(product, t.dp, lc, t.do16, pk.vt + i0 * HDp, HDp, nqp);
                p_ds_and_pack(&t, lc, lb, i0, nq, nqp, scale, row_lse, di, i0, i0 + nqp);
                for (int64_t c0 = 0; c0 < nqp; c0 += SUB) {
                    const int64_t from = (i0 + c0) * nqp + c0 * 16; /* column i0 + c0, query c0 */
                    product(t.dkt + i0 + c0, lf, t.qt16 + c0, QB, t.ds_packed + from, nqp, HDp, SUB, nqp - c0, true);
                    product(t.dvt + i0 + c0, lf, t.dot16 + c0, QB, t.p_packed + from, nqp, HDp, SUB, nqp - c0, true);
                }
                /* dQ = dS·K over all the keys the rows see, from the dS rows the chunks left */
                float *dqp = dq + (b * S + i0) * ld_dq + h * HD;
                if (nq == nqp && HD == HDp) {
                    staircase_over_keys(product, dqp, ld_dq, t.ds16, lb, pk.k, Sp, HD, i0, nq);
                } else {
                    staircase_over_keys(product, t.res, HDp, t.ds16, lb, pk.k, Sp, HDp, i0, nqp);
                    for (int64_t r = 0; r < nq; r++)
                        memcpy(dqp + r * ld_dq, t.res + r * HDp, (size_t)HD * sizeof(float));
                }
            }
        }
        if (unit.amx_tiles) amx_release_tiles();
        transpose_f32_serial(dk + b * S * ld_dk + kvh * HD, ld_dk, t.dkt, lf, HD, S);
        transpose_f32_serial(dv + b * S * ld_dv + kvh * HD, ld_dv, t.dvt, lf, HD, S);
    }
}
