#!/usr/bin/env bash
# dtype=bfloat16 against float32 on one config, side by side in one run: the loss curve (every
# step, relative difference) and the step time (median, tokens/s, ratio); and two more with bf16
# weights as well (weight_dtype=bfloat16: no fp32 master copy, bf16 AdamW moments), their updates
# rounded to nearest and stochastically (stochastic_rounding=true). The data is a token
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
build/stepscope configs/base.yml "${common[@]}" dtype=bfloat16 weight_dtype=bfloat16 stochastic_rounding=true \
    run_name=w16sr >"$out/w16sr.log"
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def recs(run):
    return [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
runs = {"bf16": recs("bf16"), "bf16 w": recs("w16"), "bf16 w sr": recs("w16sr")}
a = recs("fp32")
print(f"{'step':>4} {'fp32 loss':>10}" + "".join(f" {name + ' loss':>14} {'rel diff':>9}" for name in runs))
worst = dict.fromkeys(runs, 0.0)
for i, x in enumerate(a):
    row = f"{x['step']:>4} {x['learning/loss']:>10.4f}"
    for name, run in runs.items():
        y = run[i]["learning/loss"]
        d = abs(y - x["learning/loss"]) / x["learning/loss"]
        worst[name] = max(worst[name], d)
        row += f" {y:>14.4f} {100*d:>8.3f}%"
    print(row)
print("loss curve, worst step's difference from fp32 (bar for bf16: 2%): " +
      ", ".join(f"{name} {100*w:.3f}%" for name, w in worst.items()))
tok = a[0]["perf/per_device_tokens"]
ta = statistics.median(r["perf/step_time_seconds"] for r in a[1:])
parts = []
for name, run in runs.items():
    t = statistics.median(r["perf/step_time_seconds"] for r in run[1:])
    parts.append(f"{name} {t:.3f} s ({tok/t:.1f} tokens/s, {ta/t:.2f}x)")
print(f"median step (step 0 left out): fp32 {ta:.3f} s ({tok/ta:.1f} tokens/s); " + "; ".join(parts))
PY
