#!/usr/bin/env python3
"""Each matmul form of a profiled run, step by step: its rate in GFLOP/s in every profiled step
(flop-weighted over the step's calls of that form), its calls and milliseconds a step, and its
rate over all the profiled steps as a share of the device peak. Read from the Chrome trace that
stepscope writes beside the XPlane profile. Standard library only.

    python3 tools/matmul_forms.py <run dir | profile dir | *.trace.json.gz> [--peak-gflops X]

The op summary averages each layer part's products over the profiled steps; this keeps the forms
and the steps apart, which is what shows a form that runs at two speeds from one step (or run)
to the next while the others keep theirs (docs/speed.md, "Two speeds for the deep input forms").
A form is a span name: the op, its pass (fwd, bwd = input gradient, wgrad) and its [M x N x K].
The peak is op_summary.json's (the run's device_peak_tflops or start-up probe) unless
--peak-gflops gives one.
"""
import argparse
import gzip
import json
import sys
from pathlib import Path


def find_trace(path):
    """The newest *.trace.json.gz under path (a run directory or a profile directory), or path."""
    p = Path(path)
    if p.is_file():
        return p
    traces = sorted(p.rglob("*.trace.json.gz"), key=lambda f: f.parent.name)
    if not traces:
        sys.exit(f"matmul_forms: no *.trace.json.gz under {p}; profile a run with profiler=xplane")
    return traces[-1]


def forms_by_step(events):
    """{form: {step_num: [flops, microseconds, calls]}} over the compute lane's matmul spans, each
    counted in the train span that holds it; and the step numbers in order."""
    trains = sorted((e for e in events if e.get("ph") == "X" and e.get("name") == "train"), key=lambda e: e["ts"])
    steps = [(e["ts"], e["ts"] + e["dur"], e.get("args", {}).get("step_num", i)) for i, e in enumerate(trains)]
    forms = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "matmul" or "flops" not in e.get("args", {}):
            continue
        step = next((n for b, end, n in steps if b <= e["ts"] < end), None)
        if step is None:
            continue
        acc = forms.setdefault(e["name"], {}).setdefault(step, [0.0, 0.0, 0])
        acc[0] += e["args"]["flops"]
        acc[1] += e["dur"]
        acc[2] += 1
    return forms, [n for _, _, n in steps]


def rate(flops, us):
    return flops / us / 1e3 if us > 0 else 0.0  # GFLOP/s


def table(forms, steps, peak):
    head = ["form", "calls/step", "ms/step"] + [f"step {n}" for n in steps] + ["all", "% of peak"]
    rows = []
    for name in sorted(forms):
        per = forms[name]
        flops = sum(v[0] for v in per.values())
        us = sum(v[1] for v in per.values())
        calls = sum(v[2] for v in per.values())
        ms = us / 1e3 / len(steps)
        row = [name, f"{calls / len(steps):.0f}", f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"]
        row += [f"{rate(*per[n][:2]):.0f}" if n in per else "-" for n in steps]
        row += [f"{rate(flops, us):.0f}", f"{100 * rate(flops, us) / peak:.1f}" if peak else "-"]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("path", help="a run directory, its profile directory, or a *.trace.json.gz")
    ap.add_argument("--peak-gflops", type=float, default=None, help="the device peak in GFLOP/s")
    a = ap.parse_args()
    trace = find_trace(a.path)
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    forms, steps = forms_by_step(events)
    if not forms:
        sys.exit(f"matmul_forms: {trace} holds no matmul spans inside train steps")
    peak = a.peak_gflops
    summary = trace.parent / "op_summary.json"
    if peak is None and summary.exists():
        peak = json.loads(summary.read_text()).get("peak_gflops")
    print(f"{trace}: matmul GFLOP/s by profiled step" + (f"; peak {peak:.1f} GFLOP/s" if peak else ""))
    print(table(forms, steps, peak))


if __name__ == "__main__":
    main()
