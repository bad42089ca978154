/* comm_none: the backend of a build without MPI. Every group has one rank, so comm.c never
 * calls the collectives here; they exist to satisfy the link and abort if reached. */
#include <stdio.h>
#include <stdlib.h>

#include "dist/comm_backend.h"

comm_backend_t *comm_backend_init(int *argc, char ***argv, int *rank, int *size) {
    (void)argc;
    (void)argv;
    /* Under mpirun every copy would think it is the only rank and train alone. */
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK")) {
        fprintf(stderr, "stepscope: started by an MPI launcher, but this build has no MPI; install an MPI "
                        "library (Debian: libopenmpi-dev openmpi-bin) and rebuild (make clean && make)\n");
        exit(2);
    }
    *rank = 0;
    *size = 1;
    return NULL;
}

void comm_backend_finalize(comm_backend_t *world) { (void)world; }

const char *comm_backend_name(const comm_backend_t *world, char *buf, int n) {
    (void)world;
    snprintf(buf, (size_t)n, "none (built without MPI; rebuild with an MPI library for several ranks)");
    return buf;
}

static _Noreturn void unreachable(const char *what) {
    fprintf(stderr, "stepscope: internal error: %s called in a build without MPI\n", what);
    abort();
}

comm_backend_t *comm_backend_split(comm_backend_t *c, int color, int key, int *rank, int *size) {
    (void)c, (void)color, (void)key, (void)rank, (void)size;
    unreachable("comm_split");
}
void comm_backend_free(comm_backend_t *c) { (void)c; }
int comm_backend_host_ranks(comm_backend_t *world) { (void)world; return 1; }
_Noreturn void comm_backend_abort(comm_backend_t *c, int code) {
    (void)c;
    exit(code);
}
void comm_backend_allreduce_f64(comm_backend_t *c, double *buf, int n) { (void)c, (void)buf, (void)n; unreachable("allreduce"); }
void comm_backend_allreduce_max_i32(comm_backend_t *c, int *buf, int n) { (void)c, (void)buf, (void)n; unreachable("allreduce"); }
void comm_backend_allreduce_f32(comm_backend_t *c, float *buf, int n) { (void)c, (void)buf, (void)n; unreachable("allreduce"); }
void comm_backend_bcast_i64(comm_backend_t *c, int64_t *buf, int n, int root) { (void)c, (void)buf, (void)n, (void)root; unreachable("bcast"); }
void comm_backend_reduce_scatter_f32(comm_backend_t *c, const float *send, float *recv, const int *counts) {
    (void)c, (void)send, (void)recv, (void)counts;
    unreachable("reduce_scatter");
}
void comm_backend_allgather_f32(comm_backend_t *c, float *buf, const int *counts) {
    (void)c, (void)buf, (void)counts;
    unreachable("allgather");
}

void comm_backend_allgather_u16(comm_backend_t *c, uint16_t *buf, const int *counts) {
    (void)c, (void)buf, (void)counts;
    unreachable("allgather");
}
