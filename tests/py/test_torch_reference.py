"""The PyTorch reference (tools/torch_qwen3.py) against stepscope, loss for loss: both start
from the same weights (torch initialises and saves them under Hugging Face's names; stepscope
loads them with load_parameters_path), read the same batches (stepscope's synthetic ids, which
the reference regenerates, or a token file), and take 3 AdamW steps with clipping. The bench
scripts time this reference against stepscope, so it must compute the same thing.

The reference runs under tools/torch_python.py's choice: $TORCH_PYTHON, else the test's own
interpreter or .venv's (which `tools/install_deps.sh --with-torch` gives torch, safetensors and
transformers; .ci/run does), else python3; the tests skip where it has no torch (or no
safetensors, or for the last, no transformers).

Tolerance: the losses differ only by float32 rounding and summation order (measured <= 1e-7
relative over the 3 steps); Adam's normalisation can amplify per-element gradient rounding
where a gradient is near zero, so the bar is 1e-4: still far below what a real difference in
the maths costs here: the z-loss term is 5.5e-3 of the untied case's loss (3e-2 of 5.58), and
dropping its clipping moves the third loss by 2.4e-4 (less than the clipping's 0.17 scale of the
gradient would suggest: Adam divides most of a gradient's scale away; measured 2026-12-07)."""
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_BIN = Path(os.environ.get("STEPSCOPE_BIN", "build/stepscope"))
BIN = _BIN if _BIN.is_absolute() else ROOT / _BIN
REFERENCE = ROOT / "tools" / "torch_qwen3.py"
sys.path.insert(0, str(ROOT / "tools"))
from torch_python import imports, torch_python  # noqa: E402

TORCH_PY = torch_python(("torch", "safetensors"))
REL_TOL = 1e-4
INSTALL = "tools/install_deps.sh --with-torch installs them in .venv"


def _imports(*modules):
    """Whether TORCH_PY imports these modules."""
    return imports(TORCH_PY, modules)


pytestmark = [
    pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built (run make)"),
    pytest.mark.skipif(not _imports("torch", "safetensors"), reason=f"{TORCH_PY} cannot import torch and safetensors ({INSTALL})"),
]

CASES = {
    # the tiny preset as it is: tied head, GQA, synthetic data
    "tiny_synthetic": ["model_name=tiny", "steps=3"],
    # untied head, z-loss, clipping that bites (raw norm ~0.6), a token file, batch of 3
    "untied_zloss_tokens": ["model_name=tiny", "override_model_config=true", "logits_via_embedding=false",
                            "rope_max_timescale=500000", "normalization_layer_epsilon=1e-5",
                            "z_loss_multiplier=1e-3", "gradient_clipping_threshold=0.1",
                            "per_device_batch_size=3", "max_target_length=40", "steps=3",
                            "dataset_type=tokens"],
}


def _losses_from_the_same_weights(tmp_path, case, dtype):
    """The first 3 losses of the reference (under bf16 autocast where dtype is bfloat16) and of
    stepscope (dtype=...), both from the weights the reference initialises and saves."""
    overrides = list(CASES[case]) + [f"dtype={dtype}"]
    if "dataset_type=tokens" in overrides:
        # 3 windows of 40 + 1 ids: every step reads the same batch, so the loss must fall
        ids = np.random.default_rng(7).integers(0, 256, size=3 * 40 + 1, dtype=np.uint32)
        ids.astype("<u4").tofile(tmp_path / "ids.bin")
        overrides.append(f"dataset_path={tmp_path / 'ids.bin'}")
    weights, result = tmp_path / "w.safetensors", tmp_path / "torch.json"
    r = subprocess.run([TORCH_PY, str(REFERENCE), "--bin", str(BIN), "--threads", "1", "--quiet", "--dtype", dtype,
                        "--save-weights", str(weights), "--json", str(result), *overrides],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    torch_losses = [s["loss"] for s in json.loads(result.read_text())["steps"]]

    r = subprocess.run([str(BIN), str(ROOT / "configs" / "base.yml"), *overrides,
                        f"load_parameters_path={weights}", f"base_output_directory={tmp_path / 'out'}",
                        "run_name=r", "profiler=", "enable_tensorboard=false", "device_peak_tflops=0.446",
                        "num_threads=1"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "out" / "r" / "metrics.jsonl").read_text().splitlines()
    ours = [json.loads(line)["learning/loss"] for line in lines]
    assert len(ours) == len(torch_losses) == 3
    return ours, torch_losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_losses_match_stepscope(tmp_path, case):
    ours, torch_losses = _losses_from_the_same_weights(tmp_path, case, "float32")
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, torch_losses)]
    print(f"{case}: stepscope {ours}, torch {torch_losses}, relative differences {rel}", file=sys.stderr)
    assert max(rel) < REL_TOL, f"stepscope {ours} vs torch {torch_losses}: relative differences {rel}"
    # the steps must have trained, or matching losses would say little about the optimizer
    assert torch_losses[2] < torch_losses[0] - 1e-3


# bf16 against torch's bf16 autocast, which bench/vs_torch.py times it against: both round the
# matmul inputs to bf16 (2^-9 relative at most) and sum in fp32, but autocast also rounds the
# matmul outputs and runs attention in bf16, where stepscope keeps fp32. Measured on both cases:
# 0.8e-5 to 1.8e-5 relative over the 3 steps (2026-12-07), as far apart as either engine's bf16
# losses are from its fp32 ones. The bar, 2e-4, is 11x that and 27x below the z-loss term's
# share of the loss (5.5e-3). A dropped clipping (2.4e-4 by the third step) is the fp32 test's
# to catch: under bf16 it would sit at the bar.
REL_TOL_BF16 = 2e-4


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_losses_track_autocast(tmp_path, case):
    """stepscope's dtype=bfloat16 computes the step the bf16 benchmarks compare it with."""
    ours, torch_losses = _losses_from_the_same_weights(tmp_path, case, "bfloat16")
    rel = [abs(a - b) / abs(b) for a, b in zip(ours, torch_losses)]
    print(f"{case} bf16: stepscope {ours}, torch autocast {torch_losses}, relative differences {rel}",
          file=sys.stderr)
    assert max(rel) < REL_TOL_BF16, f"stepscope {ours} vs torch autocast {torch_losses}: relative differences {rel}"
    assert torch_losses[2] < torch_losses[0] - 1e-3 and ours[2] < ours[0] - 1e-3


@pytest.mark.parametrize("override,needle", [
    ("gradient_accumulation_steps=2", "compare with per_device_batch_size=4 (the same update)"),
    ("mu_dtype=bfloat16", "the reference keeps torch AdamW's fp32 moments; compare with mu_dtype=float32"),
    ("dtype=bfloat16 weight_dtype=bfloat16", "the reference keeps fp32 parameters and AdamW moments; compare with "
                                             "weight_dtype=float32")])
def test_reference_refuses_what_it_does_not_compute(tmp_path, override, needle):
    """A setting the reference would not compute as stepscope does is refused in one line with the
    setting to compare against, rather than timed as if it were the same step."""
    r = subprocess.run([TORCH_PY, str(REFERENCE), "--bin", str(BIN), "--threads", "1", "--quiet", "model_name=tiny",
                        "steps=1", *override.split()], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_continues_in_the_reference(tmp_path):
    """A checkpoint (enable_checkpointing) is a Hugging Face Qwen3 state dict that another
    implementation takes as it is: the PyTorch reference, started from step 2's parameters on the
    same batch, computes at its first step the loss stepscope computed at step 3. Same bar as
    above: float32 rounding and summation order only."""
    overrides = ["model_name=tiny"]
    r = subprocess.run([str(BIN), str(ROOT / "configs" / "base.yml"), *overrides, "steps=4", "enable_checkpointing=true",
                        "checkpoint_period=2", f"base_output_directory={tmp_path / 'out'}", "run_name=r", "profiler=",
                        "enable_tensorboard=false", "device_peak_tflops=0.446", "num_threads=1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ours = [json.loads(line)["learning/loss"]
            for line in (tmp_path / "out" / "r" / "metrics.jsonl").read_text().splitlines()]
    checkpoint, result = tmp_path / "out" / "r" / "checkpoints" / "2" / "model.safetensors", tmp_path / "torch.json"
    r = subprocess.run([TORCH_PY, str(REFERENCE), "--bin", str(BIN), "--threads", "1", "--quiet",
                        "--load-weights", str(checkpoint), "--json", str(result), *overrides, "steps=1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    theirs = json.loads(result.read_text())["steps"][0]["loss"]
    assert abs(theirs - ours[3]) / abs(ours[3]) < REL_TOL, (theirs, ours)
    assert abs(ours[3] - ours[0]) / abs(ours[0]) > 100 * REL_TOL   # the checkpoint is not the initial weights


def _read_f32(path):
    """A safetensors file of F32 tensors, as numpy arrays, and its metadata."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = np.frombuffer(raw, dtype="<f4", offset=8 + n)
    return ({k: data[v["data_offsets"][0] // 4:v["data_offsets"][1] // 4] for k, v in header.items()
             if k != "__metadata__"}, header.get("__metadata__", {}), header)


def test_optimizer_state_matches_the_reference(tmp_path):
    """A checkpoint's optimizer_state file holds AdamW's moments as torch's AdamW holds them: from
    the same weights and batches, 3 steps (clipping included) leave exp_avg and exp_avg_sq, tensor
    by tensor (our flat ranges cut at model.safetensors' offsets, which follow the same layout),
    within 1e-4 of torch's in relative norm (the losses' bar), and the same update count. The
    moments are averages of gradients, which differ by float32 rounding only, but the parameters
    they were taken at have moved by Adam's normalised steps, which amplify that rounding where a
    gradient is near zero: measured 2.6e-6 at worst (torch 2.15, 2026-12-07)."""
    overrides = ["model_name=tiny", "steps=3"]
    weights, moments = tmp_path / "w.safetensors", tmp_path / "torch_adam.safetensors"
    r = subprocess.run([TORCH_PY, str(REFERENCE), "--bin", str(BIN), "--threads", "1", "--quiet",
                        "--save-weights", str(weights), "--save-optimizer", str(moments), *overrides],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(BIN), str(ROOT / "configs" / "base.yml"), *overrides, f"load_parameters_path={weights}",
                        "enable_checkpointing=true", f"base_output_directory={tmp_path / 'out'}", "run_name=r",
                        "profiler=", "enable_tensorboard=false", "device_peak_tflops=0.446", "num_threads=1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "out" / "r" / "checkpoints" / "2"
    ours, meta, _ = _read_f32(folder / "optimizer_state-00000-of-00001.safetensors")
    theirs, their_meta, _ = _read_f32(moments)
    assert meta["updates_done"] == their_meta["updates_done"] == "3"
    _, _, layout = _read_f32(folder / "model.safetensors")
    names = sorted((v["data_offsets"][0] // 4, v["data_offsets"][1] // 4, k) for k, v in layout.items()
                   if k != "__metadata__")
    assert names[-1][1] == ours["exp_avg"].size and len(theirs) == 2 * len(names)
    worst = 0.0
    for lo, hi, name in names:
        for moment in ("exp_avg", "exp_avg_sq"):
            a, b = ours[moment][lo:hi], theirs[f"{name}.{moment}"]
            assert np.linalg.norm(b) > 0, (name, moment)
            rel = np.linalg.norm(a - b) / np.linalg.norm(b)
            worst = max(worst, rel)
            assert rel < REL_TOL, (name, moment, rel)
    print(f"largest relative difference of a moment from torch's: {worst:.2e}", file=sys.stderr)


HF_LOSS = r'''
import json, sys
import numpy as np, torch
from transformers import Qwen3ForCausalLM
folder, ids_path, B, S = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
ids = np.fromfile(ids_path, dtype="<u4").astype(np.int64)
rows = torch.tensor(np.stack([ids[w * S:w * S + S + 1] for w in range(B)]))
with torch.no_grad():
    logits = model(rows[:, :S]).logits.float()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
print(json.dumps({"loss": loss.item(), "tied": model.config.tie_word_embeddings}))
'''


@pytest.mark.skipif(not _imports("torch", "transformers"), reason=f"{TORCH_PY} cannot import transformers ({INSTALL})")
@pytest.mark.parametrize("shape", [
    ["model_name=tiny"],
    ["model_name=tiny", "override_model_config=true", "logits_via_embedding=false", "rope_max_timescale=500000",
     "normalization_layer_epsilon=1e-5", "base_num_kv_heads=1", "head_dim=24"],
])
def test_checkpoint_opens_in_transformers(tmp_path, shape):
    """A checkpoint folder is a Hugging Face model folder (model.safetensors and config.json):
    transformers' Qwen3ForCausalLM.from_pretrained opens it as it is and computes, on the batch
    of step 2 (a token file of exactly B windows: every step reads the same batch), the loss
    stepscope computed at step 2 from step 1's checkpoint. Tied and untied, with a non-default
    rope base, eps and head_dim. Same bar as above: float32 rounding and summation order."""
    B, S = 2, 32
    np.random.default_rng(3).integers(0, 256, size=B * S + 1, dtype=np.uint32).astype("<u4").tofile(tmp_path / "ids.bin")
    r = subprocess.run([str(BIN), str(ROOT / "configs" / "base.yml"), *shape, "steps=3", "enable_checkpointing=true",
                        "checkpoint_period=1", "dataset_type=tokens", f"dataset_path={tmp_path / 'ids.bin'}",
                        f"per_device_batch_size={B}", f"max_target_length={S}",
                        f"base_output_directory={tmp_path / 'out'}", "run_name=r", "profiler=",
                        "enable_tensorboard=false", "device_peak_tflops=0.446", "num_threads=1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ours = [json.loads(line)["learning/loss"]
            for line in (tmp_path / "out" / "r" / "metrics.jsonl").read_text().splitlines()]
    folder = tmp_path / "out" / "r" / "checkpoints" / "1"
    # AdamW's state beside the model does not get in the way of its readers
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors",
                                                        "optimizer_state-00000-of-00001.safetensors"]
    r = subprocess.run([TORCH_PY, "-c", HF_LOSS, str(folder), str(tmp_path / "ids.bin"), str(B), str(S)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    hf = json.loads(r.stdout.strip().splitlines()[-1])
    assert hf["tied"] == ("logits_via_embedding=false" not in shape)
    print(f"transformers {hf['loss']!r}, stepscope {ours[2]!r}, relative {abs(hf['loss'] - ours[2]) / ours[2]:.2e}",
          file=sys.stderr)
    assert abs(hf["loss"] - ours[2]) / abs(ours[2]) < REL_TOL, (hf, ours)
    assert abs(ours[2] - ours[0]) / abs(ours[0]) > 100 * REL_TOL   # trained: not the initial weights
