#!/usr/bin/env python3
"""stepscope against PyTorch on the same configs, side by side in one run.

For each config (model x batch x sequence) it runs, one process at a time and interleaved when
--repeats > 1: stepscope (build/stepscope), the PyTorch reference tools/torch_qwen3.py in eager
float32, under torch.compile, and with bf16 autocast (eager, and with --runs compile-bf16 under
torch.compile), and stepscope with dtype=bfloat16 where this build supports it. Every torch
child gets torch.set_num_threads(THREADS), OMP_NUM_THREADS and a caching allocator (tcmalloc via
LD_PRELOAD, freed pages kept); stepscope gets num_threads=THREADS. Per run: median step time
(step 0 left out), tokens/s, TFLOP/s by MaxText's count (per_device_tflops from stepscope's
--dry-run), MFU against --peak (fp32) or --bf16-peak, peak RSS (the child's ru_maxrss), and the
CPU other processes took during the run (in cores; near 0 = the run had the machine), and what
the cores' FMA units delivered around it (build/bench/fma_probe before and after, as a fraction
of --peak: this VM's speed moves by a quarter or more within minutes, and a round run at 0.6 of
the peak is slow for any engine), and what the memory bus delivered (build/bench/mem_probe
before and after, GB/s: it moves apart from the FMA units, and an engine bound by memory traffic
moves with it), and for fp32 runs the 512-bit FMA rate over the 256-bit one (fma_probe's ymm
line; the log line and the JSON's zmm_over_ymm_by_round): ~2 at full width, ~1 in the Zen 5 VM's
slow phase, where torch's 256-bit MKL kernel loses nothing and our 512-bit code half.
Ratios: stepscope's tokens/s over each run's (of the medians, and round by round), and its peak
RSS over theirs. Round by round also each speed-up's ceiling: their step over a step that does
the counted FLOPs at 100% of the rate the cores' probe read in their dtype around their run (the
faster of its readings before and after; fma_probe's bf16 line for bf16 runs), the most any
engine could have been faster than theirs in that round; and stepscope's counted FLOPs rate as a
fraction of that probe. A target above a round's ceiling was out of reach in it, whatever the
code: on a VM whose cores run at half their rate in some phases, this tells a phase from a
shortfall.

    bench/vs_torch.py                                       # qwen3-0.6b, 1 x 1024, fp32 and bf16
    bench/vs_torch.py --model tiny --seq 128 --steps 4 --runs stepscope,eager
    bench/vs_torch.py --seq 512,1024 --repeats 2 --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

RUNS = {
    # name: (engine, torch mode, dtype, label)
    "stepscope": ("stepscope", None, "float32", "stepscope"),
    "eager": ("torch", "eager", "float32", "torch eager"),
    "compile": ("torch", "compile", "float32", "torch.compile"),
    "stepscope-bf16": ("stepscope", None, "bfloat16", "stepscope"),
    "eager-bf16": ("torch", "eager", "bfloat16", "torch eager autocast"),
    # torch.compile of the same autocast step: the strongest bf16 PyTorch there is to compare with
    "compile-bf16": ("torch", "compile", "bfloat16", "torch.compile autocast"),
}
DEFAULT_RUNS = "stepscope,eager,compile,stepscope-bf16,eager-bf16"


def ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b", help="stepscope model_name (a preset)")
    ap.add_argument("--batch", type=ints, default=[1], help="per_device_batch_size, comma list")
    ap.add_argument("--seq", type=ints, default=[1024], help="max_target_length, comma list")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; step 0 is left out of the median")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1, help="rounds of all runs, interleaved")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help=f"comma list of {', '.join(RUNS)}")
    ap.add_argument("--peak", type=float, default=0.446, help="fp32 peak TFLOP/s (MACHINE.md's Zen 5, 2 cores: 0.446; a Zen 4's: 0.232)")
    ap.add_argument("--bf16-peak", type=float, default=None,
                    help="bf16 peak TFLOP/s; default 2 x --peak where the CPU has a bf16 unit (AVX512-BF16 or AMX), "
                         "else --peak (stepscope emulates bf16 at the fp32 rate there)")
    ap.add_argument("--memory-cap-gib", type=float, default=None,
                    help="kill a torch child past this RSS; default and upper bound: available memory less 1 GiB")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra stepscope override for every run (both engines read the config)")
    ap.add_argument("--passive", action="store_true",
                    help="OMP_WAIT_POLICY=passive for every child (both engines): on a shared machine, spinning "
                         "OpenMP threads slow down many-fold when another process holds a core")
    ap.add_argument("--workdir", help="keep logs and metrics here (default: a temporary folder, removed)")
    ap.add_argument("--json", help="write every run's numbers here")
    ap.add_argument("--markdown-from", metavar="JSON",
                    help="print the Markdown table of a run written with --json (docs/performance_log.md's "
                         "form) and exit; a run prints it at the end too")
    a = ap.parse_args()
    if a.markdown_from:
        print(markdown_table(json.loads(Path(a.markdown_from).read_text())))
        return 0
    runs = [r for r in a.runs.split(",") if r]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        ap.error(f"unknown run {unknown[0]!r}; choose from {', '.join(RUNS)}")
    bf16_peak = a.bf16_peak or bl.matmul_peak(["dtype=bfloat16"], a.peak)
    if a.passive:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    if any(RUNS[r][0] == "torch" for r in runs):
        bl.require_torch()
    bl.build()
    # The default --peak is the Zen 5's of MACHINE.md; other CPUs these VMs land on have other
    # peaks (the Zen 4's is 0.232), and an MFU against the wrong one misleads.
    probe = bl.fma_probe(a.threads)
    if probe and not 0.6 <= probe / a.peak <= 1.1:
        bl.log(f"note: --peak {a.peak} TFLOP/s, but this CPU's FMA probe reads {probe:.3f} now; pass this "
               f"CPU's peak as --peak (and --bf16-peak) for MFU figures against it")
    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="vs_torch_")
    workdir = Path(a.workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)

    configs = [(b, s) for b in a.batch for s in a.seq]
    results = {}  # (config, run) -> list of child results
    plans = {}
    for b, s in configs:
        base = [f"model_name={a.model}", f"per_device_batch_size={b}", f"max_target_length={s}",
                f"steps={a.steps}", "profiler=", *a.set]
        plans[(b, s)] = {"float32": bl.plan_of(base), "bfloat16": bl.plan_of(base + ["dtype=bfloat16"])}
    for rep in range(a.repeats):
        for b, s in configs:
            base = [f"model_name={a.model}", f"per_device_batch_size={b}", f"max_target_length={s}",
                    f"steps={a.steps}", "profiler=", *a.set]
            for run in runs:
                engine, mode, dtype, _ = RUNS[run]
                name = f"{run}_b{b}_s{s}_r{rep}"
                key = ((b, s), run)
                if engine == "stepscope":
                    plan = plans[(b, s)][dtype]
                    if "refused" in plan:
                        results[key] = [{"skipped": plan["refused"]}]
                        continue
                    over = base + (["dtype=bfloat16"] if dtype == "bfloat16" else [])
                    bl.log(f"[{time.strftime('%H:%M:%S')}] {name}: stepscope")
                    probe0, mem0, rate0, width0 = probes_now(a.threads, dtype)
                    peak = bf16_peak if dtype == "bfloat16" else a.peak  # the dtype's peak
                    res = bl.run_stepscope(over, workdir, name, a.threads, peak)
                else:
                    cap = bl.memory_cap(a.memory_cap_gib)
                    bl.log(f"[{time.strftime('%H:%M:%S')}] {name}: torch {mode} {dtype} (RSS cap {cap / bl.GIB:.1f} GiB)")
                    probe0, mem0, rate0, width0 = probes_now(a.threads, dtype)
                    res = bl.run_torch(base, workdir, name, a.threads, mode, dtype, rss_cap=cap)
                probe1, mem1, rate1, width1 = probes_now(a.threads, dtype)
                res["probe"] = (probe0 + probe1) / 2 / a.peak if probe0 and probe1 else None
                # The cores' rate in the run's own dtype around it, for the speed-up's ceiling: the
                # faster reading, so that a probe slowed for a moment cannot lower the bound.
                res["rate_tflops"] = max(rate0, rate1) if rate0 and rate1 else None
                res["mem_gbs"] = (mem0 + mem1) / 2 if mem0 and mem1 else None
                res["zmm_over_ymm"] = (width0 + width1) / 2 if width0 and width1 else None
                if res["rc"] != 0 or len(res["seconds"]) < 2:
                    why = "over the RSS cap" if res["over_cap"] else f"exit {res['rc']}"
                    bl.log(f"  failed ({why}); log {res['log']}:\n{bl.tail(res['log'])}")
                else:
                    probed = (f", FMA probe {probe0:.4f} before and {probe1:.4f} TFLOP/s after"
                              if probe0 and probe1 else "")
                    probed += f", memory {mem0:.1f} before and {mem1:.1f} GB/s after" if mem0 and mem1 else ""
                    probed += (f", 512-bit FMAs at {res['zmm_over_ymm']:.2f}x the 256-bit rate"
                               if res["zmm_over_ymm"] else "")
                    bl.log(f"  median step {bl.median_step(res['seconds']):.3f} s, peak RSS "
                           f"{res['peak_rss'] / bl.GIB:.2f} GiB, others' CPU {res['others_cores']:.2f} cores{probed}")
                results.setdefault(key, []).append(res)

    report = print_tables(a, configs, runs, results, plans, bf16_peak)
    print("\n" + markdown_table(report))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=str))
    if tmp:
        tmp.cleanup()


def probes_now(threads, dtype):
    """(FMA probe, memory probe, the cores' rate in dtype, the 512-bit FMA rate over the 256-bit
    one) now, in TFLOP/s, GB/s, TFLOP/s and a ratio (fp32 runs only; else None): ~2 at full
    width, ~1 where the CPU splits 512-bit FMAs, the Zen 5 VM's slow phase (run CE)."""
    if dtype != "bfloat16":
        fma, ymm = bl.fma_and_ymm_probes(threads)
        return fma, bl.mem_probe(threads), fma, (fma / ymm if fma and ymm else None)
    fma, bf16 = bl.fma_and_bf16_probes(threads)
    return fma, bl.mem_probe(threads), bf16, None


def completed(r):
    return "skipped" not in r and r["rc"] == 0 and len(r["seconds"]) >= 2


def round_ratios(theirs, ours):
    """Speed-ups round by round: their median step over ours in the same round (None where either
    failed), so that a ratio compares runs made minutes apart, not across the VM's phases."""
    return [t / o for t, o in zip(theirs, ours) if t is not None and o is not None]


def ceilings(theirs, rates, tflop):
    """Round by round, the most any engine could have been faster than theirs: their median step
    over a step that does the counted FLOPs (MaxText's count: tflop per step) at 100% of the
    rate the cores' probe read in their dtype around their run, the faster of its readings
    before and after (None where either is missing).
    A speed-up target above it was out of reach in that round, whatever the code."""
    return [t * r / tflop if t is not None and r else None for t, r in zip(theirs, rates)]


def fractions_of_rate(ours, rates, tflop):
    """Round by round, the counted FLOPs' rate in our step over the cores' probed rate then."""
    return [tflop / (t * r) if t is not None and r else None for t, r in zip(ours, rates)]


def rounds_text(values, fmt):
    return ", ".join("-" if v is None else fmt.format(v) for v in values)


def summarise(reps):
    """Median over repeats of each run's median step; peak RSS the largest seen; each round's
    median step (None where the round failed)."""
    ok = [r for r in reps if completed(r)]
    if not ok:
        first = reps[0]
        if "skipped" in first:
            return {"error": "not run: " + first["skipped"].replace("stepscope: ", "")}
        return {"error": "over the RSS cap" if first.get("over_cap") else f"failed (exit {first['rc']})",
                "peak_rss": first.get("peak_rss")}
    return {"median": statistics.median(bl.median_step(r["seconds"]) for r in ok),
            "peak_rss": max(r["peak_rss"] for r in ok),
            "others": max(r["others_cores"] for r in ok),
            "probe": [r.get("probe") for r in ok],
            "mem_gbs": [r.get("mem_gbs") for r in ok],
            "zmm_over_ymm": [r.get("zmm_over_ymm") for r in ok],
            "by_round": [bl.median_step(r["seconds"]) if completed(r) else None for r in reps],
            "rate_by_round": [r.get("rate_tflops") if completed(r) else None for r in reps],
            "steps": len(ok[0]["seconds"]), "repeats": len(ok), "loss": ok[0]["losses"][:3],
            "cmds": [r["cmd"] for r in ok]}


def print_tables(a, configs, runs, results, plans, bf16_peak):
    report = []
    for b, s in configs:
        plan = plans[(b, s)]["float32"]
        tflop = float(plan["per_device_tflops"])
        sums = {run: summarise(results[((b, s), run)]) for run in runs if ((b, s), run) in results}
        # each dtype's own plan (a bf16 run's differs: it had been read against fp32's until 2026-12-07)
        plan_of = lambda dtype: plans[(b, s)].get(dtype, plan)
        dtypes = sorted({RUNS[run][2] for run in sums if RUNS[run][0] == "stepscope"}, reverse=True) or ["float32"]
        plan_text = ", ".join(f"{bl.gib(int(plan_of(d)['memory_total_bytes']))} GiB ({d})" for d in dtypes)
        print(f"\n{a.model}, batch {b} x {s} tokens, {a.threads} threads, {tflop:.4f} TFLOP per step "
              f"(MaxText's count); MFU of {a.peak} TFLOP/s (float32) or {bf16_peak:g} (bfloat16); "
              f"stepscope's memory plan {plan_text}")
        rows, notes, by_round = [], [], []
        for run in runs:
            sm = sums.get(run)
            if sm is None:
                continue
            engine, mode, dtype, label = RUNS[run]
            if "error" in sm:
                notes.append(f"{label} {dtype}: {sm['error']}")
                rows.append([label, dtype] + ["-"] * 11)
                continue
            tps = b * s / sm["median"]
            tflops = tflop / sm["median"]
            mfu = tflops / (bf16_peak if dtype == "bfloat16" else a.peak)
            ours = sums.get("stepscope-bf16" if dtype == "bfloat16" else "stepscope")
            vs = ""
            if dtype == "bfloat16" and (ours is None or "error" in ours):
                ours, vs = sums.get("stepscope"), " (fp32)"
            speed = mem = ""
            ratios, ceiling = [], []
            if ours and "error" not in ours:
                speed = f"{sm['median'] / ours['median']:.2f}x{vs}"
                mem = f"{ours['peak_rss'] / sm['peak_rss']:.2f}"
                if engine != "stepscope":
                    ratios = round_ratios(sm["by_round"], ours["by_round"])
                    ceiling = ceilings(sm["by_round"], sm["rate_by_round"], tflop)
                    by_round.append(f"  {label} {dtype}: " + ", ".join(f"{r:.2f}" for r in ratios) +
                                    (f" (median {statistics.median(ratios):.2f})" if ratios else "") +
                                    (f"; ceiling {rounds_text(ceiling, '{:.2f}')}" if any(ceiling) else ""))
            if engine == "stepscope":
                of_rate = fractions_of_rate(sm["by_round"], sm["rate_by_round"], tflop)
                if any(of_rate):
                    by_round.append(f"  stepscope {dtype} at {rounds_text(of_rate, '{:.1%}')} of the cores' "
                                    f"probed {'bf16' if dtype == 'bfloat16' else 'fp32'} rate")
            probes = [p for p in sm["probe"] if p is not None]
            probe = f"{statistics.median(probes):.2f}" if probes else "-"
            mems = [m for m in sm["mem_gbs"] if m is not None]
            mem_gbs = f"{statistics.median(mems):.1f}" if mems else "-"
            rows.append([label, dtype, f"{sm['median']:.3f}", f"{tps:.1f}", f"{tflops:.4f}", f"{100 * mfu:.1f}%",
                         bl.gib(sm["peak_rss"]), f"{sm['others']:.2f}", probe, mem_gbs, speed, mem,
                         f"{sm['steps']}x{sm['repeats']}"])
            report.append({"model": a.model, "batch": b, "seq": s, "run": run, "dtype": dtype,
                           "median_step_s": sm["median"], "tokens_per_s": tps, "tflops_per_s": tflops, "mfu": mfu,
                           "peak_rss_bytes": sm["peak_rss"], "others_cores": sm["others"],
                           "fma_probe_of_peak": sm["probe"],
                           "mem_probe_gbs": sm["mem_gbs"], "zmm_over_ymm_by_round": sm["zmm_over_ymm"],
                           "step_s_by_round": sm["by_round"],
                           "speedup_by_round": ratios, "rate_tflops_by_round": sm["rate_by_round"],
                           "ceiling_by_round": ceiling,
                           "first_losses": sm["loss"], "plan_bytes": int(plan_of(dtype)["memory_total_bytes"]),
                           "plan_dtype": dtype,
                           "commands": sm["cmds"]})
        print(bl.table(["run", "dtype", "median s", "tokens/s", "TFLOP/s", "MFU", "peak RSS GiB",
                        "others' CPU", "FMA probe/peak", "memory GB/s", "stepscope speed-up", "RSS ours/theirs", "steps x reps"],
                       rows))
        for note in notes:
            print(f"  {note}")
        if by_round:
            print("stepscope speed-up round by round (each round runs every engine back to back; ceiling: the "
                  "speed-up a step at 100% of the cores' probed rate in that round would have had):")
            print("\n".join(by_round))
        for run in ("stepscope", "stepscope-bf16"):
            ss, dtype = sums.get(run), RUNS[run][2]
            if ss and "error" not in ss:
                planned = int(plan_of(dtype)["memory_total_bytes"])
                print(f"stepscope {dtype} peak RSS {bl.gib(ss['peak_rss'])} GiB = {ss['peak_rss'] / planned:.3f} "
                      f"x its plan ({bl.gib(planned)} GiB)")
    print("\nspeed-up = run's median step time / stepscope's (same dtype; '(fp32)' where stepscope has no bf16); "
          "> 1 means stepscope is faster. others' CPU: cores that other processes used during the run "
          "(timings with > 0.1 are suspect). FMA probe/peak: median over the run's rounds of build/bench/fma_probe "
          "before and after each, over --peak (fp32): what the cores could do then, whatever the engine. memory GB/s: "
          "the same for build/bench/mem_probe (the better of a streaming triad and an in-place update over 256 MiB arrays, "
          "on every thread; a plain-store triad before 2026-12-07).")
    return report


def markdown_table(report):
    """The run's table as docs/performance_log.md keeps it: per run its rounds, median, tokens/s,
    MFU, peak RSS and stepscope's speed-up (of the medians, then round by round); stepscope's bf16
    row gives its speed-up over its own fp32. Built from the report (or a --json file), so the
    log carries the figures the run printed, not figures copied by hand."""
    out = []
    configs = sorted({(r["model"], r["batch"], r["seq"]) for r in report}, key=lambda c: (c[1], c[2]))
    for model, b, s in configs:
        rows = [r for r in report if (r["model"], r["batch"], r["seq"]) == (model, b, s)]
        ours = {r["dtype"]: r for r in rows if RUNS[r["run"]][0] == "stepscope"}
        if len(configs) > 1:
            out.append(f"\n{model}, batch {b} x {s} tokens:\n")
        out.append("| run | dtype | rounds | median | tokens/s | MFU | peak RSS | stepscope speed-up (median; per round) |")
        out.append("|---|---|---:|---:|---:|---:|---:|---|")
        for r in rows:
            engine, _, dtype, label = RUNS[r["run"]]
            rounds = ", ".join("-" if t is None else f"{t:.3f}" for t in r["step_s_by_round"]) + " s"
            rss = f"{r['peak_rss_bytes'] / bl.GIB:.2f} GiB"
            speed = "—"
            if engine == "stepscope":
                name, median = f"**{label}**", f"**{r['median_step_s']:.3f} s**"
                # (a bf16 row's plan_bytes before plan_dtype was recorded is the fp32 plan's)
                if r["run"] == "stepscope" or r.get("plan_dtype") == dtype:
                    rss += f" ({r['peak_rss_bytes'] / r['plan_bytes']:.3f}× the plan)"
                if r["run"] != "stepscope":
                    fp32 = ours.get("float32")
                    if fp32:
                        ratios = round_ratios(fp32["step_s_by_round"], r["step_s_by_round"])
                        speed = (f"**{fp32['median_step_s'] / r['median_step_s']:.2f}× its fp32**; "
                                 + ", ".join(f"{x:.2f}" for x in ratios))
            else:
                name, median = label, f"{r['median_step_s']:.3f} s"
                mine = ours.get(dtype) or ours.get("float32")
                if mine:
                    speed = (f"**{r['median_step_s'] / mine['median_step_s']:.2f}×**; "
                             + ", ".join(f"{x:.2f}" for x in r["speedup_by_round"]))
                    if any(r.get("ceiling_by_round") or []):
                        speed += f" (ceiling {rounds_text(r['ceiling_by_round'], '{:.2f}')})"
            out.append(f"| {name} | {'bf16' if dtype == 'bfloat16' else 'fp32'} | {rounds} | {median} | "
                       f"{r['tokens_per_s']:.1f} | {100 * r['mfu']:.1f}% | {rss} | {speed} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
