"""bench/vs_torch.py's report, from results made up here (no engine runs): the median table and
the speed-ups round by round, which pair each torch round with stepscope's round of the same
repeat and leave out rounds where either failed."""
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import vs_torch  # noqa: E402

GIB = 1 << 30


def run_result(step_s, rc=0, mem_gbs=80.0, rate_tflops=None):
    # step 0 is start-up and left out of each round's median
    return {"rc": rc, "seconds": [99.0, step_s, step_s], "peak_rss": 12 * GIB, "others_cores": 0.01,
            "probe": 1.2, "mem_gbs": mem_gbs, "rate_tflops": rate_tflops, "losses": [12.1, 11.6, 10.1],
            "cmd": "made up", "over_cap": False}


def report_of(results, runs, tflop="4.0225"):
    """vs_torch's report of made-up results for config (1, 1024), and what it printed."""
    plans = {(1, 1024): {"float32": {"per_device_tflops": tflop, "memory_total_bytes": str(11 * GIB)},
                         "bfloat16": {"per_device_tflops": tflop, "memory_total_bytes": str(10 * GIB)}}}
    a = types.SimpleNamespace(model="qwen3-0.6b", threads=2, peak=0.446)
    return vs_torch.print_tables(a, [(1, 1024)], runs, results, plans, 0.892)


def test_round_ratios_pair_rounds_and_skip_failures():
    assert vs_torch.round_ratios([9.0, 8.0, None], [4.5, 4.0, 5.0]) == [2.0, 2.0]
    assert vs_torch.round_ratios([9.0, 8.0], [None, 4.0]) == [2.0]
    assert vs_torch.round_ratios([], []) == []


def test_report_prints_speedups_round_by_round(capsys):
    key = (1, 1024)
    results = {
        (key, "stepscope-bf16"): [run_result(4.0), run_result(5.0), run_result(4.5)],
        (key, "eager-bf16"): [run_result(8.0, mem_gbs=81.0), run_result(8.0, rc=1), run_result(9.9, mem_gbs=60.0)],
    }
    report = report_of(results, ["stepscope-bf16", "eager-bf16"])
    out = capsys.readouterr().out
    # medians over the completed rounds: ours 4.5 s, theirs median(8.0, 9.9) = 8.95 s
    assert "1.99x" in out
    assert "torch eager autocast bfloat16: 2.00, 2.20 (median 2.10)" in out
    torch_row = next(r for r in report if r["run"] == "eager-bf16")
    assert torch_row["step_s_by_round"] == [8.0, None, 9.9]
    # the memory probe, as the FMA probe, is kept per completed round; the table shows its median
    assert torch_row["mem_probe_gbs"] == [81.0, 60.0]
    assert "70.5" in out and "memory GB/s" in out
    assert [round(x, 6) for x in torch_row["speedup_by_round"]] == [2.0, 2.2]
    ours_row = next(r for r in report if r["run"] == "stepscope-bf16")
    assert ours_row["speedup_by_round"] == []


def test_ceiling_is_their_step_against_the_counted_flops_at_the_probed_rate(capsys):
    # 4 TFLOP a step: at the 0.5 TFLOP/s the cores' bf16 probe read around their 12 s round, a
    # step at 100% of that rate takes 8 s, so no engine could have been more than 1.5x faster
    # there; around their 9 s round the probe read 1.0, so 4 s and 2.25x. Ours, 5 s at 1.0 and
    # 4 s at 1.0: 80% and 100% of the probed rate. A failed round, or one without a probe, has none.
    key = (1, 1024)
    results = {
        (key, "stepscope-bf16"): [run_result(5.0, rate_tflops=1.0), run_result(4.0, rate_tflops=1.0),
                                  run_result(4.0)],
        (key, "eager-bf16"): [run_result(12.0, rate_tflops=0.5), run_result(9.0, rate_tflops=1.0),
                              run_result(9.0, rc=1, rate_tflops=1.0)],
    }
    report = report_of(results, ["stepscope-bf16", "eager-bf16"], tflop="4.0")
    out = capsys.readouterr().out
    assert "torch eager autocast bfloat16: 2.40, 2.25 (median 2.33); ceiling 1.50, 2.25, -" in out
    assert "stepscope bfloat16 at 80.0%, 100.0%, - of the cores' probed bf16 rate" in out
    torch_row = next(r for r in report if r["run"] == "eager-bf16")
    assert torch_row["ceiling_by_round"] == [1.5, 2.25, None]
    assert torch_row["rate_tflops_by_round"] == [0.5, 1.0, None]
    assert vs_torch.markdown_table(report).splitlines()[-1].endswith(
        "| **2.62×**; 2.40, 2.25 (ceiling 1.50, 2.25, -) |")  # medians: 10.5 s over 4.0


def test_markdown_table_carries_the_printed_figures(capsys):
    # the log's table from the report: rounds, medians and the speed-ups by round, the bf16 row
    # against stepscope's own fp32, and a failed round shown as "-"
    key = (1, 1024)
    results = {
        (key, "stepscope"): [run_result(9.0), run_result(10.0), run_result(9.5)],
        (key, "stepscope-bf16"): [run_result(4.5), run_result(5.0), run_result(4.75)],
        (key, "eager-bf16"): [run_result(9.0), run_result(8.0, rc=1), run_result(9.5)],
    }
    report = report_of(results, ["stepscope", "stepscope-bf16", "eager-bf16"])
    capsys.readouterr()
    lines = vs_torch.markdown_table(report).splitlines()
    assert lines[0].startswith("| run | dtype | rounds | median |") and len(lines) == 5
    fp32, bf16, torch = lines[2:]
    # 1024 tokens in 9.5 s: 107.8 tokens/s; 4.0225 TFLOP / 9.5 s / 0.446 = 94.9%; 12/11 of the plan
    assert fp32 == ("| **stepscope** | fp32 | 9.000, 10.000, 9.500 s | **9.500 s** | 107.8 | 94.9% | "
                    "12.00 GiB (1.091× the plan) | — |")
    assert bf16.endswith("| **2.00× its fp32**; 2.00, 2.00, 2.00 |") and "4.500, 5.000, 4.750 s" in bf16
    # each dtype against its own plan (bf16's had been read against fp32's): 12/10
    assert "| 12.00 GiB (1.200× the plan) |" in bf16
    assert [(r["run"], r["plan_bytes"], r["plan_dtype"]) for r in report if r["run"].startswith("stepscope")] == [
        ("stepscope", 11 * GIB, "float32"), ("stepscope-bf16", 10 * GIB, "bfloat16")]
    # a bf16 row saved before plan_dtype was recorded holds fp32's plan: no ratio is printed from it
    old = [dict(r) for r in report]
    for r in old:
        r.pop("plan_dtype")
    assert "× the plan" not in vs_torch.markdown_table(old).splitlines()[3]
    # theirs: median of 9.0 and 9.5 over ours 4.75; rounds 0 and 2 only
    assert torch.startswith("| torch eager autocast | bf16 | 9.000, -, 9.500 s | 9.250 s |")
    assert torch.endswith("| **1.95×**; 2.00, 2.00 |")


def test_ab_overrides_sums_kernels_time_and_bytes(tmp_path):
    """bench/ab_overrides.py's per-kernel totals from a made-up profile: the compute lane's leaf
    spans summed by name with the matmul shape left off, their bytes beside them, the containers
    and the data lane left out; a kernel's GB/s is its bytes over its time."""
    import gzip
    import json
    import ab_overrides
    prof = tmp_path / "run" / "tensorboard" / "plugins" / "profile" / "t"
    prof.mkdir(parents=True)
    events = [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "compute (step thread)"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "data"}},
        {"name": "train", "cat": "step", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10000, "args": {"step_num": 1}},
        {"name": "layer 0 fwd", "cat": "layer", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 5000},
        {"name": "matmul qkv_proj fwd [8x16x4]", "cat": "matmul", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 2000,
         "args": {"flops": 1024, "bytes_accessed": 4e6}},
        {"name": "matmul qkv_proj fwd [8x16x4]", "cat": "matmul", "ph": "X", "pid": 1, "tid": 1, "ts": 3000,
         "dur": 2000, "args": {"flops": 1024, "bytes_accessed": 4e6}},
        {"name": "rmsnorm fwd", "cat": "norm", "ph": "X", "pid": 1, "tid": 1, "ts": 6000, "dur": 500,
         "args": {"bytes_accessed": 2.5e7}},
        {"name": "data wait", "cat": "data", "ph": "X", "pid": 1, "tid": 1, "ts": 7000, "dur": 100},
        {"name": "next_batch", "cat": "data", "ph": "X", "pid": 1, "tid": 2, "ts": 0, "dur": 9000},
    ]
    with gzip.open(prof / "h.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    totals, nbytes, step_ms = ab_overrides.kernel_totals(tmp_path / "run")
    assert step_ms == 10.0
    assert totals == {"matmul qkv_proj fwd": 4.0, "rmsnorm fwd": 0.5, "data wait": 0.1}
    assert nbytes == {"matmul qkv_proj fwd": 8e6, "rmsnorm fwd": 2.5e7, "data wait": 0}
    run = {"totals": totals, "bytes": nbytes}
    assert ab_overrides.gb_per_s(run, "rmsnorm fwd") == 50.0     # 25 MB in 0.5 ms
    assert ab_overrides.gb_per_s(run, "matmul qkv_proj fwd") == 2.0
    assert ab_overrides.gb_per_s(run, "data wait") is None
    assert ab_overrides.gb_per_s(run, "absent") is None


def test_torch_python_order(monkeypatch):
    """tools/torch_python.py: $TORCH_PYTHON whatever it imports; else the caller's interpreter,
    then .venv's, whichever first imports the modules; else python3 on PATH."""
    import torch_python as tp  # bench/benchlib put tools/ on the path
    has = set()
    monkeypatch.setattr(tp, "imports", lambda python, modules: python in has)

    def pick():
        tp.torch_python.cache_clear()
        return tp.torch_python(("torch",))

    monkeypatch.setenv("TORCH_PYTHON", "/opt/torch/bin/python")
    assert pick() == "/opt/torch/bin/python"
    monkeypatch.delenv("TORCH_PYTHON")
    assert pick() == "python3"
    has.add(str(tp.VENV_PYTHON))
    assert pick() == str(tp.VENV_PYTHON)
    has.add(sys.executable)
    assert pick() == sys.executable
    tp.torch_python.cache_clear()


def test_probes_give_the_fma_width_for_fp32_runs(monkeypatch):
    """probes_now: an fp32 run's probes carry the 512-bit FMA rate over the 256-bit one (~1 in the
    Zen 5 VM's slow phase, run CE); a bf16 run's, and a build without AVX-512 (whose fma_probe
    refuses ymm), carry none, and the latter still gets its FMA figure."""
    bl = vs_torch.bl
    monkeypatch.setattr(bl, "mem_probe", lambda threads, seconds=0.5: 80.0)
    monkeypatch.setattr(bl, "fma_and_bf16_probes", lambda threads, seconds=0.5: (0.23, 0.46))
    monkeypatch.setattr(bl, "fma_and_ymm_probes", lambda threads, seconds=0.5: (0.46, 0.23))
    assert vs_torch.probes_now(2, "float32") == (0.46, 80.0, 0.46, 2.0)
    assert vs_torch.probes_now(2, "bfloat16") == (0.23, 80.0, 0.46, None)
    monkeypatch.undo()
    calls = []

    def probe(name, fields, threads, seconds, *extra):
        calls.append(extra)
        return (None, None) if extra == ("ymm",) else (0.2,)

    monkeypatch.setattr(bl, "_probe", probe)
    assert bl.fma_and_ymm_probes(2) == (0.2, None)
    assert calls == [("ymm",), ()]
