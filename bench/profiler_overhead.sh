#!/usr/bin/env bash
# Profiler overhead, side by side in one run: the same config with the profiler off and on,
# interleaved (off, on, off, on, ...) so machine noise hits both alike. Prints the median
# step time of the profiled window against the same steps without the profiler, and each
# step around the window edges against the median.
#   bench/profiler_overhead.sh [rounds] [key=value ...]     (default: 3 rounds, configs/base.yml)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; shift || true
[ -x build/stepscope ] || make -j2 >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(steps=16 skip_first_n_steps_for_profiler=5 profiler_steps=6 device_peak_tflops=0.446 base_output_directory="$out" "$@")
for r in $(seq 1 "$rounds"); do
    build/stepscope configs/base.yml "${common[@]}" profiler= run_name="off$r" >/dev/null
    build/stepscope configs/base.yml "${common[@]}" profiler=xplane run_name="on$r" >/dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def times(run):
    return [json.loads(l)["perf/step_time_seconds"] for l in open(f"{out}/{run}/metrics.jsonl")]
first, last = 5, 10
off = [times(f"off{r}") for r in range(1, rounds + 1)]
on = [times(f"on{r}") for r in range(1, rounds + 1)]
win_off = statistics.median([t for run in off for t in run[first:last + 1]])
win_on = statistics.median([t for run in on for t in run[first:last + 1]])
print(f"profiled window: steps {first}..{last}, {rounds} interleaved rounds of each")
print(f"median step time, profiler off: {win_off*1e3:9.3f} ms")
print(f"median step time, profiler on : {win_on*1e3:9.3f} ms   ratio on/off = {win_on/win_off:.4f}")
med_on = statistics.median([t for run in on for t in run[1:]])
med_off = statistics.median([t for run in off for t in run[1:]])
print("steps at the window edges, median over rounds, as a ratio to the runs' median step (step 0 left out):")
print("            profiler on             profiler off (same step, for scale)")
for s in (first - 1, first, last, last + 1):
    m = statistics.median([run[s] for run in on])
    o = statistics.median([run[s] for run in off])
    print(f"  step {s:2d}: {m*1e3:9.3f} ms  {m/med_on:.4f}    {o*1e3:9.3f} ms  {o/med_off:.4f}")
PY
