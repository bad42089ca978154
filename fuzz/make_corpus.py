#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/): valid inputs and
near-misses of each refusal, so the fuzzer starts from every branch a user can reach.
Run from the repository root: python3 fuzz/make_corpus.py"""
import json
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "fuzz" / "corpus"


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


# ---- config_yaml: whole files
put("config_yaml", "base.yml", (ROOT / "configs" / "base.yml").read_bytes())
put("config_yaml", "tiny.yml", "model_name: tiny\nsteps: 3\nprofiler: xplane\nskip_first_n_steps_for_profiler: 1\n"
    "profiler_steps: 2\nlearning_rate: 1e-2\nrun_name: \"r\"\n")
put("config_yaml", "tiny_override.yml", "model_name: tiny\noverride_model_config: true\nbase_emb_dim: 32\n"
    "dataset_type: tokens\ndataset_path: ids.bin\nremat_policy: full\n")
put("config_yaml", "empty.yml", "")
put("config_yaml", "comment.yml", "# nothing\n")
put("config_yaml", "unknown_key.yml", "learning_rat: 1\n")
put("config_yaml", "bad_types.yml", "steps: abc\nlearning_rate: nan\nuse_qk_norm: maybe\n")
put("config_yaml", "out_of_range.yml", "steps: 0\nadam_b1: 1\n")
put("config_yaml", "heads.yml", "base_num_query_heads: 6\nbase_num_kv_heads: 4\n")
put("config_yaml", "window.yml", "profiler: xplane\nsteps: 3\nskip_first_n_steps_for_profiler: 3\n")
put("config_yaml", "nested.yml", "steps:\n  a: 1\n")
put("config_yaml", "list.yml", "- steps\n- 3\n")
put("config_yaml", "alias.yml", "steps: &a 3\nper_device_batch_size: *a\n")
put("config_yaml", "duplicate.yml", "steps: 3\nsteps: 4\n")
put("config_yaml", "two_docs.yml", "steps: 3\n---\nsteps: 4\n")
put("config_yaml", "null.yml", "steps: ~\nrun_name: null\n")
put("config_yaml", "syntax.yml", "steps: [3\n")
put("config_yaml", "preset_missing.yml", "model_name: qwen9-1t\n")
put("config_yaml", "preset_path.yml", "model_name: ../base\n")
put("config_yaml", "bf16_weights.yml", "dtype: bfloat16\nweight_dtype: bf16\nmu_dtype: float32\n")
put("config_yaml", "bf16_weights_fp32.yml", "weight_dtype: bfloat16\n")
put("config_yaml", "quoted.yml", "run_name: 'a\"b\\\\c'\nbase_output_directory: \"out dir\"\n")
put("config_yaml", "huge_int.yml", "steps: 99999999999999999999999\nvocab_size: 9223372036854775807\n")

# ---- config_override: one argument per line
for name, args in {
    "tiny": ["model_name=tiny", "steps=3"],
    "unknown": ["learning_rat=1"],
    "malformed": ["stepsx"],
    "empty_key": ["=3"],
    "quoted": ["run_name=\"a b\"", "base_output_directory='x'"],
    "preset_key": ["model_name=qwen3-0.6b", "base_emb_dim=512"],
    "preset_key_ok": ["model_name=qwen3-0.6b", "base_emb_dim=512", "override_model_config=true"],
    "window": ["profiler=xplane", "steps=3", "skip_first_n_steps_for_profiler=3"],
    "tokens_no_path": ["dataset_type=tokens"],
    "path_no_tokens": ["dataset_path=x.bin"],
    "unsupported": ["dtype=bfloat16", "remat_policy=minimal", "enable_checkpointing=true"],
    "floats": ["learning_rate=1e400", "adam_eps=-0", "rope_max_timescale=inf", "memory_limit_gib=1e-320"],
    "ints": ["steps=-1", "per_device_batch_size=9223372036854775808", "num_threads= 2"],
    "later_wins": ["steps=3", "steps=4", "model_name=tiny", "model_name=default"],
    "bad_preset": ["model_name=", "model_name=.hidden", "model_name=a/b"],
}.items():
    put("config_override", name, "\n".join(args))


# ---- safetensors: the micro model of fuzz/safetensors.c (V=8 D=4 F=8 L=1 H=2 KV=1 HD=2, tied)
MICRO = [("model.embed_tokens.weight", [8, 4])] + [
    (f"model.layers.0.{s}", shape) for s, shape in [
        ("input_layernorm.weight", [4]), ("self_attn.q_proj.weight", [4, 4]), ("self_attn.k_proj.weight", [2, 4]),
        ("self_attn.v_proj.weight", [2, 4]), ("self_attn.q_norm.weight", [2]), ("self_attn.k_norm.weight", [2]),
        ("self_attn.o_proj.weight", [4, 4]), ("post_attention_layernorm.weight", [4]),
        ("mlp.gate_proj.weight", [8, 4]), ("mlp.up_proj.weight", [8, 4]), ("mlp.down_proj.weight", [4, 8])]
] + [("model.norm.weight", [4])]
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I32": 4, "I64": 8}


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def safetensors(tensors, dtype="F32", meta=None, header_edit=None, pad=True):
    header, off = {}, 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, shape, *own in tensors:  # (name, shape) in dtype, or (name, shape, its own dtype)
        kind = own[0] if own else dtype
        nb = numel(shape) * SIZES[kind]
        header[name] = {"dtype": kind, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    if header_edit:
        header_edit(header)
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    data = bytes((i * 7) & 0x3F for i in range(off))   # small finite values in every dtype
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "micro_f32", safetensors(MICRO, meta={"format": "pt"}))
put("safetensors", "micro_bf16", safetensors(MICRO, "BF16"))
put("safetensors", "micro_f16", safetensors(MICRO, "F16"))
put("safetensors", "micro_f64", safetensors(MICRO, "F64"))
put("safetensors", "ints", safetensors([("a", [3]), ("b", [2, 2])], "I64"))
put("safetensors", "empty_header", safetensors([]))
put("safetensors", "scalar", safetensors([("s", [])]))
full = safetensors(MICRO)
put("safetensors", "truncated", full[:len(full) - 5])
put("safetensors", "header_too_long", struct.pack("<Q", 1 << 40) + full[8:64])
put("safetensors", "short", b"\x10\x00\x00")
put("safetensors", "extra_tensor", safetensors(MICRO + [("lm_head.weight", [8, 4])]))
put("safetensors", "missing_tensor", safetensors(MICRO[:-1]))
put("safetensors", "wrong_shape", safetensors([(n, [s[0] + 1] + s[1:]) if n.endswith("norm.weight") else (n, s)
                                               for n, s in MICRO]))


def overlap(h):
    h["model.norm.weight"]["data_offsets"] = [0, 16]


def past_end(h):
    h["model.norm.weight"]["data_offsets"][1] += 4


def bad_dtype(h):
    h["model.norm.weight"]["dtype"] = "F8_E4M3"


def bad_shape(h):
    h["model.norm.weight"]["shape"] = [-4]


put("safetensors", "overlap", safetensors(MICRO, header_edit=overlap))
put("safetensors", "offset_past_end", safetensors(MICRO, header_edit=past_end))
put("safetensors", "bad_dtype", safetensors(MICRO, header_edit=bad_dtype))
put("safetensors", "bad_shape", safetensors(MICRO, header_edit=bad_shape))
put("safetensors", "not_json", struct.pack("<Q", 8) + b"{\"a\": 1" + b"\x00")
put("safetensors", "trailing", struct.pack("<Q", 8) + b"{} x    ")


# ---- tokens: 4 option bytes (S-1, batches and offset, vocab-1 as uint16) then uint32 ids
def tokens(seq_minus_1, batch_bits, vocab, ids):
    return bytes([seq_minus_1, batch_bits]) + struct.pack("<H", vocab - 1) + struct.pack(f"<{len(ids)}I", *ids)


put("tokens", "valid", tokens(3, 0x05, 16, [i % 16 for i in range(40)]))
put("tokens", "one_window", tokens(7, 0x00, 256, list(range(8)) + [9]))
put("tokens", "too_short", tokens(7, 0x00, 256, list(range(8))))
put("tokens", "id_over_vocab", tokens(3, 0x00, 16, [1, 2, 3, 16, 4, 5]))
put("tokens", "empty", tokens(3, 0x00, 16, []))
put("tokens", "odd_length", tokens(0, 0x00, 16, [1, 2]) + b"\x01")
put("tokens", "rows_outside", tokens(1, 0x3C, 16, [1] * 20))


# ---- full_state: the micro model's optimizer_state file (train/resume.c), one shard. Its layout
# fingerprint is qwen3_layout_hash's: FNV-1a over each tensor's name (with its NUL) and its
# offset, rows and cols as little-endian int64s (cols 0 for a vector), in MICRO's order.
def layout_hash(tensors):
    h, off = 14695981039346656037, 0
    for name, shape in tensors:
        rows, cols = shape[0], (shape[1] if len(shape) > 1 else 0)
        for b in name.encode() + b"\x00" + struct.pack("<qqq", off, rows, cols):
            h = ((h ^ b) * 1099511628211) & ((1 << 64) - 1)
        off += numel(shape)
    return h or 1


N_MICRO = sum(numel(s) for _, s in MICRO)
STATE_META = {"format": "stepscope adamw state 1", "step": "4", "updates_done": "5", "num_params": str(N_MICRO),
              "shard_lo": "0", "shard_count": str(N_MICRO), "param_layout": f"{layout_hash(MICRO):016x}"}


def state(meta_edit=None, tensors=None):
    meta = dict(STATE_META)
    if meta_edit:
        meta_edit(meta)
    return safetensors(tensors or [("exp_avg", [N_MICRO]), ("exp_avg_sq", [N_MICRO])], meta=meta)


put("full_state", "valid", state())
put("full_state", "other_format", state(lambda m: m.update(format="pt")))
put("full_state", "step_not_a_number", state(lambda m: m.update(step="4x")))
put("full_state", "no_updates", state(lambda m: m.update(updates_done="0")))
put("full_state", "other_layout", state(lambda m: m.update(param_layout="0123456789abcdef")))
put("full_state", "shard_out_of_place", state(lambda m: m.update(shard_lo="16")))
put("full_state", "short_shard", state(lambda m: m.update(shard_count=str(N_MICRO - 1)),
                                       [("exp_avg", [N_MICRO - 1]), ("exp_avg_sq", [N_MICRO - 1])]))
put("full_state", "one_moment", state(tensors=[("exp_avg", [N_MICRO])]))
put("full_state", "bf16_moments", safetensors([("exp_avg", [N_MICRO]), ("exp_avg_sq", [N_MICRO])], "BF16",
                                              meta=STATE_META))
# mu_dtype=bfloat16's file: exp_avg in BF16 after exp_avg_sq in F32 (valid)
put("full_state", "bf16_mu", safetensors([("exp_avg_sq", [N_MICRO]), ("exp_avg", [N_MICRO], "BF16")], meta=STATE_META))
# weight_dtype=bfloat16's file: both moments in BF16 (valid)
put("full_state", "bf16_weights", safetensors([("exp_avg_sq", [N_MICRO], "BF16"), ("exp_avg", [N_MICRO], "BF16")],
                                              meta=STATE_META))
