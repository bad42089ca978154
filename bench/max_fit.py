#!/usr/bin/env python3
"""The largest batch x sequence that fits in this machine's memory, stepscope against PyTorch.

stepscope: its --dry-run memory plan refuses a config over memory_limit_gib, so the largest
batch per sequence length (and per remat_policy) is found from plans alone; --confirm runs the
largest of the chosen policy for one real step and reports its peak RSS against the plan.
PyTorch (tools/torch_qwen3.py, eager float32, caching allocator): one real step per candidate,
batch 1, 2, 4, ... per sequence length, under an RSS cap (the child is killed past it), until
one does not fit. The cap is --budget-gib but never more than the memory available at the start
less 1 GiB, so a probe cannot push other users of the machine out of memory; the table says
which cap applied. One process at a time.

    bench/max_fit.py                                # qwen3-0.6b; stepscope plans, torch at 512, 1024, 2048
    bench/max_fit.py --confirm --confirm-seq 2048   # and a real step of stepscope's largest at 2048
    bench/max_fit.py --model tiny --torch-seqs 128 --max-batch 8
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl


def ints(text):
    return [int(x) for x in text.split(",") if x]


def largest_batch(base, budget_gib, max_batch):
    """The largest per_device_batch_size in [1, max_batch] whose plan fits, and that plan (or
    (0, refusal) when batch 1 does not fit). Plans grow with the batch, so doubling then bisecting
    finds it."""
    def plan(b):
        return bl.plan_of(base + [f"per_device_batch_size={b}", f"memory_limit_gib={budget_gib}"])
    p = plan(1)
    if "refused" in p:
        return 0, p
    lo, lo_plan, hi = 1, p, None
    while hi is None and lo < max_batch:
        b = min(2 * lo, max_batch)
        pb = plan(b)
        if "refused" in pb:
            hi = b
        else:
            lo, lo_plan = b, pb
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        pm = plan(mid)
        if "refused" in pm:
            hi = mid
        else:
            lo, lo_plan = mid, pm
    return lo, lo_plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--seqs", type=ints, default=[512, 1024, 2048, 4096], help="sequence lengths for stepscope")
    ap.add_argument("--remat", default="none,full", help="stepscope remat_policy values to plan for")
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--budget-gib", type=float, default=None,
                    help="memory budget; default: stepscope's own default, 90%% of physical memory")
    ap.add_argument("--confirm", action="store_true", help="run stepscope's largest at --confirm-seq for one step")
    ap.add_argument("--confirm-seq", type=int, default=2048)
    ap.add_argument("--confirm-remat", default="none")
    ap.add_argument("--torch-seqs", type=ints, default=[512, 1024, 2048],
                    help="sequence lengths to probe torch at (empty: no torch)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra stepscope override")
    ap.add_argument("--workdir", help="keep logs here (default: a temporary folder, removed)")
    a = ap.parse_args()
    if a.torch_seqs:
        bl.require_torch()
    bl.build()
    tmp = None if a.workdir else tempfile.TemporaryDirectory(prefix="max_fit_")
    workdir = Path(a.workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    physical = bl.meminfo("MemTotal")
    budget = a.budget_gib if a.budget_gib else round(physical * 0.9 / bl.GIB, 2)
    rows = []

    for remat in [r for r in a.remat.split(",") if r]:
        for seq in a.seqs:
            base = [f"model_name={a.model}", f"max_target_length={seq}", f"remat_policy={remat}", "steps=1",
                    "profiler=", f"num_threads={a.threads}", *a.set]
            b, plan = largest_batch(base, budget, a.max_batch)
            if b == 0:
                rows.append(["stepscope", f"remat {remat}", seq, 0, 0, "-", "-", "batch 1 over budget"])
                continue
            note = "largest plan that fits" + (f" (search stopped at --max-batch {a.max_batch})" if b == a.max_batch else "")
            rss = "-"
            if a.confirm and seq == a.confirm_seq and remat == a.confirm_remat:
                name = f"stepscope_{remat}_b{b}_s{seq}"
                bl.log(f"[{time.strftime('%H:%M:%S')}] {name}: one real step")
                res = bl.run_stepscope(base + [f"per_device_batch_size={b}", f"memory_limit_gib={budget}"],
                                       workdir, name, a.threads, 0.446, rss_cap=bl.memory_cap(budget))
                rss = bl.gib(res["peak_rss"])
                plan_bytes = int(plan["memory_total_bytes"])
                if res["rc"] == 0:
                    note = f"ran 1 step: RSS {res['peak_rss'] / plan_bytes:.3f} x plan"
                else:
                    note = "over the RSS cap" if res["over_cap"] else f"real step failed (exit {res['rc']})"
            rows.append(["stepscope", f"remat {remat}", seq, b, b * seq, bl.gib(int(plan["memory_total_bytes"])),
                         rss, note])

    cap = bl.memory_cap(budget)
    for seq in a.torch_seqs:
        fitted = None
        b = 1
        while b <= a.max_batch:
            base = [f"model_name={a.model}", f"max_target_length={seq}", f"per_device_batch_size={b}", "steps=1",
                    *a.set]
            name = f"torch_b{b}_s{seq}"
            bl.log(f"[{time.strftime('%H:%M:%S')}] {name}: one step under an RSS cap of {cap / bl.GIB:.1f} GiB")
            res = bl.run_torch(base, workdir, name, a.threads, rss_cap=cap)
            if res["rc"] != 0:
                why = "over the RSS cap" if res["over_cap"] else f"failed (exit {res['rc']})"
                bl.log(f"  {why}")
                rows.append(["torch eager", "-", seq, b, b * seq, "-", bl.gib(res["peak_rss"]), why])
                break
            fitted = res
            rows.append(["torch eager", "-", seq, b, b * seq, "-", bl.gib(res["peak_rss"]), "ran 1 step"])
            b *= 2
        if fitted is None:
            break  # a longer sequence at batch 1 will not fit either

    capped = (f"; torch RSS cap {cap / bl.GIB:.2f} GiB (the budget, or available memory less 1 GiB if lower)"
              if a.torch_seqs else "")
    # stepscope's settings as the overrides leave them (the last of a key wins, as in stepscope);
    # torch's probes always run eager float32
    ours = ", ".join(a.set) if a.set else "dtype=float32"
    print(f"\n{a.model}, stepscope with {ours}, {a.threads} threads; budget {budget:.2f} GiB "
          f"(physical {physical / bl.GIB:.2f} GiB){capped}")
    print(bl.table(["engine", "policy", "seq", "batch", "tokens", "plan GiB", "peak RSS GiB", "result"], rows))
    fits = {}
    for r in rows:
        if r[7].startswith(("largest plan", "ran 1 step")):
            key = f"{r[0]} ({r[1]})" if r[1] != "-" else r[0]
            if r[4] > fits.get(key, (0, ""))[0]:
                fits[key] = (r[4], f"{r[3]} x {r[2]}")
    for key, (tokens, shape) in fits.items():
        print(f"largest that fits, {key}: batch {shape} = {tokens} tokens")
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
