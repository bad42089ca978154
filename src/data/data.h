/* data: next-token batches for the training step, produced by a background thread into a
 * small ring so that loading overlaps compute. Each batch is [local_batch, S+1] token ids;
 * the step reads inputs tokens[:, 0:S] and targets tokens[:, 1:S+1].
 * - synthetic: uniform ids in [0, vocab) from data_seed; one global batch, reused every step
 *   (as MaxText does). Row r of the global batch depends only on (seed, r), so ranks that
 *   each take rows [row_offset, row_offset+local_batch) together see the one-process batch.
 * - tokens: a file of raw little-endian uint32 ids, memory-mapped. W = floor((N-1)/S)
 *   windows; window w is ids [w*S, w*S+S]; global row b of step i reads window
 *   (i*global_batch + b) mod W. */
#ifndef STEPSCOPE_DATA_H
#define STEPSCOPE_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "profile/trace.h"

typedef struct data_options {
    const char *dataset_type; /* "synthetic" | "tokens" */
    const char *dataset_path; /* tokens only */
    int64_t vocab_size;
    int64_t seq_len;          /* S */
    int64_t global_batch;
    int64_t row_offset;       /* first global row this process reads */
    int64_t local_batch;
    uint64_t seed;
    int64_t first_batch;      /* data_next's step i is the reader's batch first_batch + i (a resumed
                                 run's first step, or the evaluations' batches read before it) */
    int64_t cycle;            /* 0: none; -1: data_next's step i is batch (first_batch + i) mod
                                 the whole batches of one pass over the data (data_whole_batches),
                                 so that every run of that many steps reads the data once */
    int64_t depth;            /* ring slots (batches ahead); >= 1 */
    int64_t delay_ms;         /* test knob: the producer sleeps this long per batch */
    trace_t *trace;           /* may be NULL; the producer records "data/produce" spans */
    uint32_t trace_lane;
} data_options_t;

typedef struct data_source data_source_t;

/* The bytes of a producer's ring: depth batches of rows windows of seq_len + 1 int32 ids (the
 * memory plan counts it; data_open allocates it). */
static inline uint64_t data_ring_bytes(int64_t depth, int64_t rows, int64_t seq_len) {
    return (uint64_t)depth * (uint64_t)rows * (uint64_t)(seq_len + 1) * sizeof(int32_t);
}

/* Validate the source (file exists, long enough, every id < vocab) and start the producer.
 * On a user error: one line in err, returns non-zero, nothing started. */
int data_open(data_source_t **out, const data_options_t *opt, char *err, size_t errlen);
/* Block until the batch of `step` is ready; returns [local_batch, S+1] int32 ids valid
 * until data_release(step). *wait_seconds gets the time spent blocked. Steps are consumed
 * in order 0, 1, 2, ... */
const int32_t *data_next(data_source_t *d, int64_t step, double *wait_seconds);
void data_release(data_source_t *d, int64_t step);
/* The whole global batches in one pass over the source: floor(windows / global_batch) of a
 * token file (the windows past the last whole batch are left out), 1 of synthetic data (one
 * batch, reused). */
int64_t data_whole_batches(const data_source_t *d);
/* Stop the producer and free everything. NULL is fine. */
void data_close(data_source_t *d);

/* Synchronous access to exactly the batches the producer makes, without the thread (tests,
 * tools). A reader is a validated, opened source; data_reader_fill writes the batch of
 * `step` into out, [local_batch, S+1] int32. The producer fills its ring with the same call. */
typedef struct data_reader data_reader_t;
int data_reader_open(data_reader_t **out, const data_options_t *opt, char *err, size_t errlen);
void data_reader_fill(const data_reader_t *r, int64_t step, int32_t *out);
int64_t data_reader_whole_batches(const data_reader_t *r);
void data_reader_close(data_reader_t *r);
/* One shot: open a reader, fill the batch of `step`, close. Same errors as data_open. */
int data_fill_batch(const data_options_t *opt, int64_t step, int32_t *out, char *err, size_t errlen);

/* Backends behind the reader, one file each (internal to src/data). opt has been checked
 * by the reader (sizes positive, rows inside the global batch, vocab in [1, 2^31]). */
typedef struct data_synthetic data_synthetic_t; /* synthetic.c */
int data_synthetic_open(data_synthetic_t **out, const data_options_t *opt, char *err, size_t errlen);
void data_synthetic_fill(const data_synthetic_t *s, int64_t step, int32_t *out);
void data_synthetic_close(data_synthetic_t *s);
typedef struct data_tokens data_tokens_t;       /* tokens.c */
int data_tokens_open(data_tokens_t **out, const data_options_t *opt, char *err, size_t errlen);
void data_tokens_fill(const data_tokens_t *t, int64_t step, int32_t *out);
int64_t data_tokens_windows(const data_tokens_t *t);
void data_tokens_close(data_tokens_t *t);

#endif
