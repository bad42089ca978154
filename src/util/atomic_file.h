/* atomic_file: write a file whole or not at all. The bytes go to "<path>.tmp.<pid>", are
 * flushed and fsynced, then renamed over path and the directory is fsynced, so a reader (or
 * a crash) sees either the old file or the complete new one, never a torn one. On any
 * failure the temp file is unlinked and a message naming the path and the cause is left in
 * err. Also mkdir_p. */
#ifndef STEPSCOPE_ATOMIC_FILE_H
#define STEPSCOPE_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

/* Writes the file's content to f; returns 0, or -1 after putting a message in err. */
typedef int (*atomic_writer_fn)(FILE *f, void *ctx, char *err, size_t errlen);

/* Write len bytes of data as the whole content of path. 0 on success, -1 with err set. */
int atomic_write_file(const char *path, const void *data, size_t len, char *err, size_t errlen);
/* Streaming form for large outputs: fn writes into the temp file. Same guarantees. */
int atomic_write_with(const char *path, atomic_writer_fn fn, void *ctx, char *err, size_t errlen);

/* For a writer fn of a large file: fwrite n bytes to f in pieces, each handed to the disk as it
 * is written and dropped from the page cache once it is there. A file of gigabytes (a
 * checkpoint) then neither fills the page cache, memory a run close to its limit needs, nor
 * leaves all its writeback to the closing fsync. Byte for byte what fwrite writes. 0, or -1 with
 * errno set. */
int atomic_file_write_through(FILE *f, const void *data, size_t n);

/* Unlink the temp file of a write in progress, if any; async-signal-safe, for a handler that
 * is about to _exit (one write is in progress at a time: only the host thread writes files). */
void atomic_file_abandon(void);

/* fsync the directory holding path, so that a rename into it survives a crash (a filesystem
 * that cannot fsync a directory counts as done). 0, or -1 with errno set. */
int fsync_parent_dir(const char *path);

/* mkdir -p: create path and missing parents (mode 0777 & ~umask). 0 if it exists or was
 * created, -1 with errno set otherwise (ENOTDIR if a component is a file). */
int mkdir_p(const char *path);

#endif
