/* zero: sharded data parallelism, see zero.h. The communication thread takes jobs from a
 * small ring in order; the compute thread posts them and, where it needs the result, waits
 * for the job's ticket. Ranks post the same jobs in the same order, so the collectives match. */
#include "dist/zero.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { ALIGN_FLOATS = 16, MAX_PIECE = 1 << 30, RING = 256 };

void zero_shard_range(int64_t n, int parts, int index, int64_t *lo, int64_t *count) {
    int64_t per = (n + parts - 1) / parts;
    per = (per + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
    int64_t a = per * index < n ? per * index : n;
    int64_t b = a + per < n ? a + per : n;
    *lo = a;
    *count = b - a;
}

int64_t zero_shard_floats(int64_t n, int parts) {
    int64_t lo, count;
    zero_shard_range(n, parts, 0, &lo, &count);
    return count;
}

typedef enum { JOB_REDUCE, JOB_ALLREDUCE, JOB_ANY, JOB_GATHER, JOB_QUIT } job_kind_t;

typedef struct job {
    job_kind_t kind;
    int64_t offset, count; /* JOB_REDUCE */
    comm_t *group;         /* JOB_ALLREDUCE */
    double *values;
    int n;
    int *flag;             /* JOB_ANY */
} job_t;

struct zero {
    zero_options_t o;
    int shard_ranks, shard_rank;
    int64_t lo, count;     /* this rank's shard */
    int *counts;           /* [shard_ranks], scratch of the communication thread */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t ring[RING];
    uint64_t posted, done; /* tickets */
    zero_stats_t stats;
    uint32_t span_reduce, span_allreduce, span_gather, span_wait;
};

/* counts[r] = floats of [a, b) in shard r; returns where this rank's part of [a, b) starts. */
static int64_t split(zero_t *z, int64_t a, int64_t b) {
    int64_t mine = z->lo;
    for (int r = 0; r < z->shard_ranks; r++) {
        int64_t lo, cnt;
        zero_shard_range(z->o.num_params, z->shard_ranks, r, &lo, &cnt);
        int64_t x = a > lo ? a : lo, y = b < lo + cnt ? b : lo + cnt;
        z->counts[r] = y > x ? (int)(y - x) : 0;
        if (r == z->shard_rank && y > x) mine = x;
    }
    return mine;
}

static uint64_t group_bytes(const zero_t *z);

/* The collectives' spans carry the bytes this rank sent in them (comm_bytes_sent's count), so
 * the profile gives each one's GB/s on the link. */
static void run_reduce(zero_t *z, int64_t a, int64_t b) {
    const zero_options_t *o = &z->o;
    int64_t t0 = trace_begin(o->trace);
    uint64_t sent = group_bytes(z);
    if (z->shard_ranks == 1) {
        /* Pure data parallelism: the whole vector is this rank's shard. */
        comm_allreduce_sum_f32(o->replica, o->grads + a, (int)(b - a));
    } else {
        int64_t mine = split(z, a, b);
        float *dst = o->grad_shard + (mine - z->lo);
        comm_reduce_scatter_f32(o->shard, o->grads + a, dst, z->counts);
        /* The local copy is left as it is: the next backward writes its matmul gradients
         * afresh, and train_step zeroes the ones that accumulate (qwen3_zero_accumulated_grads). */
        if (z->counts[z->shard_rank] > 0) comm_allreduce_sum_f32(o->replica, dst, z->counts[z->shard_rank]);
    }
    trace_end(o->trace, o->comm_lane, z->span_reduce, t0, 0, (double)(group_bytes(z) - sent));
}

static void run_gather(zero_t *z) {
    const zero_options_t *o = &z->o;
    int64_t t0 = trace_begin(o->trace);
    uint64_t sent = group_bytes(z);
    for (int64_t a = 0; a < o->num_params; a += MAX_PIECE) {
        int64_t b = a + MAX_PIECE < o->num_params ? a + MAX_PIECE : o->num_params;
        split(z, a, b);
        if (o->params16) comm_allgather_u16(o->shard, o->params16 + a, z->counts);
        else comm_allgather_f32(o->shard, o->params + a, z->counts);
    }
    trace_end(o->trace, o->comm_lane, z->span_gather, t0, 0, (double)(group_bytes(z) - sent));
}

static uint64_t group_bytes(const zero_t *z) {
    return comm_bytes_sent(z->o.shard) + comm_bytes_sent(z->o.replica);
}

static void *comm_main(void *arg) {
    zero_t *z = arg;
    for (;;) {
        pthread_mutex_lock(&z->mu);
        while (z->done == z->posted) pthread_cond_wait(&z->cv, &z->mu);
        job_t job = z->ring[z->done % RING];
        pthread_mutex_unlock(&z->mu);
        if (job.kind == JOB_QUIT) return NULL;
        int64_t start = trace_now_ns();
        uint64_t bytes = group_bytes(z);
        switch (job.kind) {
        case JOB_REDUCE: run_reduce(z, job.offset, job.offset + job.count); break;
        case JOB_GATHER: run_gather(z); break;
        case JOB_ALLREDUCE: {
            int64_t t0 = trace_begin(z->o.trace);
            uint64_t sent = group_bytes(z);
            comm_allreduce_sum_f64(job.group, job.values, job.n);
            trace_end(z->o.trace, z->o.comm_lane, z->span_allreduce, t0, 0, (double)(group_bytes(z) - sent));
            break;
        }
        case JOB_ANY: comm_allreduce_max_i32(z->o.world, job.flag, 1); break;
        case JOB_QUIT: break;
        }
        pthread_mutex_lock(&z->mu);
        z->stats.busy_ns += trace_now_ns() - start;
        z->stats.bytes_sent += group_bytes(z) - bytes;
        z->done++;
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
    }
}

static uint64_t post(zero_t *z, job_t job) {
    pthread_mutex_lock(&z->mu);
    while (z->posted - z->done >= RING) pthread_cond_wait(&z->cv, &z->mu);
    z->ring[z->posted % RING] = job;
    uint64_t ticket = ++z->posted;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
    return ticket;
}

/* Block until job `ticket` is done; the wait is a span on the compute lane. */
static void wait_for(zero_t *z, uint64_t ticket) {
    int64_t t0 = trace_now_ns(), span = trace_begin(z->o.trace);
    pthread_mutex_lock(&z->mu);
    while (z->done < ticket) pthread_cond_wait(&z->cv, &z->mu);
    z->stats.wait_ns += trace_now_ns() - t0;
    pthread_mutex_unlock(&z->mu);
    trace_end(z->o.trace, z->o.compute_lane, z->span_wait, span, 0, 0);
}

zero_t *zero_create(const zero_options_t *o, char *err, size_t errlen) {
    zero_t *z = calloc(1, sizeof *z);
    if (!z) {
        snprintf(err, errlen, "out of memory for the gradient communication");
        return NULL;
    }
    z->o = *o;
    z->shard_ranks = comm_size(o->shard);
    z->shard_rank = comm_rank(o->shard);
    zero_shard_range(o->num_params, z->shard_ranks, z->shard_rank, &z->lo, &z->count);
    z->counts = calloc((size_t)z->shard_ranks, sizeof *z->counts);
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    if (o->trace) {
        z->span_reduce = trace_intern(o->trace, "reduce_scatter grads", TRACE_CAT_COMM, "comm");
        z->span_allreduce = trace_intern(o->trace, "allreduce", TRACE_CAT_COMM, "comm");
        z->span_gather = trace_intern(o->trace, "allgather params", TRACE_CAT_COMM, "comm");
        z->span_wait = trace_intern(o->trace, "wait for collectives", TRACE_CAT_COMM, "comm");
    }
    if (!z->counts || pthread_create(&z->thread, NULL, comm_main, z) != 0) {
        snprintf(err, errlen, "cannot start the communication thread");
        zero_destroy(z);
        return NULL;
    }
    z->thread_started = true;
    return z;
}

void zero_destroy(zero_t *z) {
    if (!z) return;
    if (z->thread_started) {
        post(z, (job_t){.kind = JOB_QUIT});
        pthread_join(z->thread, NULL);
    }
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    free(z->counts);
    free(z);
}

int64_t zero_shard_lo(const zero_t *z) { return z->lo; }
int64_t zero_shard_count(const zero_t *z) { return z->count; }

void zero_grads_ready(void *arg, int64_t offset, int64_t count) {
    zero_t *z = arg;
    for (int64_t a = offset; a < offset + count; a += MAX_PIECE) {
        int64_t n = offset + count - a < MAX_PIECE ? offset + count - a : MAX_PIECE;
        post(z, (job_t){.kind = JOB_REDUCE, .offset = a, .count = n});
    }
}

void zero_finish_grads(zero_t *z) {
    pthread_mutex_lock(&z->mu);
    uint64_t ticket = z->posted;
    pthread_mutex_unlock(&z->mu);
    wait_for(z, ticket);
}

void zero_allreduce(zero_t *z, int group, double *v, int n) {
    comm_t *c = group == ZERO_WORLD ? z->o.world : z->o.shard;
    wait_for(z, post(z, (job_t){.kind = JOB_ALLREDUCE, .group = c, .values = v, .n = n}));
}

void zero_gather_params(zero_t *z) {
    wait_for(z, post(z, (job_t){.kind = JOB_GATHER}));
    pthread_mutex_lock(&z->mu);
    z->stats.steps++;
    pthread_mutex_unlock(&z->mu);
}

int zero_any(zero_t *z, int flag) {
    int v = flag ? 1 : 0;
    wait_for(z, post(z, (job_t){.kind = JOB_ANY, .flag = &v}));
    return v;
}

zero_stats_t zero_stats(const zero_t *z) {
    zero_t *m = (zero_t *)z;
    pthread_mutex_lock(&m->mu);
    zero_stats_t s = z->stats;
    pthread_mutex_unlock(&m->mu);
    return s;
}
