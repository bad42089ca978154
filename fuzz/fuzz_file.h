/* fuzz_file: the readers under test take a path, so each input is put in an in-memory file
 * (memfd) and handed over as /proc/self/fd/N: no disk traffic, and mmap works on it. Also the
 * invariant every refusal must keep: a non-empty message of one line. */
#ifndef STEPSCOPE_FUZZ_FILE_H
#define STEPSCOPE_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The path of a file holding exactly data[0..size); the same memfd is reused per input. */
static inline const char *fuzz_file_with(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("stepscope-fuzz", MFD_CLOEXEC);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t k = pwrite(fd, data + done, size - done, (off_t)done);
        if (k <= 0) abort();
        done += (size_t)k;
    }
    return path;
}

/* A refusal must say what is wrong in exactly one non-empty line. */
static inline void fuzz_check_message(const char *err) {
    if (!err[0] || strchr(err, '\n') || strchr(err, '\r')) {
        fprintf(stderr, "bad error message: '%s'\n", err);
        abort();
    }
}

#endif
