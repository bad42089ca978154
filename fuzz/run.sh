#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time: fuzz/run.sh [seconds-per-target] (default 60;
# 0 only replays the committed seed corpus once, a quick regression check). Each target
# starts from fuzz/corpus/<target>/ (so a committed crash input is replayed every time) and
# keeps what it finds in build-fuzz/corpus/<target>/. Prints, per target, the executions
# run and the crashes found (crash, leak, timeout or out-of-memory inputs, saved under
# build-fuzz/artifacts/<target>/); exits 1 if any target found one.
set -u
cd "$(dirname "$0")/.."
secs=${1:-60}
targets="config_yaml config_override safetensors tokens full_state"
make -s fuzz || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work   # the config target's scratch folder
# Leaks are failures here: the readers run once per input and must free everything.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
total_execs=0; total_crashes=0
printf '%-16s %8s %12s %8s\n' target seconds executions crashes
for t in $targets; do
    corpus=build-fuzz/corpus/$t art=build-fuzz/artifacts/$t
    mkdir -p "$corpus" "$art"
    log=$work/$t.log
    if [ "$secs" -eq 0 ]; then
        build-fuzz/fuzz_$t -runs=0 -print_final_stats=1 -artifact_prefix="$art/" fuzz/corpus/$t >"$log" 2>&1
    else
        build-fuzz/fuzz_$t -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
            -print_final_stats=1 -artifact_prefix="$art/" "$corpus" fuzz/corpus/$t >"$log" 2>&1
    fi
    rc=$?
    execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    execs=${execs:-0}
    crashes=$(find "$art" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) -newer "$log" 2>/dev/null | wc -l)
    # a target that died without saving an input (an abort in the harness's set-up) still counts
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi
    printf '%-16s %8s %12s %8s\n' "$t" "$secs" "$execs" "$crashes"
    if [ "$crashes" -gt 0 ]; then
        grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -20
        ls "$art" >&2
    fi
    total_execs=$((total_execs + execs)); total_crashes=$((total_crashes + crashes))
done
echo "fuzz: $total_execs executions, $total_crashes crashes"
[ "$total_crashes" -eq 0 ]
