"""Reliability end to end: a sweep of bad inputs (each must end in one line on stderr, an exit
code in 1..123 (2 for config errors), and no files), injected faults (a full disk, a read-only
output folder, truncated inputs, SIGINT/SIGTERM, a second signal, a signal before step 0),
each checked for what was kept (whole files, nothing half-written), and a tiny end-to-end run
under valgrind.

The full disk is a small tmpfs mounted for the test when the container allows mount (root
with CAP_SYS_ADMIN); otherwise a file-size limit (RLIMIT_FSIZE, stepscope ignores SIGXFSZ so
the write fails with EFBIG) stands in for it; STEPSCOPE_TEST_NO_MOUNT=1 forces that. The read-only folder is a read-only bind mount;
without mount that test is skipped, since root ignores permission bits.

Needs: pytest, numpy. valgrind for the leak test (skipped without it)."""
import contextlib
import gzip
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from test_cli import BIN, CONFIG, FAST, PEAK, ROOT, drain, write_tiny_safetensors, write_tokens

pytestmark = pytest.mark.skipif(not BIN.exists(), reason=f"{BIN} not built (run make)")

RUN = "r"


# ---- helpers ----------------------------------------------------------------------------------

SAN_BIN = ROOT / "build-san" / "stepscope"


def run(cwd, args, out=None, preexec_fn=None, timeout=120, binary=BIN, extra_env=None):
    """The binary with cwd=cwd; base_output_directory=out (default cwd/out); extra_env added to
    the environment."""
    cmd = [str(binary), *args, f"base_output_directory={out or cwd / 'out'}"]
    env = {k: v for k, v in os.environ.items() if k not in ("STEPSCOPE_EVENT_LOG", "DNNL_JIT_PROFILE")}
    env.update(extra_env or {})
    # under ASan, leaks too: a refused run frees what it took (checked clean, no suppressions);
    # an impossible allocation returns NULL, as glibc's does, for the code to refuse
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1:allocator_may_return_null=1"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec_fn)


def one_line(stderr):
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: "), stderr
    return lines[0]


def leftovers(folder):
    """Temp names stepscope writes through: none may outlive a run."""
    return [p for p in Path(folder).rglob("*") if ".partial" in p.name or ".tmp." in p.name]


def metrics_whole(path, first=0):
    """Every line of metrics.jsonl parses, steps run first, first + 1, ... Returns the steps."""
    lines = Path(path).read_text().split("\n")
    assert lines[-1] == "", "metrics.jsonl does not end with a whole line"
    steps = [json.loads(l)["step"] for l in lines[:-1]]
    assert steps == list(range(first, first + len(steps))), steps
    return steps


def tfrecords_whole(path):
    """An event file is a sequence of whole TFRecords (length, crc, payload, crc)."""
    data = Path(path).read_bytes()
    i = n = 0
    while i < len(data):
        assert i + 12 <= len(data), "torn record header"
        (length,) = struct.unpack_from("<Q", data, i)
        i += 12 + length + 4
        assert i <= len(data), "torn record"
        n += 1
    return n


@contextlib.contextmanager
def small_disk(tmp_path, kib, file_kib):
    """A folder where writes fail: a tmpfs of `kib` KiB, or else a limit of `file_kib` KiB
    per file. Yields (folder, preexec_fn, how)."""
    d = tmp_path / "disk"
    d.mkdir()
    no_mount = os.environ.get("STEPSCOPE_TEST_NO_MOUNT")     # to exercise the fallback
    r = None if no_mount else subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(d)],
                                             capture_output=True)
    if r is not None and r.returncode == 0:
        try:
            yield d, None, "tmpfs"
        finally:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)
        return

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_kib * 1024, file_kib * 1024))
    yield d, limit, "RLIMIT_FSIZE"


@contextlib.contextmanager
def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    r = subprocess.run(["mount", "--bind", str(d), str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({r.stderr.decode().strip()}); root ignores permission bits")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.decode().strip()}")
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


# ---- 1. the bad-input sweep -------------------------------------------------------------------

def _yaml(text):
    def setup(d):
        (d / "c.yml").write_text(text)
        return [str(d / "c.yml")]
    return setup


def _st(make):
    """A safetensors file made by make(path), passed as load_parameters_path."""
    def setup(d):
        p = d / "w.safetensors"
        make(p)
        return [str(CONFIG), *FAST, f"load_parameters_path={p}"]
    return setup


def _full(edit):
    """A tiny run's step-0 checkpoint (written by the optimised build) whose optimizer_state file
    edit(path) damages, passed as load_full_state_path."""
    def setup(d):
        p = run(d, [str(CONFIG), *FAST, "steps=1", "enable_checkpointing=true", "run_name=src"])
        assert p.returncode == 0, p.stderr
        folder = d / "out" / "src" / "checkpoints" / "0"
        edit(folder / "optimizer_state-00000-of-00001.safetensors")
        return [str(CONFIG), *FAST, "steps=3", f"load_full_state_path={folder}"]
    return setup


def _meta(key, value):
    def edit(p):
        _rewrite(p, lambda h, _: h["__metadata__"].__setitem__(key, value))
    return edit


def _tok(make):
    def setup(d):
        p = d / "ids.bin"
        make(p)
        return [str(CONFIG), *FAST, "dataset_type=tokens", f"dataset_path={p}"]
    return setup


def _args(*a):
    return lambda d: [str(CONFIG), *FAST, *a]


def _rewrite(p, edit, extra=b""):
    """Re-pack the safetensors file p after edit(header, data_len); extra bytes go at the end."""
    raw = p.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    edit(header, len(data))
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    p.write_bytes(struct.pack("<Q", len(h)) + h + data + extra)


def _edit_header(edit):
    """A valid tiny checkpoint whose JSON header is changed by edit(dict), lengths redone."""
    def make(p):
        write_tiny_safetensors(p)
        _rewrite(p, lambda h, _: edit(h))
    return make


def _truncate(keep):
    def make(p):
        write_tiny_safetensors(p)
        raw = p.read_bytes()
        p.write_bytes(raw[:keep(len(raw))])
    return make


def _set(name, key, value):
    def edit(h):
        h[name][key] = value
    return edit


def _rename(old, new):
    def edit(h):
        h[new] = h.pop(old)
    return edit


def _drop(name):
    return lambda h: h.pop(name)


def _extra_tensor(p, name="extra.weight"):
    """A valid tiny checkpoint plus one tensor the model does not have."""
    def add(h, end):
        h[name] = {"dtype": "F32", "shape": [4], "data_offsets": [end, end + 16]}
    write_tiny_safetensors(p)
    _rewrite(p, add, bytes(16))


def _header_len(p):
    write_tiny_safetensors(p)
    raw = bytearray(p.read_bytes())
    struct.pack_into("<Q", raw, 0, len(raw))           # longer than the file
    p.write_bytes(bytes(raw))


# (id, setup(dir) -> argv, exit code, words the one line must hold)
BAD_INPUTS = [
    # unknown or misspelt keys
    ("unknown key", _args("learning_rat=1e-3"), 2, ["learning_rat", "did you mean", "learning_rate"]),
    ("misspelt key in YAML", _yaml("stpes: 3\n"), 2, ["stpes", "c.yml", "did you mean", "steps"]),
    ("unknown option", _args("--dryrun"), 2, ["--dryrun", "--help"]),
    ("malformed override", _args("steps"), 2, ["malformed override", "key=value"]),
    ("empty key", _args("=3"), 2, ["malformed override"]),
    # values of the wrong type
    ("int not a number", _args("steps=ten"), 2, ["'ten'", "steps", "not an integer"]),
    ("float not a number", _args("learning_rate=fast"), 2, ["learning_rate", "not a finite number"]),
    ("bool not a bool", _args("use_qk_norm=maybe"), 2, ["use_qk_norm", "not a bool"]),
    ("bad dtype", _args("dtype=int8"), 2, ["dtype", "int8"]),
    ("int overflow", _args("steps=99999999999999999999"), 2, ["steps", "out of int64 range"]),
    ("string too long", _args("run_name=" + "x" * 600), 2, ["run_name", "too long"]),
    # out of range
    ("steps zero", _args("steps=0"), 2, ["steps=0", "out of range", ">= 1"]),
    ("negative learning rate", _args("learning_rate=-1"), 2, ["learning_rate", "out of range"]),
    ("adam_b1 one", _args("adam_b1=1"), 2, ["adam_b1", "[0, 1)"]),
    ("vocab one", _args("model_name=default", "vocab_size=1"), 2, ["vocab_size=1", "out of range"]),
    ("dataset type", _args("dataset_type=parquet"), 2, ["dataset_type=parquet", "synthetic"]),
    # NaN / Inf
    ("nan learning rate", _args("learning_rate=nan"), 2, ["learning_rate", "not a finite number"]),
    ("inf eps", _args("adam_eps=inf"), 2, ["adam_eps", "not a finite number"]),
    ("nan in YAML", _yaml("learning_rate: .nan\n"), 2, ["learning_rate", "c.yml"]),
    # inconsistent
    ("heads not divisible", _args("model_name=default", "base_num_query_heads=6", "base_num_kv_heads=4"), 2,
     ["base_num_query_heads=6", "multiple", "base_num_kv_heads=4"]),
    ("profiler window past last step", _args("profiler=xplane", "steps=3", "skip_first_n_steps_for_profiler=3"), 2,
     ["skip_first_n_steps_for_profiler=3", "steps=3"]),
    ("profiler zero steps", _args("profiler=xplane", "profiler_steps=0"), 2, ["profiler_steps=0"]),
    ("tokens without a path", _args("dataset_type=tokens"), 2, ["dataset_type=tokens", "dataset_path"]),
    ("path without tokens", _args("dataset_path=x.bin"), 2, ["dataset_path=x.bin", "dataset_type=tokens"]),
    ("preset key without override", _args("base_emb_dim=32"), 2, ["base_emb_dim", "override_model_config=true"]),
    ("odd head_dim", _args("model_name=default", "head_dim=15"), 2, ["head_dim=15", "even"]),
    ("bf16 weights without bf16 matmuls", _args("weight_dtype=bfloat16"), 2, ["weight_dtype=bfloat16", "dtype=bfloat16"]),
    ("stochastic rounding of fp32 weights", _args("stochastic_rounding=true"), 2,
     ["stochastic_rounding=true", "weight_dtype=bfloat16"]),
    ("bf16 weight copy of fp32 matmuls", _args("bf16_weight_copy=true"), 2,
     ["bf16_weight_copy=true", "dtype=float32", "dtype=bfloat16 weight_dtype=float32"]),
    ("bf16 weight copy of bf16 weights", _args("bf16_weight_copy=true", "dtype=bfloat16", "weight_dtype=bfloat16"), 2,
     ["bf16_weight_copy=true", "weight_dtype=bfloat16", "bf16_weight_copy=false"]),
    ("not allowed: remat policy", _args("remat_policy=partial"), 2, ["remat_policy=partial", "minimal"]),
    ("not allowed: first moment dtype", _args("mu_dtype=float16"), 2, ["mu_dtype=float16", "bfloat16"]),
    ("checkpoint period zero", _args("enable_checkpointing=true", "checkpoint_period=0"), 2, ["checkpoint_period=0"]),
    ("eval interval zero", _args("eval_interval=0"), 2, ["eval_interval=0", "-1"]),
    ("eval steps zero", _args("eval_interval=2", "eval_steps=0"), 2, ["eval_steps=0"]),
    ("eval path without tokens", _args("eval_dataset_path=e.bin"), 2, ["eval_dataset_path=e.bin", "dataset_type=tokens"]),
    # YAML files
    ("missing YAML file", lambda d: [str(d / "nope.yml")], 2, ["nope.yml", "No such file"]),
    ("no config given", lambda d: ["steps=3"], 2, ["no config file"]),
    ("YAML syntax error", _yaml("steps: '3\n"), 2, ["YAML syntax error", "c.yml"]),
    ("YAML nested mapping", _yaml("steps:\n  a: 1\n"), 2, ["nested", "steps"]),
    ("YAML list", _yaml("- steps\n- 3\n"), 2, ["flat mapping"]),
    ("YAML alias", _yaml("steps: &a 3\nper_device_batch_size: *a\n"), 2, ["aliases"]),
    ("YAML duplicate key", _yaml("steps: 3\nsteps: 4\n"), 2, ["duplicate", "steps"]),
    ("YAML two documents", _yaml("steps: 3\n---\nsteps: 4\n"), 2, ["one YAML document"]),
    ("YAML missing value", _yaml("steps:\n"), 2, ["missing value", "steps"]),
    ("YAML binary", _yaml("\x00\x01\x02steps: 3"), 2, ["c.yml"]),
    ("YAML is a folder", lambda d: [str(d)], 2, ["is a folder", "YAML file"]),
    # presets
    ("preset does not exist", _args("model_name=qwen9-1t"), 2, ["qwen9-1t", "not found", "tiny"]),
    ("preset path escape", _args("model_name=../base"), 2, ["invalid model_name", "../base"]),
    # safetensors
    ("safetensors missing", lambda d: [str(CONFIG), *FAST, f"load_parameters_path={d / 'no.safetensors'}"], 1,
     ["no.safetensors", "cannot open"]),
    ("safetensors empty", _st(lambda p: p.write_bytes(b"")), 1, ["too small"]),
    ("safetensors truncated data", _st(_truncate(lambda n: n - 100)), 1, ["w.safetensors"]),
    ("safetensors truncated header", _st(_truncate(lambda n: 200)), 1, ["header length", "exceeds file size"]),
    ("safetensors header length > file", _st(_header_len), 1, ["header length", "exceeds file size"]),
    ("safetensors overlapping offsets",
     _st(_edit_header(_set("model.norm.weight", "data_offsets", [0, 256]))), 1, ["overlapping"]),
    ("safetensors offsets out of range",
     _st(_edit_header(_set("model.norm.weight", "data_offsets", [10**9, 10**9 + 256]))), 1, ["past the", "truncated"]),
    ("safetensors begin > end", _st(_edit_header(_set("model.norm.weight", "data_offsets", [256, 0]))), 1,
     ["begin > end"]),
    ("safetensors unknown dtype", _st(_edit_header(_set("model.norm.weight", "dtype", "F8_E4M3")))
     , 1, ["unsupported dtype", "F8_E4M3"]),
    ("safetensors integer dtype", _st(_edit_header(_set("model.norm.weight", "dtype", "I32"))), 1,
     ["model.norm.weight", "F32, BF16, F16 or F64"]),
    ("safetensors wrong shape", _st(_edit_header(_set("model.norm.weight", "shape", [8, 8]))), 1,
     ["model.norm.weight", "shape [8, 8]", "[64]"]),
    ("safetensors size mismatch", _st(_edit_header(_set("model.norm.weight", "shape", [32]))), 1,
     ["model.norm.weight", "data_offsets span"]),
    ("safetensors missing tensor", _st(_edit_header(_rename("model.norm.weight", "model.nrom.weight"))), 1,
     ["model.norm.weight", "missing"]),
    ("safetensors misnamed tensor", _st(_edit_header(_rename("model.norm.weight", "lm_head.weight"))), 1,
     ["model.norm.weight"]),
    ("safetensors extra tensor", _st(_extra_tensor), 1, ["unexpected tensor extra.weight"]),
    # a newline in a name from the file is shown as '?' (the fuzzer's find): still one line
    ("safetensors extra tensor, newline in its name", _st(lambda p: _extra_tensor(p, "extra\nweight")), 1,
     ["unexpected tensor extra?weight"]),
    ("safetensors dropped tensor", _st(_edit_header(_drop("model.layers.0.mlp.up_proj.weight"))), 1,
     ["belong to no tensor"]),
    ("safetensors not JSON", _st(lambda p: p.write_bytes(struct.pack("<Q", 8) + b"{'a': 1}")), 1, ["not valid JSON"]),
    ("safetensors is a folder", lambda d: [str(CONFIG), *FAST, f"load_parameters_path={d}"], 1, ["is a folder without model.safetensors"]),
    # full-state checkpoints (load_full_state_path)
    ("full state truncated", _full(lambda p: p.write_bytes(p.read_bytes()[:-64])), 1,
     ["optimizer_state-00000-of-00001.safetensors", "data section"]),
    ("full state of another format", _full(_meta("format", "other 2")), 1,
     ["not stepscope's AdamW state", "other 2"]),
    ("full state metadata damaged", _full(_meta("updates_done", "seven")), 1,
     ["metadata (step, updates_done,", "damaged"]),
    ("full state shard out of place", _full(_meta("shard_lo", "16")), 1, ["should start at 0", "damaged"]),
    ("full state moments misnamed", _full(lambda p: _rewrite(p, lambda h, _: h.__setitem__("m", h.pop("exp_avg")))), 1,
     ["needs an F32 or BF16 tensor exp_avg of shape"]),
    # token files
    ("tokens missing", lambda d: [str(CONFIG), *FAST, "dataset_type=tokens", f"dataset_path={d / 'no.bin'}"], 1,
     ["no.bin", "cannot open"]),
    ("tokens empty", _tok(lambda p: p.write_bytes(b"")), 1, ["empty"]),
    ("tokens too short", _tok(lambda p: write_tokens(p, np.arange(256) % 256)), 1, ["256 tokens", "257"]),
    ("tokens id >= vocab", _tok(lambda p: write_tokens(p, [5] * 999 + [256] + [5] * 999)), 1,
     ["id 256", "index 999", "vocab_size 256"]),
    ("tokens truncated", _tok(lambda p: p.write_bytes(b"\x01\x00\x00\x00" * 300 + b"\x01")), 1, ["not a multiple of 4"]),
    ("tokens is a folder", lambda d: [str(CONFIG), *FAST, "dataset_type=tokens", f"dataset_path={d}"], 1,
     ["not a regular file"]),
    # memory plans
    ("plan over memory_limit_gib", _args("memory_limit_gib=0.001"), 2, ["memory plan", "smaller model_name"]),
    ("plan over this machine", _args("model_name=qwen3-32b", "per_device_batch_size=64", "max_target_length=32768"), 2,
     ["memory plan", "GiB"]),
    ("plan sizes overflow int64", _args("max_target_length=4611686018427387904"), 2, ["too large to plan"]),
    ("plan with absurd layers", _args("model_name=default", "base_num_decoder_layers=4000000000000000000"), 2,
     ["too large to plan"]),
    ("steps beyond memory", _args("steps=4611686018427387904", "memory_limit_gib=1000"), 1, ["steps", "lower steps"]),
]


@pytest.mark.parametrize("build", ["build", "build-san"])
@pytest.mark.parametrize("setup,code,needles", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_refused(tmp_path, setup, code, needles, build):
    """Each bad input on the optimised build and on the ASan+UBSan build (where a sanitizer
    report would add lines to stderr and fail the one-line check)."""
    binary = BIN if build == "build" else SAN_BIN
    if not binary.exists():
        pytest.skip(f"{binary} not built (make SAN=1)")
    inputs = tmp_path / "in"
    inputs.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = run(cwd, setup(inputs), binary=binary)
    assert 1 <= r.returncode <= 123, (r.returncode, r.stderr)     # never a signal, never >123
    assert r.returncode == code, (r.returncode, r.stderr)
    line = one_line(r.stderr)
    for n in needles:
        assert n in line, (n, line)
    assert list(cwd.iterdir()) == [], "a refused run left files"
    assert "Traceback" not in r.stdout and "completed step" not in r.stdout


def test_bad_input_count():
    # the README's reliability table quotes this number
    assert len(BAD_INPUTS) == len({c[0] for c in BAD_INPUTS}) == 84


# ---- 2. faults: a full disk, a read-only folder, truncated inputs -----------------------------

def test_full_disk_keeps_whole_metrics(tmp_path, record_property):
    # ~600 bytes of metrics and ~500 of events per step: 64 KiB fills within 200 steps
    with small_disk(tmp_path, 64, 64) as (disk, preexec, how):
        record_property("full_disk", how)
        r = run(tmp_path, [str(CONFIG), *FAST, f"run_name={RUN}", "steps=400"], out=disk, preexec_fn=preexec)
        assert r.returncode == 1, (r.returncode, r.stdout[-500:], r.stderr)
        line = one_line(r.stderr)
        assert "No space left on device" in line or "File too large" in line, line
        m = re.search(r"failed at step (\d+)", line)
        d = disk / RUN
        steps = metrics_whole(d / "metrics.jsonl")
        assert len(steps) >= 1
        if m:     # the metrics write failed: every step before it is kept
            assert steps == list(range(int(m.group(1)))), (steps[-3:], line)
        events = list((d / "tensorboard" / RUN).glob("events.out.tfevents.*"))
        assert len(events) == 1
        assert tfrecords_whole(events[0]) >= 1
        assert leftovers(disk) == []


def test_full_disk_while_writing_the_profile(tmp_path, record_property):
    # room for the metrics of 6 steps (2.9 KB, one page), not for the XPlane of 4 profiled
    # steps (7 KB)
    with small_disk(tmp_path, 8, 4) as (disk, preexec, how):
        record_property("full_disk", how)
        r = run(tmp_path, [str(CONFIG), "model_name=tiny", f"device_peak_tflops={PEAK}", f"run_name={RUN}", "steps=6",
                           "profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=4",
                           "enable_tensorboard=false"], out=disk, preexec_fn=preexec)
        assert r.returncode == 1, (r.returncode, r.stderr)
        line = one_line(r.stderr)
        assert "profile could not be written" in line and "metrics are complete" in line, line
        assert metrics_whole(disk / RUN / "metrics.jsonl") == list(range(6))
        assert leftovers(disk) == []
        prof = disk / RUN / "tensorboard" / "plugins" / "profile"
        written = [p for p in prof.rglob("*") if p.is_file()] if prof.exists() else []
        for p in written:      # whatever made it is whole
            if p.name.endswith(".json"):
                json.loads(p.read_text())
            elif p.name.endswith(".gz"):
                json.loads(gzip.decompress(p.read_bytes()))


def test_read_only_output_folder(tmp_path):
    with read_only_dir(tmp_path) as ro:
        r = run(tmp_path, [str(CONFIG), *FAST, f"run_name={RUN}", "steps=2"], out=ro / "out")
        assert r.returncode == 1, (r.returncode, r.stderr)
        line = one_line(r.stderr)
        assert "Read-only file system" in line and str(ro / "out") in line, line
        assert list(ro.iterdir()) == []
        assert "completed step" not in r.stdout     # refused before step 0
        assert "set-up:" not in r.stdout            # and before set-up touches the plan's buffers


def test_failure_after_opening_the_metrics_leaves_nothing(tmp_path):
    # the TensorBoard folder cannot be made (a file has its name) after metrics.jsonl.partial
    # and the run folder were: both go again, the user's file stays
    block = tmp_path / "out" / RUN / "tensorboard"
    block.parent.mkdir(parents=True)
    block.write_text("mine")
    r = run(tmp_path, [str(CONFIG), *FAST, f"run_name={RUN}", "steps=2", "metrics_file=" + str(tmp_path / "m" / "x.jsonl")])
    assert r.returncode == 1, r.stderr
    assert "tensorboard" in one_line(r.stderr) and "Not a directory" in r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out", RUN, "tensorboard"]
    assert block.read_text() == "mine"


def test_every_truncation_of_a_checkpoint_is_refused(tmp_path):
    good = write_tiny_safetensors(tmp_path / "good.safetensors")
    raw = good.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cuts = sorted({0, 4, 8, 9, n // 2, 8 + n - 1, 8 + n, 8 + n + 1, len(raw) // 2, len(raw) - 4, len(raw) - 1})
    for cut in cuts:
        p = tmp_path / f"cut{cut}.safetensors"
        p.write_bytes(raw[:cut])
        r = run(cwd, [str(CONFIG), *FAST, f"load_parameters_path={p}"])
        assert r.returncode == 1, (cut, r.returncode, r.stderr)
        assert f"cut{cut}.safetensors" in one_line(r.stderr)
        assert list(cwd.iterdir()) == [], cut


def test_every_truncation_of_a_token_file_is_refused(tmp_path):
    ids = np.arange(600) % 256
    raw = np.asarray(ids, dtype="<u4").tobytes()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for cut in (0, 1, 3, 4, 5, 257 * 4 - 1, 257 * 4 - 4, 257 * 4 + 2):
        p = tmp_path / f"cut{cut}.bin"
        p.write_bytes(raw[:cut])
        r = run(cwd, [str(CONFIG), *FAST, "dataset_type=tokens", f"dataset_path={p}"])
        assert r.returncode == 1, (cut, r.returncode, r.stderr)
        assert f"cut{cut}.bin" in one_line(r.stderr)
        assert list(cwd.iterdir()) == [], cut


# ---- 3. signals -------------------------------------------------------------------------------

def start(tmp_path, *args):
    cmd = [str(BIN), str(CONFIG), f"base_output_directory={tmp_path / 'out'}", f"run_name={RUN}", *args]
    env = {k: v for k, v in os.environ.items() if k != "STEPSCOPE_EVENT_LOG"}
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_until(p, prefix, timeout=60):
    seen = []
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return seen
        assert time.monotonic() < deadline, "".join(seen)
    raise AssertionError("".join(seen))


def finish(p, timeout=60):
    try:
        return drain(p, timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigterm_mid_profile_keeps_metrics_and_profile(tmp_path):
    # profile steps 1..30; SIGTERM after step 2: the profile holds the profiled steps done
    p = start(tmp_path, *FAST[:2], "profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=30",
              "steps=60", "data_delay_ms=30")
    seen = read_until(p, "completed step: 2,")
    p.send_signal(signal.SIGTERM)
    rest, err = finish(p)
    out = "".join(seen) + rest
    assert p.returncode == 143, out + err
    m = re.search(r"interrupted by SIGTERM after step (\d+); the metrics and profile so far are written",
                  one_line(err))
    assert m, err
    last = int(m.group(1))
    assert 2 <= last < 30
    d = tmp_path / "out" / RUN
    assert metrics_whole(d / "metrics.jsonl") == list(range(last + 1))
    summaries = list((d / "tensorboard" / "plugins" / "profile").rglob("op_summary.json"))
    assert len(summaries) == 1
    s = json.loads(summaries[0].read_text())
    assert (s["first_step"], s["last_step"]) == (1, last), s
    assert f"op summary, profiled steps 1..{last}:" in out
    assert "summary over steps" in out
    assert leftovers(tmp_path / "out") == []


def test_second_signal_exits_at_once(tmp_path):
    # each batch takes 4 s to produce, so the first SIGINT would wait for the step boundary
    p = start(tmp_path, *FAST, "steps=10", "data_delay_ms=4000")
    read_until(p, "completed step: 0,")
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    rest, err = finish(p)
    elapsed = time.monotonic() - t0
    assert p.returncode == 130, err
    assert elapsed < 2.0, elapsed
    assert "second signal" in one_line(err)
    d = tmp_path / "out" / RUN
    steps = metrics_whole(d / "metrics.jsonl")        # renamed into place, whole lines
    assert steps[:1] == [0]
    assert leftovers(tmp_path / "out") == []
    assert tfrecords_whole(next((d / "tensorboard" / RUN).glob("events.out.tfevents.*"))) == len(steps) + 1


def test_signal_before_the_first_step_leaves_nothing(tmp_path):
    # without device_peak_tflops the start-up peak probe runs for a while before step 0
    p = start(tmp_path, "model_name=tiny", "profiler=", "steps=3", "data_delay_ms=3000")
    read_until(p, "stepscope: tiny,")
    p.send_signal(signal.SIGINT)
    rest, err = finish(p)
    line = one_line(err)
    assert p.returncode == 130, err
    if "after step" in line:     # the probe was faster than the signal; then step 0 is kept
        pytest.skip("the signal arrived after step 0 began")
    assert "before the first step" in line and "nothing was written" in line, line
    assert not (tmp_path / "out").exists()


def test_closed_stdout_does_not_end_the_run(tmp_path):
    # `stepscope ... | head -3`: the console is gone, the run and its files are not
    p = start(tmp_path, *FAST, "steps=20")
    read_until(p, "completed step: 0,")
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=60)
    assert p.returncode == 0, err
    assert err == ""
    assert metrics_whole(tmp_path / "out" / RUN / "metrics.jsonl") == list(range(20))


# ---- 4. valgrind ------------------------------------------------------------------------------

VG_BIN = ROOT / "build-vg" / "stepscope"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
@pytest.mark.skipif(not VG_BIN.exists(), reason="build-vg/stepscope not built (make VG=1 build-vg/stepscope)")
@pytest.mark.parametrize("case", ["run", "refused", "resumed"])
def test_valgrind_no_leaks_no_errors(tmp_path, case):
    """A tiny run with a profiled step (a run refused at load, a run resumed from a checkpoint that
    writes two, the first beside the next step, its fp32 parameters and moments read into
    weight_dtype=bfloat16's bf16 ones)
    under memcheck: no invalid access, no uninitialised use, no definitely lost block. No
    suppressions are needed."""
    args = [str(CONFIG), "model_name=tiny", f"device_peak_tflops={PEAK}", "num_threads=1", "steps=2",
            "per_device_batch_size=1", "max_target_length=32", f"run_name={RUN}",
            f"base_output_directory={tmp_path / 'out'}"]
    if case == "run":
        args += ["profiler=xplane", "skip_first_n_steps_for_profiler=1", "profiler_steps=1"]
    elif case == "resumed":
        p = run(tmp_path, [*args, "profiler=", "steps=1", "enable_checkpointing=true", "run_name=first"])
        assert p.returncode == 0, p.stderr
        args += ["profiler=", "steps=3", "enable_checkpointing=true", "checkpoint_period=1", "async_checkpointing=true",
                 "dtype=bfloat16", "weight_dtype=bfloat16",
                 f"load_full_state_path={tmp_path / 'out' / 'first' / 'checkpoints' / '0'}"]
    else:
        bad = tmp_path / "bad.safetensors"
        _truncate(lambda n: n - 8)(bad)
        args += ["profiler=", f"load_parameters_path={bad}"]
    # Valgrind warns "client switching stacks?" around oneDNN's JIT kernels; raising
    # --max-stackframe to silence it makes memcheck treat the other stack as a frame of this
    # one and report the kernels' reads as invalid, so the default is kept.
    r = subprocess.run(["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99",
                        str(VG_BIN), *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == (1 if case == "refused" else 0), r.stderr[-3000:]
    assert re.search(r"ERROR SUMMARY: 0 errors", r.stderr), r.stderr[-3000:]
    assert re.search(r"definitely lost: 0 bytes", r.stderr) or "All heap blocks were freed" in r.stderr, r.stderr[-3000:]
    if case != "refused":
        assert metrics_whole(tmp_path / "out" / RUN / "metrics.jsonl", first=int(case == "resumed"))


def test_no_failed_library_loads_on_compute_threads(tmp_path):
    """oneDNN's default VTune JIT registration dlopen()ed the absent libJitPI.so from an OpenMP
    worker, and glibc's kept message for that failure was once reported by LeakSanitizer as a
    leak at exit, aborting a sanitizer run. gemm_create turns the registration off (unless
    DNNL_JIT_PROFILE is set): the loader's own log must show no attempt to load it."""
    r = run(tmp_path, [str(CONFIG), "model_name=tiny", f"device_peak_tflops={PEAK}", "steps=2", "profiler=",
                       f"run_name={RUN}"], extra_env={"LD_DEBUG": "files"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "file=libdnnl.so" in r.stderr, "LD_DEBUG=files logged nothing: the check would prove nothing"
    assert "libJitPI" not in r.stderr, [line for line in r.stderr.splitlines() if "libJitPI" in line][:3]
