#!/usr/bin/env bash
# dtype=bfloat16 against float32 on one config, side by side in one run: the loss curve (every
# step, relative difference) and the step time (median, tokens/s, ratio); and a third run with
# bf16 weights as well (weight_dtype=bfloat16: no fp32 master copy, bf16 AdamW moments). The data is a token
# file with structure to learn (each token follows from the previous one by a fixed rule, with
# 10% random tokens), so the curve falls (below ln(vocab) = 11.93 within 30 steps at lr 1e-4:
# 11.55 at step 29 on 2026-12-07) and a drift would show.
#   bench/bf16_vs_fp32.sh [steps=30] [key=value ...]
#   default config: qwen3-0.6b, batch 1 x 256, lr 1e-4 (at 3e-4 this small batch's fp32 curve
#   spikes and the two runs part after ~25 steps), device_peak_tflops unset (probe)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-30}; shift || true
[ -x build/stepscope ] || make -j2 >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 - "$out/tokens.bin" <<'PY'
import random, struct, sys
rng = random.Random(0)
V, n, t, ids = 151936, 400_000, 7, []
for _ in range(n):
    t = rng.randrange(V) if rng.random() < 0.1 else (t * 48271 + 11) % 4096
    ids.append(t)
open(sys.argv[1], "wb").write(struct.pack(f"<{n}I", *ids))
PY
common=(model_name=qwen3-0.6b per_device_batch_size=1 max_target_length=256 learning_rate=1e-4 profiler=
        steps="$steps" dataset_type=tokens dataset_path="$out/tokens.bin" base_output_directory="$out" "$@")
build/stepscope configs/base.yml "${common[@]}" dtype=float32 run_name=fp32 >"$out/fp32.log"
build/stepscope configs/base.yml "${common[@]}" dtype=bfloat16 run_name=bf16 >"$out/bf16.log"
build/stepscope configs/base.yml "${common[@]}" dtype=bfloat16 weight_dtype=bfloat16 run_name=w16 >"$out/w16.log"
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def recs(run):
    return [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
a, b, w = recs("fp32"), recs("bf16"), recs("w16")
print(f"{'step':>4} {'fp32 loss':>10} {'bf16 loss':>10} {'rel diff':>9} {'bf16 w loss':>11} {'rel diff':>9}")
worst = worst_w = 0.0
for x, y, z in zip(a, b, w):
    d = abs(y["learning/loss"] - x["learning/loss"]) / x["learning/loss"]
    dw = abs(z["learning/loss"] - x["learning/loss"]) / x["learning/loss"]
    worst, worst_w = max(worst, d), max(worst_w, dw)
    print(f"{x['step']:>4} {x['learning/loss']:>10.4f} {y['learning/loss']:>10.4f} {100*d:>8.3f}% "
          f"{z['learning/loss']:>11.4f} {100*dw:>8.3f}%")
ta, tb, tw = (statistics.median(r["perf/step_time_seconds"] for r in run[1:]) for run in (a, b, w))
tok = a[0]["perf/per_device_tokens"]
print(f"loss curve: worst step differs by {100*worst:.3f}% (bar: 2%); with bf16 weights {100*worst_w:.3f}%")
print(f"median step (step 0 left out): fp32 {ta:.3f} s ({tok/ta:.1f} tokens/s), bf16 {tb:.3f} s ({tok/tb:.1f} tokens/s): "
      f"bf16 {ta/tb:.2f}x the fp32 tokens/s; bf16 weights {tw:.3f} s ({tok/tw:.1f} tokens/s), {ta/tw:.2f}x")
PY
