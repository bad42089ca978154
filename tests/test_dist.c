/* test_dist: the parts of data parallelism that one process can check: shard ranges (every
 * parameter in exactly one shard, in rank order, 64-byte aligned), the communicator on one
 * rank (collectives are identities, agreement returns the status), and the communication
 * thread's job queue (more jobs than the ring holds, waits, the stop vote, counters).
 * Several ranks are tested end to end under mpirun in tests/py/test_mpi.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "dist/zero.h"
#include "test_util.h"

static void test_shard_ranges_partition(void **state) {
    (void)state;
    const int64_t sizes[] = {1, 15, 16, 17, 90496, 1000003};
    const int parts[] = {1, 2, 3, 4, 7, 8, 1024};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        for (size_t j = 0; j < sizeof parts / sizeof *parts; j++) {
            int64_t n = sizes[i], next = 0, largest = zero_shard_floats(n, parts[j]);
            for (int r = 0; r < parts[j]; r++) {
                int64_t lo, count;
                zero_shard_range(n, parts[j], r, &lo, &count);
                assert_int_equal(lo, next);            /* contiguous, in rank order */
                assert_true(count >= 0 && count <= largest);
                if (count > 0) assert_int_equal(lo % 16, 0);
                next = lo + count;
            }
            assert_int_equal(next, n);                 /* every parameter once */
            /* 1/N of the state, rounded up to 16 floats */
            assert_true(largest * parts[j] >= n && (largest - 16) * parts[j] < n);
        }
    }
}

static void test_one_rank_collectives_are_identities(void **state) {
    (void)state;
    int argc = 1;
    char *args[] = {"test_dist", NULL}, **argv = args;
    comm_t *world = comm_init(&argc, &argv);
    assert_int_equal(comm_rank(world), 0);
    assert_int_equal(comm_size(world), 1);
    assert_int_equal(comm_host_ranks(world), 1);
    double d[2] = {1.5, -2.0};
    comm_allreduce_sum_f64(world, d, 2);
    assert_true(d[0] == 1.5 && d[1] == -2.0);
    float send[5] = {1, 2, 3, 4, 5}, recv[5] = {0};
    int counts[1] = {5};
    comm_reduce_scatter_f32(world, send, recv, counts);
    assert_memory_equal(send, recv, sizeof send);
    comm_allgather_f32(world, recv, counts);
    assert_memory_equal(send, recv, sizeof send);
    assert_int_equal(comm_agree(world, 0, "unused"), 0);
    assert_int_equal(comm_agree(world, 2, NULL), 2);
    comm_t *sub = comm_split(world, 0, 0);
    assert_int_equal(comm_size(sub), 1);
    assert_int_equal(comm_bytes_sent(world) + comm_bytes_sent(sub), 0);
    comm_free(sub);
    comm_finalize(world);
}

/* One rank: every job runs on the communication thread and leaves the data as it was. */
static void test_zero_queue_on_one_rank(void **state) {
    (void)state;
    int argc = 1;
    char *args[] = {"test_dist", NULL}, **argv = args;
    comm_t *world = comm_init(&argc, &argv);
    comm_t *shard = comm_split(world, 0, 0), *replica = comm_split(world, 0, 0);
    enum { N = 4096 };
    float *params = malloc(N * sizeof(float)), *grads = malloc(N * sizeof(float));
    float *ref = malloc(N * sizeof(float));
    test_rng_t rng = {7};
    fill_uniform(grads, N, &rng, -1, 1);
    fill_uniform(params, N, &rng, -1, 1);
    memcpy(ref, grads, N * sizeof(float));
    char err[256];
    zero_options_t o = {.world = world, .shard = shard, .replica = replica, .num_params = N, .params = params,
                        .grads = grads, .grad_shard = grads};
    zero_t *z = zero_create(&o, err, sizeof err);
    assert_non_null(z);
    assert_int_equal(zero_shard_lo(z), 0);
    assert_int_equal(zero_shard_count(z), N);
    for (int step = 0; step < 3; step++) {
        /* 1024 buckets of 4 floats: four times the ring, so posting must wait for room */
        for (int64_t off = N - 4; off >= 0; off -= 4) zero_grads_ready(z, off, 4);
        zero_finish_grads(z);
        double v[2] = {3.0, 4.0};
        zero_allreduce(z, ZERO_WORLD, v, 2);
        assert_true(v[0] == 3.0 && v[1] == 4.0);
        assert_int_equal(zero_any(z, 0), 0);
        assert_int_equal(zero_any(z, 1), 1);
        zero_gather_params(z);
    }
    assert_memory_equal(grads, ref, N * sizeof(float));
    zero_stats_t s = zero_stats(z);
    assert_int_equal(s.steps, 3);
    assert_int_equal(s.bytes_sent, 0);
    zero_destroy(z);
    free(params);
    free(grads);
    free(ref);
    comm_free(shard);
    comm_free(replica);
    comm_finalize(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_ranges_partition),
        cmocka_unit_test(test_one_rank_collectives_are_identities),
        cmocka_unit_test(test_zero_queue_on_one_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
