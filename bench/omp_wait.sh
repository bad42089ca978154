#!/usr/bin/env bash
# OpenMP wait policies, side by side in one run: the same config under libgomp's default
# (idle workers spin GOMP_SPINCOUNT=300000 rounds, then sleep), OMP_WAIT_POLICY=active (spin
# for ever) and OMP_WAIT_POLICY=passive (sleep at once), interleaved round by round so machine
# noise hits them alike; prints each one's median step time (step 0 left out) and its ratio to
# the default's. A spinning worker that no step uses takes a core from the step: before the
# set-up's team was released (src/train/loop.c), OMP_WAIT_POLICY=active ran the tiny default
# 1.8-1.9x as long. Give other binaries (a build of an earlier commit, say) to time them too.
#   bench/omp_wait.sh [rounds] [binary ...]       (default: 4 rounds, build/stepscope, configs/base.yml)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4}; shift || true
bins=("$@"); [ ${#bins[@]} -gt 0 ] || bins=(build/stepscope)
[ -x build/stepscope ] || make -j2 >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
policies=(default active passive)
for r in $(seq 1 "$rounds"); do
    for b in "${!bins[@]}"; do
        for p in "${policies[@]}"; do
            envs=(); [ "$p" = default ] || envs=(OMP_WAIT_POLICY="$p")
            env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "${envs[@]}" "${bins[$b]}" configs/base.yml steps=20 profiler= \
                base_output_directory="$out" run_name="b${b}_${p}_$r" >/dev/null
        done
    done
done
python3 - "$out" "$rounds" "${policies[*]}" "${bins[@]}" <<'PY'
import json, statistics, sys
out, rounds, policies, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def med(b, p):
    return statistics.median(json.loads(l)["perf/step_time_seconds"]
                             for r in range(1, rounds + 1)
                             for l in list(open(f"{out}/b{b}_{p}_{r}/metrics.jsonl"))[1:])
print(f"configs/base.yml, 20 steps, {rounds} interleaved rounds; median step time over rounds (step 0 left out)")
print(f"{'binary':40s} {'policy':8s} {'median ms':>10s} {'/ default':>10s}")
for b, name in enumerate(bins):
    base = med(b, "default")
    for p in policies:
        m = med(b, p)
        print(f"{name:40s} {p:8s} {m*1e3:10.2f} {m/base:10.3f}")
PY
