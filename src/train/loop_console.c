/* loop_console: see loop_console.h. */
#include "train/loop_console.h"

#include <stdio.h>

#include "kernels/gemm.h"
#include "model/qwen3.h"
#include "train/checkpoint.h"
#include "util/memstat.h"

static const double GIB = 1073741824.0, MIB = 1048576.0;

void console_ranks(const plan_t *p, comm_t *world) {
    char lib[160];
    uint64_t full = 2 * (uint64_t)p->num_params * sizeof(float);
    printf("ranks: %d (%s), global batch %lld = %d ranks x %lld per device\n", p->num_ranks,
           comm_describe(world, lib, sizeof lib), (long long)p->dims.B * p->num_ranks, p->num_ranks,
           (long long)p->dims.B);
    printf("optimizer state: AdamW m and v sharded over %d rank%s (ici_fsdp_parallelism), %d cop%s "
           "(dcn_data_parallelism): %.3f MiB per rank of %.3f MiB in all; gradients reduce-scattered in "
           "%lld layer buckets while backward runs\n",
           p->shard_ranks, p->shard_ranks == 1 ? "" : "s", p->replica_groups, p->replica_groups == 1 ? "y" : "ies",
           (double)p->optimizer_bytes / MIB, (double)full / MIB, (long long)p->dims.L + 2);
}

void console_setup(const config_t *cfg, const plan_t *plan, const train_state_t *st, bool multi) {
    printf("matmul library: %s\n", gemm_library_detail(st->gemm));
    if (plan->bf16) printf("bf16 matmuls: %s\n", gemm_bf16_detail(st->gemm));
    printf("attention block products: %s\n", qwen3_attention_blocks(st->model));
    printf("activation rows: %s (row_padding=%s)\n", qwen3_rows_detail(st->model), cfg->row_padding);
    /* The plan's buffers are all touched by now: what is resident beyond them is the binary,
     * the libraries and their own allocations. */
    memstat_t mem;
    if (memstat_read(&mem))
        printf("resident memory after set-up: %.3f GiB%s, %.3fx the plan's %.3f GiB\n", (double)mem.rss_bytes / GIB,
               multi ? " (rank 0)" : "", (double)mem.rss_bytes / (double)plan->total_bytes,
               (double)plan->total_bytes / GIB);
    printf("set-up: %.3f GiB of buffers mapped and touched in %.2f s (%.2f GB/s of first-touch page faults), "
           "parameters %s in %.2f s\n",
           (double)st->setup_touched_bytes / GIB, st->setup_touch_s,
           st->setup_touch_s > 0 ? (double)st->setup_touched_bytes / st->setup_touch_s / 1e9 : 0.0,
           st->resumed_step >= 0            ? "and AdamW state loaded"
           : cfg->load_parameters_path[0] ? "loaded"
                                          : "initialised",
           st->setup_params_s);
    if (st->resumed_step >= 0)
        printf("resumed: the state after step %lld (%lld AdamW updates) from %s; steps %lld..%lld run now\n",
               (long long)st->resumed_step, (long long)st->updates_done, cfg->load_full_state_path,
               (long long)st->resumed_step + 1, (long long)cfg->steps - 1);
}

void console_checkpoint(const config_t *cfg, const plan_t *plan, const step_record_t *rec) {
    char folder[4096];
    checkpoint_folder(folder, sizeof folder, cfg, rec->step);
    bool gib = rec->checkpoint_bytes >= (uint64_t)GIB;
    char where[96];
    if (rec->checkpoint_async)
        snprintf(where, sizeof where, "beside step %lld (async_checkpointing)", (long long)rec->step + 1);
    else
        snprintf(where, sizeof where, "outside the step times");
    printf("checkpoint: step %lld's parameters and AdamW state, %.3f %s%s in %.3f s (%.3f GB/s), %s: %s\n",
           (long long)rec->step, (double)rec->checkpoint_bytes / (gib ? GIB : MIB), gib ? "GiB" : "MiB",
           plan->shard_ranks > 1 ? " (rank 0's files)" : "", rec->checkpoint_seconds,
           (double)rec->checkpoint_bytes / rec->checkpoint_seconds / 1e9, where, folder);
}

void console_checkpoint_wait(const step_record_t *rec) {
    printf("checkpoint: step %lld's update waited %.3f s for step %lld's write to finish (async_checkpointing; in "
           "step %lld's time)\n",
           (long long)rec->step, rec->checkpoint_wait_seconds, (long long)rec->step - 1, (long long)rec->step);
}

/* A batch's forward in MaxText's count (plan_forward_tflops_per_device), so its TFLOP/s and MFU
 * compare with the steps'. */
void console_eval(const plan_t *plan, double peak_tflops, const step_record_t *rec) {
    double tflops_s = plan_forward_tflops_per_device(plan) * (double)rec->eval_batches / rec->eval_seconds;
    printf("eval: after step %lld, average loss %.4f over %lld tokens (%lld batches), %.3f s, %.1f tokens/s/device, "
           "%.3f TFLOP/s/device, MFU %.2f%%, outside the step times\n",
           (long long)rec->step, rec->eval_loss,
           (long long)(rec->eval_batches * plan_batch_tokens_per_device(plan) * plan->num_ranks),
           (long long)rec->eval_batches, rec->eval_seconds,
           (double)(rec->eval_batches * plan_batch_tokens_per_device(plan)) / rec->eval_seconds, tflops_s,
           peak_tflops > 0 ? 100.0 * tflops_s / peak_tflops : 0.0);
}

void console_comm(const plan_t *p, zero_t *zero, zero_stats_t after_step0) {
    zero_stats_t z = zero_stats(zero), b = after_step0;
    z.steps -= b.steps;
    z.bytes_sent -= b.bytes_sent;
    z.busy_ns -= b.busy_ns;
    z.wait_ns -= b.wait_ns;
    if (z.steps < 1) return;
    double N = (double)p->num_ranks, grad_bytes = (double)p->num_params * sizeof(float);
    double per_step = (double)z.bytes_sent / (double)z.steps, theory = 2.0 * (N - 1.0) / N * grad_bytes;
    printf("collectives: %.0f bytes sent per step per rank (ring model; 2(N-1)/N x %.0f gradient bytes = %.0f), "
           "communication thread busy %.3f ms/step, step waited %.3f ms/step for it (steps 1..)\n",
           per_step, grad_bytes, theory, (double)z.busy_ns / (double)z.steps * 1e-6,
           (double)z.wait_ns / (double)z.steps * 1e-6);
}

void console_files(const report_t *r, const profile_files_t *pf, const checkpoints_written_t *ck, const config_t *cfg) {
    printf("files written:\n  %s\n", report_metrics_path(r));
    if (report_summary_path(r)) printf("  %s\n", report_summary_path(r));
    if (report_tensorboard_dir(r)) printf("  %s/ (TensorBoard scalars)\n", report_tensorboard_dir(r));
    if (ck->count) {
        char dir[4096];
        checkpoint_path(dir, sizeof dir, cfg, -1);
        printf("  %s/ (%lld checkpoint%s, the last after step %lld: load_full_state_path=%s/%lld resumes from it, "
               "load_parameters_path=%s/%lld starts from its parameters)\n",
               dir, (long long)ck->count, ck->count == 1 ? "" : "s", (long long)ck->last_step, dir,
               (long long)ck->last_step, dir, (long long)ck->last_step);
    }
    if (pf->written) {
        printf("  %s\n  %s\n  %s\n", pf->xplane, pf->trace, pf->summary);
        printf("open the profile: xprof --logdir=%s/%s/tensorboard --port=6006  (or tensorboard --logdir=... with the "
               "xprof plugin), or load %s in https://ui.perfetto.dev\n",
               cfg->base_output_directory, cfg->run_name, pf->trace);
    }
}
