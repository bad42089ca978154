/* crc32c: CRC-32C (Castagnoli) and the masked form that TFRecord framing stores. */
#ifndef STEPSCOPE_CRC32C_H
#define STEPSCOPE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c("123456789") == 0xE3069283. */
uint32_t crc32c(const void *data, size_t n);
/* Continue a CRC: crc32c_extend(crc32c(a), b) == crc32c(a || b); crc32c_extend(0, ..) starts one. */
uint32_t crc32c_extend(uint32_t crc, const void *data, size_t n);
/* TFRecord mask: ((c >> 15) | (c << 17)) + 0xA282EAD8, so CRCs of CRCs do not look valid. */
uint32_t crc32c_mask(uint32_t crc);
uint32_t crc32c_masked(const void *data, size_t n);

#endif
