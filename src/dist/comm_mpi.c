/* comm_mpi: the collectives over MPI (built when make finds mpicc). MPI is initialised only
 * when a launcher started this process, so `stepscope` run by hand never touches it.
 * Errors inside MPI use its default handler, MPI_ERRORS_ARE_FATAL: they end the job.
 * Collectives are started non-blocking and waited for by wait_request, which does not spin
 * for long: MPI's blocking calls poll shared memory at full speed, and a rank waiting for a
 * slower one would take a core from its own compute threads. */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm_backend.h"

struct comm_backend {
    MPI_Comm comm;
    int *displs; /* [size], for the v-collectives; the caller serialises calls */
};

static bool launched_by_mpi(void) {
    /* Open MPI's mpirun, MPICH's hydra and PMIx launchers (srun) each set one of these. */
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

enum { SPIN_TESTS = 2000, SLEEP_NS = 50000 };

/* Test in a tight loop for a few microseconds (a collective whose peers are all there and
 * whose data is small is done by then), then every 50 µs: the thread sleeps while it waits
 * for a slower rank, and a transfer in progress loses at most 50 µs per protocol round. */
static void wait_request(MPI_Request *req) {
    int done = 0;
    for (int i = 0; i < SPIN_TESTS && !done; i++) MPI_Test(req, &done, MPI_STATUS_IGNORE);
    const struct timespec pause = {0, SLEEP_NS};
    while (!done) {
        nanosleep(&pause, NULL);
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
    }
}

static comm_backend_t *wrap(MPI_Comm comm, int *rank, int *size) {
    MPI_Comm_rank(comm, rank);
    MPI_Comm_size(comm, size);
    comm_backend_t *b = calloc(1, sizeof *b);
    if (b) b->displs = calloc((size_t)*size, sizeof *b->displs);
    if (!b || !b->displs) {
        fprintf(stderr, "stepscope: rank %d: out of memory for a communicator\n", *rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    b->comm = comm;
    return b;
}

comm_backend_t *comm_backend_init(int *argc, char ***argv, int *rank, int *size) {
    *rank = 0;
    *size = 1;
    if (!launched_by_mpi()) return NULL;
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "stepscope: this MPI library gives thread level %d, but stepscope's communication "
                        "thread needs MPI_THREAD_SERIALIZED (%d); use an MPI built with thread support\n",
                provided, MPI_THREAD_SERIALIZED);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return wrap(MPI_COMM_WORLD, rank, size);
}

void comm_backend_finalize(comm_backend_t *world) {
    if (!world) return;
    free(world->displs);
    free(world);
    MPI_Finalize();
}

const char *comm_backend_name(const comm_backend_t *world, char *buf, int n) {
    if (!world) {
        snprintf(buf, (size_t)n, "MPI (not started by mpirun: one rank)");
        return buf;
    }
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4" */
    snprintf(buf, (size_t)n, "%s", lib);
    return buf;
}

comm_backend_t *comm_backend_split(comm_backend_t *c, int color, int key, int *rank, int *size) {
    MPI_Comm sub;
    MPI_Comm_split(c->comm, color, key, &sub);
    return wrap(sub, rank, size);
}

int comm_backend_host_ranks(comm_backend_t *world) {
    MPI_Comm host;
    int n = 1;
    MPI_Comm_split_type(world->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
    MPI_Comm_size(host, &n);
    MPI_Comm_free(&host);
    return n;
}

void comm_backend_free(comm_backend_t *c) {
    if (!c) return;
    if (c->comm != MPI_COMM_WORLD) MPI_Comm_free(&c->comm);
    free(c->displs);
    free(c);
}

_Noreturn void comm_backend_abort(comm_backend_t *c, int code) {
    (void)c;
    MPI_Abort(MPI_COMM_WORLD, code); /* the whole job, whatever group failed */
    exit(code);                      /* MPI_Abort does not return; this tells the compiler */
}

void comm_backend_allreduce_f64(comm_backend_t *c, double *buf, int n) {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, c->comm, &req);
    wait_request(&req);
}

void comm_backend_allreduce_max_i32(comm_backend_t *c, int *buf, int n) {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_INT, MPI_MAX, c->comm, &req);
    wait_request(&req);
}

void comm_backend_allreduce_f32(comm_backend_t *c, float *buf, int n) {
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, c->comm, &req);
    wait_request(&req);
}

void comm_backend_bcast_i64(comm_backend_t *c, int64_t *buf, int n, int root) {
    MPI_Request req;
    MPI_Ibcast(buf, n, MPI_INT64_T, root, c->comm, &req);
    wait_request(&req);
}

void comm_backend_reduce_scatter_f32(comm_backend_t *c, const float *send, float *recv, const int *counts) {
    MPI_Request req;
    MPI_Ireduce_scatter(send, recv, counts, MPI_FLOAT, MPI_SUM, c->comm, &req);
    wait_request(&req);
}

static void allgather(comm_backend_t *c, void *buf, const int *counts, MPI_Datatype type) {
    int size;
    MPI_Comm_size(c->comm, &size);
    int off = 0;
    for (int r = 0; r < size; r++) {
        c->displs[r] = off;
        off += counts[r];
    }
    MPI_Request req;
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, c->displs, type, c->comm, &req);
    wait_request(&req);
}

void comm_backend_allgather_f32(comm_backend_t *c, float *buf, const int *counts) {
    allgather(c, buf, counts, MPI_FLOAT);
}

void comm_backend_allgather_u16(comm_backend_t *c, uint16_t *buf, const int *counts) {
    allgather(c, buf, counts, MPI_UINT16_T);
}
