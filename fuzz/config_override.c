/* libFuzzer target: key=value overrides. The input is split at newlines into up to 32
 * arguments, applied over the built-in defaults with presets from configs/models (the runner
 * starts us in the repo root). Same invariants as the YAML target. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "fuzz_check_config.h"

enum { MAX_ARGS = 32 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *args[MAX_ARGS];
    int n = 0;
    for (char *p = buf; n < MAX_ARGS;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (*p) args[n++] = p;
        if (!nl) break;
        p = nl + 1;
    }
    static config_t cfg;
    char err[1024];
    int rc = config_load(&cfg, NULL, n, args, err, sizeof err);
    fuzz_check_config(rc, &cfg, err);
    free(buf);
    return 0;
}
