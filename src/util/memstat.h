/* memstat: this process's memory as the kernel counts it, for the figures a run reports beside
 * its plan: the resident set now and its high-water mark since the process started
 * (/proc/self/status VmRSS and VmHWM), and the machine's physical memory. The resident set is
 * what the plan is checked against: it counts every touched page of the planned buffers and also
 * the binary, the libraries and their own allocations, which the plan does not. */
#ifndef STEPSCOPE_MEMSTAT_H
#define STEPSCOPE_MEMSTAT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct memstat {
    int64_t rss_bytes;      /* resident now */
    int64_t peak_rss_bytes; /* the most resident at any moment so far */
} memstat_t;

/* false (and *m zeroed) where /proc/self/status cannot be read or lacks the two fields. */
bool memstat_read(memstat_t *m);

/* Resets the high-water mark to the resident set now (Linux 4.0+: "5" into /proc/self/clear_refs),
 * so that a probe's own buffers, mapped and unmapped before set-up, are not the run's peak. false
 * where the kernel refuses it. */
bool memstat_reset_peak(void);

/* The machine's physical memory in bytes; 0 where the system does not say. */
uint64_t memstat_physical_bytes(void);

#endif
