/* tfevents: TensorBoard event files, see tfevents.h. Event field numbers: wall_time 1
 * (double), step 2, file_version 3, summary 5; Summary.value 1; Value.tag 1, simple_value 2
 * (float). */
#include "metrics/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "metrics/crc32c.h"
#include "util/atomic_file.h"

struct tfevents {
    int fd;
    off_t size;        /* bytes of whole records written so far */
    pb_buf_t payload;  /* reused per record: no allocation per step after the first */
    pb_buf_t frame;
    char path[4096];
    char error[4096 + 256]; /* room for the path and the cause */
};

double tfevents_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void tfevents_encode_file_version(pb_buf_t *out, double wall_time) {
    pb_double(out, 1, wall_time);
    pb_string(out, 3, "brain.Event:2");
}

void tfevents_encode_scalars(pb_buf_t *out, int64_t step, double wall_time, size_t n,
                             const char *const tags[], const float values[]) {
    pb_double(out, 1, wall_time);
    pb_opt_int64(out, 2, step);           /* proto3: step 0 is left out, as protobuf does */
    size_t summary = pb_begin(out, 5);
    for (size_t i = 0; i < n; i++) {
        size_t value = pb_begin(out, 1);
        pb_string(out, 1, tags[i]);
        pb_float(out, 2, values[i]);      /* oneof: written even when 0 */
        pb_end(out, value);
    }
    pb_end(out, summary);
}

/* Value{tag=1, metadata=9{plugin_data=1{plugin_name=1}, data_class=4}, tensor=8{dtype=1,
 * tensor_shape=2 (empty: rank 0), float_val=5 packed}}. metadata goes before tensor: that is
 * the order protobuf itself emits here (tensor is in a oneof), checked against FORMATS.md. */
void tfevents_encode_scalar_tensor(pb_buf_t *out, int64_t step, double wall_time, const char *tag,
                                   float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    pb_double(out, 1, wall_time);
    pb_opt_int64(out, 2, step);
    size_t summary = pb_begin(out, 5);
    size_t v = pb_begin(out, 1);
    pb_string(out, 1, tag);
    size_t meta = pb_begin(out, 9);
    size_t plugin = pb_begin(out, 1);
    pb_string(out, 1, "scalars");
    pb_end(out, plugin);
    pb_uint64(out, 4, 1);                 /* DATA_CLASS_SCALAR */
    pb_end(out, meta);
    size_t tensor = pb_begin(out, 8);
    pb_uint64(out, 1, 1);                 /* DT_FLOAT */
    pb_bytes(out, 2, "", 0);              /* scalar shape: present but empty */
    pb_tag(out, 5, PB_LEN);               /* packed float_val with one element */
    pb_varint(out, 4);
    pb_put_fixed32(out, bits);
    pb_end(out, tensor);
    pb_end(out, v);
    pb_end(out, summary);
}

void tfevents_frame(pb_buf_t *out, const void *payload, size_t n) {
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    pb_raw(out, len, sizeof len);
    pb_put_fixed32(out, crc32c_masked(len, sizeof len));
    pb_raw(out, payload, n);
    pb_put_fixed32(out, crc32c_masked(payload, n));
}

static int set_error(tfevents_t *w, const char *what, int e) {
    snprintf(w->error, sizeof w->error, "%s %s: %s", what, w->path, strerror(e));
    return -1;
}

/* Append the framed w->payload as one write(); on failure cut the file back to whole records. */
static int write_record(tfevents_t *w) {
    pb_reset(&w->frame);
    tfevents_frame(&w->frame, w->payload.data, w->payload.len);
    if (!pb_ok(&w->payload) || !pb_ok(&w->frame)) return set_error(w, "out of memory for", ENOMEM);
    size_t done = 0;
    while (done < w->frame.len) {
        ssize_t k = write(w->fd, w->frame.data + done, w->frame.len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            if (ftruncate(w->fd, w->size) != 0) { /* nothing more to do; report the write error */ }
            return set_error(w, "cannot append to", e);
        }
        done += (size_t)k;
    }
    w->size += (off_t)done;
    return 0;
}

/* O_EXCL so two writers never share a file; a taken name gets ".1", ".2", ... */
static int create_file(tfevents_t *w, const char *dir, const char *host, double wall_time) {
    long long secs = (long long)wall_time;
    for (int k = 0; k < 1000; k++) {
        int n = k == 0 ? snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s", dir, secs, host)
                       : snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d", dir, secs, host, k);
        if (n < 0 || (size_t)n >= sizeof w->path) return set_error(w, "path too long:", ENAMETOOLONG);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (w->fd >= 0) return 0;
        if (errno != EEXIST) return set_error(w, "cannot create", errno);
    }
    return set_error(w, "cannot create", EEXIST);
}

int tfevents_open_at(tfevents_t **out, const char *dir, const char *hostname, double wall_time,
                     char *err, size_t errlen) {
    *out = NULL;
    tfevents_t *w = calloc(1, sizeof *w);
    if (!w) { snprintf(err, errlen, "out of memory"); return -1; }
    w->fd = -1;
    pb_init(&w->payload);
    pb_init(&w->frame);
    int rc = 0;
    if (mkdir_p(dir) != 0) {
        snprintf(w->path, sizeof w->path, "%s", dir);
        rc = set_error(w, "cannot create directory", errno);
    }
    if (rc == 0) rc = create_file(w, dir, hostname, wall_time);
    if (rc == 0) {
        tfevents_encode_file_version(&w->payload, wall_time);
        rc = write_record(w);
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s", w->error);
        if (w->fd >= 0) unlink(w->path);  /* no file without its version record */
        tfevents_close(w);
        return -1;
    }
    *out = w;
    return 0;
}

int tfevents_open(tfevents_t **w, const char *dir, char *err, size_t errlen) {
    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    return tfevents_open_at(w, dir, host, tfevents_wall_time(), err, errlen);
}

int tfevents_write_scalars(tfevents_t *w, int64_t step, double wall_time, size_t n,
                           const char *const tags[], const float values[]) {
    if (!w || w->fd < 0) return -1;
    pb_reset(&w->payload);
    tfevents_encode_scalars(&w->payload, step, wall_time, n, tags, values);
    return write_record(w);
}

int tfevents_add_scalar(tfevents_t *w, const char *tag, float value, int64_t step, double wall_time) {
    const char *tags[1] = {tag};
    const float values[1] = {value};
    return tfevents_write_scalars(w, step, wall_time, 1, tags, values);
}

int tfevents_flush(tfevents_t *w) {
    if (!w || w->fd < 0) return -1;
    if (fsync(w->fd) != 0 && errno != EINVAL) return set_error(w, "cannot fsync", errno);
    return 0;
}

int tfevents_close(tfevents_t *w) {
    if (!w) return 0;
    int rc = 0;
    if (w->fd >= 0) {
        rc = tfevents_flush(w);
        if (close(w->fd) != 0 && rc == 0) rc = set_error(w, "cannot close", errno);
    }
    pb_free(&w->payload);
    pb_free(&w->frame);
    free(w);
    return rc;
}

const char *tfevents_path(const tfevents_t *w) { return w ? w->path : ""; }
const char *tfevents_error(const tfevents_t *w) { return w ? w->error : "no writer"; }
