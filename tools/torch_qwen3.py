#!/usr/bin/env python3
"""A plain PyTorch Qwen3 training step with stepscope's maths, written once: the reference the
benchmarks in bench/ compare stepscope with, and that tests/py/test_torch_reference.py checks
loss for loss against stepscope.

Same maths as src/model/qwen3.c and src/train/state.c (and Hugging Face's Qwen3ForCausalLM):
token embedding; per layer RMSNorm -> q/k/v projections -> per-head q/k RMSNorm -> rotate-half
RoPE -> causal GQA attention (F.scaled_dot_product_attention) -> o projection -> residual ->
RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head tied to the embedding or not; loss =
mean next-token cross-entropy (+ z_loss_multiplier * mean(logsumexp^2)); global-norm clipping
(clip_grad_norm_) and torch's AdamW over all parameters (norm weights decay too, as in
stepscope); constant learning rate. Parameters carry Hugging Face's names, so the state dict
saved as safetensors is what stepscope's load_parameters_path reads.

The configuration is stepscope's own: the model, batch, optimizer and data keys are read from
`stepscope CONFIG key=value ... --dry-run`, so presets and overrides resolve exactly as they do
for the C binary. Data: stepscope's synthetic batch (the same ids, see src/data/synthetic.c) or
its token file (src/data/tokens.c).

    python3 tools/torch_qwen3.py model_name=tiny steps=3            # run, one line per step
    python3 tools/torch_qwen3.py --mode compile --dtype bfloat16 --threads 2 --json out.json \\
        model_name=qwen3-0.6b per_device_batch_size=1 max_target_length=1024 steps=4
    python3 tools/torch_qwen3.py --save-weights w.safetensors model_name=tiny   # then pass
        # load_parameters_path=w.safetensors to stepscope to start both from the same weights
"""
import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stepscope_plan import DEFAULT_BIN, DEFAULT_CONFIG, stepscope_plan  # noqa: E402


# ---- configuration, from stepscope's --dry-run --------------------------------------------

def resolved_plan(overrides, binary=DEFAULT_BIN, config=DEFAULT_CONFIG):
    """stepscope's resolved config and plan; RuntimeError when stepscope rejects the config
    itself (a plan over stepscope's memory budget is fine: torch does not use it). The profiler
    keys are stepscope's alone, so the profiler is switched off for the check."""
    plan = stepscope_plan([*overrides, "profiler="], binary, config)
    if "refused" in plan and "memory_total_bytes" not in plan:
        raise RuntimeError(plan["refused"])
    micro = int(plan.get("gradient_accumulation_steps", "1"))
    if micro != 1:
        raise RuntimeError(f"gradient_accumulation_steps={micro}: the reference takes one batch a step; compare "
                           f"with per_device_batch_size={int(plan['per_device_batch_size']) * micro} (the same update)")
    if plan.get("weight_dtype", "").startswith("bfloat16"):
        raise RuntimeError("weight_dtype=bfloat16: the reference keeps fp32 parameters and AdamW moments; compare "
                           "with weight_dtype=float32")
    if plan.get("mu_dtype", "").startswith("bfloat16"):
        raise RuntimeError("mu_dtype=bfloat16: the reference keeps torch AdamW's fp32 moments; compare with "
                           "mu_dtype=float32")
    return plan


def _bool(text):
    return text.strip().lower() == "true"


@dataclass
class Qwen3Dims:
    B: int
    S: int
    D: int
    F: int
    L: int
    H: int
    KV: int
    HD: int
    V: int
    tied: bool
    qk_norm: bool
    rope_theta: float
    eps: float

    @classmethod
    def from_plan(cls, p):
        return cls(B=int(p["per_device_batch_size"]), S=int(p["max_target_length"]),
                   D=int(p["base_emb_dim"]), F=int(p["base_mlp_dim"]), L=int(p["base_num_decoder_layers"]),
                   H=int(p["base_num_query_heads"]), KV=int(p["base_num_kv_heads"]), HD=int(p["head_dim"]),
                   V=int(p["vocab_size"]), tied=_bool(p["logits_via_embedding"]), qk_norm=_bool(p["use_qk_norm"]),
                   rope_theta=float(p["rope_max_timescale"]), eps=float(p["normalization_layer_epsilon"]))


@dataclass
class TrainConfig:
    steps: int
    lr: float
    b1: float
    b2: float
    adam_eps: float
    weight_decay: float
    clip: float
    z_loss: float
    init_seed: int
    dataset_type: str
    dataset_path: str
    data_seed: int

    @classmethod
    def from_plan(cls, p):
        return cls(steps=int(p["steps"]), lr=float(p["learning_rate"]), b1=float(p["adam_b1"]),
                   b2=float(p["adam_b2"]), adam_eps=float(p["adam_eps"]),
                   weight_decay=float(p["adam_weight_decay"]), clip=float(p["gradient_clipping_threshold"]),
                   z_loss=float(p["z_loss_multiplier"]), init_seed=int(p["init_weights_seed"]),
                   dataset_type=p["dataset_type"], dataset_path=p.get("dataset_path", ""),
                   data_seed=int(p["data_seed"]))


# ---- data: stepscope's synthetic ids and token-file windows ------------------------------

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def synthetic_row(seed, row, length, vocab):
    """Row `row` of stepscope's synthetic batch (src/data/synthetic.c: a splitmix64 stream keyed
    by (seed, row), 32-bit halves high first, Lemire's bounded draw with rejection)."""
    state = _mix64(_mix64((seed + _GOLDEN) & _M64) ^ ((row * 0xD1B54A32D192ED03) & _M64))
    halves = []
    out = np.empty(length, dtype=np.int64)
    threshold = ((1 << 32) - vocab) % vocab  # 2^32 mod vocab

    def next32():
        nonlocal state
        if not halves:
            state = (state + _GOLDEN) & _M64
            word = _mix64(state)
            halves.extend([word & 0xFFFFFFFF, word >> 32])  # popped from the end: high half first
        return halves.pop()

    for j in range(length):
        m = next32() * vocab
        if (m & 0xFFFFFFFF) < vocab:
            while (m & 0xFFFFFFFF) < threshold:
                m = next32() * vocab
        out[j] = m >> 32
    return out


class Batches:
    """Step i's batch, [B, S+1] int64, as stepscope's data reader makes it."""

    def __init__(self, dims, train):
        self.B, self.S = dims.B, dims.S
        if train.dataset_type == "synthetic":
            self.fixed = np.stack([synthetic_row(train.data_seed, b, self.S + 1, dims.V) for b in range(self.B)])
            self.ids = None
        elif train.dataset_type == "tokens":
            self.fixed = None
            self.ids = np.fromfile(train.dataset_path, dtype="<u4").astype(np.int64)
            self.windows = (len(self.ids) - 1) // self.S
        else:
            raise ValueError(f"dataset_type {train.dataset_type!r} is not one this reference reads")

    def __call__(self, step):
        if self.fixed is not None:
            return self.fixed
        rows = [(step * self.B + b) % self.windows for b in range(self.B)]
        return np.stack([self.ids[w * self.S: w * self.S + self.S + 1] for w in rows])


# ---- the model ---------------------------------------------------------------------------
# torch is imported here, not at the top, so the config and data helpers above load without it.
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

INIT_STD = 0.02  # Hugging Face's initializer_range; stepscope's QWEN3_INIT_STD_MILLI


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        # In float32 even under bf16 autocast, as Hugging Face's Qwen3RMSNorm.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(S, HD, theta):
    """cos, sin [S, HD] (each half repeated), computed in float64 then rounded, as rope_tables in
    src/kernels/rope.c."""
    inv_freq = 1.0 / theta ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    angle = torch.outer(torch.arange(S, dtype=torch.float64), inv_freq)
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos().float(), angle.sin().float()


def apply_rope(x, cos, sin):
    """x [B, heads, S, HD]; rotate-half RoPE."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.d = d
        self.q_proj = nn.Linear(d.D, d.H * d.HD, bias=False)
        self.k_proj = nn.Linear(d.D, d.KV * d.HD, bias=False)
        self.v_proj = nn.Linear(d.D, d.KV * d.HD, bias=False)
        self.o_proj = nn.Linear(d.H * d.HD, d.D, bias=False)
        if d.qk_norm:
            self.q_norm = RMSNorm(d.HD, d.eps)
            self.k_norm = RMSNorm(d.HD, d.eps)

    def forward(self, x, cos, sin):
        d = self.d
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, d.H, d.HD)
        k = self.k_proj(x).view(B, S, d.KV, d.HD)
        v = self.v_proj(x).view(B, S, d.KV, d.HD)
        if d.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        # Query head h reads kv head h // (H/KV), as Hugging Face's repeat_kv and stepscope.
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=d.H != d.KV)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, d.H * d.HD))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gate_proj = nn.Linear(d.D, d.F, bias=False)
        self.up_proj = nn.Linear(d.D, d.F, bias=False)
        self.down_proj = nn.Linear(d.F, d.D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_layernorm = RMSNorm(d.D, d.eps)
        self.self_attn = Attention(d)
        self.post_attention_layernorm = RMSNorm(d.D, d.eps)
        self.mlp = MLP(d)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.embed_tokens = nn.Embedding(d.V, d.D)
        self.layers = nn.ModuleList([DecoderLayer(d) for _ in range(d.L)])
        self.norm = RMSNorm(d.D, d.eps)

    def forward(self, ids, cos, sin):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Qwen3(nn.Module):
    """Parameter names are Hugging Face's (model.embed_tokens.weight, model.layers.N...,
    model.norm.weight, lm_head.weight only when untied)."""

    def __init__(self, d, z_loss=0.0):
        super().__init__()
        self.d = d
        self.z_loss = z_loss
        self.model = Decoder(d)
        if not d.tied:
            self.lm_head = nn.Linear(d.D, d.V, bias=False)
        cos, sin = rope_tables(d.S, d.HD, d.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def head_weight(self):
        return self.model.embed_tokens.weight if self.d.tied else self.lm_head.weight

    def forward(self, tokens):
        """tokens [B, S+1]: inputs tokens[:, :S], targets tokens[:, 1:]. Returns the mean loss."""
        S = tokens.shape[1] - 1
        h = self.model(tokens[:, :-1], self.rope_cos[:S], self.rope_sin[:S])
        logits = F.linear(h, self.head_weight()).float().reshape(-1, self.d.V)
        targets = tokens[:, 1:].reshape(-1)
        if self.z_loss == 0.0:
            return F.cross_entropy(logits, targets)
        lse = torch.logsumexp(logits, dim=-1)
        target_logit = logits.gather(1, targets[:, None])[:, 0]
        return (lse - target_logit + self.z_loss * lse * lse).mean()


def build_model(dims, z_loss=0.0, seed=0):
    """Linear and embedding weights N(0, 0.02^2), norm weights 1, as Hugging Face and stepscope
    initialise (stepscope's counter-based numbers differ; pass weights across to compare)."""
    with torch.device("meta"):
        model = Qwen3(dims, z_loss)
    model.to_empty(device="cpu")
    cos, sin = rope_tables(dims.S, dims.HD, dims.rope_theta)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)
    return model


def save_weights(model, path):
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))


def load_weights(model, path):
    from safetensors.torch import load_file
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    model.load_state_dict(state, strict=True)


def save_optimizer(model, opt, path):
    """torch's AdamW state after the run, <name>.exp_avg and <name>.exp_avg_sq for every
    parameter (Hugging Face names), and the update count as metadata: what stepscope keeps in a
    checkpoint's optimizer_state files, by name where stepscope's are flat."""
    from safetensors.torch import save_file
    tensors, steps = {}, set()
    for name, p in model.named_parameters():
        st = opt.state[p]
        tensors[f"{name}.exp_avg"] = st["exp_avg"].detach().contiguous()
        tensors[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].detach().contiguous()
        steps.add(int(st["step"]))
    save_file(tensors, str(path), metadata={"updates_done": str(steps.pop())})


def make_optimizer(model, train):
    kwargs = dict(lr=train.lr, betas=(train.b1, train.b2), eps=train.adam_eps, weight_decay=train.weight_decay)
    try:  # the fused CPU AdamW (torch >= 2.4) is the fastest torch offers
        return torch.optim.AdamW(model.parameters(), fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(model.parameters(), foreach=True, **kwargs)


class Trainer:
    """One optimizer step per call: loss, backward, global-norm clip, AdamW, zero grads."""

    def __init__(self, model, train, mode="eager", dtype="float32"):
        self.model, self.train = model, train
        self.params = list(model.parameters())
        self.opt = make_optimizer(model, train)
        self.loss_fn = torch.compile(model) if mode == "compile" else model
        self.autocast = dtype == "bfloat16"

    def step(self, tokens):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.loss_fn(tokens)
        loss.backward()
        grad_norm = None
        if self.train.clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.train.clip, foreach=True))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach()), grad_norm


def run(overrides, binary=DEFAULT_BIN, config=DEFAULT_CONFIG, mode="eager", dtype="float32", threads=0,
        load=None, save=None, quiet=False, profile_step=-1, save_opt=None):
    """Trains for the config's `steps` and returns a dict: per-step losses and seconds (completion
    to completion, as stepscope times its steps) and the settings used."""
    t_start = time.monotonic()
    if threads > 0:
        torch.set_num_threads(threads)
    plan = resolved_plan(overrides, binary, config)
    dims, train = Qwen3Dims.from_plan(plan), TrainConfig.from_plan(plan)
    batches = Batches(dims, train)
    model = build_model(dims, train.z_loss, train.init_seed)
    if load:
        load_weights(model, load)
    if save:
        save_weights(model, save)
    trainer = Trainer(model, train, mode, dtype)
    steps = []
    setup_seconds = time.monotonic() - t_start
    last = time.monotonic()
    for i in range(train.steps):
        tokens = torch.from_numpy(batches(i))
        if i == profile_step:  # torch's own op profile of one step, beside stepscope's op summary
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                loss, grad_norm = trainer.step(tokens)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
        else:
            loss, grad_norm = trainer.step(tokens)
        now = time.monotonic()
        steps.append({"step": i, "seconds": now - last, "loss": loss, "grad_norm": grad_norm})
        last = now
        if not quiet:
            tokens_per_s = dims.B * dims.S / steps[-1]["seconds"]
            print(f"torch step: {i}, seconds: {steps[-1]['seconds']:.3f}, Tokens/s: {tokens_per_s:.3f}, "
                  f"loss: {loss:.4f}", flush=True)
    if save_opt:
        save_optimizer(model, trainer.opt, save_opt)
    timed = [s["seconds"] for s in steps[1:]] or [steps[0]["seconds"]]
    return {"mode": mode, "dtype": dtype, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "tokens_per_step": dims.B * dims.S, "per_device_tflops": float(plan["per_device_tflops"]),
            "setup_seconds": setup_seconds, "median_seconds": statistics.median(timed), "steps": steps}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="stepscope key=value overrides (model_name=..., steps=...)")
    ap.add_argument("--bin", default=str(DEFAULT_BIN), help="stepscope binary whose --dry-run resolves the config")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="stepscope base config")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="bfloat16 = torch.autocast(bfloat16) over float32 weights")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads; 0 = torch's default")
    ap.add_argument("--load-weights", help="start from this safetensors file (Hugging Face names)")
    ap.add_argument("--save-weights", help="write the initial weights here (safetensors, Hugging Face names)")
    ap.add_argument("--save-optimizer", help="write AdamW's moments after the last step here (safetensors, "
                                             "<name>.exp_avg and <name>.exp_avg_sq)")
    ap.add_argument("--json", help="write the result (per-step seconds and losses) here")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--profile-step", type=int, default=-1,
                    help="print torch.profiler's op table (self CPU time) for this step; its time includes "
                         "the profiler's overhead")
    a = ap.parse_args(argv)
    bad = [o for o in a.overrides if "=" not in o]
    if bad:
        ap.error(f"{bad[0]!r} is not a key=value override")
    try:
        result = run(a.overrides, a.bin, a.config, a.mode, a.dtype, a.threads, a.load_weights, a.save_weights, a.quiet,
                     a.profile_step, a.save_optimizer)
    except RuntimeError as e:
        print(f"torch_qwen3: {e}", file=sys.stderr)
        return 2
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a.json)
    if not a.quiet:
        print(f"torch {result['torch']} {a.mode} {a.dtype}, {result['threads']} threads: median step "
              f"{result['median_seconds']:.3f} s over steps 1.., set-up {result['setup_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
