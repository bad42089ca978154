/* prefetch: the data thread and its ring. The producer fills the batch of step i into
 * slot i % depth once the consumer has released that slot, so it runs up to `depth`
 * batches ahead and the step only waits when loading is slower than compute. The ring is
 * allocated at open; nothing is allocated while running. One mutex guards the slot table;
 * the slot memory itself is written by the producer and read by the consumer only on
 * either side of a hand-off under that mutex, so it needs no lock of its own. */
#include "data/data.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { SLOT_FREE = -1 };

struct data_source {
    data_options_t opt;
    data_reader_t *reader;
    int64_t cycle;        /* opt.cycle resolved: 0, or the batches of one pass */
    int32_t *ring;        /* [depth, local_batch, S+1] */
    size_t slot_elems;    /* local_batch * (S+1) */
    int64_t *slot_step;   /* [depth]: the step a slot holds, or SLOT_FREE */
    pthread_mutex_t mu;
    pthread_cond_t ready; /* producer -> consumer: a slot was filled */
    pthread_cond_t freed; /* consumer -> producer: a slot was released, or stop (CLOCK_MONOTONIC) */
    bool stop;
    int64_t next_step;    /* consumer: the step data_next expects */
    int64_t release_step; /* consumer: the step data_release expects */
    pthread_t thread;
    bool thread_started;
    uint32_t produce_name;
};

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* The delay knob: sleep delay_ms, but on the `freed` condition so data_close wakes us.
 * Called with mu held. */
static void delay_locked(data_source_t *d) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += d->opt.delay_ms / 1000;
    until.tv_nsec += (d->opt.delay_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (!d->stop && pthread_cond_timedwait(&d->freed, &d->mu, &until) != ETIMEDOUT) {}
}

static void *producer(void *arg) {
    data_source_t *d = arg;
    size_t depth = (size_t)d->opt.depth;
    if (d->opt.trace) trace_set_lane(d->opt.trace, d->opt.trace_lane, "data", (int64_t)gettid());
    pthread_mutex_lock(&d->mu);
    for (int64_t step = 0; !d->stop; step++) {
        size_t slot = (size_t)step % depth;
        while (!d->stop && d->slot_step[slot] != SLOT_FREE) pthread_cond_wait(&d->freed, &d->mu);
        if (d->stop) break;
        pthread_mutex_unlock(&d->mu);

        int64_t t0 = trace_begin(d->opt.trace);
        int64_t batch = d->opt.first_batch + step;
        if (d->cycle > 0) batch %= d->cycle;
        data_reader_fill(d->reader, batch, d->ring + slot * d->slot_elems);
        pthread_mutex_lock(&d->mu);
        if (d->opt.delay_ms > 0) delay_locked(d);
        if (d->stop) break; /* a batch cut short by close is not a span */
        trace_end(d->opt.trace, d->opt.trace_lane, d->produce_name, t0, 0.0, 0);
        d->slot_step[slot] = step;
        pthread_cond_broadcast(&d->ready);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int data_open(data_source_t **out, const data_options_t *opt, char *err, size_t errlen) {
    *out = NULL;
    data_source_t *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "data: out of memory");
        return 1;
    }
    d->opt = *opt;
    if (data_reader_open(&d->reader, opt, err, errlen)) {
        free(d);
        return 1;
    }
    if (opt->cycle == -1 && (d->cycle = data_reader_whole_batches(d->reader)) < 1) {
        snprintf(err, errlen, "data: %s holds fewer windows of %" PRId64 " + 1 ids than one batch of %" PRId64
                 " sequences; a pass over it needs a longer file", opt->dataset_path, opt->seq_len, opt->global_batch);
        data_reader_close(d->reader);
        free(d);
        return 1;
    }
    size_t depth = (size_t)opt->depth;
    d->slot_elems = (size_t)opt->local_batch * ((size_t)opt->seq_len + 1);
    d->ring = malloc(data_ring_bytes(opt->depth, opt->local_batch, opt->seq_len));
    d->slot_step = malloc(depth * sizeof(int64_t));
    if (!d->ring || !d->slot_step) {
        snprintf(err, errlen, "data: out of memory for a ring of %zu batches of %zu ids; lower prefetch_depth",
                 depth, d->slot_elems);
        data_close(d);
        return 1;
    }
    for (size_t i = 0; i < depth; i++) d->slot_step[i] = SLOT_FREE;
    if (opt->trace) d->produce_name = trace_intern(opt->trace, "data/produce", TRACE_CAT_DATA, NULL);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->ready, NULL);
    pthread_cond_init(&d->freed, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&d->thread, NULL, producer, d);
    if (rc != 0) {
        snprintf(err, errlen, "data: cannot start the data thread: %s", strerror(rc));
        pthread_cond_destroy(&d->freed);
        pthread_cond_destroy(&d->ready);
        pthread_mutex_destroy(&d->mu);
        data_reader_close(d->reader);
        free(d->ring);
        free(d->slot_step);
        free(d);
        return 1;
    }
    d->thread_started = true;
    *out = d;
    return 0;
}

const int32_t *data_next(data_source_t *d, int64_t step, double *wait_seconds) {
    /* in order, and never more held than the ring has slots (that would wait forever) */
    assert(step == d->next_step && "data_next: steps must be consumed in order 0, 1, 2, ...");
    assert(d->next_step - d->release_step < d->opt.depth && "data_next: release earlier steps first");
    size_t slot = (size_t)step % (size_t)d->opt.depth;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&d->mu);
    while (d->slot_step[slot] != step) pthread_cond_wait(&d->ready, &d->mu);
    pthread_mutex_unlock(&d->mu);
    if (wait_seconds) *wait_seconds = seconds_since(&t0);
    d->next_step++;
    return d->ring + slot * d->slot_elems;
}

int64_t data_whole_batches(const data_source_t *d) { return data_reader_whole_batches(d->reader); }

void data_release(data_source_t *d, int64_t step) {
    assert(step == d->release_step && step < d->next_step &&
           "data_release: release the steps data_next returned, in order");
    size_t slot = (size_t)step % (size_t)d->opt.depth;
    pthread_mutex_lock(&d->mu);
    d->slot_step[slot] = SLOT_FREE;
    pthread_cond_signal(&d->freed);
    pthread_mutex_unlock(&d->mu);
    d->release_step++;
}

void data_close(data_source_t *d) {
    if (!d) return;
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_broadcast(&d->freed);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
        pthread_cond_destroy(&d->freed);
        pthread_cond_destroy(&d->ready);
        pthread_mutex_destroy(&d->mu);
    }
    data_reader_close(d->reader);
    free(d->ring);
    free(d->slot_step);
    free(d);
}
