/* comm: the collectives stepscope's data parallelism needs (rank, size, sub-groups,
 * all-reduce, reduce-scatter, all-gather, broadcast, abort), behind one small interface so
 * no other file knows whether MPI is there. comm.c answers every call on a one-rank group
 * itself; larger groups go to the backend: comm_mpi.c when make found an MPI library,
 * comm_none.c (no MPI: every group has one rank) otherwise. A process that was not
 * started by an MPI launcher (mpirun, srun) runs as one rank without initialising MPI.
 *
 * Threading: MPI is initialised with MPI_THREAD_SERIALIZED; the caller makes sure that at
 * most one thread is inside a comm call at a time (stepscope: the main thread before and
 * after the run, the communication thread of dist/zero during it).
 *
 * Counts are int (MPI's): callers split anything larger into pieces. Every collective adds
 * to a byte counter the bytes this rank sends under the ring algorithm (all-reduce
 * 2·(N−1)/N·bytes, reduce-scatter and all-gather (N−1)/N·bytes): a model of the traffic
 * that the communication benchmark checks against a measurement of MPI's own. */
#ifndef STEPSCOPE_COMM_H
#define STEPSCOPE_COMM_H

#include <stdint.h>

typedef struct comm comm_t;

/* The world group. Initialises MPI when launched by an MPI launcher. Never fails: MPI's own
 * errors abort the job. */
comm_t *comm_init(int *argc, char ***argv);
/* Free the world group and finalise MPI. */
void comm_finalize(comm_t *world);
int comm_rank(const comm_t *c);
int comm_size(const comm_t *c);
/* Ranks of the world on this rank's machine (they share its memory). */
int comm_host_ranks(const comm_t *world);
/* "Open MPI v4.1.4" or "none (built without MPI)" or "MPI (not launched by mpirun)". */
const char *comm_describe(const comm_t *world, char *buf, int n);

/* Sub-groups: ranks with the same color form one group, ordered by key. */
comm_t *comm_split(comm_t *c, int color, int key);
void comm_free(comm_t *c);

/* End every rank of the job now with exit code `code` (MPI_Abort); the caller printed why. */
_Noreturn void comm_abort(comm_t *c, int code);

/* Set-up agreement, so one rank's failure cannot leave the others waiting in a collective:
 * every rank passes its status (0 = fine) and the message of a failure; the largest status
 * comes back on every rank. A failure is printed once, "stepscope: rank R: msg" on stderr
 * (no rank with one rank): by rank 0 when it failed, else by each rank that failed. */
int comm_agree(comm_t *c, int status, const char *msg);

/* In place. */
void comm_allreduce_sum_f64(comm_t *c, double *buf, int n);
void comm_allreduce_max_i32(comm_t *c, int *buf, int n);
void comm_allreduce_sum_f32(comm_t *c, float *buf, int n);
void comm_bcast_i64(comm_t *c, int64_t *buf, int n, int root);
/* send[Σ counts] summed over the group; rank r receives block r (counts[r] floats, blocks in
 * rank order) into recv. send and recv must not overlap. */
void comm_reduce_scatter_f32(comm_t *c, const float *send, float *recv, const int *counts);
/* buf[Σ counts]: rank r's block starts at Σ counts[<r]; every rank ends with all blocks. */
void comm_allgather_f32(comm_t *c, float *buf, const int *counts);
/* The same over 16-bit values (bf16 parameters: weight_dtype=bfloat16). */
void comm_allgather_u16(comm_t *c, uint16_t *buf, const int *counts);

/* Bytes this rank sent through c's collectives so far (ring model, see above). */
uint64_t comm_bytes_sent(const comm_t *c);

#endif
