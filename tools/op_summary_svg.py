#!/usr/bin/env python3
"""Draws a profiled run's op summary (op_summary.json, written beside the profile) as an SVG bar
chart: one bar per op kind and, indented, one per layer part, each as its share of the step
time, labelled with ms per step and GFLOP/s and % of the device peak, or where a row does no
counted arithmetic (norms, elementwise passes, the update) its GB/s and % of the memory
bandwidth. Standard library only.

    python3 tools/op_summary_svg.py <op_summary.json> <out.svg> [--title TEXT] [--peak-gflops X]
                                    [--peak-gb-per-s Y]

--peak-gflops recomputes every "% of peak" against X (say, the bf16 peak for a run whose
device_peak_tflops was given as the fp32 one); --peak-gb-per-s every "% of bandwidth" against Y
(say, the fastest the bus was probed that day, where the run's own probe caught a slow moment).
"""
import argparse
import json
import os
import sys
import tempfile
from xml.sax.saxutils import escape

ROW_H, BAR_X, BAR_W, LABEL_W = 22, 230, 420, 360
COLORS = {"matmul": "#4e79a7", "attention": "#f28e2b", "optimizer": "#59a14f", "norm": "#b07aa1",
          "xent": "#e15759", "swiglu": "#76b7b2", "rope": "#edc948", "elementwise": "#9c755f",
          "embed": "#bab0ac", "comm": "#ff9da7", "data": "#d37295"}


def rows_to_draw(summary):
    steps = max(summary.get("num_steps", 1), 1)
    rows = []
    parts_of = {}
    for r in summary["rows"]:
        if r["part"]:
            parts_of.setdefault(r["category"], []).append(r)
    for r in summary["rows"]:
        if r["category"].startswith("total"):
            continue
        if r["part"] and len(parts_of[r["category"]]) == 1:
            continue  # a kind with one part: its bar already says it all
        rows.append({"label": r["part"] if r["part"] else r["category"], "indent": bool(r["part"]),
                     "category": r["category"], "share": r["share"], "ms": r["total_ms"] / steps,
                     "gflops": r.get("gflops_per_s", 0.0), "pct": r.get("pct_peak", 0.0),
                     "gbytes": r.get("gbytes_per_s", 0.0), "pct_bw": r.get("pct_bandwidth", 0.0)})
    return rows


def svg(summary, title):
    rows = rows_to_draw(summary)
    width = BAR_X + BAR_W + LABEL_W
    height = 70 + ROW_H * len(rows) + 30
    steps = max(summary.get("num_steps", 1), 1)
    bandwidth = summary.get("peak_gbytes_per_s", 0.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
           f'<text x="10" y="42" fill="#444">steps {summary["first_step"]}..{summary["last_step"]}: '
           f'{summary["step_ms"] / steps:.1f} ms per step; bars: share of step time; '
           f'peak {summary["peak_gflops"]:.1f} GFLOP/s'
           + (f', memory bandwidth {bandwidth:.1f} GB/s' if bandwidth > 0 else "") + '</text>']
    y = 60
    for r in rows:
        color = COLORS.get(r["category"], "#888888")
        opacity = "0.55" if r["indent"] else "1"
        x_label = 26 if r["indent"] else 10
        weight = "normal" if r["indent"] else "bold"
        w = max(r["share"], 0.0) * BAR_W
        out.append(f'<text x="{x_label}" y="{y + 15}" font-weight="{weight}">{escape(r["label"])}</text>')
        out.append(f'<rect x="{BAR_X}" y="{y + 4}" width="{BAR_W}" height="{ROW_H - 6}" fill="#f2f2f2"/>')
        out.append(f'<rect x="{BAR_X}" y="{y + 4}" width="{w:.1f}" height="{ROW_H - 6}" fill="{color}" '
                   f'fill-opacity="{opacity}"/>')
        # The optimizer's few flops (the norm's squares) make no meaningful rate: show rates of 1+
        # GFLOP/s, and the bus's figures for the rest.
        if r["gflops"] >= 1:
            rate = f'{r["gflops"]:.0f} GFLOP/s, {r["pct"]:.0f}% of peak'
        elif r["gbytes"] > 0:
            rate = f'{r["gbytes"]:.1f} GB/s' + (f', {r["pct_bw"]:.0f}% of bandwidth' if bandwidth > 0 else "")
        else:
            rate = ""
        x = BAR_X + BAR_W
        out.append(f'<text x="{x + 55}" y="{y + 15}" text-anchor="end">{100 * r["share"]:.1f}%</text>')
        out.append(f'<text x="{x + 150}" y="{y + 15}" text-anchor="end">{r["ms"]:.1f} ms</text>')
        out.append(f'<text x="{x + 162}" y="{y + 15}">{rate}</text>')
        y += ROW_H
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary")
    ap.add_argument("out")
    ap.add_argument("--title", default="stepscope op summary")
    ap.add_argument("--peak-gflops", type=float, default=None)
    ap.add_argument("--peak-gb-per-s", type=float, default=None)
    a = ap.parse_args()
    try:
        summary = json.load(open(a.summary))
    except (OSError, ValueError) as e:
        sys.exit(f"op_summary_svg: cannot read {a.summary}: {e}")
    rereads = (("--peak-gflops", a.peak_gflops, "peak_gflops", "gflops_per_s", "pct_peak"),
               ("--peak-gb-per-s", a.peak_gb_per_s, "peak_gbytes_per_s", "gbytes_per_s", "pct_bandwidth"))
    for flag, value, reference, rate, pct in rereads:
        if value is None:
            continue
        if not value > 0:
            sys.exit(f"op_summary_svg: {flag} must be positive")
        summary[reference] = value
        for r in summary["rows"]:
            r[pct] = 100.0 * r.get(rate, 0.0) / value
    text = svg(summary, a.title)
    # Whole or not at all, as every file the project writes.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(a.out)), suffix=".partial")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it owner-only; a picture is for everyone
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
