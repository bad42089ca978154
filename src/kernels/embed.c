#include "kernels/embed.h"

#include <string.h>

void embed_forward(float *out, int64_t ld_out, const int32_t *tokens, int64_t ld_tokens, const float *table,
                   int64_t B, int64_t S, int64_t D) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * S; t++) {
        int32_t id = tokens[(t / S) * ld_tokens + t % S];
        memcpy(out + t * ld_out, table + (int64_t)id * D, (size_t)D * sizeof(float));
    }
}

enum { EMBED_COLUMNS = 64 };

void embed_backward(float *dtable, const float *dout, int64_t ld_dout, const int32_t *tokens, int64_t ld_tokens,
                    int64_t B, int64_t S, int64_t D) {
    int64_t col_blocks = (D + EMBED_COLUMNS - 1) / EMBED_COLUMNS;
#pragma omp parallel for schedule(static)
    for (int64_t cb = 0; cb < col_blocks; cb++) {
        int64_t c0 = cb * EMBED_COLUMNS;
        int64_t c1 = c0 + EMBED_COLUMNS < D ? c0 + EMBED_COLUMNS : D;
        for (int64_t t = 0; t < B * S; t++) {
            int32_t id = tokens[(t / S) * ld_tokens + t % S];
            float *row = dtable + (int64_t)id * D;
            const float *g = dout + t * ld_dout;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) row[c] += g[c];
        }
    }
}

void embed_forward_bf16(float *out, int64_t ld_out, const int32_t *tokens, int64_t ld_tokens, const bf16_t *table,
                        int64_t B, int64_t S, int64_t D) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < B * S; t++) {
        const bf16_t *row = table + (int64_t)tokens[(t / S) * ld_tokens + t % S] * D;
        float *o = out + t * ld_out;
#pragma omp simd
        for (int64_t c = 0; c < D; c++) o[c] = bf16_to_f32(row[c]);
    }
}
