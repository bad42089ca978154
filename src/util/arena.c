#include "util/arena.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

enum { HUGE_PAGE = 2 << 20 };

static size_t round_up(size_t n) { return (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

void *arena_alloc(size_t bytes, const char *what, char *err, size_t errlen) {
    if (bytes == 0) bytes = 1;
    size_t len = round_up(bytes);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "cannot allocate %.2f GiB for %s; lower per_device_batch_size or max_target_length",
                 (double)len / 1073741824.0, what);
        return NULL;
    }
    madvise(p, len, MADV_HUGEPAGE);
    /* Touch every page now, in parallel, so faults happen here and not inside a step. */
    unsigned char *c = p;
#pragma omp parallel for schedule(static)
    for (size_t off = 0; off < len; off += 4096) c[off] = 0;
    return p;
}

void arena_free(void *p, size_t bytes) {
    if (p) munmap(p, round_up(bytes ? bytes : 1));
}
