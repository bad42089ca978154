"""End-to-end tests of the stepscope binary through its command line: dry-run plan numbers,
a tiny training run and its outputs (console, metrics.jsonl, TensorBoard), refusals, the
token-file reader, determinism, the one-step-late loss read, data prefetch, the profiler,
--help/--version, divergence aborts and SIGINT.

Every run writes under a pytest tmp dir (cwd and base_output_directory), uses the tiny preset,
and passes device_peak_tflops and machine_probe=false to skip the start-up and closing probes.

Needs: pytest, numpy; optional (parts skip without them): tensorboard, xprof.
The binary: $STEPSCOPE_BIN, default build/stepscope relative to the repository root."""
import gzip
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_BIN = Path(os.environ.get("STEPSCOPE_BIN", "build/stepscope"))
BIN = _BIN if _BIN.is_absolute() else ROOT / _BIN
CONFIG = ROOT / "configs" / "base.yml"
PEAK = 0.446
# tiny preset, no probe, no profiler unless a test asks for it
FAST = ["model_name=tiny", f"device_peak_tflops={PEAK}", "machine_probe=false", "profiler="]
RUN = "r"

STEP_RE = re.compile(
    r"^completed step: (\d+), seconds: (\d+\.\d{3}), TFLOP/s/device: (\d+\.\d{3}), "
    r"Tokens/s/device: (\d+\.\d{3}), MFU: (\d+\.\d{2})%, total_weights: (\d+), loss: (-?\d+\.\d{4})$")

METRIC_KEYS = {
    "learning/loss", "learning/grad_norm", "learning/raw_grad_norm", "learning/current_learning_rate",
    "perf/step_time_seconds", "perf/per_device_tflops", "perf/per_device_tflops_per_sec",
    "perf/per_device_tokens", "perf/per_device_tokens_per_sec", "perf/mfu", "perf/data_wait_seconds",
    "memory/rss_gib", "memory/peak_rss_gib", "step", "run_name",
}

pytestmark = pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built (run make)")


# ---- helpers ----------------------------------------------------------------------------------

def stepscope(tmp_path, *args, env_extra=None, timeout=60, config=CONFIG):
    """Runs the binary with cwd=tmp_path and base_output_directory=tmp_path/out."""
    cmd = [str(BIN)]
    if config is not None:
        cmd.append(str(config))
    cmd += [f"base_output_directory={tmp_path / 'out'}", *args]
    env = dict(os.environ)
    env.pop("STEPSCOPE_EVENT_LOG", None)
    if env_extra:
        env.update(env_extra)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def train(tmp_path, *args, run_name=RUN, **kw):
    """A tiny training run that must succeed."""
    r = stepscope(tmp_path, *FAST, f"run_name={run_name}", *args, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def run_dir(tmp_path, run_name=RUN):
    return tmp_path / "out" / run_name


def read_metrics(tmp_path, run_name=RUN):
    d = run_dir(tmp_path, run_name)
    assert not (d / "metrics.jsonl.partial").exists()
    lines = (d / "metrics.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines], lines


def raw_losses(lines):
    """The loss as written (text), so equality is on the file's bytes, not a float parse."""
    return [re.search(r'"learning/loss": ([^,]+),', l).group(1) for l in lines]


def parse_plan(stdout):
    out = {}
    for line in stdout.splitlines():
        k, sep, v = line.partition(": ")
        if sep:
            out[k] = v
    return out


def read_yaml_flat(path):
    """configs/models/*.yml are flat `key: value` files."""
    out = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def shape_of(preset):
    y = read_yaml_flat(ROOT / "configs" / "models" / f"{preset}.yml")
    return dict(V=int(y["vocab_size"]), D=int(y["base_emb_dim"]), F=int(y["base_mlp_dim"]),
                L=int(y["base_num_decoder_layers"]), H=int(y["base_num_query_heads"]),
                KV=int(y["base_num_kv_heads"]), HD=int(y["head_dim"]),
                tied=y["logits_via_embedding"] == "true")


def qwen3_params(V, D, F, L, H, KV, HD, tied):
    per_layer = 2 * D + (H + 2 * KV) * HD * D + 2 * HD + H * HD * D + 3 * D * F
    return V * D + L * per_layer + D + (0 if tied else V * D)


def maxtext_tflops(B, S, V, D, F, L, H, KV, HD, **_):
    """MaxText's calculate_tflops_training_per_device (causal attention halved)."""
    ffn = 6 * B * S * D * F
    qkv = 2 * B * S * D * (H + 2 * KV) * HD
    proj = 2 * B * S * D * H * HD
    attn = 4 * B * S * S * H * HD / 2
    emb = 2 * B * S * D * V
    return (((ffn + qkv + proj) * L + emb) * 3 + attn * L * 3) / 1e12


def assert_refused(r, tmp_path, *needles, code=2):
    """Exit code, one stderr line naming what is wrong, and nothing written."""
    assert r.returncode == code, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("stepscope: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, r.stderr)
    assert list(tmp_path.iterdir()) == [], "a refused run created files"


def nested(spans):
    """spans: [(begin, end)]; True when no two spans partially overlap."""
    stack = []
    for b, e in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]))):
        while stack and stack[-1] <= b:
            stack.pop()
        if stack and e > stack[-1]:
            return False
        stack.append(e)
    return True


def tensorboard_scalars(logdir):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except Exception as e:  # ImportError or a broken install
        pytest.skip(f"tensorboard not importable: {e!r}")
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


# ---- 1. dry run -------------------------------------------------------------------------------

def test_dry_run_tiny_plan(tmp_path):
    r = stepscope(tmp_path, "model_name=tiny", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    plan = parse_plan(r.stdout)
    s = shape_of("tiny")
    assert int(plan["num_parameters"]) == qwen3_params(**s) == 90496
    # per_device_tflops: exactly four decimals, MaxText's formula (B=2, S=256 from base.yml)
    m = re.search(r"^per_device_tflops: (\d+\.\d{4})$", r.stdout, re.M)
    assert m, r.stdout
    assert m.group(1) == f"{maxtext_tflops(B=2, S=256, **s):.4f}"
    assert int(plan["tokens_per_device_per_step"]) == 2 * 256
    # memory plan: the parts sum to the total; params and grads are fp32
    parts = ["memory_parameters_bytes", "memory_gradients_bytes", "memory_optimizer_state_bytes",
             "memory_saved_activations_bytes", "memory_scratch_bytes", "memory_data_ring_bytes"]
    for k in parts + ["memory_total_bytes", "memory_total_gib", "memory_available_bytes"]:
        assert k in plan, k
    total = int(plan["memory_total_bytes"])
    assert sum(int(plan[k]) for k in parts) == total
    assert int(plan["memory_parameters_bytes"]) == 4 * 90496
    assert int(plan["memory_gradients_bytes"]) == 4 * 90496
    assert int(plan["memory_optimizer_state_bytes"]) >= 8 * 90496   # Adam m and v
    assert plan["memory_total_gib"] == f"{total / 2**30:.3f}"
    # the data thread's ring: prefetch_depth=2 batches of 2 rows of 256 + 1 token ids (int32)
    assert int(plan["memory_data_ring_bytes"]) == 2 * 2 * 257 * 4
    # the merged config is printed too
    assert plan["model_name"] == "tiny" and plan["vocab_size"] == "256"
    # nothing written: not the out dir, not anything in cwd
    assert list(tmp_path.iterdir()) == []


def test_dry_run_untied_adds_lm_head(tmp_path):
    r = stepscope(tmp_path, "model_name=tiny", "logits_via_embedding=false", "override_model_config=true",
                  "--dry-run")
    assert r.returncode == 0, r.stderr
    s = dict(shape_of("tiny"), tied=False)
    assert int(parse_plan(r.stdout)["num_parameters"]) == qwen3_params(**s) == 90496 + 256 * 64
    assert "tied=false" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_bfloat16_plan_and_run(tmp_path):
    # the plan keeps fp32 master weights, gradients and optimizer state; the matmuls round the
    # weights as they pack them, and bf16_weight_copy=true adds a bf16 copy (2 bytes a parameter)
    # for them instead
    copy = parse_plan(stepscope(tmp_path, "model_name=tiny", "dtype=bfloat16", "bf16_weight_copy=true",
                                "--dry-run").stdout)
    r = stepscope(tmp_path, "model_name=tiny", "dtype=bfloat16", "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = parse_plan(r.stdout)
    assert plan["dtype"].startswith("bfloat16")
    assert int(plan["memory_bf16_weights_bytes"]) == 0 and int(copy["memory_bf16_weights_bytes"]) == 2 * 90496
    assert int(copy["memory_total_bytes"]) - int(plan["memory_total_bytes"]) == 2 * 90496
    assert int(plan["memory_parameters_bytes"]) == 4 * 90496
    parts = ["memory_parameters_bytes", "memory_bf16_weights_bytes", "memory_gradients_bytes",
             "memory_optimizer_state_bytes", "memory_saved_activations_bytes", "memory_scratch_bytes",
             "memory_data_ring_bytes"]
    assert sum(int(plan[k]) for k in parts) == int(plan["memory_total_bytes"])
    # a run trains in bf16 and its losses stay near the fp32 run's (same seed, same data)
    losses = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        out.mkdir()
        train(out, "steps=5", f"dtype={dtype}")
        recs, _ = read_metrics(out)
        losses[dtype] = [rec["learning/loss"] for rec in recs]
    assert len(losses["bfloat16"]) == 5
    for a, b in zip(losses["float32"], losses["bfloat16"]):
        assert abs(a - b) / a < 0.02, losses


def bf16_matmuls_line(r):
    return next(l for l in r.stdout.splitlines() if l.startswith("bf16 matmuls: "))


def test_bfloat16_emulated_where_the_cpu_has_no_bf16_matmul(tmp_path):
    """Where no library has a bf16 matmul (oneDNN capped at AVX2, as on a CPU without AVX512 or
    AMX; MKL takes bf16 only where the CPU reports AVX512-BF16 or AMX, which no environment
    variable can hide, so the cap is shown on oneDNN), bf16 runs with the operands widened to
    fp32: the console says so, the bits do not depend on the thread count, and the losses match
    an uncapped run's within summation-order noise (the same bf16 inputs, exact products)."""
    cap = {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    for n in (1, 2):
        r = train(tmp_path, "steps=3", "dtype=bfloat16", "gemm_library=onednn", f"num_threads={n}",
                  run_name=f"e{n}", env_extra=cap)
        line = bf16_matmuls_line(r)
        assert line.startswith("bf16 matmuls: emulated: bf16 operands widened to fp32") and "onednn" in line, line
    assert_same_bits(tmp_path, "e1", "e2")
    train(tmp_path, "steps=3", "dtype=bfloat16", "gemm_library=onednn", run_name="uncapped")
    _, capped = read_metrics(tmp_path, "e2")
    _, uncapped = read_metrics(tmp_path, "uncapped")
    for a, b in zip(map(float, raw_losses(capped)), map(float, raw_losses(uncapped))):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)


def cpu_has_amx():
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " amx_tile" in flags and " amx_bf16" in flags


def test_bf16_matmuls_where(tmp_path):
    """The console says where bf16 products run: gemm_library=auto on a CPU with AMX takes
    stepscope's AMX GEMM, a library named outright runs them all; and both train the same
    model to the same losses within summation-order noise."""
    r = train(tmp_path, "steps=3", "dtype=bfloat16", "gemm_library=onednn", run_name="dnn")
    line = bf16_matmuls_line(r)  # "onednn", or "emulated: ... on onednn (...)" without a bf16 unit
    assert line == "bf16 matmuls: onednn" or line.startswith("bf16 matmuls: emulated: ") and " on onednn " in line, line
    r = train(tmp_path, "steps=3", "dtype=bfloat16", "gemm_library=auto", run_name="auto")
    line = bf16_matmuls_line(r)
    assert ("AMX tiles" in line) == cpu_has_amx(), line
    r = train(tmp_path, "steps=3", run_name="fp32")
    assert "bf16 matmuls" not in r.stdout  # said only where bf16 runs
    _, dnn = read_metrics(tmp_path, "dnn")
    _, auto = read_metrics(tmp_path, "auto")
    # bf16 inputs are rounded alike and their products are exact in fp32; only the fp32 sums'
    # order differs, ~1e-6 relative a product, grown through 3 steps of training well under
    # 1e-4 of a loss near 5 (as the fp32 libraries in test_gemm_library_choice).
    for a, b in zip(map(float, raw_losses(dnn)), map(float, raw_losses(auto))):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)


@pytest.mark.parametrize("preset,tflops", [("qwen3-0.6b", "8.7666"), ("qwen3-8b", "96.7076")])
def test_dry_run_maxtext_tflops(tmp_path, preset, tflops):
    # memory_limit_gib: the plan check must not depend on this machine's memory
    r = stepscope(tmp_path, f"model_name={preset}", "per_device_batch_size=1", "max_target_length=2048",
                  "memory_limit_gib=4096", "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = parse_plan(r.stdout)
    assert plan["per_device_tflops"] == tflops          # MaxText's numbers for this shape
    s = shape_of(preset)
    assert f"{maxtext_tflops(B=1, S=2048, **s):.4f}" == tflops
    assert int(plan["num_parameters"]) == qwen3_params(**s)
    parts = ["memory_parameters_bytes", "memory_gradients_bytes", "memory_optimizer_state_bytes",
             "memory_saved_activations_bytes", "memory_scratch_bytes", "memory_data_ring_bytes"]
    assert sum(int(plan[k]) for k in parts) == int(plan["memory_total_bytes"])
    assert list(tmp_path.iterdir()) == []


# ---- 2. a tiny run ----------------------------------------------------------------------------

def test_tiny_run_outputs(tmp_path):
    r = train(tmp_path, "steps=5", "learning_rate=1e-2")
    out = r.stdout.splitlines()

    # console: five step lines in order, then a summary block
    step_lines = [l for l in out if l.startswith("completed step:")]
    assert len(step_lines) == 5, r.stdout
    matches = [STEP_RE.match(l) for l in step_lines]
    assert all(matches), step_lines
    assert [int(m.group(1)) for m in matches] == [0, 1, 2, 3, 4]
    assert all(int(m.group(6)) == 512 for m in matches)          # B*S tokens
    i_sum = out.index("summary over steps 1..4 (4 steps; step 0 left out):")
    assert i_sum > out.index(step_lines[-1])
    block = out[i_sum + 1:i_sum + 5]
    assert block[0].startswith("  step time     median ")
    assert block[1].startswith("  tokens/s/device ")
    assert block[2].startswith("  TFLOP/s/device  ")
    assert block[3].startswith("  MFU             ") and f"of {PEAK:.4f} TFLOP/s" in block[3]
    plan_gib = float(re.search(r"memory plan (\d+\.\d+) GiB", r.stdout).group(1))
    mem = re.match(r"^  memory          peak RSS (\d+\.\d+) GiB, (\d+\.\d+)x the plan's (\d+\.\d+) GiB, "
                   r"\d+\.\d% of \d+\.\d GiB physical$", out[i_sum + 5])
    assert mem, out[i_sum + 5]
    peak_gib, ratio, plan_again = (float(x) for x in mem.groups())
    assert plan_again == pytest.approx(plan_gib, abs=1e-3)
    # the three are printed to 3 decimals: the ratio lies within what their rounding allows
    h = 0.0005
    assert (peak_gib - h) / (plan_gib + h) - 0.0005 <= ratio <= (peak_gib + h) / (plan_gib - h) + 0.0005
    setup = re.search(r"^resident memory after set-up: (\d+\.\d+) GiB, \d+\.\d+x the plan's", r.stdout, re.M)
    assert setup and float(setup.group(1)) <= peak_gib + 0.002, r.stdout
    # set-up's time, measured around the plan's buffers (all of them: the plan's bytes) and the init
    touch = re.search(r"^set-up: (\d+\.\d+) GiB of buffers mapped and touched in (\d+\.\d+) s "
                      r"\((\d+\.\d+) GB/s of first-touch page faults\), parameters initialised in (\d+\.\d+) s$",
                      r.stdout, re.M)
    assert touch, r.stdout
    assert float(touch.group(1)) == pytest.approx(plan_gib, abs=1e-3)
    assert float(touch.group(3)) > 0 and float(touch.group(2)) < 60 and float(touch.group(4)) < 60

    # metrics.jsonl: five records with the documented keys and consistent arithmetic
    recs, lines = read_metrics(tmp_path)
    assert len(recs) == 5
    assert list(run_dir(tmp_path).glob("*.partial")) == []
    tflops = maxtext_tflops(B=2, S=256, **shape_of("tiny"))
    for i, (rec, m) in enumerate(zip(recs, matches)):
        assert METRIC_KEYS <= set(rec), METRIC_KEYS - set(rec)
        assert rec["step"] == i and rec["run_name"] == RUN
        assert rec["learning/current_learning_rate"] == pytest.approx(1e-2, rel=1e-12)
        assert rec["perf/per_device_tokens"] == 512
        t = rec["perf/step_time_seconds"]
        assert t > 0
        assert rec["perf/per_device_tflops"] == pytest.approx(tflops, abs=5e-7)
        assert rec["perf/per_device_tokens_per_sec"] == pytest.approx(512 / t, rel=2e-3)
        assert rec["perf/per_device_tflops_per_sec"] == pytest.approx(tflops / t, rel=2e-3)
        assert rec["perf/mfu"] == pytest.approx(rec["perf/per_device_tflops_per_sec"] / PEAK, rel=2e-3, abs=2e-6)
        assert 0 <= rec["perf/data_wait_seconds"] <= t
        # every planned buffer is touched before step 0, so the resident set holds at least the
        # plan (less 2 MiB: the kernel sums its per-CPU page counts approximately); the peak is
        # the high-water mark so far, so it holds the resident set and never falls
        slack = 2 / 1024
        assert rec["memory/peak_rss_gib"] >= rec["memory/rss_gib"] - slack
        assert rec["memory/rss_gib"] >= plan_gib - 0.0005 - slack
        assert rec["memory/peak_rss_gib"] <= peak_gib + slack
        if i:
            assert rec["memory/peak_rss_gib"] >= recs[i - 1]["memory/peak_rss_gib"] - slack
        # clipping at 1.0 (base.yml): grad_norm = min(raw, 1)
        raw, g = rec["learning/raw_grad_norm"], rec["learning/grad_norm"]
        assert g == pytest.approx(min(raw, 1.0), rel=1e-5)
        # the console line shows the same numbers, rounded
        assert float(m.group(7)) == pytest.approx(rec["learning/loss"], abs=5.01e-5)
        assert float(m.group(2)) == pytest.approx(t, abs=5.01e-4)
        assert float(m.group(4)) == pytest.approx(rec["perf/per_device_tokens_per_sec"], abs=1e-3)
    losses = [rec["learning/loss"] for rec in recs]
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(256), abs=0.1)   # near-uniform at init
    assert losses[4] < losses[0] - 0.2, losses                 # learning_rate=1e-2 learns

    # summary.json: the summary's figures unrounded, consistent with the console block and with
    # metrics.jsonl's steps 1..4, listed under "files written:"
    summ = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert f"  {run_dir(tmp_path) / 'summary.json'}" in out
    later = sorted(rec["perf/step_time_seconds"] for rec in recs[1:])
    median = (later[1] + later[2]) / 2
    # metrics.jsonl keeps step times to 6 decimals, summary.json to 9 significant digits
    assert summ["perf/step_time_seconds_median"] == pytest.approx(median, abs=1.1e-6)
    assert summ["perf/step_time_seconds_min"] == pytest.approx(later[0], abs=6e-7)
    assert summ["perf/step_time_seconds_max"] == pytest.approx(later[-1], abs=6e-7)
    t = summ["perf/step_time_seconds_median"]
    assert block[0].startswith(f"  step time     median {t:.3f} s, min {summ['perf/step_time_seconds_min']:.3f} s")
    assert summ["perf/per_device_tokens_per_sec"] == pytest.approx(512 / t, rel=1e-8)
    assert summ["perf/per_device_tflops"] == pytest.approx(tflops, rel=1e-8)
    assert summ["perf/per_device_tflops_per_sec"] == pytest.approx(tflops / t, rel=1e-8)
    assert summ["perf/mfu"] == pytest.approx(tflops / t / PEAK, rel=1e-8)
    assert block[3] == f"  MFU             {100 * summ['perf/mfu']:.2f}% of {PEAK:.4f} TFLOP/s"
    assert summ["perf/peak_tflops"] == PEAK and summ["perf/peak_source"] == "device_peak_tflops"
    assert summ["memory/plan_gib"] == pytest.approx(plan_gib, abs=5e-4)
    assert f"{summ['memory/peak_rss_gib']:.3f}" == f"{peak_gib:.3f}"
    assert summ["memory/peak_rss_to_plan"] == pytest.approx(summ["memory/peak_rss_gib"] / summ["memory/plan_gib"], rel=1e-7)
    assert summ["learning/final_loss"] == recs[-1]["learning/loss"]
    assert (summ["run_name"], summ["model_name"], summ["dtype"], summ["weight_dtype"]) == (RUN, "tiny", "float32", "float32")
    assert (summ["per_device_batch_size"], summ["max_target_length"], summ["num_ranks"]) == (2, 256, 1)
    assert (summ["steps_logged"], summ["summary_first_step"], summ["summary_last_step"]) == (5, 1, 4)
    # the other load while steps 1..4 ran: the line after the memory line, its figures in the file
    load = OTHER_LOAD_RE.match(out[i_sum + 6])
    assert load and int(load.group(3)) == 4, out[i_sum + 6]
    others, steal = summ["machine/others_cores"], summ["machine/steal_cores"]
    assert others >= 0 and steal >= 0
    assert (f"{others:.2f}", f"{steal:.2f}") == (load.group(1), load.group(2))
    assert summ["machine/other_load"] == (others + steal > 0.1) == (load.group(4) is not None)
    # FAST: machine_probe=false, so no probe keys
    assert not any(k.startswith("machine/probe") for k in summ)
    assert list(run_dir(tmp_path).glob("*.tmp.*")) == []

    # no profile with profiler=""
    assert not (run_dir(tmp_path) / "tensorboard" / "plugins").exists()

    # TensorBoard: the same values per step
    tb = run_dir(tmp_path) / "tensorboard" / RUN
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    acc = tensorboard_scalars(tb)
    assert METRIC_KEYS - {"step", "run_name"} <= set(acc.Tags()["scalars"])
    ev = acc.Scalars("learning/loss")
    assert [e.step for e in ev] == [0, 1, 2, 3, 4]
    for e, x in zip(ev, losses):
        # the TB value is float32(loss); metrics.jsonl holds %.8g of the double, which can land
        # on the other side of a float32 rounding midpoint, so allow one float32 ulp.
        f = np.float32(x)
        assert abs(np.float32(e.value) - f) <= np.spacing(f), (e.value, x)
    st = acc.Scalars("perf/step_time_seconds")
    assert [e.step for e in st] == [0, 1, 2, 3, 4]
    for e, rec in zip(st, recs):
        assert e.value == pytest.approx(rec["perf/step_time_seconds"], abs=1e-6)


def test_mfu_over_100_percent_is_pointed_out_once(tmp_path):
    # A peak far below what any CPU reaches (as the fp32 peak passed to a bf16 run is): every
    # step's MFU is over 100%, and one line on stderr says which number is wrong.
    for dtype in ("float32", "bfloat16"):
        r = stepscope(tmp_path, "model_name=tiny", "device_peak_tflops=0.00001", "profiler=", "steps=3",
                      f"dtype={dtype}", f"run_name=low_{dtype}")
        assert r.returncode == 0, r.stdout + r.stderr
        said = [l for l in r.stderr.splitlines() if "below what this run reaches" in l]
        assert len(said) == 1, r.stderr
        assert said[0].startswith("stepscope: MFU ") and "at step 0" in said[0], said
        assert "device_peak_tflops=1e-05" in said[0] and f"matmul dtype ({dtype})" in said[0], said
    # the tiny model runs far below a real peak: nothing to say
    r = train(tmp_path, "steps=2", run_name="sane")
    assert "below what this run reaches" not in r.stderr, r.stderr


MACHINE_BUS_RE = re.compile(r"; memory bus (\d+\.\d) GB/s after the steps, (\d+\.\d{3})x the start-up probe's "
                            r"(\d+\.\d)$")


def _machine_line(stdout):
    """The summary's machine line: (probe after, ratio, probe before), its figures checked against
    each other to the printed precision, and the flag against the threshold; it follows the
    memory line. A profiled run's bus part, after the cores', is read by _machine_bus."""
    m = re.search(r"^  machine         probe (\d+\.\d+) TFLOP/s after the steps, (\d+\.\d+)x the start-up "
                  r"probe's (\d+\.\d+)(: the cores' pace moved during the run, so compare its step times with "
                  r"another run's with care)?(; memory bus .*)?$", stdout, re.M)
    assert m, stdout
    after, ratio, before = (float(m.group(i)) for i in (1, 2, 3))
    assert after > 0 and before > 0
    # the probes printed to 4 decimals (0.02 TFLOP/s in the sanitizer build, so up to 0.25% each),
    # the ratio to 3
    slack = after / before * (5e-5 / after + 5e-5 / before) + 5e-4
    assert ratio == pytest.approx(after / before, abs=slack)
    if abs(abs(after / before - 1) - 0.10) > slack:  # clear of the threshold, whatever the rounding
        assert (m.group(4) is not None) == (abs(after / before - 1) > 0.10), stdout
    lines = stdout.splitlines()
    at = next(i for i, l in enumerate(lines) if l.startswith("  machine "))
    assert lines[at - 1].startswith("  other load ") and lines[at - 2].startswith("  memory ")
    return after, ratio, before


def _machine_bus(stdout):
    """The machine line's bus part: (GB/s after, ratio, GB/s before), checked against each other to
    the printed precision; None where the line has none."""
    line = next(l for l in stdout.splitlines() if l.startswith("  machine "))
    m = MACHINE_BUS_RE.search(line)
    if not m:
        assert "memory bus" not in line, line
        return None
    after, ratio, before = float(m.group(1)), float(m.group(2)), float(m.group(3))
    assert after > 0 and before > 0
    slack = after / before * (0.05 / after + 0.05 / before) + 5e-4  # GB/s to 1 decimal, the ratio to 3
    assert ratio == pytest.approx(after / before, abs=slack), line
    return after, ratio, before


OTHER_LOAD_RE = re.compile(r"^  other load      (\d+\.\d\d) cores used by other processes, (\d+\.\d\d) taken by the "
                           r"hypervisor \(steal\), while steps 1\.\.(\d+) ran(: other work held the cores, so these "
                           r"step times are not the machine's alone)?$", re.M)


def test_probe_after_the_steps(tmp_path):
    # machine_probe (on by default) probes the cores before the steps and after them, and the
    # summary gives the ratio: whether the cores' pace held through the run. Beyond a tenth either
    # way the line says so.
    common = ["model_name=tiny", "profiler=", "steps=3"]
    # without device_peak_tflops the start-up probe is the MFU peak too
    r = stepscope(tmp_path, *common, "run_name=probed")
    assert r.returncode == 0, r.stdout + r.stderr
    mfu = re.search(r"^  MFU             \d+\.\d+% of (\d+\.\d+) TFLOP/s$", r.stdout, re.M)
    assert mfu, r.stdout
    after, _, before = _machine_line(r.stdout)
    assert before == float(mfu.group(1))
    summ = json.loads(run_dir(tmp_path, "probed").joinpath("summary.json").read_text())
    assert summ["perf/peak_source"] == "probe" and summ["machine/probe_before_tflops"] == summ["perf/peak_tflops"]
    assert (f"{summ['machine/probe_before_tflops']:.4f}", f"{summ['machine/probe_after_tflops']:.4f}") == \
        (f"{before:.4f}", f"{after:.4f}")
    ratio = summ["machine/probe_after_tflops"] / summ["machine/probe_before_tflops"]
    assert summ["machine/probe_ratio"] == pytest.approx(ratio, rel=1e-8)
    assert summ["machine/probe_moved"] == (abs(ratio - 1) > 0.10)
    # a peak given in device_peak_tflops stays the MFU peak; the first probe is its own, named
    r = stepscope(tmp_path, *common, f"device_peak_tflops={PEAK}", "run_name=fixed")
    assert r.returncode == 0, r.stdout + r.stderr
    first = re.search(r"^device peak: 0\.4460 TFLOP/s \(device_peak_tflops\); the cores probe (\d+\.\d+) TFLOP/s "
                      r"fp32 now \(machine_probe\)$", r.stdout, re.M)
    assert first, r.stdout
    assert _machine_line(r.stdout)[2] == float(first.group(1))
    assert re.search(r"^  MFU             \d+\.\d+% of 0\.4460 TFLOP/s$", r.stdout, re.M), r.stdout
    # machine_probe=false: no probe of its own, no second one, no line
    for peak in ([f"device_peak_tflops={PEAK}"], []):
        r = stepscope(tmp_path, *common, *peak, "machine_probe=false", f"run_name=off{len(peak)}")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "  machine " not in r.stdout and "(machine_probe)" not in r.stdout, r.stdout
    assert "set device_peak_tflops to fix it" in r.stdout  # the peak was still probed


def test_bus_probed_after_the_steps(tmp_path):
    # A profiled run that probed the bus for its op summary probes it again after the steps
    # (machine_probe): the machine line and summary.json give both readings, the op summary's
    # header the closing one beside the one its %bw is read against. The closing probe runs in the
    # run's dead activation and scratch buffers, so the peak RSS an outside reader gets from
    # getrusage stays the run's (mapping its 3 x 256 MiB had added 0.75 GiB to it). 96 x 1024 tokens
    # of the tiny model plan 0.59 GiB of activations and 0.49 of scratch: room for the arrays.
    common = ["model_name=tiny", f"device_peak_tflops={PEAK}", "steps=2", "skip_first_n_steps_for_profiler=1",
              "profiler_steps=1"]
    big = ["per_device_batch_size=96", "max_target_length=1024"]
    env = dict(os.environ)
    env.pop("STEPSCOPE_EVENT_LOG", None)
    cmd = [str(BIN), str(CONFIG), f"base_output_directory={tmp_path / 'out'}", *common, *big, "run_name=bus"]
    # a fresh interpreter runs it, so that its RUSAGE_CHILDREN is this run's alone
    wrapper = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
               "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=180)
    stdout, stderr = r.stdout, r.stderr
    assert r.returncode == 0, stdout + stderr
    start = re.search(r"^memory bandwidth: (\d+\.\d) GB/s on \d+ threads \(probe", stdout, re.M)
    assert start, stdout
    bus = _machine_bus(stdout)
    assert bus is not None, stdout
    after, _, before = bus
    assert before == float(start.group(1))
    assert re.search(rf", memory bandwidth {re.escape(start.group(1))} GB/s \({after:.1f} after the steps\)$",
                     stdout, re.M), stdout
    summ = json.loads(run_dir(tmp_path, "bus").joinpath("summary.json").read_text())
    assert (f"{summ['machine/bus_before_gb_per_s']:.1f}", f"{summ['machine/bus_after_gb_per_s']:.1f}") == \
        (f"{before:.1f}", f"{after:.1f}")
    assert summ["machine/bus_ratio"] == pytest.approx(after / before, rel=0.01)
    op = json.loads(next(run_dir(tmp_path, "bus").glob("tensorboard/plugins/profile/*/op_summary.json")).read_text())
    assert op["peak_gbytes_per_s"] == pytest.approx(summ["machine/bus_before_gb_per_s"], rel=1e-6)
    outside = int(re.search(r"^maxrss_kib (\d+)$", stderr, re.M).group(1)) / 2**20
    assert outside <= summ["memory/peak_rss_gib"] + 0.1, (outside, summ["memory/peak_rss_gib"])
    # a plan too small to hold the arrays (the first command's 0.13 GiB) says so and records none
    r = stepscope(tmp_path, *common, "run_name=small")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "; memory bus not probed again (it runs in the run's activation and scratch buffers, under its " \
        "3 x 256 MiB here)" in r.stdout, r.stdout
    summ = json.loads(run_dir(tmp_path, "small").joinpath("summary.json").read_text())
    assert not any(k.startswith("machine/bus_") for k in summ), summ
    # a bandwidth given is not probed, before or after; nor is anything with machine_probe=false
    for extra, name in ((["device_peak_gb_per_s=50"], "given"), (["machine_probe=false"], "off")):
        r = stepscope(tmp_path, *common, *big, *extra, f"run_name={name}", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "after the steps)" not in r.stdout, r.stdout
        summ = json.loads(run_dir(tmp_path, name).joinpath("summary.json").read_text())
        assert not any(k.startswith("machine/bus_") for k in summ), summ
        if name == "given":
            assert _machine_bus(r.stdout) is None  # and the line names no bus at all
        else:
            assert "  machine " not in r.stdout


def test_other_load_is_pointed_out(tmp_path):
    # a process spinning on a core while the steps run (each step waits 30 ms for its batch, so
    # the spinner has a core to itself): the summary counts it, and says the step times are not
    # the machine's alone
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        r = train(tmp_path, "steps=30", "data_delay_ms=30", run_name="busy")
    finally:
        spinner.kill()
        spinner.wait()
    load = OTHER_LOAD_RE.search(r.stdout)
    assert load, r.stdout
    # ~1 core over ~0.9 s, counted in 10 ms jiffies; our own threads' time is left out
    assert float(load.group(1)) >= 0.5 and load.group(4), load.group(0)
    summ = json.loads((run_dir(tmp_path, "busy") / "summary.json").read_text())
    assert summ["machine/other_load"] is True and summ["machine/others_cores"] >= 0.5


def test_summary_json_follows_its_run(tmp_path):
    # A run with no summary (one step) removes an earlier run's summary.json under its name, which
    # would otherwise pass for its own; with metrics_file it sits beside the named file.
    train(tmp_path, "steps=2")
    assert (run_dir(tmp_path) / "summary.json").exists()
    r = train(tmp_path, "steps=1")
    assert "run 2 steps or more for a summary without the first (step 0)" in r.stdout
    assert not (run_dir(tmp_path) / "summary.json").exists()
    assert "summary.json" not in r.stdout
    m = tmp_path / "m" / "x.jsonl"
    r = train(tmp_path, "steps=3", f"metrics_file={m}", "enable_tensorboard=false", run_name="named")
    summ = json.loads((tmp_path / "m" / "x.summary.json").read_text())
    assert summ["run_name"] == "named" and summ["steps_logged"] == 3
    assert f"  {tmp_path / 'm' / 'x.summary.json'}" in r.stdout.splitlines()
    assert sorted(x.name for x in (tmp_path / "m").iterdir()) == ["x.jsonl", "x.summary.json"]


# ---- 3. refusals ------------------------------------------------------------------------------

def test_refuses_unknown_key(tmp_path):
    r = stepscope(tmp_path, *FAST, "learning_rat=1")
    assert_refused(r, tmp_path, "learning_rat", "did you mean", "learning_rate")
    assert r.stdout == ""


@pytest.mark.parametrize("arg,needles", [
    ("steps=0", ["steps=0", "out of range", ">= 1"]),
    ("steps=abc", ["'abc'", "steps", "not an integer"]),
    ("learning_rate=nan", ["'nan'", "learning_rate", "not a finite number"]),
    ("learning_rate=-1", ["learning_rate", "out of range"]),
    ("device_peak_gb_per_s=-5", ["device_peak_gb_per_s=-5", "out of range", ">= 0"]),
    ("device_peak_gb_per_s=fast", ["'fast'", "device_peak_gb_per_s", "not a finite number"]),
    ("dtype=int8", ["'int8'", "dtype", "float32"]),
    ("adam_b1=1", ["adam_b1", "out of range", "[0, 1)"]),
    ("use_qk_norm=maybe", ["use_qk_norm", "not a bool"]),
    ("dataset_type=parquet", ["dataset_type=parquet", "not allowed", "synthetic"]),
    ("remat_policy=some", ["remat_policy=some", "not allowed", "minimal"]),
    ("gemm_library=blis", ["gemm_library=blis", "not allowed", "onednn"]),
    ("num_threads=100000", ["num_threads", "out of range", "[0, 1025)"]),
    ("stepsx", ["malformed override", "key=value"]),
    # run_name is a folder under base_output_directory: never above it (".." had written there)
    ("run_name=..", ["run_name=..", "outside base_output_directory"]),
    ("run_name=a/../b", ["run_name=a/../b", "outside base_output_directory"]),
    ("run_name=/tmp/x", ["run_name=/tmp/x", "outside base_output_directory"]),
    ("run_name=a//b", ["run_name=a//b", "no part empty"]),
])
def test_refuses_bad_values(tmp_path, arg, needles):
    r = stepscope(tmp_path, *FAST, arg)
    assert_refused(r, tmp_path, *needles)
    assert r.stdout == ""


def test_refuses_heads_not_divisible(tmp_path):
    r = stepscope(tmp_path, "model_name=default", f"device_peak_tflops={PEAK}",
                  "base_num_query_heads=6", "base_num_kv_heads=4")
    assert_refused(r, tmp_path, "base_num_query_heads=6", "base_num_kv_heads=4", "multiple")


def test_refuses_profiler_window_past_last_step(tmp_path):
    r = stepscope(tmp_path, "model_name=tiny", f"device_peak_tflops={PEAK}", "profiler=xplane", "steps=3",
                  "skip_first_n_steps_for_profiler=3")
    assert_refused(r, tmp_path, "skip_first_n_steps_for_profiler=3", "steps=3")


def test_preset_keys_need_override_model_config(tmp_path):
    r = stepscope(tmp_path, "model_name=qwen3-0.6b", "base_emb_dim=512", "--dry-run")
    assert_refused(r, tmp_path, "base_emb_dim", "qwen3-0.6b", "override_model_config=true")
    assert r.stdout == ""
    r = stepscope(tmp_path, "model_name=qwen3-0.6b", "base_emb_dim=512", "override_model_config=true",
                  "memory_limit_gib=4096", "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = parse_plan(r.stdout)
    assert plan["base_emb_dim"] == "512" and " D=512 " in plan["shape"]
    assert int(plan["num_parameters"]) == qwen3_params(**dict(shape_of("qwen3-0.6b"), D=512))
    assert list(tmp_path.iterdir()) == []


def test_refuses_missing_config_file(tmp_path):
    r = stepscope(tmp_path, *FAST, config=tmp_path / "nope.yml")
    assert_refused(r, tmp_path, "nope.yml", "No such file")
    r = stepscope(tmp_path, *FAST, config=None)
    assert_refused(r, tmp_path, "no config file")


def test_refuses_unknown_preset(tmp_path):
    r = stepscope(tmp_path, "model_name=qwen9-1t", f"device_peak_tflops={PEAK}")
    assert_refused(r, tmp_path, "qwen9-1t", "not found", "tiny", "qwen3-0.6b")


def test_refuses_unknown_option(tmp_path):
    r = stepscope(tmp_path, *FAST, "--dryrun")
    assert_refused(r, tmp_path, "--dryrun")


def test_refuses_memory_plan_over_budget(tmp_path):
    # a budget smaller than the tiny plan: refused before anything is written, with a fix that
    # can work for what is over: the batch's activations, the AdamW state (more ranks shard it),
    # or the parameters and gradients (every rank keeps them whole: only a smaller model)
    r = stepscope(tmp_path, "model_name=tiny", "memory_limit_gib=4096", "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = {k: int(v) for k, v in parse_plan(r.stdout).items() if k.startswith("memory_") and k.endswith("_bytes")}
    whole = plan["memory_parameters_bytes"] + plan["memory_bf16_weights_bytes"] + plan["memory_gradients_bytes"]
    state = whole + plan["memory_optimizer_state_bytes"]
    total = plan["memory_total_bytes"]
    assert whole < state < total
    gib = lambda b: f"memory_limit_gib={b / 2**30:.9f}"
    # over by the batch's part: smaller batches, shorter sequences or remat can fit it
    between = gib((state + total) // 2)
    r = stepscope(tmp_path, *FAST, between)
    assert_refused(r, tmp_path, "memory plan", "per_device_batch_size", "remat_policy=full")
    # a dry run prints the plan, then refuses the same way
    r = stepscope(tmp_path, "model_name=tiny", between, "--dry-run")
    assert_refused(r, tmp_path, "memory plan", "per_device_batch_size", "remat_policy=full")
    plan_again = parse_plan(r.stdout)
    assert int(plan_again["memory_total_bytes"]) > int(plan_again["memory_available_bytes"])
    # with remat already full it does not suggest remat
    r = stepscope(tmp_path, "model_name=tiny", between, "remat_policy=full", "--dry-run")
    assert_refused(r, tmp_path, "memory plan", "per_device_batch_size")
    assert "remat_policy" not in r.stderr
    # over by the AdamW state: no batch fits, more ranks do
    r = stepscope(tmp_path, *FAST, gib((whole + state) // 2))
    assert_refused(r, tmp_path, "memory plan", "AdamW state alone", "whatever the batch", "ici_fsdp_parallelism")
    assert "per_device_batch_size" not in r.stderr
    # over by less than a bf16 first moment saves: mu_dtype=bfloat16 is named, and fits
    n = qwen3_params(**shape_of("tiny"))
    near = gib(total - n)  # the bf16 moment saves 2 bytes a parameter
    r = stepscope(tmp_path, "model_name=tiny", near, "--dry-run")
    assert_refused(r, tmp_path, "memory plan", "or set mu_dtype=bfloat16 (AdamW's first moment in bf16:")
    assert stepscope(tmp_path, "model_name=tiny", near, "mu_dtype=bfloat16", "--dry-run").returncode == 0
    assert "mu_dtype" not in stepscope(tmp_path, *FAST, between).stderr  # not where it would not fit
    # weight_dtype=bfloat16 (bf16 parameters and moments) likewise, with the plan it would have
    w16 = int(parse_plan(stepscope(tmp_path, "model_name=tiny", "dtype=bfloat16", "weight_dtype=bfloat16",
                                   "--dry-run").stdout)["memory_total_bytes"])
    r = stepscope(tmp_path, "model_name=tiny", "dtype=bfloat16", gib(w16 + 4096), "--dry-run")
    assert_refused(r, tmp_path, "memory plan", "or set weight_dtype=bfloat16 (bf16 parameters and AdamW state: a "
                   f"plan of {w16 / 2**30:.2f} GiB)")
    assert stepscope(tmp_path, "model_name=tiny", gib(w16 + 4096), "dtype=bfloat16", "weight_dtype=bfloat16",
                     "--dry-run").returncode == 0
    r = stepscope(tmp_path, "model_name=tiny", "dtype=bfloat16", gib(w16 - 4096), "--dry-run")
    assert r.returncode == 2 and "weight_dtype" not in r.stderr, r.stderr  # not where it would not fit
    # and from fp32 matmuls it names dtype=bfloat16 with it (qwen3-1.7b, whose state alone is over)
    big = ("model_name=qwen3-1.7b", "per_device_batch_size=1", "max_target_length=1024")
    r = stepscope(tmp_path, *big, "memory_limit_gib=21", "--dry-run")
    plan16 = parse_plan(stepscope(tmp_path, *big, "weight_dtype=bfloat16", "dtype=bfloat16", "--dry-run").stdout)
    gib16 = int(plan16["memory_total_bytes"]) / 2**30
    assert 19 < gib16 < 21
    assert_refused(r, tmp_path, "memory plan", "AdamW state alone", "or set weight_dtype=bfloat16 dtype=bfloat16 "
                   f"(bf16 parameters and AdamW state: a plan of {gib16:.2f} GiB)")
    # over by the parameters and gradients: neither a batch nor ranks fit it
    r = stepscope(tmp_path, *FAST, gib(whole // 2))
    assert_refused(r, tmp_path, "memory plan", "gradients alone", "smaller model_name")
    assert "per_device_batch_size" not in r.stderr and "ici_fsdp_parallelism" not in r.stderr


def test_refuses_qwen3_32b_on_this_machine(tmp_path):
    # 32B parameters and their gradients in fp32 are 244 GiB: over any test machine's memory,
    # whatever the batch or the ranks
    r = stepscope(tmp_path, "model_name=qwen3-32b", "--dry-run")
    plan = parse_plan(r.stdout)
    if r.returncode == 0 and int(plan["memory_total_bytes"]) <= int(plan["memory_available_bytes"]):
        pytest.skip("this machine has the memory for qwen3-32b")
    assert_refused(r, tmp_path, "memory plan", "gradients alone", "smaller model_name")
    assert "memory_total_bytes:" in r.stdout


# ---- 4. token files and determinism -----------------------------------------------------------

def write_tokens(path, ids):
    np.asarray(ids, dtype="<u4").tofile(path)
    return path


def test_token_file_run(tmp_path):
    rng = np.random.default_rng(0)
    f = write_tokens(tmp_path / "ids.bin", rng.integers(0, 256, size=3000))
    r = train(tmp_path, "steps=3", "dataset_type=tokens", f"dataset_path={f}")
    recs, lines = read_metrics(tmp_path)
    assert [x["step"] for x in recs] == [0, 1, 2]
    assert all(math.isfinite(x["learning/loss"]) for x in recs)
    # a different data source: the losses differ from the synthetic run's
    train(tmp_path, "steps=3", run_name="syn")
    _, syn = read_metrics(tmp_path, "syn")
    assert raw_losses(lines) != raw_losses(syn)


def test_token_file_id_out_of_vocab(tmp_path):
    ids = np.arange(3000) % 256
    ids[1234] = 256
    f = write_tokens(tmp_path / "ids.bin", ids)
    r = stepscope(tmp_path, *FAST, "dataset_type=tokens", f"dataset_path={f}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "vocab_size 256" in r.stderr and "id 256" in r.stderr and "index 1234" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    assert "set-up:" not in r.stdout   # said before set-up touches the plan's buffers


def test_token_file_too_short(tmp_path):
    f = write_tokens(tmp_path / "ids.bin", np.arange(256) % 256)   # one window needs S+1 = 257
    r = stepscope(tmp_path, *FAST, "dataset_type=tokens", f"dataset_path={f}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "256 tokens" in r.stderr and "257" in r.stderr and "max_target_length" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    g = tmp_path / "odd.bin"
    g.write_bytes(b"\x01\x00\x00\x00" * 300 + b"\x00\x00")
    r = stepscope(tmp_path, *FAST, "dataset_type=tokens", f"dataset_path={g}")
    assert r.returncode == 1 and "not a multiple of 4" in r.stderr, r.stderr
    r = stepscope(tmp_path, *FAST, "dataset_type=tokens", f"dataset_path={tmp_path / 'missing.bin'}")
    assert r.returncode == 1 and "missing.bin" in r.stderr, r.stderr
    assert "set-up:" not in r.stdout   # said before set-up, which takes minutes for a large model
    # dataset_type=tokens without a path is a config error
    r = stepscope(tmp_path, *FAST, "dataset_type=tokens")
    assert r.returncode == 2 and "dataset_path" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_metrics_json_escapes_run_name(tmp_path):
    name = 'q"b\\c'
    train(tmp_path, "steps=1", run_name=name)
    recs, _ = read_metrics(tmp_path, name)
    assert recs[0]["run_name"] == name


def test_runs_are_deterministic(tmp_path):
    train(tmp_path, "steps=4", run_name="a")
    train(tmp_path, "steps=4", run_name="b")
    _, a = read_metrics(tmp_path, "a")
    _, b = read_metrics(tmp_path, "b")
    assert raw_losses(a) == raw_losses(b)
    ga = [re.search(r'"learning/raw_grad_norm": ([^,]+),', l).group(1) for l in a]
    gb = [re.search(r'"learning/raw_grad_norm": ([^,]+),', l).group(1) for l in b]
    assert ga == gb
    # a different data_seed changes them
    train(tmp_path, "steps=4", "data_seed=1", run_name="c")
    _, c = read_metrics(tmp_path, "c")
    assert raw_losses(c) != raw_losses(a)


def test_gemm_library_choice(tmp_path):
    """gemm_library=onednn always runs; mkl names the library it loaded or, where it cannot load
    one, says so in one line and exits non-zero; auto falls back to oneDNN. Both libraries
    train the same model to the same loss within fp32 summation-order noise."""
    r = train(tmp_path, "steps=3", "gemm_library=onednn", run_name="dnn")
    assert "matmul library: onednn" in r.stdout
    missing = {"STEPSCOPE_MKL_LIBRARY": str(tmp_path / "no-such-libmkl_rt.so")}
    r = stepscope(tmp_path, *FAST, "steps=2", "gemm_library=mkl", env_extra=missing)
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "gemm_library=mkl" in lines[0] and "STEPSCOPE_MKL_LIBRARY" in lines[0], r.stderr
    r = train(tmp_path, "steps=2", "gemm_library=auto", env_extra=missing, run_name="fallback")
    assert "matmul library: onednn" in r.stdout
    r = stepscope(tmp_path, *FAST, "steps=3", "gemm_library=mkl", "run_name=mkl")
    if r.returncode != 0:
        assert "gemm_library=mkl" in r.stderr
        pytest.skip("MKL not installed here: " + r.stderr.strip())
    assert re.search(r"matmul library: mkl \(.*libmkl_rt", r.stdout), r.stdout
    _, dnn = read_metrics(tmp_path, "dnn")
    _, mkl = read_metrics(tmp_path, "mkl")
    # Same maths, different summation order: fp32 rounding (~1e-6 relative per product) grows
    # through 3 steps of training to well under 1e-4 of a loss near 5.
    assert len(raw_losses(dnn)) == len(raw_losses(mkl)) == 3
    for a, b in zip(map(float, raw_losses(dnn)), map(float, raw_losses(mkl))):
        assert abs(a - b) <= 1e-4 * abs(a), (a, b)


def assert_same_bits(tmp_path, run_a, run_b):
    """Two runs' losses and gradient norms, compared as the exact decimal text written."""
    _, a = read_metrics(tmp_path, run_a)
    _, b = read_metrics(tmp_path, run_b)
    assert raw_losses(a) == raw_losses(b)
    assert [json.loads(l)["learning/raw_grad_norm"] for l in a] == [json.loads(l)["learning/raw_grad_norm"] for l in b]


def test_thread_count_does_not_change_results(tmp_path):
    rng = np.random.default_rng(1)
    f = write_tokens(tmp_path / "ids.bin", rng.integers(0, 256, size=5000))
    for n in (1, 2):
        train(tmp_path, "steps=4", f"num_threads={n}", run_name=f"t{n}")
        train(tmp_path, "steps=3", f"num_threads={n}", "dataset_type=tokens", f"dataset_path={f}",
              run_name=f"k{n}")
    assert_same_bits(tmp_path, "t1", "t2")
    assert_same_bits(tmp_path, "k1", "k2")


def test_more_threads_than_cores_is_pointed_out(tmp_path):
    # allowed, but its step times are not the machine's: one line on stderr says why
    cores = len(os.sched_getaffinity(0))
    r = train(tmp_path, "steps=2", f"num_threads={cores + 1}", run_name="over")
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: "), r.stderr
    assert f"num_threads={cores + 1} is more than the {cores} core" in lines[0] and "num_threads=0" in lines[0], r.stderr
    r = train(tmp_path, "steps=2", "num_threads=1", run_name="fits")
    assert "is more than" not in r.stderr, r.stderr


def test_thread_count_does_not_change_results_at_real_width(tmp_path):
    """The tiny model's matmuls are too small for a library to split them by thread count;
    qwen3-0.6b's widths (2 layers, 8192-token vocabulary, 512 tokens) are not. MKL without its
    strict reproducible mode gave gradient norms that differed in the 8th digit between 1 and
    2 threads here; every library must give the same bits."""
    args = ["model_name=qwen3-0.6b", "override_model_config=true", "base_num_decoder_layers=2",
            "vocab_size=8192", "per_device_batch_size=1", "max_target_length=512", "steps=2",
            f"device_peak_tflops={PEAK}", "profiler="]
    for n in (1, 2):
        r = stepscope(tmp_path, *args, f"num_threads={n}", f"run_name=w{n}", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    assert_same_bits(tmp_path, "w1", "w2")


def test_row_padding_layouts(tmp_path):
    """row_padding picks the activations' row strides, not the maths or the plan: dense and
    padded train the tiny model to the same losses within fp32 summation-order noise (a library
    may order a product's sums by stride; three steps keep that far under 1e-5 of a loss near
    5), the plan is the same for all three values, the console names the layout that ran, and
    auto runs one of the two, bit for bit."""
    plans = {}
    for rows in ("dense", "padded", "auto"):
        r = train(tmp_path, "steps=3", f"row_padding={rows}", run_name=rows)
        m = re.search(r"^activation rows: (dense|padded)[^\n]*\(row_padding=(\w+)\)$", r.stdout, re.M)
        assert m and m.group(2) == rows, r.stdout
        assert rows == "auto" or m.group(1) == rows, r.stdout
        d = stepscope(tmp_path, *FAST, f"row_padding={rows}", "--dry-run")
        assert d.returncode == 0, d.stderr
        plans[rows] = parse_plan(d.stdout)["memory_total_bytes"]
    assert plans["dense"] == plans["padded"] == plans["auto"]
    raw = {rows: raw_losses(read_metrics(tmp_path, rows)[1]) for rows in ("dense", "padded", "auto")}
    for a, b in zip(map(float, raw["dense"]), map(float, raw["padded"])):
        assert abs(a - b) <= 1e-5 * abs(a), (a, b)
    assert raw["auto"] in (raw["dense"], raw["padded"])


def test_row_padding_console_names_the_padded_activations(tmp_path):
    """Under row_padding=auto the console names the layout from the strides that ran: dense,
    every activation padded, or "padded where N floats or wider (...)" naming exactly the
    activations at least N wide. A tiny model with a 4096-wide gate/up output (2 x 2048) puts
    that one over the 4096 threshold of oneDNN's matmul primitive (AVX-512) and the rest under
    it; other CPUs run it dense (MKL) or all padded (the AVX2 gemm driver)."""
    dims = {"D": 64, "attention output": 4 * 16, "F": 2048, "q/k/v": (4 + 2 * 2) * 16, "gate/up": 2 * 2048}
    r = train(tmp_path, "steps=1", "override_model_config=true", "base_mlp_dim=2048", "row_padding=auto")
    m = re.search(r"^activation rows: (.*) \(row_padding=auto\)$", r.stdout, re.M)
    assert m, r.stdout
    line = m.group(1)
    partial = re.fullmatch(r"padded where (\d+) floats or wider \((.*), 64 bytes wider\), the rest dense", line)
    if partial:
        names = {"D": "residual stream", "F": "SwiGLU output"}
        wide = [names.get(k, k) for k, w in dims.items() if w >= int(partial.group(1))]
        assert partial.group(2).split(", ") == wide, line
    else:
        assert line in ("dense", "padded, 64 bytes wider than their width"), line


def test_step_ab_bench(tmp_path):
    """build/bench/step_ab alternates two configurations' steps in one process: it prints every
    round, the medians, and the last losses, which a layout-only difference leaves equal to
    fp32 noise."""
    tool = BIN.parent / "bench" / "step_ab"
    if not tool.exists():
        pytest.skip(f"{tool} not built (make bench)")
    r = subprocess.run([str(tool), "3", "2", "row_padding=dense", "row_padding=padded", "model_name=tiny"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(re.findall(r"^\s+\d+\s+(AB|BA)\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+$", r.stdout, re.M)) == 3, r.stdout
    assert re.search(r"^median step: A \d+\.\d+ s, B \d+\.\d+ s; A/B per round: median \d+\.\d+", r.stdout, re.M)
    m = re.search(r"^last losses: A (\S+), B (\S+)$", r.stdout, re.M)
    assert m, r.stdout
    a, b = float(m.group(1)), float(m.group(2))
    assert abs(a - b) <= 1e-5 * abs(a), (a, b)
    bad = subprocess.run([str(tool), "0", "2", "", ""], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "ROUNDS" in bad.stderr


def test_adamw_cores_bench():
    """build/bench/adamw_cores prints the update's rate on all threads and on one, their ratio as
    the two figures give it, and (on a CPU with a bf16 matmul unit) the rate beside a matmul with
    the overlap estimate; bad arguments exit 2 with the usage."""
    tool = BIN.parent / "bench" / "adamw_cores"
    if not tool.exists():
        pytest.skip(f"{tool} not built (make bench)")
    r = subprocess.run([str(tool), "2", "1", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"^  2 threads: (\d+\.\d) GB/s; 1 thread: (\d+\.\d) GB/s \((\d+\.\d\d) of 2 threads\)$", r.stdout, re.M)
    assert m, r.stdout
    both, one, ratio = map(float, m.groups())
    assert both > 0 and one > 0 and abs(one / both - ratio) <= 0.01 + 0.1 / both, r.stdout
    if "no bf16 matmul unit" not in r.stdout:
        assert re.search(r"^  1 thread beside a bf16 matmul on 1: \d+\.\d GB/s .* the matmul \d+ GFLOP/s beside it, "
                         r"\d+ alone", r.stdout, re.M), r.stdout
        assert re.search(r"^  overlap estimate: the update's cost would be -?\d+\.\d\d of its time", r.stdout, re.M)
    bad = subprocess.run([str(tool), "1"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage: adamw_cores" in bad.stderr


# ---- 5. the loss of step N is read only after step N+1 has started ----------------------------

def test_loss_read_one_step_late(tmp_path):
    log = tmp_path / "events.txt"
    train(tmp_path, "steps=4", env_extra={"STEPSCOPE_EVENT_LOG": str(log)})
    events = log.read_text().splitlines()
    assert sorted(events) == sorted([f"start {i}" for i in range(4)] + [f"read {i}" for i in range(4)]), events
    pos = {e: i for i, e in enumerate(events)}
    for n in range(3):
        assert pos[f"read {n}"] > pos[f"start {n + 1}"], events
    assert pos["read 3"] > pos["start 3"], events
    # reads in order, starts in order
    assert [e for e in events if e.startswith("read")] == [f"read {i}" for i in range(4)]
    assert [e for e in events if e.startswith("start")] == [f"start {i}" for i in range(4)]


# ---- 6. data prefetch -------------------------------------------------------------------------

def test_slow_data_wait_is_visible(tmp_path):
    # The producer needs 150 ms per batch and starts batch N as soon as batch N-1 is handed over,
    # so step N waits 150 ms minus step N-1's compute: wait[N] + compute[N-1] >= 150 ms, where
    # compute = step time - wait. On an idle machine a step is ~10 ms and the wait ~140 ms; on an
    # oversubscribed one the step takes longer and the wait shrinks to match, never vanishes.
    train(tmp_path, "steps=5", "data_delay_ms=150", run_name="slow")
    recs, _ = read_metrics(tmp_path, "slow")
    waits = [rec["perf/data_wait_seconds"] for rec in recs]
    times = [rec["perf/step_time_seconds"] for rec in recs]
    assert all(t >= w for t, w in zip(times, waits)), (times, waits)
    for n in range(1, 5):
        compute_before = times[n - 1] - waits[n - 1]
        if compute_before < 0.1:                            # a busy machine can stretch it past 150 ms
            assert waits[n] >= 0.05, waits                  # visible, not hidden in the step
        assert waits[n] + compute_before >= 0.14, (n, times, waits)
    # the run cannot go faster than the data: 5 batches at 150 ms each
    assert sum(times) >= 5 * 0.15 - 0.05, times


def test_xprof_finds_a_slow_data_run_input_bound(tmp_path):
    """The data wait reaches XProf as input time: its overview page calls the run input-bound by
    the share of the step the op summary gives the data row, and each step's input time is that
    step's wait in the Chrome trace."""
    train(tmp_path, "steps=4", "data_delay_ms=150", "profiler=xplane", "skip_first_n_steps_for_profiler=1",
          "profiler_steps=2")
    try:
        from xprof.convert import raw_to_tool_data
    except Exception as e:
        pytest.skip(f"xprof not importable: {e!r}")
    (prof,) = (run_dir(tmp_path) / "tensorboard" / "plugins" / "profile").iterdir()
    summ = json.loads((prof / "op_summary.json").read_text())
    share = next(r["share"] for r in summ["rows"] if r["category"] == "data" and not r["part"])
    assert share > 0.3, summ["rows"]      # 150 ms of data against a ~10 ms step
    path = str(next(prof.glob("*.xplane.pb")))
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    verdict = next(t["p"]["input_conclusion"] for t in json.loads(data) if "input_conclusion" in t.get("p", {}))
    m = re.search(r"input-bound because (\d+\.\d)% of the total step time sampled is waiting for input", verdict)
    assert m and "NOT" not in verdict and float(m[1]) == pytest.approx(100 * share, abs=0.06), verdict
    events = json.loads(gzip.decompress(next(prof.glob("*.trace.json.gz")).read_bytes()))["traceEvents"]
    check_xprof_op_tables(raw_to_tool_data, path, events, summ)


def test_fast_data_is_prefetched(tmp_path):
    train(tmp_path, "steps=4", "data_delay_ms=0", run_name="fast")
    recs, _ = read_metrics(tmp_path, "fast")
    waits = [rec["perf/data_wait_seconds"] for rec in recs[1:]]
    assert all(w < 0.01 for w in waits), waits


# ---- 7. profiler ------------------------------------------------------------------------------

def test_profile_files(tmp_path):
    r = stepscope(tmp_path, "model_name=tiny", f"device_peak_tflops={PEAK}", f"run_name={RUN}", "steps=5",
                  "profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=2")
    assert r.returncode == 0, r.stdout + r.stderr
    prof = run_dir(tmp_path) / "tensorboard" / "plugins" / "profile"
    dirs = list(prof.iterdir())
    assert len(dirs) == 1 and re.fullmatch(r"\d{4}_\d{2}_\d{2}_\d{2}_\d{2}_\d{2}", dirs[0].name), dirs
    files = sorted(p.name for p in dirs[0].iterdir())
    xplanes = [n for n in files if n.endswith(".xplane.pb")]
    assert len(xplanes) == 1, files
    host = xplanes[0][:-len(".xplane.pb")]
    assert host and "/" not in host and ":" not in host
    assert files == sorted([f"{host}.xplane.pb", f"{host}.trace.json.gz", "op_summary.json"])
    for n in files:
        assert str(dirs[0] / n) in r.stdout        # listed under "files written:"

    # Chrome trace: gzip JSON, two "train" spans for steps 1 and 2, X events nest per thread
    doc = json.loads(gzip.decompress((dirs[0] / f"{host}.trace.json.gz").read_bytes()))
    events = doc["traceEvents"]
    trains = sorted((e for e in events if e.get("name") == "train"), key=lambda e: e["ts"])
    assert len(trains) == 2 and all(e["ph"] == "X" for e in trains)
    assert [e["args"]["step_num"] for e in trains] == [1, 2]
    assert len({e["tid"] for e in trains}) == 1
    by_tid = {}
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            by_tid.setdefault(e["tid"], []).append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    assert len(by_tid) >= 2          # the compute lane and the data lane
    for tid, spans in by_tid.items():
        assert nested(spans), f"thread {tid}: X events overlap partially"
    # every X event on the compute lane lies inside one of the two train spans
    t0 = trains[0]["tid"]
    windows = [(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in trains]
    for b, e in by_tid[t0]:
        assert any(wb <= b and e <= we for wb, we in windows), (b, e)

    summ = json.loads((dirs[0] / "op_summary.json").read_text())
    assert summ["first_step"] == 1 and summ["last_step"] == 2 and summ["num_steps"] == 2
    # every kernel row with flops has its calls' spread, slowest tenth at or below the fastest
    rated = [row for row in summ["rows"] if row["flops"] > 0 and not row["category"].startswith("total")]
    assert any(row["category"] == "matmul" for row in rated)
    for row in rated:
        assert 0 < row["gflops_p10"] <= row["gflops_p90"], row
    # the picture of it: an SVG with one labelled bar per op kind, no more wide than the step
    svg_path = tmp_path / "op_summary.svg"
    subprocess.run([sys.executable, str(ROOT / "tools" / "op_summary_svg.py"), str(dirs[0] / "op_summary.json"),
                    str(svg_path)], check=True)
    import xml.etree.ElementTree as ET
    root = ET.parse(svg_path).getroot()
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    kinds = {r["category"] for r in summ["rows"] if not r["part"] and not r["category"].startswith("total")}
    assert kinds <= set(texts) and "matmul" in kinds
    # rows without counted arithmetic are labelled with the bus's figures instead
    assert any(re.fullmatch(r"\d+\.\d GB/s, \d+% of bandwidth", t or "") for t in texts), texts
    bars = [float(r.get("width")) for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill-opacity")]
    assert bars and all(0 <= w <= 420 for w in bars)
    # --peak-gb-per-s reads every row's GB/s against another bandwidth: twice the run's halves each %
    given = summ["peak_gbytes_per_s"]
    subprocess.run([sys.executable, str(ROOT / "tools" / "op_summary_svg.py"), str(dirs[0] / "op_summary.json"),
                    str(svg_path), "--peak-gb-per-s", str(2 * given)], check=True)
    texts2 = [t.text for t in ET.parse(svg_path).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert f"memory bandwidth {2 * given:.1f} GB/s" in " ".join(t or "" for t in texts2)
    for row in summ["rows"]:
        if row["flops"] == 0 and row["bytes"] > 0 and not row["category"].startswith(("total", "other")):
            assert f"{row['gbytes_per_s']:.1f} GB/s, {row['pct_bandwidth'] / 2:.0f}% of bandwidth" in texts2, row

    # each matmul form step by step (tools/matmul_forms.py): one row per form, a rate per
    # profiled step, and the overall rate as its flops over its time in the trace
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "matmul_forms.py"), str(run_dir(tmp_path))],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    assert re.search(r"peak \d+\.\d GFLOP/s$", out[0]), out[0]
    assert re.search(r"\bstep 1\s+step 2\s+all\s+% of peak$", out[1]), out[1]
    mm = [e for e in events if e["ph"] == "X" and e.get("cat") == "matmul"]
    forms = sorted({e["name"] for e in mm})
    rows = {line.rsplit("]", 1)[0] + "]": line.rsplit("]", 1)[1].split() for line in out[3:]}
    assert sorted(rows) == forms, (sorted(rows), forms)
    name = forms[0]
    calls = [e for e in mm if e["name"] == name]
    want = sum(e["args"]["flops"] for e in calls) / sum(e["dur"] for e in calls) / 1e3
    calls_per_step, ms_per_step, g1, g2, g_all, pct = rows[name]
    assert int(calls_per_step) == len(calls) // 2 and float(ms_per_step) > 0
    assert abs(float(g_all) - want) <= 0.5 + 1e-9 * want, (g_all, want)
    assert float(pct) == pytest.approx(100 * want / summ["peak_gflops"], abs=0.06)

    # console: the op summary table
    assert "op summary, profiled steps 1..2:" in r.stdout
    assert re.search(r"^category\s+part\s+calls\s+total ms.*p10-p90 GFLOP/s\s+GB/s\s+%bw$", r.stdout, re.M)
    assert re.search(r"^matmul\s.*\s\d+-\d+\s+\d+\.\d\s+\d+%$", r.stdout, re.M)  # its spread, p10-p90, GB/s, %bw
    assert re.search(r"^total \(train steps\)\s+2\s", r.stdout, re.M)
    # metrics still cover every step
    recs, _ = read_metrics(tmp_path)
    assert [x["step"] for x in recs] == [0, 1, 2, 3, 4]

    # XProf's own reader, when installed
    try:
        from xprof.convert import raw_to_tool_data
    except Exception as e:
        pytest.skip(f"xprof not importable: {e!r}")
    path = str(dirs[0] / f"{host}.xplane.pb")
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    tables = json.loads(data)
    step_table = next(t for t in tables if any(c.get("id") == "stepnum" for c in t.get("cols", [])))
    assert [row["c"][0]["v"] for row in step_table["rows"]] == ["train 1", "train 2"]
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})
    trace = json.loads(data)
    names = {ev.get("args", {}).get("step_name") or ev.get("name") for ev in trace["traceEvents"]}
    assert {n for n in names if isinstance(n, str) and re.fullmatch(r"train \d+", n)} == {"train 1", "train 2"}
    # the kernels' bytes reach its trace viewer as an arg (flops it hides: IsInternalStat)
    matmuls = [ev for ev in trace["traceEvents"] if str(ev.get("name", "")).startswith("matmul ")]
    assert matmuls and all(int(ev["args"]["bytes_accessed"]) > 0 for ev in matmuls)
    # and its current viewer (the tool the UI lists, "trace_viewer@") draws the "_counters_" line
    # as the two rate tracks, a sample at each kernel's start and end
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer@", {})
    tracks = {ev["name"]: ev["entries"] for ev in json.loads(data)["traceEvents"] if ev.get("ph") == "C"}
    assert set(tracks) == {"compute lane GFLOP/s", "compute lane GB/s"}
    assert len(tracks["compute lane GB/s"]) >= len(matmuls) and max(v for _, v in tracks["compute lane GFLOP/s"]) > 0
    check_xprof_op_tables(raw_to_tool_data, path, events, summ)
    check_xprof_memory_profile(raw_to_tool_data, path, tmp_path, "model_name=tiny")


def check_xprof_memory_profile(raw_to_tool_data, path, tmp_path, *config):
    """XProf's memory profile shows the memory plan --dry-run prints: one allocation a buffer with
    its bytes, in use together from the window's start (their sum the peak, the memory available
    the capacity), none freed."""
    r = stepscope(tmp_path, *config, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    plan = {k: int(v) for k, v in re.findall(r"^memory_(\w+)_bytes: (\d+)$", r.stdout, re.M)}
    names = {"parameters": "parameters", "bf16_weights": "bf16 weights", "gradients": "gradients",
             "optimizer_state": "optimizer state", "saved_activations": "saved activations", "scratch": "scratch",
             "data_ring": "data rings"}
    want = {names[k]: v for k, v in plan.items() if k in names and v > 0}
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "memory_profile", {})
    (allocator,) = json.loads(data)["memoryProfilePerAllocator"].values()
    snaps = allocator["memoryProfileSnapshots"]
    assert {s["activityMetadata"]["tfOpName"]: int(s["activityMetadata"]["allocationBytes"]) for s in snaps} == want
    assert len(snaps) == len(want) and all(s["activityMetadata"]["memoryActivity"] == "ALLOCATION" for s in snaps)
    summary = allocator["profileSummary"]
    assert int(summary["peakStats"]["heapAllocatedBytes"]) == plan["total"] == sum(want.values())
    assert int(summary["memoryCapacity"]) == plan["available"]


def check_xprof_op_tables(raw_to_tool_data, path, events, summ):
    """XProf's host op table (framework_op_stats) lists the compute lane's kernels, one row a
    "<part>/<name>" with its category as the op type, the calls and times the Chrome trace has;
    the self times add up to the op summary's kernel time. Its step breakdown counts the data
    wait as input."""
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "framework_op_stats", {})
    table = json.loads(data)[0]   # the ops of host and device; a second table leaves out IDLE
    ids = [c["id"] for c in table["cols"]]
    rows = [dict(zip(ids, (c.get("v") for c in row["c"]))) for row in table["rows"]]
    # an op is "<part>/<name>", and no part has a "/"
    ops = {row["operation"].split("/", 1)[1]: row for row in rows if row["type"] != "IDLE"}
    assert len(ops) == len(rows) - 1 and all(row["host_or_device"] == "Host" for row in rows)
    tid = next(e["tid"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name" and e["args"]["name"] == summ["lane"])
    kernels = [e for e in events if e["ph"] == "X" and e["tid"] == tid and e["cat"] in KERNEL_CATS | {"data", "comm"}]
    want = {}
    for e in kernels:
        want.setdefault(e["name"], []).append(e)
    assert set(ops) == set(want), (sorted(ops), sorted(want))
    for name, calls in want.items():
        row = ops[name]
        assert row["type"] == calls[0]["cat"] and row["occurrences"] == len(calls), (name, row)
        assert row["total_time"] == pytest.approx(sum(e["dur"] for e in calls), abs=1e-3 * len(calls))   # us
    self_us = sum(row["total_self_time"] for row in ops.values())
    kernel_ms = sum(r["total_ms"] for r in summ["rows"] if not r["part"] and r["category"] in KERNEL_CATS | {"data"})
    assert self_us / 1e3 == pytest.approx(kernel_ms, rel=1e-6, abs=1e-3)
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    steps = next(t for t in json.loads(data) if any(c.get("id") == "stepnum" for c in t.get("cols", [])))
    cols = [c["id"] for c in steps["cols"]]
    waits = sorted((e for e in kernels if e["cat"] == "data"), key=lambda e: e["ts"])
    assert len(waits) == len(steps["rows"])
    for row, wait in zip(steps["rows"], waits):
        assert dict(zip(cols, (c["v"] for c in row["c"])))["infeedTimeMs"] == pytest.approx(wait["dur"] / 1e3, abs=1e-6)


KERNEL_CATS = {"matmul", "attention", "norm", "rope", "swiglu", "xent", "embed", "optimizer", "elementwise"}


@pytest.mark.parametrize("dtype,weights,copy,per_param", [("float32", "float32", False, 28),
                                                          ("bfloat16", "float32", False, 28),
                                                          ("bfloat16", "float32", True, 30),
                                                          ("bfloat16", "bfloat16", False, 16)])
def test_profile_counts_each_kernels_bytes(tmp_path, dtype, weights, copy, per_param):
    """Every kernel span carries the bytes it must move (XProf's bytes_accessed): each matmul its
    operands in the dtypes it reads them in (a bf16 run's activations in bf16, its fp32 weights in
    fp32 where it rounds them as it packs them, in bf16 from bf16_weight_copy's copy or bf16
    weights) and its fp32 result, the update its state in the dtypes held (fp32: p, m, v read and
    written and g read, 28 bytes a parameter; bf16_weight_copy adds the copy's write, 30; bf16
    weights hold p, m and v in bf16, 16), the gradient norm what it reads. The op summary gives
    each row's GB/s and its share of the bandwidth given or probed."""
    given = dtype == "bfloat16"   # the fp32 run probes the bus itself
    r = stepscope(tmp_path, "model_name=tiny", f"device_peak_tflops={PEAK}", "machine_probe=false", f"run_name={RUN}",
                  "steps=2", f"dtype={dtype}", f"weight_dtype={weights}", "profiler=xplane",
                  "skip_first_n_steps_for_profiler=1", "profiler_steps=1", *(["device_peak_gb_per_s=50"] if given else []),
                  *(["bf16_weight_copy=true"] if copy else []))
    assert r.returncode == 0, r.stdout + r.stderr
    n = int(re.search(r"^stepscope: tiny, (\d+) parameters", r.stdout, re.M).group(1))
    if given:
        assert "memory bandwidth: 50.0 GB/s (device_peak_gb_per_s), for the op summary" in r.stdout
    else:
        m = re.search(r"^memory bandwidth: (\d+\.\d) GB/s on \d+ threads \(probe, for the op summary: the better of a "
                      r"STREAM triad with streaming stores, (\d+\.\d), and an in-place a \+= s\*b, (\d+\.\d),", r.stdout, re.M)
        assert m and float(m[1]) == max(float(m[2]), float(m[3])) > 0, r.stdout
        # the probe's 3 x 256 MiB are mapped before set-up and the peak RSS reset after them
        assert float(re.search(r"peak RSS (\d+\.\d+) GiB", r.stdout)[1]) < 0.5, r.stdout
    prof = next((run_dir(tmp_path) / "tensorboard" / "plugins" / "profile").iterdir())
    events = json.loads(gzip.decompress(next(prof.glob("*.trace.json.gz")).read_bytes()))["traceEvents"]
    kernels = [e for e in events if e["ph"] == "X" and e.get("cat") in KERNEL_CATS]
    assert {e["cat"] for e in kernels} >= KERNEL_CATS - {"rope"}     # rope runs fused with qk-norm here
    for e in kernels:
        assert e.get("args", {}).get("bytes_accessed", 0) > 0, e
    a = 2 if dtype == "bfloat16" else 4      # the matmuls' activations; results are fp32
    w = 2 if copy or weights == "bfloat16" else 4  # their weights, as read
    for e in (e for e in kernels if e["cat"] == "matmul"):
        kind, shape = re.search(r" (fwd|dgrad|wgrad) \[(\d+)x(\d+)x(\d+)\]$", e["name"]).group(1, 2), None
        T, O, I = map(int, re.search(r"\[(\d+)x(\d+)x(\d+)\]$", e["name"]).groups())
        operands, result = {"fwd": (a * T * I + w * I * O, T * O), "dgrad": (a * T * O + w * O * I, T * I),
                            "wgrad": (a * (O * T + T * I), O * I)}[kind[0]]
        # written, or read and written where the product adds onto its output
        assert e["args"]["bytes_accessed"] in (operands + 4 * result, operands + 8 * result), e
    # tiny: T = 2 x 256 tokens, d = 64, 4 query heads and 2 KV heads of 16; attention reads q, k, v
    # and writes its output and a log-sum-exp a head and row (backward: dO, O, q, k, v, lse in;
    # dq, dk, dv out); a layer norm reads x and its weight, writes its output (bf16 for a bf16
    # matmul's input) and an rstd a row
    T, q, kv = 512, 512 * 64, 512 * 32
    attn = {e["name"]: e["args"]["bytes_accessed"] for e in kernels if e["cat"] == "attention"}
    assert attn == {"flash_attention fwd": 4 * (2 * q + 2 * kv + 4 * T), "flash_attention bwd": 4 * (4 * q + 4 * kv + 4 * T)}
    norms = {e["args"]["bytes_accessed"] for e in kernels if e["name"] == "rmsnorm fwd"}
    assert norms == {T * 64 * (4 + a) + (64 + T) * 4}, norms
    # the compute lane's GB/s counter track: each kernel's bytes over its time, from its start
    gbs = {c["ts"]: c["args"]["GB/s"] for c in events if c["ph"] == "C" and c["name"] == "compute lane GB/s"}
    for e in kernels:
        assert gbs[e["ts"]] == pytest.approx(e["args"]["bytes_accessed"] / (e["dur"] * 1e3), rel=1e-5, abs=1e-6), e
    update = [e for e in kernels if e["name"] == "adamw_update"]
    assert [e["args"]["bytes_accessed"] for e in update] == [per_param * n]
    norm = [e["args"]["bytes_accessed"] for e in kernels if e["name"] == "grad_norm"]
    # bf16 products sum their gradients' squares as they write them: the pass reads the rest
    assert len(norm) == 1 and (norm[0] == 4 * n if dtype == "float32" else 0 < norm[0] < 4 * n), (norm, n)

    summ = json.loads((prof / "op_summary.json").read_text())
    bw = summ["peak_gbytes_per_s"]
    assert bw == 50 if given else bw > 0
    rows = {(row["category"], row["part"]): row for row in summ["rows"]}
    for cat in KERNEL_CATS - {"rope"}:
        row = rows[(cat, "")]
        assert row["bytes"] > 0, row
        assert row["gbytes_per_s"] == pytest.approx(row["bytes"] / (row["total_ms"] * 1e6), rel=1e-6)
        assert row["pct_bandwidth"] == pytest.approx(100 * row["gbytes_per_s"] / bw, rel=1e-6)
    assert rows[("optimizer", "")]["bytes"] == per_param * n + norm[0]
    assert rows[("optimizer", "adamw update")]["bytes"] == per_param * n        # a part each, with its own GB/s
    assert rows[("optimizer", "gradient norm")]["bytes"] == norm[0]
    total = rows[("total (train steps)", "")]
    assert total["bytes"] == pytest.approx(sum(r["bytes"] for (c, p), r in rows.items() if not p and c in KERNEL_CATS))
    assert re.search(r"^category\s+part\s+calls\s+total ms.*p10-p90 GFLOP/s\s+GB/s\s+%bw$", r.stdout, re.M)
    assert re.search(r"^optimizer\s.*\s\d+\.\d\s+\d+%$", r.stdout, re.M)
    assert re.search(r"memory bandwidth \d+\.\d GB/s$", r.stdout, re.M)
    # XProf's memory profile: this dtype's plan (bf16_weight_copy adds the bf16 weights' line)
    try:
        from xprof.convert import raw_to_tool_data
    except Exception as e:
        pytest.skip(f"xprof not importable: {e!r}")
    check_xprof_memory_profile(raw_to_tool_data, str(next(prof.glob("*.xplane.pb"))), tmp_path, "model_name=tiny",
                               f"dtype={dtype}", f"weight_dtype={weights}", *(["bf16_weight_copy=true"] if copy else []))


def test_profile_names_what_ran_between_steps(tmp_path):
    """An evaluation and a checkpoint inside the profile's window are one span each on the
    compute thread, between the train spans they came after and before (so a gap in the trace
    says what it was), with no kernel spans of their own; the op summary still counts the
    training steps only, and XProf still finds exactly those steps."""
    r = stepscope(tmp_path, "model_name=tiny", f"device_peak_tflops={PEAK}", "machine_probe=false", f"run_name={RUN}",
                  "steps=6", "profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=4",
                  "eval_interval=2", "eval_steps=3", "enable_checkpointing=true", "checkpoint_period=2")
    assert r.returncode == 0, r.stdout + r.stderr
    prof = next((run_dir(tmp_path) / "tensorboard" / "plugins" / "profile").iterdir())
    trace_file = next(prof.glob("*.trace.json.gz"))
    events = [e for e in json.loads(gzip.decompress(trace_file.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    trains = sorted((e for e in events if e["name"] == "train"), key=lambda e: e["ts"])
    assert [e["args"]["step_num"] for e in trains] == [1, 2, 3, 4]
    tid = trains[0]["tid"]
    ends = {e["args"]["step_num"]: e["ts"] + e["dur"] for e in trains}
    starts = {e["args"]["step_num"]: e["ts"] for e in trains}
    outside = sorted((e for e in events if e["tid"] == tid and e["name"] != "train"
                      and not any(t["ts"] <= e["ts"] <= t["ts"] + t["dur"] for t in trains)), key=lambda e: e["ts"])
    # after step 1: evaluation; after 2: checkpoint; after 3: evaluation. Step 4's checkpoint
    # is not recorded: the window closes with step 4, whose end the profile's write follows.
    assert [e["name"] for e in outside] == ["evaluation (between steps)", "checkpoint write (between steps)",
                                          "evaluation (between steps)"], [e["name"] for e in outside]
    for e, after in zip(outside, (1, 2, 3)):
        assert ends[after] - 1 <= e["ts"] and e["ts"] + e["dur"] <= starts[after + 1] + 1, (e, after)
    summ = json.loads((prof / "op_summary.json").read_text())
    assert summ["num_steps"] == 4
    assert re.search(r"^total \(train steps\)\s+4\s", r.stdout, re.M)
    # the run's wall time, accounted: the steps' own times summed, the pauses between them, each
    # at least what its own figure says, and all of it within the wall time
    recs, _ = read_metrics(tmp_path)
    run = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert abs(run["time/steps_seconds"] - sum(m["perf/step_time_seconds"] for m in recs)) <= 6e-6
    assert run["time/evaluation_seconds"] >= sum(m.get("eval/seconds", 0) for m in recs) - 3e-6
    assert run["time/checkpoint_seconds"] >= sum(m.get("checkpoint/write_seconds", 0) for m in recs) - 4e-6
    assert run["time/profile_write_seconds"] > 0
    parts = ("before_steps", "steps", "evaluation", "checkpoint", "profile_write")
    assert 0 < sum(run[f"time/{k}_seconds"] for k in parts) <= run["time/wall_seconds"]
    assert re.search(r"^  run time        \d+\.\d\d s wall: \d+\.\d\d s before step 0 \(probes, data, set-up\), "
                     r"\d+\.\d\d s in steps 0\.\.5, \d+\.\d\d s between them \(evaluation \d+\.\d\d, checkpoints "
                     r"\d+\.\d\d, profile \d+\.\d\d\), \d+\.\d\d s after \(the closing probes, the last reads\)$", r.stdout,
                     re.M), r.stdout
    try:
        from xprof.convert import raw_to_tool_data
    except Exception as e:
        pytest.skip(f"xprof not importable: {e!r}")
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(next(prof.glob("*.xplane.pb")))], "overview_page", {})
    step_table = next(t for t in json.loads(data) if any(c.get("id") == "stepnum" for c in t.get("cols", [])))
    assert [row["c"][0]["v"] for row in step_table["rows"]] == ["train 1", "train 2", "train 3", "train 4"]


def test_profiler_off_writes_no_profile(tmp_path):
    r = train(tmp_path, "steps=3")      # FAST has profiler=
    assert not (run_dir(tmp_path) / "tensorboard" / "plugins").exists()
    assert "op summary" not in r.stdout and ".xplane.pb" not in r.stdout


# ---- 8. --help and --version ------------------------------------------------------------------

def test_help_lists_every_key(tmp_path):
    r = subprocess.run([str(BIN), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == ""
    keys = re.findall(r"^KEY\((\w+),", (ROOT / "src" / "config" / "config_keys.def").read_text(), re.M)
    assert len(keys) > 40
    listed = {l.split()[0] for l in r.stdout.splitlines() if l.strip()}
    missing = [k for k in keys if k not in listed]
    assert not missing, missing
    # base.yml uses only known keys, and every key of base.yml is in --help
    for k in read_yaml_flat(CONFIG):
        assert k in listed, k
    assert list(tmp_path.iterdir()) == []


def test_version(tmp_path):
    r = subprocess.run([str(BIN), "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert re.fullmatch(r"stepscope \d+\.\d+\.\d+\n", r.stdout), r.stdout


# ---- 9. divergence aborts ---------------------------------------------------------------------

TINY_LAYER = [  # (suffix, rows, cols) as in QWEN3_LAYER_TENSORS, tiny shape
    ("input_layernorm.weight", 64, 0), ("self_attn.q_proj.weight", 64, 64), ("self_attn.k_proj.weight", 32, 64),
    ("self_attn.v_proj.weight", 32, 64), ("self_attn.q_norm.weight", 16, 0), ("self_attn.k_norm.weight", 16, 0),
    ("self_attn.o_proj.weight", 64, 64), ("post_attention_layernorm.weight", 64, 0),
    ("mlp.gate_proj.weight", 128, 64), ("mlp.up_proj.weight", 128, 64), ("mlp.down_proj.weight", 64, 128),
]


# ---- checkpoints -------------------------------------------------------------------------------

OPTIMIZER_FILE = "optimizer_state-00000-of-00001.safetensors"


def checkpoint_file(tmp_path, step, run_name=RUN):
    return run_dir(tmp_path, run_name) / "checkpoints" / str(step) / "model.safetensors"


def checkpoint_bytes(folder):
    """What one process writes of a checkpoint: the parameters and AdamW's state (config.json
    aside, the mark of a whole checkpoint written after them)."""
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def safetensors_header(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), len(raw) - 8 - n


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoints_load_back(tmp_path, dtype):
    """enable_checkpointing writes the parameters after steps 0, 2 and 4 (the multiples of
    checkpoint_period=2, and the last). A run started from step 2's file computes at its step 0
    the very loss, to the last bit, that the first run computed at its step 3: the same parameters
    on the same batch (synthetic data repeats one batch). Both dtypes save the fp32 master
    weights; bf16's copy is made from them at set-up as the update makes it."""
    log = tmp_path / "events.txt"
    r = train(tmp_path, "steps=5", f"dtype={dtype}", "enable_checkpointing=true", "checkpoint_period=2",
              env_extra={"STEPSCOPE_EVENT_LOG": str(log)})
    ckdir = run_dir(tmp_path) / "checkpoints"
    assert sorted(p.relative_to(ckdir).as_posix() for p in ckdir.rglob("*")) == [
        f"{s}{f}" for s in (0, 2, 4)
        for f in ("", "/config.json", "/model.safetensors", f"/{OPTIMIZER_FILE}")]   # no temporaries
    hf = json.loads((ckdir / "2" / "config.json").read_text())
    assert (hf["model_type"], hf["vocab_size"], hf["hidden_size"], hf["num_hidden_layers"], hf["head_dim"],
            hf["tie_word_embeddings"]) == ("qwen3", 256, 64, 2, 16, True)
    # Hugging Face's names, fp32, every parameter once
    header, data_bytes = safetensors_header(checkpoint_file(tmp_path, 2))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
            "model.layers.1.mlp.down_proj.weight"} <= set(tensors)
    assert {v["dtype"] for v in tensors.values()} == {"F32"}
    num_params = int(re.search(r"tiny, (\d+) parameters", r.stdout).group(1))
    assert sum(math.prod(v["shape"]) for v in tensors.values()) == num_params
    assert data_bytes == 4 * num_params
    # each written after its step and before the next step started: outside every step's time
    events = log.read_text().splitlines()
    for s in (0, 2):
        assert events.index(f"start {s}") < events.index(f"checkpoint {s}") < events.index(f"start {s + 1}"), events
    assert events.index("checkpoint 4") > events.index("start 4")
    # the console says so under its step, the metrics carry it on those steps only
    lines = r.stdout.splitlines()
    for s in (0, 2, 4):
        i = next(k for k, l in enumerate(lines) if l.startswith(f"completed step: {s},"))
        assert lines[i + 1].startswith(f"checkpoint: step {s}'s parameters and AdamW state, "), lines[i + 1]
        assert "outside the step times" in lines[i + 1]
        assert lines[i + 1].endswith(str(ckdir / str(s))), lines[i + 1]
    recs, raw = read_metrics(tmp_path)
    assert [m["step"] for m in recs if "checkpoint/bytes" in m] == [0, 2, 4]
    for m in recs:
        if "checkpoint/bytes" in m:
            assert m["checkpoint/bytes"] == checkpoint_bytes(ckdir / str(m["step"]))
            assert m["checkpoint/write_seconds"] > 0
    assert (f"{ckdir}/ (3 checkpoints, the last after step 4: load_full_state_path={ckdir}/4 resumes from it, "
            f"load_parameters_path={ckdir}/4 starts from its parameters)") in r.stdout
    # the summary: how many, their size, the median write
    size = checkpoint_bytes(ckdir / "4")
    summ = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    assert (summ["checkpoint/count"], summ["checkpoint/bytes"]) == (3, size)
    writes = sorted(m["checkpoint/write_seconds"] for m in recs if "checkpoint/bytes" in m)
    assert abs(summ["checkpoint/write_seconds_median"] - writes[1]) <= 1e-6
    assert f"  checkpoints     3 written, {size / 2**20:.3f} MiB each, " in r.stdout
    # loaded back
    train(tmp_path, "steps=1", f"dtype={dtype}", f"load_parameters_path={checkpoint_file(tmp_path, 2)}",
          run_name="from2")
    _, raw2 = read_metrics(tmp_path, "from2")
    assert raw_losses(raw2)[0] == raw_losses(raw)[3]
    # the folder names its model.safetensors, as a Hugging Face model folder does
    train(tmp_path, "steps=1", f"dtype={dtype}", f"load_parameters_path={ckdir / '2'}", run_name="from2dir")
    assert raw_losses(read_metrics(tmp_path, "from2dir")[1])[0] == raw_losses(raw)[3]
    # off by default: no folder
    train(tmp_path, "steps=2", run_name="off")
    assert not (run_dir(tmp_path, "off") / "checkpoints").exists()


def test_checkpoints_that_cannot_be_kept_are_refused_before_set_up(tmp_path):
    # a file where the checkpoints folder goes
    run_dir(tmp_path).mkdir(parents=True)
    (run_dir(tmp_path) / "checkpoints").write_text("")
    r = stepscope(tmp_path, *FAST, f"run_name={RUN}", "enable_checkpointing=true")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "checkpoints is not a folder" in r.stderr and "set-up:" not in r.stdout
    # no room: a million checkpoints of qwen3-0.6b's 2.2 GiB, said before its 10 GiB set-up
    r = stepscope(tmp_path, *FAST[1:], "model_name=qwen3-0.6b", "run_name=big", "enable_checkpointing=true",
                  "steps=1000000", "checkpoint_period=1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the run's 1000000 checkpoints" in r.stderr and "6.662 GiB each" in r.stderr, r.stderr
    assert "raise checkpoint_period, lower steps or free space" in r.stderr
    assert "set-up:" not in r.stdout
    assert not run_dir(tmp_path, "big").exists()


def test_parameters_file_is_checked_before_set_up(tmp_path):
    # a tiny model's checkpoint handed to qwen3-0.6b: refused from its header, before the 10 GiB
    # set-up, naming the first tensor that does not match
    train(tmp_path, "steps=1", "enable_checkpointing=true")
    r = stepscope(tmp_path, *FAST[1:], "model_name=qwen3-0.6b", "run_name=big",
                  f"load_parameters_path={checkpoint_file(tmp_path, 0)}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "model.embed_tokens.weight" in r.stderr and "set-up:" not in r.stdout, r.stdout + r.stderr
    assert not run_dir(tmp_path, "big").exists()


def test_checkpoint_folders_are_whole(tmp_path):
    """A step's files are written into <step>.partial and the folder renamed into place once
    whole, so a <step> folder is always one whole checkpoint: a run under the same name replaces
    an earlier run's folder of that step whole (no file of it left), and removes the .partial
    folders an interrupted run left before it writes (their files, such as another rank count's
    optimizer shards, would otherwise end up in its checkpoints)."""
    train(tmp_path, "steps=3", "enable_checkpointing=true", "checkpoint_period=2")
    ck = run_dir(tmp_path) / "checkpoints"
    (ck / "2" / "optimizer_state-00001-of-00002.safetensors").write_bytes(b"left by an earlier run")
    (ck / "0.partial").mkdir()
    (ck / "0.partial" / "optimizer_state-00000-of-00003.safetensors").write_bytes(b"interrupted")
    r = train(tmp_path, "steps=3", "enable_checkpointing=true", "checkpoint_period=2")
    files = ["config.json", "model.safetensors", OPTIMIZER_FILE]
    assert sorted(p.relative_to(ck).as_posix() for p in ck.rglob("*")) == [
        f"{s}{f}" for s in (0, 2) for f in [""] + [f"/{n}" for n in files]]
    train(tmp_path, "steps=4", f"load_full_state_path={ck / '2'}", run_name="resumed")


def test_checkpoint_that_cannot_be_written_stops_the_run(tmp_path):
    # step 2's folder cannot be made: the run stops after step 2 with a message, and keeps the
    # metrics of steps 0..2 and step 0's checkpoint
    (run_dir(tmp_path) / "checkpoints").mkdir(parents=True)
    (run_dir(tmp_path) / "checkpoints" / "2").write_text("")
    r = stepscope(tmp_path, *FAST, f"run_name={RUN}", "steps=5", "enable_checkpointing=true", "checkpoint_period=2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the checkpoint of step 2 could not be written" in r.stderr and "Not a directory" in r.stderr, r.stderr
    recs, _ = read_metrics(tmp_path)
    assert [m["step"] for m in recs] == [0, 1, 2]
    assert checkpoint_file(tmp_path, 0).exists()


def test_async_checkpoints_are_the_same_files(tmp_path):
    """async_checkpointing=true writes each checkpoint while the next step's forward and backward
    run, and that step's update waits for it: the checkpoints are the same bytes as those written
    between steps, the losses the same bits, and the resumed run goes on as from any checkpoint.
    The last step's checkpoint is written after it, as without async. The console, metrics.jsonl
    and summary.json say which were written beside a step and how long the updates waited."""
    ck = ["steps=6", "enable_checkpointing=true", "checkpoint_period=2"]
    train(tmp_path, *ck, run_name="sync")
    r = train(tmp_path, *ck, "async_checkpointing=true", run_name="async")
    assert raw_losses(read_metrics(tmp_path, "async")[1]) == raw_losses(read_metrics(tmp_path, "sync")[1])
    for step in (0, 2, 4, 5):
        for f in ("model.safetensors", OPTIMIZER_FILE, "config.json"):
            a = run_dir(tmp_path, "async") / "checkpoints" / str(step) / f
            assert a.read_bytes() == (run_dir(tmp_path, "sync") / "checkpoints" / str(step) / f).read_bytes(), (step, f)
    assert not list((run_dir(tmp_path, "async") / "checkpoints").glob("*.partial"))
    assert re.search(r"checkpoint: step 2's parameters and AdamW state, [\d.]+ MiB in [\d.]+ s \([\d.]+ GB/s\), beside "
                     r"step 3 \(async_checkpointing\)", r.stdout), r.stdout
    assert re.search(r"checkpoint: step 3's update waited [\d.]+ s for step 2's write to finish", r.stdout), r.stdout
    assert re.search(r"checkpoint: step 5's parameters .*, outside the step times", r.stdout), r.stdout
    assert "3 beside the next step (async_checkpointing: the next steps' updates waited" in r.stdout
    recs = read_metrics(tmp_path, "async")[0]
    assert [m.get("checkpoint/async") for m in recs] == [True, None, True, None, True, False]
    assert all(m["checkpoint/wait_seconds"] >= 0 for m in recs if m["step"] in (1, 3, 5))
    summ = json.loads((run_dir(tmp_path, "async") / "summary.json").read_text())
    assert (summ["checkpoint/count"], summ["checkpoint/async_count"]) == (4, 3)
    train(tmp_path, "steps=6", f"load_full_state_path={run_dir(tmp_path, 'async') / 'checkpoints' / '2'}",
          run_name="resumed")
    assert raw_losses(read_metrics(tmp_path, "resumed")[1]) == raw_losses(read_metrics(tmp_path, "sync")[1])[3:]


def test_async_checkpoint_that_cannot_be_written_stops_the_run(tmp_path):
    # step 2's folder cannot be made while step 3 runs beside its write: step 3's update learns it
    # (on every rank), the run stops after step 3 with the message, and keeps steps 0..3's metrics
    (run_dir(tmp_path) / "checkpoints").mkdir(parents=True)
    (run_dir(tmp_path) / "checkpoints" / "2").write_text("")
    r = stepscope(tmp_path, *FAST, f"run_name={RUN}", "steps=6", "enable_checkpointing=true", "checkpoint_period=2",
                  "async_checkpointing=true")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the checkpoint of step 2 could not be written" in r.stderr and "Not a directory" in r.stderr, r.stderr
    assert "after the step beside which it was written" in r.stderr
    assert [m["step"] for m in read_metrics(tmp_path)[0]] == [0, 1, 2, 3]
    assert checkpoint_file(tmp_path, 0).exists()


def test_dry_run_counts_checkpoints(tmp_path):
    r = stepscope(tmp_path, *FAST, "--dry-run", "enable_checkpointing=true", "steps=21", "checkpoint_period=10")
    assert r.returncode == 0, r.stderr
    plan = parse_plan(r.stdout)
    assert plan["checkpoints"].startswith("3 ")    # 0, 10, 20
    assert int(plan["checkpoint_bytes_each"].split()[0]) >= 12 * int(plan["num_parameters"])
    assert "checkpoints" not in parse_plan(stepscope(tmp_path, *FAST, "--dry-run").stdout)
    # resumed: counted from the step after the checkpoint's, which a dry run reads
    train(tmp_path, "steps=12", "enable_checkpointing=true", "checkpoint_period=11")
    r = stepscope(tmp_path, *FAST, "--dry-run", "enable_checkpointing=true", "steps=21", "checkpoint_period=10",
                  f"load_full_state_path={run_dir(tmp_path) / 'checkpoints' / '11'}")
    assert r.returncode == 0, r.stderr
    plan = parse_plan(r.stdout)
    assert plan["first_step"].startswith("12 ") and plan["checkpoints"].startswith("1 ")    # 20
    r = stepscope(tmp_path, *FAST, "--dry-run", f"load_full_state_path={tmp_path / 'none'}")
    assert r.returncode == 1 and "is not a folder" in r.stderr


# ---- resuming (load_full_state_path) -----------------------------------------------------------

def resumable_run(tmp_path, dtype, *extra, run_name=RUN, **kw):
    """9 steps on token files for training and evaluation (whose positions a resumed run must
    take up), evaluating after steps 1, 3, 5, 7, checkpointing after 0, 4 and 8."""
    rng = np.random.default_rng(7)
    train_ids = tmp_path / "train.bin"
    if not train_ids.exists():
        write_tokens(train_ids, rng.integers(0, 256, size=20000))
        write_tokens(tmp_path / "eval.bin", rng.integers(0, 256, size=9000))
    return train(tmp_path, "steps=9", f"dtype={dtype}", "dataset_type=tokens", f"dataset_path={train_ids}",
                 f"eval_dataset_path={tmp_path / 'eval.bin'}", "eval_interval=2", "eval_steps=2",
                 "enable_checkpointing=true", "checkpoint_period=4", *extra, run_name=run_name, **kw)


@pytest.mark.parametrize("dtype,micro,mu", [("float32", 1, ""), ("bfloat16", 1, ""), ("float32", 2, ""),
                                             ("bfloat16", 1, "bfloat16"), ("bfloat16", 2, "weights"),
                                             ("bfloat16", 1, "weights_sr")])
def test_full_state_resumes_to_the_same_bits(tmp_path, dtype, micro, mu):
    """A run resumed from step 4's checkpoint (parameters, AdamW's moments and update count) runs
    steps 5..8 and computes the very losses and evaluations, to the last bit, that the run it
    goes on from computed there: the same parameters, optimizer state, bias corrections, training
    batches (token windows by step) and evaluation batches (the ones after the four read before
    step 5). Its step-8 checkpoint is the same bytes as the first run's. It counts its steps as
    MaxText does (steps is the last step + 1), opens the profiler's window after its own first
    step, and leaves its own first step out of the summary. With gradient accumulation a step
    reads micro x 2 windows, from the resumed step's on. With mu_dtype=bfloat16 the first moment
    is kept, written and read back in bf16; with weight_dtype=bfloat16 ("weights") the parameters
    and both moments are, and with stochastic_rounding ("weights_sr") the resumed steps draw the
    same roundings (by step and index)."""
    ga = [f"gradient_accumulation_steps={micro}"] + {"": [], "bfloat16": ["mu_dtype=bfloat16"],
                                                     "weights": ["weight_dtype=bfloat16"],
                                                     "weights_sr": ["weight_dtype=bfloat16", "stochastic_rounding=true"]}[mu]
    resumable_run(tmp_path, dtype, *ga)
    folder = run_dir(tmp_path) / "checkpoints" / "4"
    log = tmp_path / "events.txt"
    r = resumable_run(tmp_path, dtype, *ga, f"load_full_state_path={folder}", "profiler=xplane", "profiler_steps=2",
                      run_name="resumed", env_extra={"STEPSCOPE_EVENT_LOG": str(log)})
    assert f"resumed: the state after step 4 (5 AdamW updates) from {folder}; steps 5..8 run now" in r.stdout
    assert "parameters and AdamW state loaded in " in r.stdout
    first, first_raw = read_metrics(tmp_path)
    again, again_raw = read_metrics(tmp_path, "resumed")
    assert [m["step"] for m in again] == [5, 6, 7, 8]
    assert raw_losses(again_raw) == raw_losses(first_raw)[5:]
    evals = [(m["step"], m["eval/avg_loss"]) for m in first if "eval/avg_loss" in m]
    assert [(m["step"], m["eval/avg_loss"]) for m in again if "eval/avg_loss" in m] == evals[2:]
    assert [m["learning/grad_norm"] for m in again] == [m["learning/grad_norm"] for m in first[5:]]
    ck = run_dir(tmp_path, "resumed") / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["8"]
    for f in ("model.safetensors", OPTIMIZER_FILE, "config.json"):
        assert (ck / "8" / f).read_bytes() == (run_dir(tmp_path) / "checkpoints" / "8" / f).read_bytes(), f
    events = log.read_text().splitlines()
    assert events[0] == "start 5" and "read 8" in events
    assert "op summary, profiled steps 6..7:" in r.stdout
    assert "summary over steps 6..8 (3 steps; step 5 left out):" in r.stdout
    assert re.search(r"s before step 5 \(probes, data, set-up\), \d+\.\d\d s in steps 5\.\.8, ", r.stdout), r.stdout
    summ = json.loads((run_dir(tmp_path, "resumed") / "summary.json").read_text())
    assert (summ["steps_logged"], summ["summary_first_step"], summ["summary_last_step"]) == (4, 6, 8)
    # and once more from the resumed run's own last checkpoint: nothing left to run
    r = stepscope(tmp_path, *FAST, "run_name=none", "steps=9", f"load_full_state_path={ck / '8'}")
    assert r.returncode == 1 and "holds the state after step 8, and steps=9 ends the run there" in r.stderr
    assert "set steps above 9" in r.stderr


def test_mu_dtype_bfloat16(tmp_path):
    """mu_dtype=bfloat16 (MaxText's key, optax's mu_dtype) keeps AdamW's first moment in bf16: the
    plan's optimizer state is 2 bytes a parameter smaller, and its checkpoints hold exp_avg in
    BF16. The update itself is computed in fp32 from the widened moment, and m only loses bits
    when stored, so steps 0 and 1 are the fp32 moment's to the bit (step 0's update is the same;
    step 1's gradients come from the same parameters); from step 2 the stored rounding (2^-9 of m,
    relative) moves each update by at most that share, and the losses stay within 1e-4 of the
    fp32 moment's over 8 steps (measured: 7.5e-7 at most, 2026-12-07). A checkpoint of one mu_dtype
    resumes in the other."""
    plans = {mu: parse_plan(stepscope(tmp_path, *FAST, f"mu_dtype={mu}", "--dry-run").stdout)
             for mu in ("float32", "bfloat16")}
    n = int(plans["float32"]["num_parameters"])
    assert (int(plans["float32"]["memory_optimizer_state_bytes"]) - int(plans["bfloat16"]["memory_optimizer_state_bytes"])
            == 2 * n), plans
    assert plans["bfloat16"]["mu_dtype"].startswith("bfloat16")
    assert parse_plan(stepscope(tmp_path, *FAST, "--dry-run").stdout)["mu_dtype"].startswith("float32")  # "": weight_dtype's
    ck = ["enable_checkpointing=true", "checkpoint_period=4"]
    train(tmp_path, "steps=8", *ck, run_name="fp32")
    train(tmp_path, "steps=8", "mu_dtype=bf16", *ck, run_name="bf16")
    a, b = read_metrics(tmp_path, "fp32")[1], read_metrics(tmp_path, "bf16")[1]
    assert raw_losses(a)[:2] == raw_losses(b)[:2]
    for x, y in zip(map(float, raw_losses(a)), map(float, raw_losses(b))):
        assert abs(x - y) <= 1e-4 * abs(x), (raw_losses(a), raw_losses(b))
    assert raw_losses(a)[2:] != raw_losses(b)[2:]  # the rounding does reach the parameters
    header, _ = safetensors_header(run_dir(tmp_path, "bf16") / "checkpoints" / "4" / OPTIMIZER_FILE)
    assert (header["exp_avg"]["dtype"], header["exp_avg_sq"]["dtype"]) == ("BF16", "F32")
    for run, mu in (("fp32", "bfloat16"), ("bf16", "float32")):
        r = train(tmp_path, "steps=6", f"mu_dtype={mu}", f"load_full_state_path={run_dir(tmp_path, run) / 'checkpoints' / '4'}",
                  run_name=f"{run}_as_{mu}")
        assert "steps 5..5 run now" in r.stdout
        assert read_metrics(tmp_path, f"{run}_as_{mu}")[0][0]["step"] == 5


def plan_vector_floats(plan):
    """The norm weights' count from a dry run's shape line: per layer the two layer norms (D) and
    the q/k norms (HD each, with qk_norm), and the final norm."""
    dims = dict(kv.split("=") for kv in plan["shape"].split())
    D, L, HD = int(dims["D"]), int(dims["L"]), int(dims["HD"])
    return L * (2 * D + (2 * HD if dims["qk_norm"] == "true" else 0)) + D


def test_weight_dtype_bfloat16(tmp_path):
    """weight_dtype=bfloat16 (MaxText's key, with dtype=bfloat16) holds the parameters in bf16 only
    (no fp32 master weights, no separate bf16 copy: the matmuls read them as they are) and AdamW's
    moments in bf16 (mu_dtype "" follows weight_dtype, and v is held in the parameters' dtype, as
    optax holds nu); the gradients stay fp32. The plan's bytes say so exactly: the bf16 values and
    the norm weights widened for their kernels, and two bf16 moments. The update widens, computes
    in fp32 and rounds each value it stores (test_kernels.c), so a weight moves by whole bf16
    steps: over 8 steps the tiny model's losses stay within 5e-3 of the fp32 master weights' (the
    rounding of each update is 2^-9 of a weight at most; measured 1.03e-3 at most, 2026-12-07) and
    fall as theirs do. Checkpoints hold BF16 parameters and moments; a checkpoint of fp32 master
    weights resumes with bf16 ones (rounded) and back (widened). dtype=float32 is refused."""
    plan32 = parse_plan(stepscope(tmp_path, *FAST, "dtype=bfloat16", "mu_dtype=bfloat16", "bf16_weight_copy=true",
                                  "--dry-run").stdout)
    r = stepscope(tmp_path, *FAST, "dtype=bfloat16", "weight_dtype=bfloat16", "--dry-run")
    assert r.returncode == 0, r.stderr
    plan = parse_plan(r.stdout)
    n = int(plan["num_parameters"])
    line = lambda b: (b + 63) // 64 * 64
    assert int(plan["memory_parameters_bytes"]) == line(2 * n) + 4 * plan_vector_floats(plan)
    assert int(plan["memory_bf16_weights_bytes"]) == 0 and int(plan32["memory_bf16_weights_bytes"]) == 2 * n
    assert (int(plan32["memory_optimizer_state_bytes"]) - int(plan["memory_optimizer_state_bytes"])
            == line(4 * n) - line(2 * n))
    assert int(plan["memory_gradients_bytes"]) == int(plan32["memory_gradients_bytes"]) == 4 * n
    assert plan["weight_dtype"].startswith("bfloat16") and plan["mu_dtype"].startswith("bfloat16")
    assert plan32["weight_dtype"].startswith("float32")
    ck = ["enable_checkpointing=true", "checkpoint_period=4", "dtype=bfloat16"]
    train(tmp_path, "steps=8", *ck, run_name="master")
    train(tmp_path, "steps=8", "weight_dtype=bfloat16", *ck, run_name="bf16")
    a, b = (list(map(float, raw_losses(read_metrics(tmp_path, run)[1]))) for run in ("master", "bf16"))
    for x, y in zip(a, b):
        assert abs(x - y) <= 5e-3 * abs(x), (a, b)
    assert b[-1] < 0.95 * b[0] and a != b, (a, b)
    assert json.loads((run_dir(tmp_path, "bf16") / "summary.json").read_text())["weight_dtype"] == "bfloat16"
    folder = run_dir(tmp_path, "bf16") / "checkpoints" / "4"
    # the disk space a run checks for is the bound of what these files take, at 6 bytes a parameter
    each = int(parse_plan(stepscope(tmp_path, *FAST, "weight_dtype=bfloat16", *ck, "--dry-run").stdout)
               ["checkpoint_bytes_each"].split()[0])
    assert checkpoint_bytes(folder) <= each < 7 * n, (checkpoint_bytes(folder), each, n)
    header, _ = safetensors_header(folder / "model.safetensors")
    assert {t["dtype"] for k, t in header.items() if k != "__metadata__"} == {"BF16"}
    header, _ = safetensors_header(folder / OPTIMIZER_FILE)
    assert (header["exp_avg"]["dtype"], header["exp_avg_sq"]["dtype"]) == ("BF16", "BF16")
    for run, weights in (("master", "bfloat16"), ("bf16", "float32")):
        r = train(tmp_path, "steps=6", "dtype=bfloat16", f"weight_dtype={weights}",
                  f"load_full_state_path={run_dir(tmp_path, run) / 'checkpoints' / '4'}", run_name=f"{run}_as_{weights}")
        assert "steps 5..5 run now" in r.stdout
        assert read_metrics(tmp_path, f"{run}_as_{weights}")[0][0]["step"] == 5
    r = stepscope(tmp_path, *FAST, "weight_dtype=bfloat16")
    assert r.returncode == 2 and "weight_dtype=bfloat16 (command line) needs dtype=bfloat16" in r.stderr, r.stderr
    # stochastic_rounding: the weights move by their updates on average; the dry run says so
    r = stepscope(tmp_path, *FAST, "dtype=bfloat16", "weight_dtype=bfloat16", "stochastic_rounding=true", "--dry-run")
    assert "stored rounded stochastically (stochastic_rounding)" in parse_plan(r.stdout)["weight_dtype"], r.stdout
    train(tmp_path, "steps=8", "dtype=bfloat16", "weight_dtype=bfloat16", "stochastic_rounding=true", run_name="sr")
    sr = list(map(float, raw_losses(read_metrics(tmp_path, "sr")[1])))
    assert sr[0] == b[0] and sr[1:] != b[1:] and sr[-1] < 0.95 * sr[0], (sr, b)
    for x, y in zip(a, sr):
        assert abs(x - y) <= 5e-3 * abs(x), (a, sr)


def test_full_state_refusals_before_set_up(tmp_path):
    """What load_full_state_path cannot resume from is said in one line before set-up, and the run
    leaves no folder: both load paths at once, a file, a folder of parameters only, a checkpoint
    missing its parameters, another model's state, no steps left, a profile window past the end
    (a missing shard of several: test_checkpoint.c and test_mpi.py). Its dry run refuses each the
    same way."""
    train(tmp_path, "steps=3", "enable_checkpointing=true", "checkpoint_period=2")
    ck = run_dir(tmp_path) / "checkpoints"
    r = stepscope(tmp_path, *FAST, "run_name=x", f"load_full_state_path={ck / '2'}",
                  f"load_parameters_path={ck / '2'}")
    assert r.returncode == 2 and "at most one of them" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    params_only = tmp_path / "hf"
    params_only.mkdir()
    (params_only / "model.safetensors").write_bytes((ck / "2" / "model.safetensors").read_bytes())
    cases = [
        ([f"load_full_state_path={ck / '2' / 'model.safetensors'}"], "is not a folder"),
        ([f"load_full_state_path={params_only}"], "holds parameters only; start a run from them with "
                                                   f"load_parameters_path={params_only}"),
        ([f"load_full_state_path={ck / '2'}", "steps=3"], "holds the state after step 2, and steps=3 ends the run"),
        ([f"load_full_state_path={ck / '2'}", "steps=5", "profiler=xplane", "skip_first_n_steps_for_profiler=2"],
         "the run resumes at step 3 (load_full_state_path) and ends before step 5"),
        ([f"load_full_state_path={ck / '2'}", "steps=5", "override_model_config=true", "base_mlp_dim=160"],
         "another layout"),
    ]
    (ck / "0" / "model.safetensors").unlink()
    cases.append(([f"load_full_state_path={ck / '0'}", "steps=5"], "has no model.safetensors; the checkpoint is "
                                                                     "incomplete"))
    for args, needle in cases:
        r = stepscope(tmp_path, *FAST, "run_name=x", *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert needle in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
        assert "set-up:" not in r.stdout
        assert not run_dir(tmp_path, "x").exists(), args
        dry = stepscope(tmp_path, *FAST, "run_name=x", *args, "--dry-run")
        assert dry.returncode == 1 and dry.stderr == r.stderr, (args, dry.stdout, dry.stderr)


# ---- gradient accumulation ---------------------------------------------------------------------

# Relative difference allowed between micro-batches and the one batch they make up, in the loss
# and in the gradient norm: the same sums in another order (a weight gradient's products over
# 2 x 256 tokens at once, or over 256 and then 256 more added on). fp32: below 1e-8 in both over 8
# steps (2026-12-07); Adam's normalised steps carry such rounding on, hence 1e-5. bf16: steps 0
# and 1 agree to 9 digits, but the matmul inputs are rounded to 8 bits, so parameters that differ
# in the 8th digit flip some of those roundings from step 2 on: the losses then stay within 4e-6
# and the gradient norms within 5e-4, the size of bf16's own noise (its gradient norms are 1e-3
# from fp32's on the same batch).
GA_TOL = {"float32": {"learning/loss": 1e-5, "learning/raw_grad_norm": 1e-5},
          "bfloat16": {"learning/loss": 1e-5, "learning/raw_grad_norm": 1e-3}}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gradient_accumulation_is_the_bigger_batch(tmp_path, dtype):
    """gradient_accumulation_steps=2 of per_device_batch_size=1 (MaxText: the micro-batch is
    per_device_batch_size) takes the update of per_device_batch_size=2 on the same rows, with the
    activations of one sequence: the same losses and gradient norms to the summation order, the
    same tokens and TFLOP per step (and so the same MFU count), a smaller memory plan. An
    evaluation forwards one micro-batch."""
    big = train(tmp_path, "steps=4", f"dtype={dtype}", "per_device_batch_size=2", run_name="big")
    acc = train(tmp_path, "steps=4", f"dtype={dtype}", "per_device_batch_size=1", "gradient_accumulation_steps=2",
                "eval_interval=2", run_name="acc")
    a, b = read_metrics(tmp_path, "big")[0], read_metrics(tmp_path, "acc")[0]
    for x, y in zip(a, b):
        for key in ("learning/loss", "learning/raw_grad_norm"):
            assert abs(x[key] - y[key]) <= GA_TOL[dtype][key] * abs(x[key]), (key, x, y)
        assert x["perf/per_device_tokens"] == y["perf/per_device_tokens"] == 2 * 256
        assert x["perf/per_device_tflops"] == y["perf/per_device_tflops"]
    assert "total_weights: 512, " in acc.stdout
    assert [m["eval/total_weights"] for m in b if "eval/avg_loss" in m] == [256, 256]
    plans = {run: parse_plan(stepscope(tmp_path, *FAST, "--dry-run", f"dtype={dtype}", *args).stdout)
             for run, args in (("big", ["per_device_batch_size=2"]),
                               ("acc", ["per_device_batch_size=1", "gradient_accumulation_steps=2"]))}
    assert plans["big"]["per_device_tflops"] == plans["acc"]["per_device_tflops"]
    assert plans["big"]["global_batch_size"].split()[0] == plans["acc"]["global_batch_size"].split()[0] == "2"
    assert plans["big"]["tokens_per_device_per_step"] == plans["acc"]["tokens_per_device_per_step"] == "512"
    acts = {run: int(plans[run]["memory_saved_activations_bytes"].split()[0]) for run in plans}
    assert 2 * acts["acc"] == acts["big"], acts
    # the data ring holds a step's rows either way
    assert plans["big"]["memory_data_ring_bytes"] == plans["acc"]["memory_data_ring_bytes"], plans


def test_gradient_accumulation_reads_consecutive_windows(tmp_path):
    """On a token file a step of 3 micro-batches of 1 reads the windows a batch of 3 would, step
    after step (so 3 steps walk 9 windows), and refuses an absurd count at the config."""
    f = write_tokens(tmp_path / "ids.bin", np.random.default_rng(5).integers(0, 256, size=20 * 65))
    data = ["dataset_type=tokens", f"dataset_path={f}", "max_target_length=64", "steps=3"]
    train(tmp_path, *data, "per_device_batch_size=3", run_name="big")
    train(tmp_path, *data, "per_device_batch_size=1", "gradient_accumulation_steps=3", run_name="acc")
    for x, y in zip(read_metrics(tmp_path, "big")[0], read_metrics(tmp_path, "acc")[0]):
        assert abs(x["learning/loss"] - y["learning/loss"]) <= 1e-5 * abs(x["learning/loss"]), (x, y)
    r = stepscope(tmp_path, *FAST, "gradient_accumulation_steps=0")
    assert r.returncode == 2 and "gradient_accumulation_steps" in r.stderr


# ---- evaluation --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_evaluation_is_the_forward_loss_of_its_parameters(tmp_path, dtype):
    """eval_interval=2 evaluates after steps 1 and 3 (MaxText: after step s when s + 1 is a
    multiple, step 0 excepted), on synthetic data of seed data_seed + 1. Its loss is the training
    loss those parameters give that batch: a run with data_seed=1 started from the checkpoint of
    step 1 computes at its step 0, to the last bit, the evaluation after step 1 (eval_steps=2 of
    the one synthetic batch: (x + x) / 2 is x)."""
    r = train(tmp_path, "steps=4", f"dtype={dtype}", "eval_interval=2", "eval_steps=2", "enable_checkpointing=true",
              "checkpoint_period=1")
    recs, raw = read_metrics(tmp_path)
    assert [m["step"] for m in recs if "eval/avg_loss" in m] == [1, 3]
    m1 = next(m for m in recs if m["step"] == 1)
    assert m1["eval/total_weights"] == 2 * 2 * 256          # 2 batches of the default 2 x 256
    assert m1["eval/seconds"] > 0 and m1["eval/per_device_tokens_per_sec"] > 0
    # a batch's forward is a third of a step's FLOPs (seconds are written to 1 us: 2e-3 relative)
    expect = m1["perf/per_device_tflops"] / 3 * 2 / m1["eval/seconds"]
    assert abs(m1["eval/per_device_tflops_per_sec"] - expect) <= 2e-3 * expect
    raw_eval = [re.search(r'"eval/avg_loss": ([^,]+),', l).group(1) for l in raw if "eval/avg_loss" in l]
    lines = r.stdout.splitlines()
    for s in (1, 3):
        i = next(k for k, l in enumerate(lines) if l.startswith(f"completed step: {s},"))
        ev = next(l for l in lines[i + 1:i + 3] if l.startswith("eval:"))
        assert ev.startswith(f"eval: after step {s}, average loss ") and "over 1024 tokens (2 batches)" in ev, ev
        assert ev.endswith("outside the step times")
    # the summary: how many, the last, the forward's median rate
    summ = json.loads((run_dir(tmp_path) / "summary.json").read_text())
    evals = [m for m in recs if "eval/avg_loss" in m]
    assert (summ["eval/count"], summ["eval/last_step"], summ["eval/last_avg_loss"]) == (2, 3, evals[1]["eval/avg_loss"])
    rates = sorted(m["eval/per_device_tokens_per_sec"] for m in evals)
    assert abs(summ["eval/per_device_tokens_per_sec_median"] - (rates[0] + rates[1]) / 2) <= 1e-3 * rates[1]
    assert "  evaluation      2, the last after step 3: average loss " in r.stdout
    train(tmp_path, "steps=1", f"dtype={dtype}", "data_seed=1", f"load_parameters_path={checkpoint_file(tmp_path, 1)}",
          run_name="b")
    _, raw_b = read_metrics(tmp_path, "b")
    assert raw_losses(raw_b)[0] == raw_eval[0]
    # TensorBoard has it too, at its steps (where tensorboard is installed)
    try:
        acc = tensorboard_scalars(run_dir(tmp_path) / "tensorboard" / RUN)
    except pytest.skip.Exception:
        acc = None
    if acc is not None:
        assert [e.step for e in acc.Scalars("eval/avg_loss")] == [1, 3]


def test_evaluation_on_a_token_file(tmp_path):
    """With dataset_type=tokens, eval_dataset_path's windows in order: the first evaluation reads
    its batch 0, the batch a training run on that file starts with."""
    write_tokens(tmp_path / "train.bin", np.random.default_rng(1).integers(0, 256, 3 * 64 + 1))
    write_tokens(tmp_path / "eval.bin", np.random.default_rng(2).integers(0, 256, 2 * 64 + 1))
    data = ["dataset_type=tokens", "per_device_batch_size=1", "max_target_length=64"]
    train(tmp_path, *data, f"dataset_path={tmp_path / 'train.bin'}", "steps=3", "eval_interval=2",
          f"eval_dataset_path={tmp_path / 'eval.bin'}", "enable_checkpointing=true", "checkpoint_period=1")
    recs, raw = read_metrics(tmp_path)
    raw_eval = [re.search(r'"eval/avg_loss": ([^,]+),', l).group(1) for l in raw if "eval/avg_loss" in l]
    assert len(raw_eval) == 1 and "eval/avg_loss" in recs[1]
    train(tmp_path, *data, f"dataset_path={tmp_path / 'eval.bin'}", "steps=1",
          f"load_parameters_path={checkpoint_file(tmp_path, 1)}", run_name="b")
    assert raw_losses(read_metrics(tmp_path, "b")[1])[0] == raw_eval[0]
    # a bad evaluation file is refused before set-up, named as the evaluation's
    r = stepscope(tmp_path, *FAST, "run_name=bad", *data, f"dataset_path={tmp_path / 'train.bin'}",
                  "eval_interval=1", f"eval_dataset_path={tmp_path / 'none.bin'}")
    assert r.returncode == 1 and "evaluation data:" in r.stderr and "none.bin" in r.stderr, r.stderr
    assert "set-up:" not in r.stdout


def test_evaluation_of_the_whole_set(tmp_path):
    """eval_steps=-1 (MaxText: the whole evaluation set) evaluates every whole batch of the
    evaluation file, from its first window each time: 7 windows of 32 + 1 ids make 3 batches of
    2 (the 7th window is left out). With parameters that do not move (learning_rate=0) every
    evaluation then gives the same loss, the first one's of eval_steps=3, whose next evaluation
    reads on to other windows. Synthetic data is one batch. A file with fewer windows than one
    batch is refused before set-up, and eval_steps=0 at the config."""
    f = write_tokens(tmp_path / "eval.bin", np.random.default_rng(9).integers(0, 256, size=7 * 32 + 1))
    common = ["steps=4", "learning_rate=0", "adam_weight_decay=0", "max_target_length=32", "eval_interval=1",
              "dataset_type=tokens", f"dataset_path={f}", f"eval_dataset_path={f}"]
    r = train(tmp_path, *common, "eval_steps=-1", run_name="whole")
    whole = [m for m in read_metrics(tmp_path, "whole")[0] if "eval/avg_loss" in m]
    assert [m["step"] for m in whole] == [1, 2, 3]
    assert len({m["eval/avg_loss"] for m in whole}) == 1
    assert all(m["eval/total_weights"] == 3 * 2 * 32 for m in whole)
    assert "(3 batches)" in r.stdout
    train(tmp_path, *common, "eval_steps=3", run_name="three")
    three = [m for m in read_metrics(tmp_path, "three")[0] if "eval/avg_loss" in m]
    assert three[0]["eval/avg_loss"] == whole[0]["eval/avg_loss"]
    assert three[1]["eval/avg_loss"] != whole[1]["eval/avg_loss"]
    train(tmp_path, "steps=3", "eval_interval=2", "eval_steps=-1", run_name="synthetic")
    assert [m["eval/total_weights"] for m in read_metrics(tmp_path, "synthetic")[0] if "eval/avg_loss" in m] == [2 * 256]
    short = write_tokens(tmp_path / "short.bin", np.arange(33) % 256)
    r = stepscope(tmp_path, *FAST, "run_name=x", *common[:-1], f"eval_dataset_path={short}", "eval_steps=-1")
    assert r.returncode == 1 and "evaluation data:" in r.stderr and "fewer windows" in r.stderr, r.stderr
    assert not run_dir(tmp_path, "x").exists()
    r = stepscope(tmp_path, *FAST, "eval_steps=0")
    assert r.returncode == 2 and "eval_steps=0" in r.stderr


def test_evaluation_is_outside_the_step_times(tmp_path):
    # 200 batches of evaluation take ~100 times a tiny step; the step after it is timed from its
    # end, so it stays a step's length
    train(tmp_path, "steps=4", "eval_interval=2", "eval_steps=200")
    recs, _ = read_metrics(tmp_path)
    ev = recs[1]["eval/seconds"]
    assert recs[2]["perf/step_time_seconds"] < ev / 4, (recs[2], ev)


def write_tiny_safetensors(path, nan_tensor=None):
    """A tiny-shaped Qwen3 checkpoint (F32); nan_tensor is filled with NaN."""
    rng = np.random.default_rng(0)
    tensors = [("model.embed_tokens.weight", (256, 64))]
    for l in range(2):
        tensors += [(f"model.layers.{l}.{s}", (r, c) if c else (r,)) for s, r, c in TINY_LAYER]
    tensors.append(("model.norm.weight", (64,)))
    header, blobs, off = {}, [], 0
    for name, shape in tensors:
        a = (np.ones(shape) if len(shape) == 1 else 0.02 * rng.standard_normal(shape)).astype("<f4")
        if name == nan_tensor:
            a[:] = np.nan
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return path


def test_abort_on_nan_loss(tmp_path):
    ok = write_tiny_safetensors(tmp_path / "ok.safetensors")
    train(tmp_path, "steps=2", f"load_parameters_path={ok}", run_name="ok")   # the file itself loads
    bad = write_tiny_safetensors(tmp_path / "nan.safetensors", nan_tensor="model.norm.weight")
    r = stepscope(tmp_path, *FAST, "run_name=nan", "steps=5", f"load_parameters_path={bad}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"loss is NaN at step 0\b", r.stderr), r.stderr
    assert "abort_on_nan_loss" in r.stderr
    recs, lines = read_metrics(tmp_path, "nan")     # renamed, no .partial
    assert [x["step"] for x in recs] == [0]
    # written as Python's json (and MaxText) writes it, not printf's "nan"/"-nan"
    assert math.isnan(recs[0]["learning/loss"]) and '"learning/loss": NaN,' in lines[0], lines[0]
    assert re.search(r"^completed step: 0, .* loss: -?nan$", r.stdout, re.M | re.I), r.stdout
    # abort_on_nan_loss=false keeps going
    r = stepscope(tmp_path, *FAST, "run_name=nan2", "steps=3", f"load_parameters_path={bad}",
                  "abort_on_nan_loss=false")
    assert r.returncode == 0, r.stdout + r.stderr
    recs, _ = read_metrics(tmp_path, "nan2")
    assert [x["step"] for x in recs] == [0, 1, 2]


def test_abort_on_non_finite_gradient(tmp_path):
    # an absurd learning rate without clipping blows the weights up within a few steps
    r = stepscope(tmp_path, *FAST, f"run_name={RUN}", "steps=20", "learning_rate=1e30",
                  "gradient_clipping_threshold=0")
    assert r.returncode == 1, r.stdout + r.stderr
    m = re.search(r"(?:gradient norm is not finite|loss is (?:NaN|Inf)) at step (\d+)", r.stderr)
    assert m, r.stderr
    step = int(m.group(1))
    recs, _ = read_metrics(tmp_path)
    assert [x["step"] for x in recs] == list(range(step + 1))   # up to and including the bad step
    assert step < 19


# ---- 10. SIGINT -------------------------------------------------------------------------------

def drain(p, timeout):
    """The rest of p's stdout and all of its stderr, then its exit, within timeout seconds.
    Not p.communicate(): with both pipes it reads their file descriptors directly, and a line the
    caller's `for line in p.stdout` had already pulled into the file object's buffer (the next
    step's, when two arrive in one read) would be lost."""
    got = {}
    readers = [threading.Thread(target=lambda name=name, f=f: got.__setitem__(name, f.read()), daemon=True)
               for name, f in (("out", p.stdout), ("err", p.stderr))]
    for r in readers:
        r.start()
    p.wait(timeout=timeout)
    for r in readers:
        r.join(timeout=timeout)
    assert not any(r.is_alive() for r in readers), "the process exited but its pipes stayed open"
    return got["out"], got["err"]


def test_sigint_stops_cleanly(tmp_path):
    cmd = [str(BIN), str(CONFIG), f"base_output_directory={tmp_path / 'out'}", *FAST, f"run_name={RUN}",
           "steps=200", "data_delay_ms=10"]
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_EVENT_LOG"}
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 30
        for line in p.stdout:
            seen.append(line)
            if line.startswith("completed step: 0,"):
                break
            assert time.monotonic() < deadline
        p.send_signal(signal.SIGINT)
        rest, err = drain(p, timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = "".join(seen) + rest
    assert p.returncode == 130, out + err
    m = re.search(r"interrupted by SIGINT after step (\d+); the metrics so far are written", err)
    assert m, err
    last = int(m.group(1))
    assert 0 <= last < 199
    steps = [int(x) for x in re.findall(r"^completed step: (\d+),", out, re.M)]
    assert steps == list(range(last + 1))
    assert "summary" in out
    recs, _ = read_metrics(tmp_path)           # renamed, no .partial
    assert [x["step"] for x in recs] == list(range(last + 1))
    assert "metrics.jsonl" in out              # "files written:"
