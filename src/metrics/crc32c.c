/* crc32c: bitwise CRC-32C. Event records are a few hundred bytes per step, so a table or the
 * SSE4.2 instruction would buy nothing worth their code. */
#include "metrics/crc32c.h"

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

uint32_t crc32c(const void *data, size_t n) { return crc32c_extend(0, data, n); }

uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

uint32_t crc32c_masked(const void *data, size_t n) { return crc32c_mask(crc32c(data, n)); }
