#!/usr/bin/env python3
"""stepscope's scaling: tokens/s with 1 and 2 compute threads (at --thread-seq), and for
sequence lengths 256 ... 4096 (at the most threads), each with the share of the step that
attention takes, from the op summary of one profiled step (profiler=xplane writes
op_summary.json beside the profile). With --torch, the PyTorch reference (eager, same threads,
caching allocator; bf16 autocast with --dtype bfloat16) runs each config too and the table gains
its tokens/s and stepscope's speed-up. One process at a time.

    bench/scaling.py                                   # qwen3-0.6b, batch 1, seq 256..4096
    bench/scaling.py --model tiny --seqs 64,128,256 --torch
    bench/scaling.py --dtype bfloat16 --peak 0.892 --torch   # bf16 against torch's autocast
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl


def ints(text):
    return [int(x) for x in text.split(",") if x]


def attention_shares(run_dir):
    """(attention kernel share, attention part share) of the profiled step, from op_summary.json:
    the first is the flash-attention kernel alone, the second everything the op summary files
    under the attention part (q/k/v and o projections, qk-norm, rope and the kernel)."""
    found = sorted(Path(run_dir).glob("tensorboard/plugins/profile/*/op_summary.json"))
    if not found:
        return None, None
    rows = json.loads(found[-1].read_text())["rows"]
    kernel = sum(r["share"] for r in rows if r["category"] == "attention" and r["part"] == "")
    part = sum(r["share"] for r in rows if r["part"] == "attention")
    return kernel, part


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqs", type=ints, default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--threads", type=ints, default=[1, 2], help="thread counts compared at --thread-seq")
    ap.add_argument("--thread-seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3, help="steps per run; step 1 is profiled, step 0 left out")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="stepscope's dtype; with --torch, bfloat16 runs the reference under bf16 autocast")
    ap.add_argument("--peak", type=float, default=0.446,
                    help="peak TFLOP/s of --dtype at --threads' largest count (the Zen 5's 2 cores: 0.446 fp32, 0.892 bf16)")
    ap.add_argument("--torch", action="store_true", help="also run the PyTorch reference (eager, --dtype)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra stepscope override")
    ap.add_argument("--workdir", help="keep logs and metrics here (default: a temporary folder, removed)")
    a = ap.parse_args()
    if a.steps < 2:
        ap.error("--steps must be at least 2 (step 0 is left out of the median)")
    if a.torch:
        bl.require_torch()
    bl.build()
    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="scaling_")
    workdir = Path(a.workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    most = max(a.threads)
    configs = [(t, a.thread_seq) for t in sorted(a.threads)] + [(most, s) for s in a.seqs]
    configs = list(dict.fromkeys(configs))  # the 1024 run at full threads is shared by both sweeps

    rows, medians = [], {}
    for threads, seq in configs:
        base = [f"model_name={a.model}", f"per_device_batch_size={a.batch}", f"max_target_length={seq}",
                f"steps={a.steps}", *a.set]
        ours = base + [f"dtype={a.dtype}"]
        plan = bl.plan_of(ours + [f"num_threads={threads}"])
        if "refused" in plan:
            rows.append([threads, seq] + ["-"] * 7 + (["-", "-"] if a.torch else []))
            bl.log(f"{threads} threads, seq {seq}: {plan['refused']}")
            continue
        tflop = float(plan["per_device_tflops"])
        name = f"t{threads}_s{seq}"
        bl.log(f"[{time.strftime('%H:%M:%S')}] {name}: stepscope")
        res = bl.run_stepscope(ours + ["profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=1"],
                               workdir, name, threads, a.peak * threads / most)
        if res["rc"] != 0 or len(res["seconds"]) < 2:
            bl.log(f"  failed (exit {res['rc']}); log {res['log']}:\n{bl.tail(res['log'])}")
            rows.append([threads, seq, f"failed (exit {res['rc']})"] + ["-"] * 6 + (["-", "-"] if a.torch else []))
            continue
        med = bl.median_step(res["seconds"])
        medians[(threads, seq)] = med
        kernel, part = attention_shares(workdir / name)
        tokens = a.batch * seq
        row = [threads, seq, f"{med:.3f}", f"{tokens / med:.1f}", f"{tflop / med:.4f}",
               f"{100 * tflop / med / (a.peak * threads / most):.1f}%",
               f"{100 * kernel:.1f}%" if kernel is not None else "-", f"{100 * part:.1f}%" if part is not None else "-",
               bl.gib(res["peak_rss"])]
        others = res["others_cores"]
        if a.torch:
            bl.log(f"[{time.strftime('%H:%M:%S')}] {name}: torch eager {a.dtype}")
            tr = bl.run_torch(base, workdir, name + "_torch", threads, dtype=a.dtype, rss_cap=bl.memory_cap())
            if tr["rc"] == 0 and len(tr["seconds"]) >= 2:
                tmed = bl.median_step(tr["seconds"])
                row += [f"{tokens / tmed:.1f}", f"{tmed / med:.2f}x"]
                others = max(others, tr["others_cores"])
            else:
                row += ["over cap" if tr["over_cap"] else f"exit {tr['rc']}", "-"]
        rows.append(row + [f"{others:.2f}"])

    print(f"\n{a.model}, batch {a.batch}, {a.dtype}; MFU of {a.peak} TFLOP/s at {most} threads "
          f"(scaled by threads/{most} for fewer); attention shares from profiled step 1")
    headers = ["threads", "seq", "median s", "tokens/s", "TFLOP/s", "MFU", "attn kernel share", "attn part share",
               "peak RSS GiB"]
    if a.torch:
        headers += ["torch tokens/s", "stepscope speed-up"]
    print(bl.table(headers + ["others' CPU"], rows))
    for t in sorted(a.threads):
        if t != most and (t, a.thread_seq) in medians and (most, a.thread_seq) in medians:
            print(f"{most} threads over {t} at seq {a.thread_seq}: "
                  f"{medians[(t, a.thread_seq)] / medians[(most, a.thread_seq)]:.2f}x the tokens/s")
    print("attn part = q/k/v/o projections, qk-norm, rope and the attention kernel. others' CPU: cores other "
          "processes used during the runs (timings with > 0.1 are suspect).")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
