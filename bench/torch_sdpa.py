#!/usr/bin/env python3
"""torch's fused attention on qwen3-0.6b's heads, forward and backward, for comparison with
build/bench/attention (which times stepscope's kernels at the same shapes).

    python3 bench/torch_sdpa.py [S ...] [--threads 2] [--reps 5]

F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), fp32, batch 1, H 16, KV 8,
HD 128 (what tools/torch_qwen3.py calls); median of --reps timed calls after two warm-up calls.
"""
import argparse
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seqs", nargs="*", type=int, default=[1024, 4096])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        raise SystemExit("bench/torch_sdpa.py: torch is not installed; install it with tools/install_deps.sh --with-torch and run this with .venv/bin/python, or python3 -m pip install torch")
    torch.set_num_threads(args.threads)
    H, KV, HD = 16, 8, 128
    print(f"torch {torch.__version__} scaled_dot_product_attention, H={H} KV={KV} HD={HD}, batch 1, "
          f"{args.threads} threads, median of {args.reps}")
    print(f"{'S':>6} {'fwd ms':>9} {'bwd ms':>9} {'fwd GFLOP/s':>12} {'bwd GFLOP/s':>12}")
    for S in args.seqs:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, H, S, HD, generator=gen, requires_grad=True)
        k = torch.randn(1, KV, S, HD, generator=gen, requires_grad=True)
        v = torch.randn(1, KV, S, HD, generator=gen, requires_grad=True)
        fwd, bwd = [], []
        for rep in range(args.reps + 2):
            t0 = time.perf_counter()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            t1 = time.perf_counter()
            o.backward(torch.ones_like(o))
            t2 = time.perf_counter()
            q.grad = k.grad = v.grad = None
            if rep >= 2:
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
        f, b = statistics.median(fwd), statistics.median(bwd)
        # counted as build/bench/attention counts: the causal half, 2 matmuls forward, 4 backward
        one = 2.0 * H * S * S / 2 * HD
        print(f"{S:>6} {f * 1e3:>9.2f} {b * 1e3:>9.2f} {2 * one / f * 1e-9:>12.1f} {4 * one / b * 1e-9:>12.1f}")


if __name__ == "__main__":
    main()
