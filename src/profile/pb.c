/* pb: protobuf wire encoder, see pb.h. */
#include "profile/pb.h"

#include <stdlib.h>
#include <string.h>

void pb_init(pb_buf_t *b) { memset(b, 0, sizeof *b); }

void pb_free(pb_buf_t *b) {
    free(b->data);
    pb_init(b);
}

void pb_reset(pb_buf_t *b) {
    b->len = 0;
    b->oom = false;
}

bool pb_ok(const pb_buf_t *b) { return !b->oom; }

bool pb_reserve(pb_buf_t *b, size_t extra) {
    if (b->oom) return false;
    if (extra <= b->cap - b->len) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2) { b->oom = true; return false; }
        cap *= 2;
    }
    uint8_t *p = realloc(b->data, cap);
    if (!p) { b->oom = true; return false; }
    b->data = p;
    b->cap = cap;
    return true;
}

void pb_raw(pb_buf_t *b, const void *p, size_t n) {
    if (n == 0 || !pb_reserve(b, n)) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

size_t pb_varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

/* Unsigned LEB128 written at dst; returns the number of bytes. */
static size_t varint_at(uint8_t *dst, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        dst[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    dst[n++] = (uint8_t)v;
    return n;
}

void pb_varint(pb_buf_t *b, uint64_t v) {
    if (!pb_reserve(b, 10)) return;
    b->len += varint_at(b->data + b->len, v);
}

void pb_tag(pb_buf_t *b, uint32_t field, pb_wire_t wt) {
    pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wt);
}

void pb_put_fixed32(pb_buf_t *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    pb_raw(b, x, sizeof x);
}

void pb_put_fixed64(pb_buf_t *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    pb_raw(b, x, sizeof x);
}

void pb_uint64(pb_buf_t *b, uint32_t field, uint64_t v) {
    pb_tag(b, field, PB_VARINT);
    pb_varint(b, v);
}

/* int64 is not zigzagged: a negative value is its two's complement as uint64. */
void pb_int64(pb_buf_t *b, uint32_t field, int64_t v) { pb_uint64(b, field, (uint64_t)v); }

void pb_fixed32(pb_buf_t *b, uint32_t field, uint32_t v) {
    pb_tag(b, field, PB_FIXED32);
    pb_put_fixed32(b, v);
}

void pb_fixed64(pb_buf_t *b, uint32_t field, uint64_t v) {
    pb_tag(b, field, PB_FIXED64);
    pb_put_fixed64(b, v);
}

void pb_float(pb_buf_t *b, uint32_t field, float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    pb_fixed32(b, field, u);
}

void pb_double(pb_buf_t *b, uint32_t field, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    pb_fixed64(b, field, u);
}

void pb_bytes(pb_buf_t *b, uint32_t field, const void *p, size_t n) {
    pb_tag(b, field, PB_LEN);
    pb_varint(b, n);
    pb_raw(b, p, n);
}

void pb_string(pb_buf_t *b, uint32_t field, const char *s) {
    pb_bytes(b, field, s ? s : "", s ? strlen(s) : 0);
}

void pb_opt_int64(pb_buf_t *b, uint32_t field, int64_t v) {
    if (v != 0) pb_int64(b, field, v);
}

void pb_opt_string(pb_buf_t *b, uint32_t field, const char *s) {
    if (s && s[0]) pb_string(b, field, s);
}

/* Most nested messages here are under 128 bytes, so one length byte is reserved and the
 * rare longer body is shifted right once at pb_end. */
size_t pb_begin(pb_buf_t *b, uint32_t field) {
    pb_tag(b, field, PB_LEN);
    size_t mark = b->len;
    pb_raw(b, "", 1);
    return mark;
}

void pb_end(pb_buf_t *b, size_t mark) {
    if (b->oom) return;
    size_t body = b->len - mark - 1;
    size_t n = pb_varint_size(body);
    if (n > 1) {
        if (!pb_reserve(b, n - 1)) return;
        memmove(b->data + mark + n, b->data + mark + 1, body);
        b->len += n - 1;
    }
    varint_at(b->data + mark, body);
}
