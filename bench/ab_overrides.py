#!/usr/bin/env python3
"""ab_overrides: two settings side by side, of one build or of two (--bin-a, --bin-b). Runs
stepscope with override set A, then B, then A, ... for --rounds rounds, one process at a time,
each run profiling its last --profiled steps. Prints, round by round and as the median over
rounds, A's time over B's (B's speed-up: above 1 means B is faster) for the profiled steps and
for each kernel in them (the compute lane's spans from the Chrome trace, summed by name with the
matmul shapes left off) with A's GB/s (the spans' bytes_accessed over their time), and what the
cores' FMA units and the memory bus delivered around each run (build/bench/fma_probe over
--peak, build/bench/mem_probe in GB/s: a memory-bound kernel moves with the bus, not the cores).

Within a round the two runs are a minute or more apart, and this VM's speed moves by a quarter
within minutes: read the per-round ratios, and a kernel's ratio against that of kernels B does
not change (--control NAME, repeatable: the ratio of the named spans' total is printed, and each
kernel's ratio divided by it).

  bench/ab_overrides.py --a row_padding=dense --b row_padding=auto --rounds 4 -- \\
      model_name=qwen3-0.6b override_model_config=true base_num_decoder_layers=8 vocab_size=8192 \\
      per_device_batch_size=1 max_target_length=1024
  bench/ab_overrides.py --bin-a /tmp/before/build/stepscope ...   (a build of another commit)
"""
import argparse
import collections
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402


def kernel_totals(run_dir):
    """({span name without its [MxNxK] shape: total ms}, {the same: total bytes}) over the compute
    lane's leaf spans of the profiled steps, and the steps' own ms."""
    traces = sorted(Path(run_dir).glob("tensorboard/plugins/profile/*/*.trace.json.gz"))
    if not traces:
        sys.exit(f"ab_overrides: no trace under {run_dir}: did the run fail? (see its .log)")
    events = json.load(gzip.open(traces[-1]))["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    compute = next((tid for tid, name in lanes.items() if name.startswith("compute")), None)
    spans = [e for e in events if e.get("ph") == "X" and e["tid"] == compute]
    # The op summary's containers (profile/summary.h): the step, its phases and layers.
    containers = {"step", "phase", "layer", "other"}
    totals, nbytes = collections.defaultdict(float), collections.defaultdict(float)
    step_ms = 0.0
    for e in spans:
        if e["cat"] == "step":
            step_ms += e["dur"] / 1e3
        elif e["cat"] not in containers:
            name = e["name"].split(" [")[0]
            totals[name] += e["dur"] / 1e3
            nbytes[name] += e.get("args", {}).get("bytes_accessed", 0)
    return dict(totals), dict(nbytes), step_ms


def run(overrides, workdir, name, args, binary):
    steps, n = args.steps, args.profiled
    prof = [f"steps={steps}", "profiler=xplane", f"skip_first_n_steps_for_profiler={steps - n}", f"profiler_steps={n}"]
    probe0, bus0 = benchlib.machine_probes(args.threads)
    over = [*args.common, *overrides, *prof]
    # A build of another commit reads its own checkout's base.yml: this one's may name keys it
    # does not know.
    config = Path(binary).resolve().parents[1] / "configs" / "base.yml" if binary else None
    res = benchlib.run_stepscope(over, workdir, name, args.threads, benchlib.matmul_peak(over, args.peak),
                                 binary=binary, config=config if config and config.exists() else None)
    probe1, bus1 = benchlib.machine_probes(args.threads)
    if res["rc"] != 0:
        sys.exit(f"ab_overrides: {name} failed (rc {res['rc']}):\n{benchlib.tail(res['log'])}")
    totals, nbytes, step_ms = kernel_totals(Path(workdir) / name)
    probes = [p / args.peak for p in (probe0, probe1) if p is not None]
    buses = [b for b in (bus0, bus1) if b is not None]
    benchlib.log(f"{name}: profiled steps {step_ms / 1e3:.2f} s, steps {[round(s, 2) for s in res['seconds']]}, "
                 f"FMA probe/peak {' '.join(f'{p:.2f}' for p in probes)}, bus {' '.join(f'{b:.0f}' for b in buses)} GB/s")
    return {"totals": totals, "bytes": nbytes, "step_ms": step_ms, "probes": probes, "buses": buses,
            "others": res["others_cores"]}


def gb_per_s(run_, name):
    """A kernel's GB/s in one run: its bytes over its time ("" where it counts none)."""
    ms, nbytes = run_["totals"].get(name, 0.0), run_["bytes"].get(name, 0.0)
    return nbytes / (ms * 1e6) if ms > 0 and nbytes > 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", action="append", default=[], help="an override of set A (repeatable)")
    ap.add_argument("--b", action="append", default=[], help="an override of set B (repeatable)")
    ap.add_argument("--bin-a", help="A's stepscope binary (default build/stepscope): another build, e.g. of the "
                    "commit before, in a git worktree")
    ap.add_argument("--bin-b", help="B's stepscope binary (default build/stepscope)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="steps per run")
    ap.add_argument("--profiled", type=int, default=1, help="the last N steps of each run are profiled and summed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak", type=float, default=0.446,
                    help="fp32 peak TFLOP/s (MACHINE.md's Zen 5, 2 cores: 0.446; a Zen 4's: 0.232), which the FMA "
                         "probe is read against and, twice it for dtype=bfloat16 on a bf16 unit, the runs' MFU")
    ap.add_argument("--control", action="append", default=[],
                    help="a span name (shape left off) that B does not change; repeatable")
    ap.add_argument("--top", type=int, default=16, help="kernels to list, by A's time")
    ap.add_argument("common", nargs="*", help="overrides both sets share")
    args = ap.parse_args()
    if args.rounds < 1 or args.profiled < 1 or args.steps < args.profiled + 1:
        sys.exit("ab_overrides: --rounds and --profiled must be at least 1, and --steps above --profiled "
                 "(step 0 is start-up, never profiled)")
    benchlib.build()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="ab_overrides_") as workdir:
        for r in range(args.rounds):
            a = run(args.a, workdir, f"a{r}", args, args.bin_a)
            b = run(args.b, workdir, f"b{r}", args, args.bin_b)
            rounds.append((a, b))
    names = sorted(rounds[0][0]["totals"], key=lambda n: -rounds[0][0]["totals"][n])[:args.top]

    def ratio(a, b, pick):
        ta, tb = pick(a), pick(b)
        return ta / tb if tb > 0 else float("nan")

    def control_ms(run_):
        return sum(run_["totals"].get(n, 0.0) for n in args.control)

    print(f"A: {args.bin_a or 'build/stepscope'} {' '.join(args.a) or '(defaults)'}\n"
          f"B: {args.bin_b or 'build/stepscope'} {' '.join(args.b) or '(defaults)'}\n"
          f"common: {' '.join(args.common)}; {args.rounds} alternated rounds, the last {args.profiled} of "
          f"{args.steps} steps profiled; A's time / B's (above 1: B faster)")
    rows = []
    step = [ratio(a, b, lambda x: x["step_ms"]) for a, b in rounds]
    ctrl = [ratio(a, b, control_ms) for a, b in rounds] if args.control else None
    rows.append(["profiled steps", f"{statistics.median(x['step_ms'] for x, _ in rounds):.0f}", "",
                 f"{statistics.median(step):.3f}", " ".join(f"{x:.3f}" for x in step), ""])
    if ctrl:
        rows.append(["control: " + ", ".join(args.control), f"{statistics.median(control_ms(x) for x, _ in rounds):.0f}",
                     "", f"{statistics.median(ctrl):.3f}", " ".join(f"{x:.3f}" for x in ctrl), "1.000"])
    for n in names:
        rs = [ratio(a, b, lambda x, n=n: x["totals"].get(n, 0.0)) for a, b in rounds]
        norm = f"{statistics.median(r / c for r, c in zip(rs, ctrl)):.3f}" if ctrl else ""
        gbs = [g for g in (gb_per_s(a, n) for a, _ in rounds) if g is not None]
        rows.append([n, f"{statistics.median(x['totals'].get(n, 0.0) for x, _ in rounds):.0f}",
                     f"{statistics.median(gbs):.1f}" if gbs else "-",
                     f"{statistics.median(rs):.3f}", " ".join(f"{x:.3f}" for x in rs), norm])
    headers = ["span", "A ms (median)", "A GB/s (median)", "A/B (median)", "A/B per round",
               "over control (median)" if ctrl else ""]
    print(benchlib.table(headers, rows))
    probes = [x["probes"] for pair in rounds for x in pair]
    print("FMA probe/peak around each run (A0 B0 A1 B1 ...): " +
          " | ".join(" ".join(f"{p:.2f}" for p in ps) for ps in probes))
    print("memory bus GB/s around each run (build/bench/mem_probe; A0 B0 A1 B1 ...): " +
          " | ".join(" ".join(f"{b:.0f}" for b in x["buses"]) for pair in rounds for x in pair))
    print("others' CPU (cores) per run: " + " ".join(f"{x['others']:.2f}" for pair in rounds for x in pair))


if __name__ == "__main__":
    main()
