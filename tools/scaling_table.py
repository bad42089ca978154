#!/usr/bin/env python3
"""Per-device memory and communication of data-parallel training at 8..1024 devices, for the
model presets in configs/models, as printed in docs/scaling.md.

The numbers that exist in stepscope come from the binary itself: for every model and device
count it runs `stepscope --dry-run` (per_device_batch_size=1, max_target_length=4096,
remat_policy=full, the AdamW state sharded over all ranks: ici_fsdp_parallelism=N) and reads
the memory plan. The other columns are the stated formulas applied to those numbers:

  ZeRO-1 (today)  params 4P + grads 4P + reduced grad shard 4P/N + AdamW 8P/N + activations + scratch
  ZeRO-2          grads kept only as this rank's shard plus two layer buckets in flight
  ZeRO-3 / FSDP   params also sharded, plus two layers gathered at a time (compute and prefetch)
  traffic         ring all-reduce / reduce-scatter + all-gather: 2(N-1)/N x M bytes per device
                  per step, M = 4P (fp32 gradients and parameters); FSDP adds one more
                  all-gather of the parameters for backward: 3(N-1)/N x M
  NIC time        a host of G devices has one NIC of B_NIC bytes/s; in a ring laid out host by
                  host every inter-host link carries the same 2(N-1)/N x M, so the step needs
                  at least that over B_NIC, flat or hierarchical (hierarchy cuts the ring's
                  latency steps from 2(N-1) to 2(G-1) + 2(H-1), not the NIC volume)
  break-even      the device speed (TFLOP/s) above which the gradient traffic of one step
                  takes longer than its compute, so overlap can no longer hide it

Usage: tools/scaling_table.py [--bin build/stepscope] [--gbps 100] [--per-host 8]"""
import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]
DEVICES = [8, 64, 256, 1024]
GIB = 1024 ** 3


def dry_run(binary, model, ranks):
    cmd = [binary, str(ROOT / "configs" / "base.yml"), f"model_name={model}", "per_device_batch_size=1",
           "max_target_length=4096", "remat_policy=full", f"ici_fsdp_parallelism={ranks}",
           "memory_limit_gib=1000000", "num_threads=1", "--dry-run"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    plan = {}
    for line in r.stdout.splitlines():
        k, sep, v = line.partition(": ")
        if sep:
            plan[k] = v
    return plan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "stepscope"))
    ap.add_argument("--gbps", type=float, default=100.0, help="NIC bandwidth per host, Gbit/s")
    ap.add_argument("--per-host", type=int, default=8, help="devices per host (G)")
    a = ap.parse_args()
    nic = a.gbps * 1e9 / 8
    print(f"Per device, one step of 1 x 4096 tokens, remat_policy=full, fp32 weights and AdamW state; "
          f"{a.per_host} devices per host, {a.gbps:g} Gbit/s NIC per host.\n")
    print("| model | params | N | ZeRO-1 GiB (today, plan) | ZeRO-2 GiB | ZeRO-3 GiB | activations + scratch GiB "
          "| traffic ZeRO-1/2 GiB | traffic ZeRO-3 GiB | NIC time s | TFLOP/step | break-even TFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in MODELS:
        for n in DEVICES:
            p = dry_run(a.bin, model, n)
            p = {k: (v if k == "shape" or not v.split() else v.split()[0]) for k, v in p.items()}
            P = int(p["num_parameters"])
            L = int(p["shape"].split("L=")[1].split()[0])
            total = int(p["memory_total_bytes"])
            params_b = int(p["memory_parameters_bytes"])
            grads_b = int(p["memory_gradients_bytes"])
            acts = int(p["memory_saved_activations_bytes"]) + int(p["memory_scratch_bytes"])
            shard = int(p["optimizer_shard_parameters"])
            bucket = 4 * P / L  # about one layer's gradients (the embedding bucket aside)
            zero2 = total - grads_b + 4 * shard + 2 * bucket
            zero3 = zero2 - params_b + 4 * shard + 2 * bucket
            m = 4 * P
            t12 = 2 * (n - 1) / n * m
            t3 = 3 * (n - 1) / n * m
            tflop = float(p["per_device_tflops"])
            if n <= a.per_host:  # one host: no NIC on the path
                nic_cols = "one host | - "
            else:
                nic_s = t12 / nic
                nic_cols = f"{nic_s:.2f} | {tflop/nic_s:.0f}"
            print(f"| {model} | {P/1e9:.2f} B | {n} | {total/GIB:.1f} | {zero2/GIB:.1f} | {zero3/GIB:.1f} | "
                  f"{acts/GIB:.1f} | {t12/GIB:.1f} | {t3/GIB:.1f} | {nic_cols.split(' | ')[0]} | {tflop:.1f} | "
                  f"{nic_cols.split(' | ')[1].strip()} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
