#!/usr/bin/env python3
"""Make the whole-model reference fixtures in tests/fixtures/<case>/ from Hugging Face's Qwen3.

For each case: a small Qwen3ForCausalLM with random weights (nothing is downloaded), run in
float64 so the reference is exact to well below float32 resolution, and
  weights.safetensors    the initial parameters under their Hugging Face names, F32
  reference.safetensors  tokens (I32 [B, S+1]), loss [1], losses [4], grad_norm [3],
                         grad.<name> (gradient at the initial weights) and step3.<name>
                         (parameters after 3 AdamW steps), all F32; hyperparameters as
                         __metadata__ strings.
The float32 values written to weights.safetensors are loaded back into the float64 model, so
the reference and the C code start from the same numbers.

Hugging Face's Qwen3 computes RMSNorm, the attention softmax and the RoPE table in float32
even inside a float64 model. Those three pieces are replaced by dtype-preserving versions with
the same formulas (see patch_hf_for_float64), and the result is cross-checked against an
independent float64 forward written out below (reference_forward), which also documents the
math the C code must match.

    python3 tools/make_fixtures.py            # write tests/fixtures/<case>/
    python3 tools/make_fixtures.py --check    # recompute and compare with the committed files
CI only reads the committed files; torch and transformers are needed only to run this script.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3 as mq

# One row per case. init_std: linear weights and embeddings ~ N(0, init_std^2);
# norm weights ~ 1 + 0.1 N(0, 1) so their gradients are exercised.
CASES = {
    "tied_gqa": dict(
        vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, batch=2, seq=12, seed=1234,
        init_std=0.05, clip=1.0),
    "untied_wide": dict(
        vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=24, rope_theta=500000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False, batch=2, seq=10, seed=5678,
        init_std=0.05, clip=1.0),
    # q/k/v and gate/up 512 columns wide (2 KiB rows), the widths where padding the activations'
    # row strides (qwen3_padded_width) pays; tests/test_model.c runs every case at both layouts.
    "padded_rows": dict(
        vocab_size=96, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, batch=2, seq=12, seed=4321,
        init_std=0.05, clip=1.0),
}
# eps = 1e-5, not torch's 1e-8: an element whose gradient is below eps moves by about
# g·lr/eps, so fp32's unavoidable gradient rounding (~1e-10 absolute on elements with
# |g| ~ 1e-9) is amplified by lr/eps. With eps = 1e-8 (gain 1e6) torch's own fp32 AdamW
# lands 1e-3 away from this float64 reference on such elements; with 1e-6 (gain 1e4) torch
# fp32 sits at 8.7e-6 relative, at the edge of the 1e-5 bar. 1e-5 (gain 1e3) leaves the
# comparison about the maths, and eps still enters every update, so its placement (outside
# the square root) is still tested.
# lr = 3e-3 (not 1e-2): an fp32 step's parameter error after Adam's normalisation is about
# lr × (relative gradient error of the small elements), so a smaller lr keeps fp32 builds
# (-O1 sanitizer and -O3 alike) well inside the 1e-5 bar while 3 steps still move every
# tensor by several percent of its init (std 0.05).
TRAIN = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-5, weight_decay=0.1)
NUM_STEPS = 3
MODEL_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta",
              "rms_norm_eps", "tie_word_embeddings"]


# ----------------------------------------------------------------------------------------
# float64 Hugging Face: replace the three float32 islands with dtype-preserving versions.

def _rmsnorm_forward(self, x):
    # HF: weight * (x * rsqrt(mean(x^2) + eps)), computed in float32; here in x's dtype.
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


def _rotary_forward(self, x, position_ids):
    # HF builds inv_freq and the angles in float32; here in float64. Same formula:
    # inv_freq[i] = theta^(-2i/HD), angle = pos * inv_freq, table = cat(angle, angle).
    theta = self.config.rope_parameters["rope_theta"]
    hd = self.config.head_dim
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = position_ids[..., None].to(torch.float64) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                             **kwargs):
    # HF's eager attention with the softmax in the input dtype instead of float32.
    key_states = mq.repeat_kv(key, module.num_key_value_groups)
    value_states = mq.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            attn_weights = attn_weights.masked_fill(~attention_mask, float("-inf"))
        else:
            attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def patch_hf_for_float64():
    mq.Qwen3RMSNorm.forward = _rmsnorm_forward
    mq.Qwen3RotaryEmbedding.forward = _rotary_forward
    mq.eager_attention_forward = _eager_attention_forward  # looked up at call time for "eager"


# ----------------------------------------------------------------------------------------
# An independent float64 forward: what the C code implements. Used as a cross-check.

def reference_forward(params, cfg, tokens):
    """params: HF name -> float64 tensor; tokens [B, S] -> logits [B, S, V]."""
    D, H, KV, HD = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    B, S = tokens.shape

    def rmsnorm(x, w):
        return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x):  # x [B, S, heads, HD]; rotate_half pairing (i, i + HD/2)
        inv = theta ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
        ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]  # [S, HD/2]
        c, s = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
        x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    x = params["model.embed_tokens.weight"][tokens]
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    for l in range(cfg["num_hidden_layers"]):
        p = lambda n: params[f"model.layers.{l}.{n}"]
        h = rmsnorm(x, p("input_layernorm.weight"))
        q = rope(rmsnorm((h @ p("self_attn.q_proj.weight").T).view(B, S, H, HD), p("self_attn.q_norm.weight")))
        k = rope(rmsnorm((h @ p("self_attn.k_proj.weight").T).view(B, S, KV, HD), p("self_attn.k_norm.weight")))
        v = (h @ p("self_attn.v_proj.weight").T).view(B, S, KV, HD)
        k = k.repeat_interleave(H // KV, dim=2)  # query head h reads kv head h / (H/KV)
        v = v.repeat_interleave(H // KV, dim=2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HD)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, S, H * HD)
        x = x + o @ p("self_attn.o_proj.weight").T
        h = rmsnorm(x, p("post_attention_layernorm.weight"))
        g = h @ p("mlp.gate_proj.weight").T
        u = h @ p("mlp.up_proj.weight").T
        x = x + (F.silu(g) * u) @ p("mlp.down_proj.weight").T
    x = rmsnorm(x, params["model.norm.weight"])
    head = params["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return x @ head.T


# ----------------------------------------------------------------------------------------

def expected_names(cfg):
    names = ["model.embed_tokens.weight"]
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        names += [pre + "input_layernorm.weight"]
        names += [pre + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
        names += [pre + "post_attention_layernorm.weight"]
        names += [pre + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names += ["model.norm.weight"]
    if not cfg["tie_word_embeddings"]:
        names += ["lm_head.weight"]
    return names


def metadata_for(cfg):
    meta = {k: (("true" if cfg[k] else "false") if isinstance(cfg[k], bool) else repr(cfg[k]))
            for k in MODEL_KEYS}
    meta.update(batch=str(cfg["batch"]), seq=str(cfg["seq"]), lr=repr(TRAIN["lr"]),
                beta1=repr(TRAIN["beta1"]), beta2=repr(TRAIN["beta2"]), eps=repr(TRAIN["eps"]),
                weight_decay=repr(TRAIN["weight_decay"]), clip=repr(cfg["clip"]),
                steps=str(NUM_STEPS), init_std=repr(cfg["init_std"]), seed=str(cfg["seed"]),
                torch_version=torch.__version__, transformers_version=transformers.__version__)
    return meta


def loss_of(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean")


def make_case(name, cfg):
    torch.manual_seed(cfg["seed"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    hf_cfg = Qwen3Config(**{k: cfg[k] for k in MODEL_KEYS}, max_position_embeddings=256,
                         attention_bias=False, attention_dropout=0.0, use_cache=False,
                         attn_implementation="eager")
    model = Qwen3ForCausalLM(hf_cfg)
    model.train()
    if cfg["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "tie did not happen"

    # Initialise in float32: these exact values are what weights.safetensors holds.
    with torch.no_grad():
        for n, p in model.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(1.0 + 0.1 * r if n.endswith("norm.weight") else cfg["init_std"] * r)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(expected_names(cfg)), (sorted(names), sorted(expected_names(cfg)))
    weights = {n: p.detach().to(torch.float32).contiguous().clone() for n, p in model.named_parameters()}

    model = model.double()
    with torch.no_grad():  # float32 -> float64 is exact; reload anyway to make the intent plain
        for n, p in model.named_parameters():
            p.copy_(weights[n].to(torch.float64))
    if cfg["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    params = [p for _, p in model.named_parameters()]

    B, S, V = cfg["batch"], cfg["seq"], cfg["vocab_size"]
    tokens = torch.randint(0, V, (B, S + 1), generator=gen, dtype=torch.int64)
    inputs, targets = tokens[:, :S], tokens[:, 1:]

    # Cross-check HF (patched) against the independent forward at the initial weights.
    with torch.no_grad():
        hf_logits = model(input_ids=inputs).logits
        assert hf_logits.dtype == torch.float64
        ref_logits = reference_forward(dict(model.named_parameters()), cfg, inputs)
        xdiff = (hf_logits - ref_logits).abs().max().item()
    assert xdiff < 1e-12, f"{name}: HF and the reference forward differ by {xdiff}"

    opt = torch.optim.AdamW(params, lr=TRAIN["lr"], betas=(TRAIN["beta1"], TRAIN["beta2"]),
                            eps=TRAIN["eps"], weight_decay=TRAIN["weight_decay"], foreach=False)
    losses, norms, grads = [], [], None
    for step in range(NUM_STEPS):
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model(input_ids=inputs).logits, targets)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        norm = torch.nn.utils.clip_grad_norm_(params, cfg["clip"], foreach=False)
        losses.append(loss.item())
        norms.append(norm.item())
        opt.step()
    with torch.no_grad():
        losses.append(loss_of(model(input_ids=inputs).logits, targets).item())
    assert norms[0] > cfg["clip"], f"{name}: raw grad norm {norms[0]} does not exceed clip {cfg['clip']}"

    ref = {"tokens": tokens.to(torch.int32).contiguous(),
           "loss": torch.tensor([losses[0]], dtype=torch.float32),
           "losses": torch.tensor(losses, dtype=torch.float32),
           "grad_norm": torch.tensor(norms, dtype=torch.float32)}
    for n, p in model.named_parameters():
        ref["grad." + n] = grads[n].to(torch.float32).contiguous()
        ref["step3." + n] = p.detach().to(torch.float32).contiguous()
    info = dict(losses=losses, norms=norms, xdiff=xdiff, log_v=math.log(V))
    return weights, ref, metadata_for(cfg), info


def load(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})


def compare(path, fresh, fresh_meta, ignore_meta=("torch_version", "transformers_version")):
    """Returns a list of problems between the committed file and fresh tensors."""
    problems = []
    old, old_meta = load(path)
    if set(old) != set(fresh):
        problems.append(f"{path}: tensor names differ: {sorted(set(old) ^ set(fresh))}")
    for k in sorted(set(old) & set(fresh)):
        a, b = old[k], fresh[k]
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{path}: {k}: {a.dtype}{list(a.shape)} vs fresh {b.dtype}{list(b.shape)}")
        elif a.dtype.is_floating_point:
            d = (a.double() - b.double()).abs()
            tol = 1e-6 * b.double().abs().clamp(min=1e-3)  # a few float32 ulps
            if (d > tol).any():
                problems.append(f"{path}: {k}: max abs diff {d.max().item():.3g}")
        elif not torch.equal(a, b):
            problems.append(f"{path}: {k}: integer data differs")
    for k in sorted(set(old_meta) | set(fresh_meta)):
        if k not in ignore_meta and old_meta.get(k) != fresh_meta.get(k):
            problems.append(f"{path}: metadata {k}: {old_meta.get(k)!r} vs fresh {fresh_meta.get(k)!r}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")))
    ap.add_argument("--check", action="store_true", help="recompute and compare with the committed files")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases")
    args = ap.parse_args()
    torch.set_num_threads(1)  # fixed reduction order
    patch_hf_for_float64()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    problems = []
    for name in args.case or list(CASES):
        cfg = CASES[name]
        weights, ref, meta, info = make_case(name, cfg)
        print(f"{name}: loss {info['losses'][0]:.6f} (log V = {info['log_v']:.6f}), "
              f"losses {[round(x, 6) for x in info['losses']]}, "
              f"raw grad norms {[round(x, 6) for x in info['norms']]} (clip {cfg['clip']}), "
              f"HF vs reference forward {info['xdiff']:.2g}")
        d = os.path.join(args.out, name)
        wmeta = {"format": "pt", **{k: meta[k] for k in MODEL_KEYS}}
        if args.check:
            problems += compare(os.path.join(d, "weights.safetensors"), weights, wmeta)
            problems += compare(os.path.join(d, "reference.safetensors"), ref, meta)
        else:
            os.makedirs(d, exist_ok=True)
            save_file(weights, os.path.join(d, "weights.safetensors"), metadata=wmeta)
            save_file(ref, os.path.join(d, "reference.safetensors"), metadata=meta)
            size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            print(f"  wrote {d} ({size} bytes)")
    if args.check:
        for p in problems:
            print("MISMATCH", p)
        print("check:", "FAILED" if problems else "ok, committed fixtures match")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
