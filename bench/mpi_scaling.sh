#!/usr/bin/env bash
# Data parallelism, side by side in one run: one process with T threads and the global batch,
# against N MPI ranks with T/N threads each and 1/N of the batch each (the same threads and the
# same global batch in total), interleaved (1 rank, N ranks, 1 rank, ...) so machine noise hits
# both alike. A third run, one rank's share alone (1 process, T/N threads, batch B, no
# communication, the other cores idle of ours), is the floor the N-rank step could reach.
# Prints the median step time of each and their ratios, then the communication per
# step per rank as stepscope counts it (ring model, src/dist/comm.h) against the theoretical
# 2(N-1)/N x gradient bytes of ZeRO-1 (reduce-scatter + all-gather), and how long the
# communication thread was busy against how long the step waited for it.
#   bench/mpi_scaling.sh [rounds] [key=value ...]     (default: 3 rounds, N=2, T=2, configs/base.yml)
#   RANKS=4 THREADS=4 bench/mpi_scaling.sh            (N ranks, T threads in total)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; shift || true
N=${RANKS:-2}; T=${THREADS:-2}
[ -x build/stepscope ] || make -j2 >/dev/null
command -v mpirun >/dev/null || { echo "mpirun not found (Debian: openmpi-bin)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
B=2   # per rank
common=(steps=12 profiler= device_peak_tflops=0.446 base_output_directory="$out" "$@")
for r in $(seq 1 "$rounds"); do
    build/stepscope configs/base.yml "${common[@]}" per_device_batch_size=$((B * N)) num_threads="$T" \
        run_name="one$r" >"$out/one$r.log"
    build/stepscope configs/base.yml "${common[@]}" per_device_batch_size="$B" num_threads=$((T / N)) \
        run_name="alone$r" >"$out/alone$r.log"
    mpirun --oversubscribe --bind-to none -np "$N" build/stepscope configs/base.yml "${common[@]}" \
        per_device_batch_size="$B" num_threads=$((T / N)) run_name="many$r" >"$out/many$r.log"
done
python3 - "$out" "$rounds" "$N" "$T" "$B" <<'PY'
import json, re, statistics, sys
out, rounds, N, T, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
def times(run):
    return [json.loads(l)["perf/step_time_seconds"] for l in open(f"{out}/{run}/metrics.jsonl")][1:]
def loss(run):
    return [json.loads(l)["learning/loss"] for l in open(f"{out}/{run}/metrics.jsonl")]
one = statistics.median([t for r in range(1, rounds + 1) for t in times(f"one{r}")])
many = statistics.median([t for r in range(1, rounds + 1) for t in times(f"many{r}")])
alone = statistics.median([t for r in range(1, rounds + 1) for t in times(f"alone{r}")])
tokens = json.loads(open(f"{out}/one1/metrics.jsonl").readline())["perf/per_device_tokens"]
print(f"global batch {N * B} sequences ({tokens} tokens), {T} threads in total, {rounds} interleaved rounds, steps 1..11 each")
print(f"  1 process  x {T} threads, batch {N * B}: median step {one*1e3:9.3f} ms  {tokens/one:9.1f} tokens/s")
print(f"  {N} ranks    x {T // N} thread{'s' if T // N > 1 else ''}, batch {B} each: median step {many*1e3:9.3f} ms  "
      f"{tokens/many:9.1f} tokens/s   ratio {N} ranks / 1 process = {many/one:.3f}")
print(f"  1 rank's share alone (1 process x {T // N} thread{'s' if T // N > 1 else ''}, batch {B}, no communication): "
      f"median step {alone*1e3:9.3f} ms   {N} ranks / this = {many/alone:.3f}")
d = max(abs(a - b) / abs(a) for r in range(1, rounds + 1) for a, b in zip(loss(f"one{r}"), loss(f"many{r}")))
print(f"  losses: largest relative difference between the two, every step of every round: {d:.2e}")
pat = re.compile(r"collectives: (\d+) bytes sent per step per rank \(ring model; 2\(N-1\)/N x (\d+) gradient bytes = (\d+)\), "
                 r"communication thread busy ([0-9.]+) ms/step, step waited ([0-9.]+) ms/step")
rows = [pat.search(open(f"{out}/many{r}.log").read()) for r in range(1, rounds + 1)]
sent, grad, theory = int(rows[0][1]), int(rows[0][2]), int(rows[0][3])
busy = statistics.median(float(m[4]) for m in rows)
wait = statistics.median(float(m[5]) for m in rows)
print(f"communication per step per rank: {sent} bytes counted (ring model) against 2(N-1)/N x {grad} gradient bytes "
      f"= {theory} bytes; ratio {sent/theory:.4f}")
print(f"communication thread busy {busy:.3f} ms/step (median over rounds); the step waited {wait:.3f} ms/step for it "
      f"(busy includes waiting inside a collective for the slower rank)")
PY
