/* What every config_load result must satisfy, for the config fuzz targets. */
#ifndef STEPSCOPE_FUZZ_CHECK_CONFIG_H
#define STEPSCOPE_FUZZ_CHECK_CONFIG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "fuzz_file.h"

static inline void fuzz_check_config(int rc, const config_t *c, const char *err) {
    if (rc != 0) {
        if (rc != CONFIG_EXIT_CODE) {
            fprintf(stderr, "config_load returned %d, not %d\n", rc, CONFIG_EXIT_CODE);
            abort();
        }
        fuzz_check_message(err);
        return;
    }
    /* Accepted: what the rest of stepscope relies on without checking again. */
    int ok = c->steps >= 1 && c->per_device_batch_size >= 1 && c->max_target_length >= 1 &&
             c->vocab_size >= 2 && c->base_emb_dim >= 1 && c->base_mlp_dim >= 1 &&
             c->base_num_decoder_layers >= 1 && c->base_num_query_heads >= 1 && c->base_num_kv_heads >= 1 &&
             c->base_num_query_heads % c->base_num_kv_heads == 0 && c->head_dim >= 1 &&
             c->prefetch_depth >= 1 && c->data_delay_ms >= 0 && c->num_threads >= 0 &&
             c->adam_b1 >= 0 && c->adam_b1 < 1 && c->adam_b2 >= 0 && c->adam_b2 < 1 &&
             c->run_name[0] && memchr(c->run_name, 0, CONFIG_STR_MAX) &&
             (strcmp(c->dataset_type, "synthetic") == 0 || strcmp(c->dataset_type, "tokens") == 0) &&
             (strcmp(c->dataset_type, "tokens") != 0 || c->dataset_path[0]) &&
             (!c->profiler[0] || (strcmp(c->profiler, "xplane") == 0 && c->skip_first_n_steps_for_profiler < c->steps &&
                                  c->profiler_steps >= 1));
    if (!ok) {
        fprintf(stderr, "config_load accepted an inconsistent config\n");
        abort();
    }
}

#endif
