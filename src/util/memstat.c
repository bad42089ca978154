#include "util/memstat.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The field's value in bytes ("VmHWM:\t  123456 kB"), or -1. */
static int64_t field_bytes(const char *line, const char *name) {
    size_t n = strlen(name);
    if (strncmp(line, name, n) != 0 || line[n] != ':') return -1;
    long long kib;
    char unit[8];
    if (sscanf(line + n + 1, "%lld %7s", &kib, unit) != 2 || strcmp(unit, "kB") != 0 || kib < 0) return -1;
    return (int64_t)kib * 1024;
}

bool memstat_read(memstat_t *m) {
    *m = (memstat_t){-1, -1};
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            int64_t v;
            if ((v = field_bytes(line, "VmRSS")) >= 0) m->rss_bytes = v;
            else if ((v = field_bytes(line, "VmHWM")) >= 0) m->peak_rss_bytes = v;
        }
        fclose(f);
    }
    if (m->rss_bytes < 0 || m->peak_rss_bytes < 0) {
        *m = (memstat_t){0, 0};
        return false;
    }
    return true;
}

bool memstat_reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

uint64_t memstat_physical_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}
