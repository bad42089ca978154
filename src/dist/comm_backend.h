/* comm_backend: what an implementation of the collectives provides to comm.c (internal to
 * src/dist). comm_mpi.c is built when make finds an MPI library, comm_none.c otherwise. The
 * backend is only called for groups of two or more ranks. */
#ifndef STEPSCOPE_COMM_BACKEND_H
#define STEPSCOPE_COMM_BACKEND_H

#include <stdint.h>

typedef struct comm_backend comm_backend_t;
/* Start the backend when launched by an MPI launcher; NULL when this is a one-rank run. */
comm_backend_t *comm_backend_init(int *argc, char ***argv, int *rank, int *size);
void comm_backend_finalize(comm_backend_t *world);
const char *comm_backend_name(const comm_backend_t *world, char *buf, int n);
comm_backend_t *comm_backend_split(comm_backend_t *c, int color, int key, int *rank, int *size);
void comm_backend_free(comm_backend_t *c);
int comm_backend_host_ranks(comm_backend_t *world); /* ranks sharing this machine */
_Noreturn void comm_backend_abort(comm_backend_t *c, int code);
void comm_backend_allreduce_f64(comm_backend_t *c, double *buf, int n);
void comm_backend_allreduce_max_i32(comm_backend_t *c, int *buf, int n);
void comm_backend_allreduce_f32(comm_backend_t *c, float *buf, int n);
void comm_backend_bcast_i64(comm_backend_t *c, int64_t *buf, int n, int root);
void comm_backend_reduce_scatter_f32(comm_backend_t *c, const float *send, float *recv, const int *counts);
void comm_backend_allgather_f32(comm_backend_t *c, float *buf, const int *counts);
void comm_backend_allgather_u16(comm_backend_t *c, uint16_t *buf, const int *counts);

#endif
