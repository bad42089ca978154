/* data: option checks and the reader, which dispatches to the synthetic or tokens backend.
 * The producer thread (prefetch.c) and the synchronous data_fill_batch both go through
 * data_reader_fill, so a test can compare the two batch for batch. */
#include "data/data.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { DATA_SYNTHETIC, DATA_TOKENS } data_kind_t;

struct data_reader {
    data_kind_t kind;
    int64_t global_batch;
    data_synthetic_t *synthetic;
    data_tokens_t *tokens;
};

/* Sizes come from the config, but library code re-checks what it relies on so a bad call
 * is a message, not an out-of-bounds write. */
static int check_options(const data_options_t *opt, char *err, size_t errlen) {
    if (!opt->dataset_type ||
        (strcmp(opt->dataset_type, "synthetic") != 0 && strcmp(opt->dataset_type, "tokens") != 0)) {
        snprintf(err, errlen, "data: unknown dataset_type '%s'; use \"synthetic\" or \"tokens\"",
                 opt->dataset_type ? opt->dataset_type : "(null)");
        return 1;
    }
    /* ids are int32 in the batch, so the largest id, vocab_size-1, must fit */
    if (opt->vocab_size < 1 || opt->vocab_size > ((int64_t)1 << 31)) {
        snprintf(err, errlen, "data: vocab_size %" PRId64 " is out of range; it must be in [1, 2^31]",
                 opt->vocab_size);
        return 1;
    }
    if (opt->seq_len < 1) {
        snprintf(err, errlen, "data: max_target_length %" PRId64 " must be >= 1", opt->seq_len);
        return 1;
    }
    if (opt->global_batch < 1 || opt->local_batch < 1 || opt->row_offset < 0 ||
        opt->local_batch > opt->global_batch || opt->row_offset > opt->global_batch - opt->local_batch) {
        snprintf(err, errlen,
                 "data: rows [%" PRId64 ", %" PRId64 ") do not fit a global batch of %" PRId64
                 "; check per_device_batch_size and the number of processes",
                 opt->row_offset, opt->row_offset + opt->local_batch, opt->global_batch);
        return 1;
    }
    if (opt->depth < 1) {
        snprintf(err, errlen, "data: prefetch_depth %" PRId64 " must be >= 1", opt->depth);
        return 1;
    }
    if (opt->cycle < -1) {
        snprintf(err, errlen, "data: cycle %" PRId64 " must be 0 or -1", opt->cycle);
        return 1;
    }
    if (opt->delay_ms < 0) {
        snprintf(err, errlen, "data: data_delay_ms %" PRId64 " must be >= 0", opt->delay_ms);
        return 1;
    }
    return 0;
}

int data_reader_open(data_reader_t **out, const data_options_t *opt, char *err, size_t errlen) {
    *out = NULL;
    if (check_options(opt, err, errlen)) return 1;
    data_reader_t *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "data: out of memory");
        return 1;
    }
    int rc;
    r->global_batch = opt->global_batch;
    if (strcmp(opt->dataset_type, "synthetic") == 0) {
        r->kind = DATA_SYNTHETIC;
        rc = data_synthetic_open(&r->synthetic, opt, err, errlen);
    } else {
        r->kind = DATA_TOKENS;
        rc = data_tokens_open(&r->tokens, opt, err, errlen);
    }
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void data_reader_fill(const data_reader_t *r, int64_t step, int32_t *out) {
    if (r->kind == DATA_SYNTHETIC) data_synthetic_fill(r->synthetic, step, out);
    else data_tokens_fill(r->tokens, step, out);
}

int64_t data_reader_whole_batches(const data_reader_t *r) {
    return r->kind == DATA_SYNTHETIC ? 1 : data_tokens_windows(r->tokens) / r->global_batch;
}

void data_reader_close(data_reader_t *r) {
    if (!r) return;
    data_synthetic_close(r->synthetic);
    data_tokens_close(r->tokens);
    free(r);
}

int data_fill_batch(const data_options_t *opt, int64_t step, int32_t *out, char *err, size_t errlen) {
    data_reader_t *r;
    if (data_reader_open(&r, opt, err, errlen)) return 1;
    data_reader_fill(r, step, out);
    data_reader_close(r);
    return 0;
}
