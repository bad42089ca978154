/* memstat: the resident-set figures a run reports beside its plan follow real allocations.
 * cpustat: the other load the summary reports is the machine's CPU time less this process's.
 * peak: the probes MFU and the machine line are read against give rates in a sane relation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/mman.h>

#include "util/cpustat.h"
#include "util/peak.h"
#include "util/memstat.h"

enum { MIB = 1 << 20 };

static void test_reads_this_process(void **state) {
    (void)state;
    memstat_t m;
    assert_true(memstat_read(&m));
    assert_true(m.rss_bytes > 0);
    assert_true(m.peak_rss_bytes >= m.rss_bytes);
    assert_true(memstat_physical_bytes() >= (uint64_t)m.peak_rss_bytes);
}

/* 64 MiB touched page by page: the resident set gains it, the peak keeps it after the pages are
 * returned, and the resident set gives it back. Each within 2 MiB: the kernel keeps the counts
 * per CPU and sums them approximately (here the peak read after munmap came out 164 KiB below
 * the resident set read before it), and the rest of the process may move by a few pages. */
static void test_follows_touched_pages(void **state) {
    (void)state;
    const size_t bytes = 64 * (size_t)MIB;
    memstat_t before, touched, after;
    assert_true(memstat_read(&before));
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 1, bytes);
    assert_true(memstat_read(&touched));
    const int64_t slack = 2 * (int64_t)MIB;
    assert_true(touched.rss_bytes - before.rss_bytes >= (int64_t)bytes - slack);
    assert_true(touched.peak_rss_bytes >= touched.rss_bytes);
    assert_int_equal(munmap(p, bytes), 0);
    assert_true(memstat_read(&after));
    assert_true(touched.rss_bytes - after.rss_bytes >= (int64_t)bytes - slack);
    assert_true(after.peak_rss_bytes >= touched.rss_bytes - slack);
}

/* A buffer touched and unmapped stays in the peak until the peak is reset (the bandwidth
 * probe's arrays, before set-up): then the peak is the resident set again, within the slack above. */
static void test_peak_reset_forgets_an_unmapped_buffer(void **state) {
    (void)state;
    const size_t bytes = 64 * (size_t)MIB;
    const int64_t slack = 2 * (int64_t)MIB;
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 1, bytes);
    memstat_t touched, unmapped, reset;
    assert_true(memstat_read(&touched));
    assert_int_equal(munmap(p, bytes), 0);
    assert_true(memstat_read(&unmapped));
    assert_true(unmapped.peak_rss_bytes >= touched.rss_bytes - slack);
    assert_true(memstat_reset_peak());
    assert_true(memstat_read(&reset));
    assert_true(reset.peak_rss_bytes <= reset.rss_bytes + slack);
    assert_true(reset.peak_rss_bytes <= unmapped.peak_rss_bytes - (int64_t)bytes + slack);
}

/* Two made-up readings 2 s apart: the cores' busy time grew by 3 s, ours by 1 s, steal by 0.5 s:
 * others 1 core, steal 0.25. Ours ahead of the machine's (the counters tick at different times)
 * gives 0, never a negative load; no time between the readings gives 0. */
static void test_load_between_readings(void **state) {
    (void)state;
    double others, steal;
    cpustat_t a = {.busy_s = 10.0, .steal_s = 1.0, .own_s = 4.0, .wall_s = 100.0};
    cpustat_t b = {.busy_s = 13.0, .steal_s = 1.5, .own_s = 5.0, .wall_s = 102.0};
    cpustat_load(&a, &b, &others, &steal);
    assert_float_equal(others, 1.0, 1e-12);
    assert_float_equal(steal, 0.25, 1e-12);
    b.own_s = 8.0;
    cpustat_load(&a, &b, &others, &steal);
    assert_float_equal(others, 0.0, 0.0);
    cpustat_load(&a, &a, &others, &steal);
    assert_float_equal(others, 0.0, 0.0);
    assert_float_equal(steal, 0.0, 0.0);
}

/* A run that paused 1 s of its 4 to write a file, while the kernel's threads did 0.6 s of the
 * writeback and the run itself 0.4 s: left out, the load of the other 3 s is what neighbours
 * used (1.5 core-seconds of busy time beyond ours: 0.5 cores), not the writeback's. */
static void test_leaves_out_a_pause(void **state) {
    (void)state;
    double others, steal;
    cpustat_t start = {.busy_s = 0.0, .steal_s = 0.0, .own_s = 0.0, .wall_s = 10.0};
    cpustat_t pause_a = {.busy_s = 2.0, .steal_s = 0.1, .own_s = 1.5, .wall_s = 11.0};
    cpustat_t pause_b = {.busy_s = 3.0, .steal_s = 0.3, .own_s = 1.9, .wall_s = 12.0};
    cpustat_t end = {.busy_s = 8.5, .steal_s = 0.4, .own_s = 6.4, .wall_s = 14.0};
    cpustat_load(&start, &end, &others, &steal);
    assert_float_equal(others, 0.525, 1e-12); /* (8.5 - 6.4) / 4 with the pause */
    cpustat_leave_out(&start, &pause_a, &pause_b);
    cpustat_load(&start, &end, &others, &steal);
    assert_float_equal(others, 0.5, 1e-12);  /* (7.5 - 6.0) / 3 */
    assert_float_equal(steal, 0.2 / 3.0, 1e-12);
}

/* Spinning on this thread for 0.3 s: this process's CPU time and the machine's busy time both
 * grow by about that (jiffies are 10 ms; the machine's counts every core, so at least ours less
 * two ticks), and the wall clock moves forward. */
static void test_reads_this_process_cpu_time(void **state) {
    (void)state;
    cpustat_t a, b;
    assert_true(cpustat_read(&a));
    volatile double x = 0.0;
    do {
        for (int i = 0; i < 100000; i++) x += 1e-9;
        assert_true(cpustat_read(&b));
    } while (b.wall_s - a.wall_s < 0.3);
    const double own = b.own_s - a.own_s;
    assert_true(own >= 0.1 && own <= b.wall_s - a.wall_s + 0.05); /* 0.1: a third, on a busy machine */
    assert_true(b.busy_s - a.busy_s >= own - 0.05);
    assert_true(b.steal_s >= a.steal_s);
}

/* The probes' own relations, loose enough for a shared machine (each is a best of 5 rounds, and a
 * neighbour only lowers a round; 0.6 leaves it 40%): a bf16 probe does at least the fp32 FMA's
 * work (2x it on a bf16 dot-product unit, ~13x on AMX tiles, 1x where bf16 runs at the fp32
 * rate), and a 512-bit FMA between one and two 256-bit ones' (2x at full width, 1x split into
 * halves). */
static void test_peak_probes_relate(void **state) {
    (void)state;
    const double fp32 = peak_probe_tflops(false, 1, 0.1), bf16 = peak_probe_tflops(true, 1, 0.1);
    assert_true(fp32 > 0 && fp32 < 100);
    assert_true(bf16 > 0.6 * fp32);
    const double ymm = peak_probe_fp32_256_tflops(1, 0.1);
#if defined(__AVX512F__) && defined(__FMA__)
    assert_true(ymm > 0.6 * fp32 / 2.0 && ymm < fp32 / 0.6);
#else
    assert_true(ymm == 0.0);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_this_process),
        cmocka_unit_test(test_follows_touched_pages),
        cmocka_unit_test(test_peak_reset_forgets_an_unmapped_buffer),
        cmocka_unit_test(test_load_between_readings),
        cmocka_unit_test(test_leaves_out_a_pause),
        cmocka_unit_test(test_reads_this_process_cpu_time),
        cmocka_unit_test(test_peak_probes_relate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
