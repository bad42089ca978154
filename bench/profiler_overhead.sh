#!/usr/bin/env bash
# Profiler overhead, side by side in one run: the same config with the profiler off and on,
# interleaved (off, on, off, on, ...) so machine noise hits both alike. Prints the median
# step time of the profiled window against the same steps without the profiler, and each
# step around the window edges against the median.
# Wall-clock ratios on a shared 2-core VM carry ±10-15% noise per step, far above the few
# percent being looked for, so the script also gives a bound that noise cannot touch: the
# spans recorded per profiled step (counted in the written trace) times what one span costs
# its thread (build/bench/trace_cost, median of rounds), as a share of the median step.
#   bench/profiler_overhead.sh [rounds] [key=value ...]     (default: 3 rounds, configs/base.yml)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; shift || true
[ -x build/stepscope ] && [ -x build/bench/trace_cost ] || make -j2 >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(steps=16 skip_first_n_steps_for_profiler=5 profiler_steps=6 device_peak_tflops=0.446 base_output_directory="$out" "$@")
for r in $(seq 1 "$rounds"); do
    build/stepscope configs/base.yml "${common[@]}" profiler= run_name="off$r" >/dev/null
    build/stepscope configs/base.yml "${common[@]}" profiler=xplane run_name="on$r" >/dev/null
done
span_cost=$(build/bench/trace_cost | sed -n 's/^span_ns_recording=\([0-9.]*\).*/\1/p')
python3 - "$out" "$rounds" "$span_cost" <<'PY'
import glob, gzip, json, statistics, sys
out, rounds, span_ns = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
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
# The bound: every span the profiled steps recorded, at the measured cost of one span.
trace = json.load(gzip.open(glob.glob(f"{out}/on1/tensorboard/plugins/profile/*/*.trace.json.gz")[0]))
events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
steps = [e for e in events if e["name"] == "train"]
spans_per_step = len(events) / len(steps)
cost = spans_per_step * span_ns * 1e-9
print(f"spans recorded: {len(events)} over {len(steps)} profiled steps = {spans_per_step:.0f} per step (all threads)")
print(f"one span costs its thread {span_ns:.1f} ns (build/bench/trace_cost), so recording adds at most "
      f"{cost*1e6:.1f} us to a {win_on*1e3:.3f} ms step: {100*cost/win_on:.4f}% of the step")
PY
