/* libFuzzer target: the safetensors reader (header length, JSON header, offsets, dtypes),
 * every conversion it offers on whatever it accepts, and the model loader that checks the
 * tensors against the Qwen3 parameter table of a micro model (V=8, D=4, F=8, L=1, H=2, KV=1,
 * HD=2, tied, qk_norm: the seed corpus holds a valid file for it). */
#include <stdint.h>
#include <stdlib.h>

#include "fuzz_file.h"
#include "io/safetensors.h"
#include "model/qwen3.h"

static const qwen3_dims_t MICRO = {.B = 1, .S = 4, .D = 4, .F = 8, .L = 1, .H = 2, .KV = 1, .HD = 2, .V = 8,
                                   .tied = true, .qk_norm = true, .rope_theta = 10000.0, .eps = 1e-6};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file_with(data, size);
    char err[1024];
    safetensors_t st;
    if (safetensors_open(&st, path, err, sizeof err) != 0) {
        fuzz_check_message(err);
    } else {
        for (size_t i = 0; i < st.num_tensors; i++) {
            const st_tensor_t *t = &st.tensors[i];
            /* An accepted tensor lies inside the mapping and its size is dtype x shape. */
            const char *lo = st.map, *p = t->data;
            if (p < lo || t->nbytes > st.map_size || (size_t)(p - lo) > st.map_size - t->nbytes ||
                t->nbytes != (size_t)t->numel * st_dtype_size(t->dtype))
                abort();
            if (safetensors_find(&st, t->name) == NULL) abort();
            void *buf = malloc(t->numel ? (size_t)t->numel * sizeof(float) : 1);
            if (!buf) continue;
            if (safetensors_to_f32(t, buf) != 0) (void)safetensors_to_i32(t, buf);
            free(buf);
        }
        (void)safetensors_meta(&st, "format");
        safetensors_close(&st);
    }
    static float params[4096];
    if (qwen3_num_params(&MICRO) > (int64_t)(sizeof params / sizeof params[0])) abort();
    if (qwen3_load_safetensors(params, &MICRO, path, err, sizeof err) != 0) fuzz_check_message(err);
    return 0;
}
