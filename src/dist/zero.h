/* zero: data parallelism with the optimizer state sharded across ranks (ZeRO-1).
 *
 * The flat parameter vector [0, n) is cut into contiguous shards, one per rank of the shard
 * group (MaxText's ici_fsdp_parallelism); each rank keeps the AdamW moments, and updates the
 * parameters, of its shard only. Ranks with the same shard in different shard groups
 * (dcn_data_parallelism) are replicas. One step:
 *   backward: as each layer's gradients are final, zero_grads_ready queues them; the
 *     communication thread reduce-scatters them over the shard group into this rank's
 *     gradient shard (then all-reduces that shard over the replicas) while backward goes on
 *     with the next layer, and zeroes the local gradients it has sent;
 *   zero_finish_grads: waits for what is still in flight;
 *   AdamW on the shard (train/state.c), then zero_gather_params all-gathers the updated
 *     parameters so every rank starts the next step with identical weights.
 * Every collective runs on the one communication thread, so MPI sees one thread at a time;
 * its spans go to their own trace lane. With one rank in the world nothing here is needed
 * (train/state.c does not create it). */
#ifndef STEPSCOPE_ZERO_H
#define STEPSCOPE_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "dist/comm.h"
#include "profile/trace.h"

/* Shard `index` of `parts` over n floats: [*lo, *lo + *count). Shards are contiguous in rank
 * order, each a multiple of 16 floats (64 bytes) except the last; a shard may be empty. */
void zero_shard_range(int64_t n, int parts, int index, int64_t *lo, int64_t *count);
/* The largest shard (shard 0): what the plan budgets per rank. */
int64_t zero_shard_floats(int64_t n, int parts);

typedef struct zero_options {
    comm_t *world;        /* every rank */
    comm_t *shard;        /* the ranks that split the optimizer state */
    comm_t *replica;      /* the ranks that hold the same shard */
    int64_t num_params;   /* n */
    float *params;        /* [n]; NULL with params16 */
    uint16_t *params16;   /* [n] bf16 parameters (weight_dtype=bfloat16), gathered instead of params */
    float *grads;         /* [n], this rank's accumulated gradients */
    float *grad_shard;    /* [shard count]: the reduced gradients of this rank's shard; equals grads
                             when the shard group has one rank */
    trace_t *trace;       /* may be NULL */
    uint32_t comm_lane;   /* the communication thread's lane */
    uint32_t compute_lane;
} zero_options_t;

typedef struct zero zero_t;

typedef struct zero_stats {
    int64_t steps;             /* zero_gather_params calls */
    uint64_t bytes_sent;       /* gradient and parameter collectives, ring model (comm.h) */
    int64_t busy_ns;           /* the communication thread inside collectives */
    int64_t wait_ns;           /* the compute thread waiting for them */
} zero_stats_t;

/* Starts the communication thread. NULL with one line in err on failure. */
zero_t *zero_create(const zero_options_t *o, char *err, size_t errlen);
void zero_destroy(zero_t *z);
int64_t zero_shard_lo(const zero_t *z);
int64_t zero_shard_count(const zero_t *z);

/* Backward's hook (qwen3_options_t.grads_ready): gradients [offset, offset+count) are final. */
void zero_grads_ready(void *z, int64_t offset, int64_t count);
/* Wait until every queued reduction is done; grad_shard then holds the summed gradients. */
void zero_finish_grads(zero_t *z);
/* Sum v[n] over the shard group (group = 0) or the world (group = 1), in place, waiting. */
enum { ZERO_SHARD_GROUP = 0, ZERO_WORLD = 1 };
void zero_allreduce(zero_t *z, int group, double *v, int n);
/* All-gather the parameters from their shards, waiting. */
void zero_gather_params(zero_t *z);
/* Any rank's flag set -> 1 on every rank (the run's stop vote). */
int zero_any(zero_t *z, int flag);
zero_stats_t zero_stats(const zero_t *z);

#endif
