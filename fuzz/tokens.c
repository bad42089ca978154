/* libFuzzer target: the token-file reader. The first 4 bytes choose the options (sequence
 * length 1..16, local and global batch 1..4, row offset, vocab 1..65536); the rest is the file
 * of little-endian uint32 ids. Whatever is accepted is read for a few steps, and every id
 * handed out must be below vocab_size. */
#include <stdint.h>
#include <stdlib.h>

#include "data/data.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    int64_t S = 1 + (data[0] & 15), global = 1 + (data[1] & 3), local = 1 + ((data[1] >> 2) & 3);
    int64_t offset = (data[1] >> 4) & 3, vocab = 1 + (int64_t)(data[2] | (data[3] << 8));
    data_options_t opt = {.dataset_type = "tokens", .dataset_path = fuzz_file_with(data + 4, size - 4),
                          .vocab_size = vocab, .seq_len = S, .global_batch = global, .row_offset = offset,
                          .local_batch = local, .seed = 0, .depth = 1};
    char err[1024];
    data_reader_t *r;
    if (data_reader_open(&r, &opt, err, sizeof err) != 0) {
        fuzz_check_message(err);
        return 0;
    }
    int32_t *batch = malloc((size_t)(local * (S + 1)) * sizeof *batch);
    if (!batch) abort();
    for (int64_t step = 0; step < 3; step++) {
        data_reader_fill(r, step, batch);
        for (int64_t i = 0; i < local * (S + 1); i++)
            if (batch[i] < 0 || batch[i] >= vocab) abort();
    }
    free(batch);
    data_reader_close(r);
    return 0;
}
