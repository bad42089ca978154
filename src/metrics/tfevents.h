/* tfevents: a TensorBoard event-file writer for scalars. The file is a TFRecord log of
 * serialized Event protos: first Event{wall_time, file_version="brain.Event:2"}, then one
 * Event per step holding the step's scalars in the legacy simple_value form (what
 * tensorboardX and MaxText write; TensorBoard migrates it on load).
 *
 * The file only ever holds complete records. Each record is framed in memory and handed to
 * the kernel with a single write() on an O_APPEND descriptor, so it is visible to TensorBoard
 * at once and a crash of this process cannot tear it; if the write fails part-way (disk
 * full) the file is truncated back to the last whole record. tfevents_flush adds fsync, for
 * durability across a power loss. */
#ifndef STEPSCOPE_TFEVENTS_H
#define STEPSCOPE_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "profile/pb.h"

typedef struct tfevents tfevents_t;

/* Create <dir>/events.out.tfevents.<%010d unix secs>.<hostname> (dir is created with its
 * parents) and write the file_version record. If that name is taken, ".1", ".2", ... is
 * appended. 0 on success, -1 with err set. */
int tfevents_open(tfevents_t **w, const char *dir, char *err, size_t errlen);
/* Same with an explicit hostname and wall time (seconds since the epoch), for tests. */
int tfevents_open_at(tfevents_t **w, const char *dir, const char *hostname, double wall_time,
                     char *err, size_t errlen);
/* One Event with one scalar. 0, or -1 (message in tfevents_error). */
int tfevents_add_scalar(tfevents_t *w, const char *tag, float value, int64_t step, double wall_time);
/* One Event holding n scalars for the same step: one record per training step. */
int tfevents_write_scalars(tfevents_t *w, int64_t step, double wall_time, size_t n,
                           const char *const tags[], const float values[]);
/* fsync the file (records are already visible to readers). */
int tfevents_flush(tfevents_t *w);
/* Flush and close; w is freed even on error. NULL is fine. */
int tfevents_close(tfevents_t *w);
const char *tfevents_path(const tfevents_t *w);
const char *tfevents_error(const tfevents_t *w);
/* Wall clock in seconds since the epoch, as Event.wall_time. */
double tfevents_wall_time(void);

/* Encoders, exposed for the byte-exact tests. They append to out. */
void tfevents_encode_file_version(pb_buf_t *out, double wall_time);
void tfevents_encode_scalars(pb_buf_t *out, int64_t step, double wall_time, size_t n,
                             const char *const tags[], const float values[]);
/* The same scalar in the tensor form (plugin "scalars", DT_FLOAT rank 0), which tf.summary
 * writes; the writer uses the smaller legacy form, this is here for tools and tests. */
void tfevents_encode_scalar_tensor(pb_buf_t *out, int64_t step, double wall_time, const char *tag,
                                   float value);
/* TFRecord framing: len u64, masked crc(len), data, masked crc(data). */
void tfevents_frame(pb_buf_t *out, const void *payload, size_t n);

#endif
