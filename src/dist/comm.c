/* comm: one-rank groups answered here, larger ones passed to the backend; the traffic
 * counter. See comm.h. */
#include "dist/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm_backend.h"

struct comm {
    comm_backend_t *be; /* NULL for a one-rank group */
    int rank, size;
    int host_ranks;
    uint64_t bytes_sent;
};

static comm_t *comm_new(comm_backend_t *be, int rank, int size) {
    comm_t *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "stepscope: rank %d: out of memory for a communicator\n", rank);
        if (be) comm_backend_abort(be, 1);
        exit(1);
    }
    *c = (comm_t){.be = size > 1 ? be : NULL, .rank = rank, .size = size};
    return c;
}

comm_t *comm_init(int *argc, char ***argv) {
    int rank = 0, size = 1;
    comm_backend_t *be = comm_backend_init(argc, argv, &rank, &size);
    comm_t *c = comm_new(be, rank, size);
    c->be = be; /* the world keeps its backend even with one rank, to finalise it */
    c->host_ranks = c->size > 1 ? comm_backend_host_ranks(be) : 1;
    return c;
}

void comm_finalize(comm_t *world) {
    if (!world) return;
    comm_backend_finalize(world->be);
    free(world);
}

int comm_rank(const comm_t *c) { return c->rank; }
int comm_size(const comm_t *c) { return c->size; }
int comm_host_ranks(const comm_t *world) { return world->host_ranks; }

const char *comm_describe(const comm_t *world, char *buf, int n) { return comm_backend_name(world->be, buf, n); }

comm_t *comm_split(comm_t *c, int color, int key) {
    if (c->size == 1) return comm_new(NULL, 0, 1);
    int rank = 0, size = 1;
    comm_backend_t *be = comm_backend_split(c->be, color, key, &rank, &size);
    comm_t *s = comm_new(be, rank, size);
    if (size == 1 && be) comm_backend_free(be);
    return s;
}

void comm_free(comm_t *c) {
    if (!c) return;
    if (c->be) comm_backend_free(c->be);
    free(c);
}

_Noreturn void comm_abort(comm_t *c, int code) {
    fflush(stdout);
    fflush(stderr);
    if (c && c->be) comm_backend_abort(c->be, code);
    exit(code);
}

int comm_agree(comm_t *c, int status, const char *msg) {
    int v[2] = {status, c->rank == 0 && status != 0};
    comm_allreduce_max_i32(c, v, 2);
    if (status != 0 && (c->rank == 0 || !v[1]) && msg && msg[0]) {
        /* Paths and names in msg come from the user: a newline in one must not split the line. */
        char line[1024];
        snprintf(line, sizeof line, "%s", msg);
        for (char *p = line; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
        if (c->size > 1) fprintf(stderr, "stepscope: rank %d: %s\n", c->rank, line);
        else fprintf(stderr, "stepscope: %s\n", line);
    }
    return v[0];
}

/* Ring-model bytes this rank sends for a collective over `bytes` of data. */
static uint64_t ring_share(const comm_t *c, uint64_t bytes) { return bytes * (uint64_t)(c->size - 1) / (uint64_t)c->size; }

void comm_allreduce_sum_f64(comm_t *c, double *buf, int n) {
    if (c->size == 1) return;
    c->bytes_sent += 2 * ring_share(c, (uint64_t)n * sizeof(double));
    comm_backend_allreduce_f64(c->be, buf, n);
}

void comm_allreduce_max_i32(comm_t *c, int *buf, int n) {
    if (c->size == 1) return;
    c->bytes_sent += 2 * ring_share(c, (uint64_t)n * sizeof(int));
    comm_backend_allreduce_max_i32(c->be, buf, n);
}

void comm_allreduce_sum_f32(comm_t *c, float *buf, int n) {
    if (c->size == 1) return;
    c->bytes_sent += 2 * ring_share(c, (uint64_t)n * sizeof(float));
    comm_backend_allreduce_f32(c->be, buf, n);
}

void comm_bcast_i64(comm_t *c, int64_t *buf, int n, int root) {
    if (c->size == 1) return;
    if (c->rank == root) c->bytes_sent += (uint64_t)n * sizeof(int64_t);
    comm_backend_bcast_i64(c->be, buf, n, root);
}

static uint64_t total_floats(const comm_t *c, const int *counts) {
    uint64_t total = 0;
    for (int r = 0; r < c->size; r++) total += (uint64_t)counts[r];
    return total;
}

void comm_reduce_scatter_f32(comm_t *c, const float *send, float *recv, const int *counts) {
    if (c->size == 1) {
        if (counts[0] > 0 && recv != send) memcpy(recv, send, (size_t)counts[0] * sizeof(float));
        return;
    }
    c->bytes_sent += ring_share(c, total_floats(c, counts) * sizeof(float));
    comm_backend_reduce_scatter_f32(c->be, send, recv, counts);
}

void comm_allgather_f32(comm_t *c, float *buf, const int *counts) {
    if (c->size == 1) return;
    c->bytes_sent += ring_share(c, total_floats(c, counts) * sizeof(float));
    comm_backend_allgather_f32(c->be, buf, counts);
}

void comm_allgather_u16(comm_t *c, uint16_t *buf, const int *counts) {
    if (c->size == 1) return;
    c->bytes_sent += ring_share(c, total_floats(c, counts) * sizeof(uint16_t));
    comm_backend_allgather_u16(c->be, buf, counts);
}

uint64_t comm_bytes_sent(const comm_t *c) { return c->bytes_sent; }
