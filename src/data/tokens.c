/* tokens: a file of raw little-endian uint32 token ids, memory-mapped read-only.
 * N ids make W = floor((N-1)/S) windows of S+1 ids, window w = ids [w*S, w*S+S] (neighbours
 * share one id, so every id but the last is a target exactly once per pass). Global row b
 * of step i reads window (i*global_batch + b) mod W. Every id is checked against vocab_size
 * at open, so a bad file fails before the first step rather than as an out-of-range
 * embedding lookup somewhere in the middle of a run. */
#include "data/data.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct data_tokens {
    const uint32_t *ids; /* [N], little-endian */
    size_t n;            /* N */
    size_t windows;      /* W */
    size_t S;
    int64_t global_batch, row_offset, local_batch;
};

enum { SCAN_BLOCK = 1 << 16 };

/* Index of the first id >= vocab, or n if none. Blocks are scanned for their maximum (a
 * loop that vectorises) and only a block that fails is walked again for its first bad id. */
static size_t first_bad_id(const uint32_t *ids, size_t n, uint32_t vocab) {
    size_t blocks = (n + SCAN_BLOCK - 1) / SCAN_BLOCK, first = n;
#pragma omp parallel for schedule(static) reduction(min : first) if (n >= ((size_t)1 << 20))
    for (size_t k = 0; k < blocks; k++) {
        size_t lo = k * SCAN_BLOCK, hi = lo + SCAN_BLOCK < n ? lo + SCAN_BLOCK : n;
        uint32_t mx = 0;
        for (size_t i = lo; i < hi; i++) {
            uint32_t v = le32toh(ids[i]);
            mx = v > mx ? v : mx;
        }
        if (mx < vocab) continue;
        for (size_t i = lo; i < hi; i++) {
            if (le32toh(ids[i]) >= vocab) {
                if (i < first) first = i;
                break;
            }
        }
    }
    return first;
}

int data_tokens_open(data_tokens_t **out, const data_options_t *opt, char *err, size_t errlen) {
    *out = NULL;
    const char *path = opt->dataset_path;
    if (!path || !path[0]) {
        snprintf(err, errlen, "data: dataset_type is \"tokens\" but dataset_path is empty; "
                              "set dataset_path to a file of little-endian uint32 token ids");
        return 1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "data: cannot open tokens file '%s': %s; set dataset_path to a "
                              "readable file of little-endian uint32 token ids", path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "data: tokens file '%s' is not a regular file; set dataset_path to a "
                              "file of little-endian uint32 token ids", path);
        close(fd);
        return 1;
    }
    size_t bytes = (size_t)st.st_size, S = (size_t)opt->seq_len;
    if (bytes == 0) {
        snprintf(err, errlen, "data: tokens file '%s' is empty; set dataset_path to a file of "
                              "little-endian uint32 token ids", path);
        close(fd);
        return 1;
    }
    if (bytes % 4 != 0) {
        snprintf(err, errlen, "data: tokens file '%s' has %zu bytes, not a multiple of 4; it must "
                              "hold raw little-endian uint32 ids (truncated or wrong format?)", path, bytes);
        close(fd);
        return 1;
    }
    size_t n = bytes / 4;
    if (n < S + 1) {
        snprintf(err, errlen, "data: tokens file '%s' has %zu tokens but one window needs %zu "
                              "(max_target_length+1); use a smaller max_target_length or a longer file",
                 path, n, S + 1);
        close(fd);
        return 1;
    }
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "data: cannot map tokens file '%s': %s", path, strerror(errno));
        return 1;
    }
    const uint32_t *ids = map;
    size_t bad = first_bad_id(ids, n, (uint32_t)opt->vocab_size);
    if (bad < n) {
        snprintf(err, errlen, "data: tokens file '%s': id %" PRIu32 " at index %zu is >= vocab_size %"
                              PRId64 "; tokenize with this model's tokenizer or fix vocab_size",
                 path, le32toh(ids[bad]), bad, opt->vocab_size);
        munmap(map, bytes);
        return 1;
    }
    data_tokens_t *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "data: out of memory");
        munmap(map, bytes);
        return 1;
    }
    *t = (data_tokens_t){.ids = ids, .n = n, .windows = (n - 1) / S, .S = S,
                         .global_batch = opt->global_batch, .row_offset = opt->row_offset,
                         .local_batch = opt->local_batch};
    *out = t;
    return 0;
}

/* out: [local_batch, S+1] */
void data_tokens_fill(const data_tokens_t *t, int64_t step, int32_t *out) {
    size_t S1 = t->S + 1;
    for (int64_t b = 0; b < t->local_batch; b++) {
        /* 128-bit so step*global_batch cannot wrap on long runs */
        unsigned __int128 g = (unsigned __int128)(uint64_t)step * (uint64_t)t->global_batch +
                              (uint64_t)(t->row_offset + b);
        size_t w = (size_t)(g % t->windows);
        const uint32_t *src = t->ids + w * t->S;
        int32_t *dst = out + (size_t)b * S1;
        for (size_t j = 0; j < S1; j++) dst[j] = (int32_t)le32toh(src[j]); /* < vocab <= 2^31 */
    }
}

int64_t data_tokens_windows(const data_tokens_t *t) { return (int64_t)t->windows; }

void data_tokens_close(data_tokens_t *t) {
    if (!t) return;
    munmap((void *)t->ids, t->n * 4);
    free(t);
}
