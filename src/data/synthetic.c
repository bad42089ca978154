/* synthetic: uniform token ids in [0, vocab) from a seed, as MaxText's synthetic dataset.
 * Row r of the global batch is the start of a splitmix64 stream keyed by (seed, r) only,
 * so a rank that takes rows [row_offset, row_offset+local_batch) sees exactly the rows the
 * one-process run sees. The batch is the same every step, so it is made once at open and
 * each fill is a copy. */
#include "data/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct data_synthetic {
    int32_t *batch; /* [local_batch, S+1] */
    size_t count;   /* local_batch * (S+1) */
};

#define GOLDEN 0x9e3779b97f4a7c15ull

/* splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One row's stream: 64-bit draws split into two 32-bit halves. */
typedef struct {
    uint64_t state, word;
    int half; /* 32-bit halves of `word` still unused */
} row_rng_t;

static uint32_t next32(row_rng_t *g) {
    if (g->half == 0) {
        g->state += GOLDEN;
        g->word = mix64(g->state);
        g->half = 2;
    }
    g->half--;
    return (uint32_t)(g->word >> (32 * g->half));
}

/* Uniform in [0, range) without modulo bias: Lemire's multiply-shift with rejection
 * ("Fast random integer generation in an interval", 2019). range in [1, 2^31]. */
static uint32_t bounded(row_rng_t *g, uint32_t range) {
    uint64_t m = (uint64_t)next32(g) * range;
    uint32_t low = (uint32_t)m;
    if (low < range) {
        uint32_t threshold = (uint32_t)(-range) % range; /* 2^32 mod range */
        while (low < threshold) {
            m = (uint64_t)next32(g) * range;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

/* out: [S1] ids of global row `row`. */
static void fill_row(int32_t *out, uint64_t seed, int64_t row, size_t S1, uint32_t vocab) {
    /* key the stream by (seed, row): mixing seed first keeps seeds s and rows r from
     * colliding with seed s+1 and row r-1 */
    row_rng_t g = {.state = mix64(mix64(seed + GOLDEN) ^ ((uint64_t)row * 0xd1b54a32d192ed03ull)),
                   .word = 0, .half = 0};
    for (size_t j = 0; j < S1; j++) out[j] = (int32_t)bounded(&g, vocab);
}

int data_synthetic_open(data_synthetic_t **out, const data_options_t *opt, char *err, size_t errlen) {
    *out = NULL;
    size_t S1 = (size_t)opt->seq_len + 1, rows = (size_t)opt->local_batch;
    data_synthetic_t *s = calloc(1, sizeof *s);
    if (s) s->batch = malloc(rows * S1 * sizeof(int32_t));
    if (!s || !s->batch) {
        free(s);
        snprintf(err, errlen, "data: out of memory for the synthetic batch (%zu x %zu ids)", rows, S1);
        return 1;
    }
    s->count = rows * S1;
    uint32_t vocab = (uint32_t)opt->vocab_size;
    /* rows are independent; only worth threads for big batches */
#pragma omp parallel for schedule(static) if (rows * S1 >= ((size_t)1 << 20))
    for (size_t b = 0; b < rows; b++)
        fill_row(s->batch + b * S1, opt->seed, opt->row_offset + (int64_t)b, S1, vocab);
    *out = s;
    return 0;
}

void data_synthetic_fill(const data_synthetic_t *s, int64_t step, int32_t *out) {
    (void)step; /* one batch for every step */
    memcpy(out, s->batch, s->count * sizeof(int32_t));
}

void data_synthetic_close(data_synthetic_t *s) {
    if (!s) return;
    free(s->batch);
    free(s);
}
