/* cpustat: who used the machine's cores over a stretch of time, for the summary's line on the
 * other load a run shared the machine with: the CPU time of every core (/proc/stat's first
 * line: busy, and what the hypervisor took from this guest, "steal") against this process's own
 * (getrusage, all its threads), on a monotonic clock. On a shared VM these say whether a step
 * time is the machine's or a neighbour's: bench/vs_torch.py logs the same "others' CPU" around
 * every run. */
#ifndef STEPSCOPE_CPUSTAT_H
#define STEPSCOPE_CPUSTAT_H

#include <stdbool.h>

typedef struct cpustat {
    double busy_s;  /* all cores: user, nice, system, irq, softirq; steal left out */
    double steal_s; /* all cores: time the hypervisor ran something else while this guest waited */
    double own_s;   /* this process: user + system, every thread */
    double wall_s;  /* CLOCK_MONOTONIC */
} cpustat_t;

/* false (and *s zeroed) where /proc/stat or getrusage cannot be read. */
bool cpustat_read(cpustat_t *s);

/* From a to b, in cores (CPU seconds a second): what other processes used (busy less this
 * process's own, never below 0: the two counters tick at different times) and what the
 * hypervisor took. */
void cpustat_load(const cpustat_t *a, const cpustat_t *b, double *others_cores, double *steal_cores);

/* Take the stretch from a to b (inside a measurement begun at `start`) out of it, so that
 * cpustat_load(start, end) covers the rest: a run leaves out the pauses in which it writes its
 * profile or a checkpoint, whose writeback the kernel's own threads do (busy time, but not a
 * neighbour's). */
void cpustat_leave_out(cpustat_t *start, const cpustat_t *a, const cpustat_t *b);

#endif
