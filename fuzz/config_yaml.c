/* libFuzzer target: the YAML config file (libyaml events -> the key table), followed by the
 * model preset it names (models/ beside it links to configs/models) and validation.
 * Invariants: a refusal is exit code 2 with one line; an accepted config is in range. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "fuzz_check_config.h"

static char g_path[PATH_MAX];

/* A folder holding the input as fuzz.yml and models -> <repo>/configs/models, so that
 * model_name=tiny in the input reads a real preset. The runner starts us in the repo root. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char cwd[PATH_MAX], dir[PATH_MAX], link[PATH_MAX + 16], models[PATH_MAX + 32];
    if (!getcwd(cwd, sizeof cwd)) abort();
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/stepscope-fuzz-config-XXXXXX", tmp);
    if (!mkdtemp(dir)) abort();
    snprintf(link, sizeof link, "%s/models", dir);
    snprintf(models, sizeof models, "%s/configs/models", cwd);
    if (symlink(models, link) != 0) abort();
    snprintf(g_path, sizeof g_path, "%s/fuzz.yml", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(g_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    static config_t cfg;
    char err[1024];
    int rc = config_load(&cfg, g_path, 0, NULL, err, sizeof err);
    fuzz_check_config(rc, &cfg, err);
    return 0;
}
