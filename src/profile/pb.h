/* pb: a tiny protobuf wire-format encoder into a growable byte buffer, shared by the XPlane
 * and tfevents writers. It knows the five wire types and nothing about schemas: callers
 * write fields in field-number order so the bytes equal protobuf's deterministic output.
 * Nested messages are written in place: pb_begin reserves one length byte and pb_end
 * backpatches it (moving the body when the length needs more bytes), so no sub-buffers.
 * Allocation failure is sticky: writes after an OOM are dropped and pb_ok reports false,
 * so encoders check once at the end instead of after every field. */
#ifndef STEPSCOPE_PB_H
#define STEPSCOPE_PB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_LEN = 2, PB_FIXED32 = 5 } pb_wire_t;

typedef struct pb_buf {
    uint8_t *data;
    size_t len, cap;
    bool oom;
} pb_buf_t;

void pb_init(pb_buf_t *b);
void pb_free(pb_buf_t *b);
void pb_reset(pb_buf_t *b);            /* len = 0, keeps the allocation, clears oom */
bool pb_ok(const pb_buf_t *b);
bool pb_reserve(pb_buf_t *b, size_t extra);
void pb_raw(pb_buf_t *b, const void *p, size_t n);

size_t pb_varint_size(uint64_t v);
void pb_varint(pb_buf_t *b, uint64_t v);
void pb_tag(pb_buf_t *b, uint32_t field, pb_wire_t wt);
void pb_put_fixed32(pb_buf_t *b, uint32_t v);   /* raw little-endian, no tag */
void pb_put_fixed64(pb_buf_t *b, uint64_t v);

/* Fields, always written (use these for oneof members, which must appear even when 0). */
void pb_uint64(pb_buf_t *b, uint32_t field, uint64_t v);
void pb_int64(pb_buf_t *b, uint32_t field, int64_t v);   /* negative: 10-byte varint */
void pb_fixed32(pb_buf_t *b, uint32_t field, uint32_t v);
void pb_fixed64(pb_buf_t *b, uint32_t field, uint64_t v);
void pb_float(pb_buf_t *b, uint32_t field, float v);
void pb_double(pb_buf_t *b, uint32_t field, double v);
void pb_bytes(pb_buf_t *b, uint32_t field, const void *p, size_t n);
void pb_string(pb_buf_t *b, uint32_t field, const char *s);   /* NULL writes "" */

/* proto3 implicit-presence fields: skipped when zero / empty, as protobuf does. */
void pb_opt_int64(pb_buf_t *b, uint32_t field, int64_t v);
void pb_opt_string(pb_buf_t *b, uint32_t field, const char *s);

/* Nested message: mark = pb_begin(b, field); ...fields...; pb_end(b, mark). */
size_t pb_begin(pb_buf_t *b, uint32_t field);
void pb_end(pb_buf_t *b, size_t mark);

#endif
