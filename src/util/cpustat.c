#include "util/cpustat.h"

#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

bool cpustat_read(cpustat_t *s) {
    *s = (cpustat_t){0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    unsigned long long user, nice, system, idle, iowait, irq, softirq, steal = 0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait, &irq,
                   &softirq, &steal);
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    struct rusage ru;
    struct timespec ts;
    if (n < 7 || hz <= 0 || getrusage(RUSAGE_SELF, &ru) != 0 || clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return false;
    s->busy_s = (double)(user + nice + system + irq + softirq) / (double)hz;
    s->steal_s = (double)steal / (double)hz;
    s->own_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
               1e-6 * (double)ru.ru_stime.tv_usec;
    s->wall_s = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return true;
}

void cpustat_leave_out(cpustat_t *start, const cpustat_t *a, const cpustat_t *b) {
    start->busy_s += b->busy_s - a->busy_s;
    start->steal_s += b->steal_s - a->steal_s;
    start->own_s += b->own_s - a->own_s;
    start->wall_s += b->wall_s - a->wall_s;
}

void cpustat_load(const cpustat_t *a, const cpustat_t *b, double *others_cores, double *steal_cores) {
    double wall = b->wall_s - a->wall_s;
    double others = wall > 0 ? ((b->busy_s - a->busy_s) - (b->own_s - a->own_s)) / wall : 0.0;
    *others_cores = others > 0 ? others : 0.0;
    *steal_cores = wall > 0 ? (b->steal_s - a->steal_s) / wall : 0.0;
}
