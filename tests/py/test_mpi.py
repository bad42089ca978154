"""Data parallelism under MPI, through mpirun and the binary: N ranks reproduce one process with
the same global batch; each rank keeps 1/N of the AdamW state; gradient reductions overlap the
backward pass (seen in the profile); only rank 0 writes the console and metrics; a rank that
fails or dies takes the job down with a message naming it, never a hang.

Every run uses the tiny preset, one compute thread per rank, and --oversubscribe so -np 4 runs
on CI's 2 cores. Skips when mpirun is missing or the binary was built without MPI."""
import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from test_cli import parse_plan  # noqa: E402  (same folder: pytest puts it on sys.path)

ROOT = Path(__file__).resolve().parents[2]
_BIN = Path(os.environ.get("STEPSCOPE_BIN", "build/stepscope"))
BIN = _BIN if _BIN.is_absolute() else ROOT / _BIN
CONFIG = ROOT / "configs" / "base.yml"
S = 64
FAST = ["model_name=tiny", "device_peak_tflops=0.446", "machine_probe=false", "profiler=", "num_threads=1",
        f"max_target_length={S}"]
MPIRUN = shutil.which("mpirun")
# Root in a container: Open MPI refuses root without these. Oversubscribe: -np 4 on 2 cores.
# bind-to none: ranks share the cores with whatever else runs, as the one-process run does.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MPI_ARGS = ["--oversubscribe", "--bind-to", "none"]
# Relative loss difference allowed against one process. The ranks sum their gradients in a
# different order than one process sums its rows (fp32); measured here ~1e-9 over 5 steps.
TOL = 1e-5
# weight_dtype=bfloat16: such a last-bit difference can flip a weight's rounding to bf16 (a step
# of 2^-9 of that weight) and so moves the losses by more than fp32's; measured over steps 0..5
# (2026-12-07) 0 to nearest (no rounding flipped) and 1.2e-5 with stochastic_rounding; a few
# flipped weights move a loss far less than this bound.
TOL_BF16 = 1e-3


def mpi_env():
    env = dict(os.environ)
    env.update(MPI_ENV)
    env.pop("STEPSCOPE_EVENT_LOG", None)
    return env


def mpirun(tmp_path, np_, *args, timeout=120, mpmd=None):
    """mpirun -np np_ stepscope CONFIG base_output_directory=... args; mpmd: a list of
    per-rank argument lists instead (one rank each)."""
    cmd = [MPIRUN, *MPI_ARGS]
    common = [str(BIN), str(CONFIG), f"base_output_directory={tmp_path / 'out'}"]
    if mpmd is None:
        cmd += ["-np", str(np_), *common, *args]
    else:
        for i, extra in enumerate(mpmd):
            cmd += ([":"] if i else []) + ["-np", "1", *common, *args, *extra]
    return subprocess.run(cmd, cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=timeout)


def single(tmp_path, *args):
    env = dict(os.environ)
    env.pop("STEPSCOPE_EVENT_LOG", None)
    cmd = [str(BIN), str(CONFIG), f"base_output_directory={tmp_path / 'out'}", *args]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def metrics(tmp_path, run):
    return [json.loads(l) for l in (tmp_path / "out" / run / "metrics.jsonl").read_text().splitlines()]


def _mpi_ready():
    if not MPIRUN:
        return "mpirun not installed (Debian: openmpi-bin)"
    if not BIN.exists():
        return f"{BIN} not built"
    try:
        r = subprocess.run([MPIRUN, *MPI_ARGS, "-np", "2", str(BIN), str(CONFIG), "model_name=tiny", "--dry-run"],
                           env=mpi_env(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "mpirun -np 2 did not finish in 60 s"
    if parse_plan(r.stdout).get("num_ranks") != "2":
        return "stepscope built without MPI, or mpirun cannot start 2 ranks here: " + (r.stderr or r.stdout)[-300:]
    return None


_REASON = _mpi_ready()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def assert_same_run(one, many):
    assert len(one) == len(many) == 5
    for a, b in zip(one, many):
        assert a["step"] == b["step"]
        assert abs(a["learning/loss"] - b["learning/loss"]) <= TOL * abs(a["learning/loss"]), (a, b)
        assert abs(a["learning/raw_grad_norm"] - b["learning/raw_grad_norm"]) <= 1e-4 * a["learning/raw_grad_norm"]
        assert a["learning/total_weights"] == b["learning/total_weights"]


@pytest.mark.parametrize("ranks,per_rank,mesh", [
    (2, 2, []),
    (4, 1, []),
    (4, 1, ["dcn_data_parallelism=2"]),   # shards over 2 ranks, 2 copies: reduce-scatter + all-reduce
])
def test_ranks_reproduce_one_process(tmp_path, ranks, per_rank, mesh):
    single(tmp_path, *FAST, "steps=5", f"per_device_batch_size={ranks * per_rank}", "run_name=one")
    r = mpirun(tmp_path, ranks, *FAST, "steps=5", f"per_device_batch_size={per_rank}", "run_name=many", *mesh)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_run(metrics(tmp_path, "one"), metrics(tmp_path, "many"))
    # Only rank 0 writes the console: one line per step, one start-up line naming the ranks.
    steps = [l for l in r.stdout.splitlines() if l.startswith("completed step:")]
    assert len(steps) == 5
    assert f"ranks: {ranks} (" in r.stdout
    # Per-device figures stay per device: this rank's tokens, the global batch as total_weights.
    m = metrics(tmp_path, "many")[0]
    assert m["perf/per_device_tokens"] == per_rank * S
    assert m["learning/total_weights"] == ranks * per_rank * S
    # rank 0's summary.json: the ranks, and the same final loss as the one process
    summ = json.loads((tmp_path / "out" / "many" / "summary.json").read_text())
    assert (summ["num_ranks"], summ["per_device_batch_size"]) == (ranks, per_rank)
    assert summ["learning/final_loss"] == metrics(tmp_path, "many")[-1]["learning/loss"]


@pytest.mark.parametrize("copy", ["false", "true"])
def test_bf16_ranks_reproduce_one_process(tmp_path, copy):
    # dtype=bfloat16 rounds the gathered fp32 weights as its matmuls pack them; with
    # bf16_weight_copy=true it keeps a bf16 copy for them instead: each rank updates the copy of
    # its own shard and converts the gathered rest, so every rank multiplies with the same
    # weights. A stale copy would show at step 1 (order-1 loss difference); what is left is the
    # reduction order's ~1e-7 in the fp32 master weights, which can flip a bf16 rounding now and
    # then: bound 1e-4 relative.
    single(tmp_path, *FAST, "steps=5", "per_device_batch_size=4", "dtype=bfloat16", f"bf16_weight_copy={copy}",
           "run_name=one")
    r = mpirun(tmp_path, 2, *FAST, "steps=5", "per_device_batch_size=2", "dtype=bfloat16", f"bf16_weight_copy={copy}",
               "run_name=many")
    assert r.returncode == 0, r.stdout + r.stderr
    one, many = metrics(tmp_path, "one"), metrics(tmp_path, "many")
    assert len(one) == len(many) == 5
    for a, b in zip(one, many):
        assert abs(a["learning/loss"] - b["learning/loss"]) <= 1e-4 * a["learning/loss"], (a, b)


def read_safetensors_f32(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = np.frombuffer(raw, dtype="<f4", offset=8 + n)
    return {k: data[v["data_offsets"][0] // 4:v["data_offsets"][1] // 4] for k, v in header.items()
            if k != "__metadata__"}


def test_checkpoints_of_ranks(tmp_path):
    """Every rank holds the whole parameters after the all-gather; rank 0 alone writes them, each
    rank its shard of AdamW's moments, and rank 0 the config.json once all are written; the ranks
    wait for them at the step's end. The parameters are what one process's run holds (to the
    ranks' reduction order), and the two shards together are its moments; a run started from the
    parameters continues where the ranks were."""
    ck = ["enable_checkpointing=true", "checkpoint_period=2"]
    single(tmp_path, *FAST, "steps=5", "per_device_batch_size=4", "run_name=one", *ck)
    r = mpirun(tmp_path, 2, *FAST, "steps=5", "per_device_batch_size=2", "run_name=many", *ck)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("checkpoint: step ") == 3 and "(rank 0's files)" in r.stdout
    listing = {run: sorted(p.relative_to(tmp_path / "out" / run / "checkpoints").as_posix()
                           for p in (tmp_path / "out" / run / "checkpoints").rglob("*")) for run in ("one", "many")}
    files = {"one": ["optimizer_state-00000-of-00001.safetensors"],
             "many": ["optimizer_state-00000-of-00002.safetensors", "optimizer_state-00001-of-00002.safetensors"]}
    for run in ("one", "many"):
        assert listing[run] == [f"{s}{f}" for s in (0, 2, 4)
                                for f in ["", "/config.json", "/model.safetensors"] + [f"/{n}" for n in files[run]]]
    for step in (0, 2, 4):
        folder = {run: tmp_path / "out" / run / "checkpoints" / str(step) for run in ("one", "many")}
        a, b = (read_safetensors_f32(folder[run] / "model.safetensors") for run in ("one", "many"))
        assert a.keys() == b.keys()
        for k in a:
            assert np.linalg.norm(a[k] - b[k]) <= TOL * np.linalg.norm(a[k]), (step, k)
        one = read_safetensors_f32(folder["one"] / files["one"][0])
        shards = [read_safetensors_f32(folder["many"] / n) for n in files["many"]]
        for k in ("exp_avg", "exp_avg_sq"):
            joined = np.concatenate([sh[k] for sh in shards])
            assert joined.shape == one[k].shape
            assert np.linalg.norm(joined - one[k]) <= 10 * TOL * np.linalg.norm(one[k]), (step, k)
    single(tmp_path, *FAST, "steps=1", "per_device_batch_size=4", "run_name=from2",
           f"load_parameters_path={tmp_path / 'out' / 'many' / 'checkpoints' / '2' / 'model.safetensors'}")
    resumed, many = metrics(tmp_path, "from2")[0]["learning/loss"], metrics(tmp_path, "many")[3]["learning/loss"]
    assert abs(resumed - many) <= TOL * abs(many), (resumed, many)


@pytest.mark.parametrize("mu", ["float32", "bfloat16", "weights", "weights_sr"])
def test_full_state_resumes_on_another_rank_count(tmp_path, mu):
    """AdamW's moments are kept as ranges of the flat parameter vector, so a checkpoint of 2 ranks
    resumes in one process and one of a process on 2 ranks (each reading its shard from the files
    that cover it): steps 3..5 then match the uninterrupted runs to the ranks' reduction order,
    and a 2-rank run resumed from its own checkpoint matches itself to the last bit, with the first
    moment in fp32 or in bf16 (mu_dtype), or with the parameters and both moments in bf16
    ("weights": weight_dtype=bfloat16, whose ranks gather bf16 parameters; there a difference in
    the reduction order's last bit can move a weight by a bf16 step, 2^-9 of it, hence TOL_BF16
    for the cross-count runs), and with their updates rounded stochastically ("weights_sr": each
    weight's draw goes by its index in the whole vector, so a rank draws for its shard what one
    process draws there). A checkpoint missing a shard's file is refused before set-up on every
    rank."""
    dt = {"float32": ["mu_dtype=float32"], "bfloat16": ["mu_dtype=bfloat16"],
          "weights": ["dtype=bfloat16", "weight_dtype=bfloat16"],
          "weights_sr": ["dtype=bfloat16", "weight_dtype=bfloat16", "stochastic_rounding=true"]}[mu]
    tol = TOL_BF16 if mu.startswith("weights") else TOL
    ck = ["enable_checkpointing=true", "checkpoint_period=2", "steps=6", *dt]
    single(tmp_path, *FAST, "per_device_batch_size=4", "run_name=one", *ck)
    r = mpirun(tmp_path, 2, *FAST, "per_device_batch_size=2", "run_name=many", *ck)
    assert r.returncode == 0, r.stdout + r.stderr
    folder = {run: tmp_path / "out" / run / "checkpoints" / "2" for run in ("one", "many")}
    single(tmp_path, *FAST, "per_device_batch_size=4", "run_name=many_to_one", "steps=6", *dt,
           f"load_full_state_path={folder['many']}")
    r = mpirun(tmp_path, 2, *FAST, "per_device_batch_size=2", "run_name=one_to_many", "steps=6", *dt,
               f"load_full_state_path={folder['one']}")
    assert r.returncode == 0, r.stdout + r.stderr
    r = mpirun(tmp_path, 2, *FAST, "per_device_batch_size=2", "run_name=many_to_many", "steps=6", *dt,
               f"load_full_state_path={folder['many']}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed: the state after step 2 (3 AdamW updates)" in r.stdout
    one, many = metrics(tmp_path, "one"), metrics(tmp_path, "many")
    for run, ref in (("many_to_one", many), ("one_to_many", one)):
        got = metrics(tmp_path, run)
        assert [m["step"] for m in got] == [3, 4, 5]
        for a, b in zip(got, ref[3:]):
            assert abs(a["learning/loss"] - b["learning/loss"]) <= tol * abs(b["learning/loss"]), (run, a, b)
    assert [m["learning/loss"] for m in metrics(tmp_path, "many_to_many")] == [m["learning/loss"] for m in many[3:]]
    (folder["many"] / "optimizer_state-00001-of-00002.safetensors").unlink()
    r = mpirun(tmp_path, 2, *FAST, "per_device_batch_size=2", "run_name=x", "steps=6",
               f"load_full_state_path={folder['many']}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "lacks optimizer_state-00001-of-00002.safetensors of its 2 optimizer_state files" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "x").exists()


def test_async_checkpoints_of_ranks(tmp_path):
    """async_checkpointing on 2 ranks of a shared AdamW state: each rank writes its shard beside
    the next step, the ranks agree before that step's update, rank 0 marks the checkpoint whole;
    every file is the bytes the writes between steps give, and the losses the same bits."""
    ck = ["steps=5", "enable_checkpointing=true", "checkpoint_period=2", "per_device_batch_size=2"]
    for run, extra in (("sync", []), ("async", ["async_checkpointing=true"])):
        r = mpirun(tmp_path, 2, *FAST, f"run_name={run}", *ck, *extra)
        assert r.returncode == 0, r.stdout + r.stderr
    assert [m["learning/loss"] for m in metrics(tmp_path, "async")] == [m["learning/loss"] for m in metrics(tmp_path, "sync")]
    files = sorted(p.relative_to(tmp_path / "out" / "sync").as_posix()
                   for p in (tmp_path / "out" / "sync" / "checkpoints").rglob("*") if p.is_file())
    assert len(files) == 3 * 4, files  # steps 0, 2, 4: the parameters, 2 shards and config.json each
    for f in files:
        assert (tmp_path / "out" / "async" / f).read_bytes() == (tmp_path / "out" / "sync" / f).read_bytes(), f


def test_gradient_accumulation_of_ranks(tmp_path):
    """2 ranks of 2 micro-batches of 1 sequence (each rank's rows one after the other) take the
    update of one process's batch of 4: the ranks reduce their summed gradients once, after the
    last micro-batch."""
    single(tmp_path, *FAST, "steps=4", "per_device_batch_size=4", "run_name=one")
    r = mpirun(tmp_path, 2, *FAST, "steps=4", "per_device_batch_size=1", "gradient_accumulation_steps=2",
               "run_name=many")
    assert r.returncode == 0, r.stdout + r.stderr
    for a, b in zip(metrics(tmp_path, "one"), metrics(tmp_path, "many")):
        for key in ("learning/loss", "learning/raw_grad_norm"):
            assert abs(a[key] - b[key]) <= TOL * abs(a[key]), (key, a, b)
        assert a["perf/per_device_tokens"] == 4 * S and b["perf/per_device_tokens"] == 2 * S


def test_evaluation_of_ranks(tmp_path):
    """Each rank evaluates its rows of the global batch and the mean is taken over the ranks: the
    one process's evaluation, to the reduction order."""
    ev = ["eval_interval=2", "eval_steps=2"]
    single(tmp_path, *FAST, "steps=4", "per_device_batch_size=4", "run_name=one", *ev)
    r = mpirun(tmp_path, 2, *FAST, "steps=4", "per_device_batch_size=2", "run_name=many", *ev)
    assert r.returncode == 0, r.stdout + r.stderr
    one = [m for m in metrics(tmp_path, "one") if "eval/avg_loss" in m]
    many = [m for m in metrics(tmp_path, "many") if "eval/avg_loss" in m]
    assert [m["step"] for m in one] == [m["step"] for m in many] == [1, 3]
    for a, b in zip(one, many):
        assert abs(a["eval/avg_loss"] - b["eval/avg_loss"]) <= TOL * a["eval/avg_loss"], (a, b)
        assert a["eval/total_weights"] == b["eval/total_weights"] == 2 * 4 * S
    assert r.stdout.count("eval: after step ") == 2


def test_token_file_rows_split_across_ranks(tmp_path):
    """A token file: rank r reads global rows [r*B, (r+1)*B) of each step, as one process does."""
    ids = struct.pack("<4096I", *[(i * 7 + i // 13) % 256 for i in range(4096)])
    (tmp_path / "tok.bin").write_bytes(ids)
    data = ["dataset_type=tokens", f"dataset_path={tmp_path / 'tok.bin'}"]
    single(tmp_path, *FAST, *data, "steps=5", "per_device_batch_size=4", "run_name=one")
    r = mpirun(tmp_path, 2, *FAST, *data, "steps=5", "per_device_batch_size=2", "run_name=many")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_run(metrics(tmp_path, "one"), metrics(tmp_path, "many"))


def test_optimizer_state_per_rank_is_one_nth(tmp_path):
    one = parse_plan(single(tmp_path, "model_name=tiny", "--dry-run").stdout)
    n = int(one["num_parameters"])
    opt1 = int(one["memory_optimizer_state_bytes"])
    for ranks in (2, 4):
        r = mpirun(tmp_path, ranks, "model_name=tiny", "--dry-run")
        assert r.returncode == 0, r.stderr
        p = parse_plan(r.stdout)
        assert p["num_ranks"] == str(ranks)
        assert p["global_batch_size"].split()[0] == str(2 * ranks)
        shard = int(p["optimizer_shard_parameters"].split()[0])
        assert shard * ranks >= n and (shard - 16) * ranks < n          # 1/N, rounded up to 16 floats
        opt = int(p["memory_optimizer_state_bytes"])
        assert opt == 8 * shard + 8                                     # m and v, plus one norm partial
        assert abs(opt / opt1 - 1 / ranks) < 0.01
        assert int(p["memory_total_bytes"]) < int(one["memory_total_bytes"])
        assert r.stdout.count("num_parameters:") == 1                   # rank 0 prints the plan
    # A dry run in one process plans for the ranks the mesh keys name.
    p8 = parse_plan(single(tmp_path, "model_name=tiny", "ici_fsdp_parallelism=8", "--dry-run").stdout)
    assert p8["num_ranks"] == "8"
    assert abs(int(p8["memory_optimizer_state_bytes"]) / opt1 - 1 / 8) < 0.02


def test_startup_line_reports_shard_bytes(tmp_path):
    r = mpirun(tmp_path, 2, *FAST, "steps=2", "run_name=r")
    assert r.returncode == 0, r.stderr
    m = re.search(r"sharded over 2 ranks .*: ([0-9.]+) MiB per rank of ([0-9.]+) MiB in all", r.stdout)
    assert m, r.stdout
    assert abs(float(m[1]) / float(m[2]) - 0.5) < 0.01
    # the closing line: bytes per step against 2(N-1)/N x gradient bytes
    c = re.search(r"collectives: (\d+) bytes sent per step per rank \(ring model; 2\(N-1\)/N x (\d+) gradient bytes = (\d+)\)",
                  r.stdout)
    assert c, r.stdout
    assert int(c[1]) == pytest.approx(int(c[3]), rel=1e-3)


def test_mesh_that_does_not_match_the_ranks_is_refused(tmp_path):
    r = mpirun(tmp_path, 2, *FAST, "ici_fsdp_parallelism=4", "run_name=r")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "ici_fsdp_parallelism=4 x dcn_data_parallelism=1 does not make the 2 ranks" in r.stderr
    assert r.stderr.count("does not make") == 1                        # said once, by rank 0


def _trace(path):
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    return names, spans


def test_reductions_overlap_backward_in_the_profile(tmp_path):
    # The default model (4 layers of d=256), not tiny: a layer's backward takes milliseconds, long
    # enough for the communication thread to be scheduled inside it on 2 busy cores.
    r = mpirun(tmp_path, 2, "model_name=default", "device_peak_tflops=0.446", "num_threads=1", "profiler=xplane",
               "skip_first_n_steps_for_profiler=2", "profiler_steps=3", "steps=6", "max_target_length=128",
               "per_device_batch_size=1", "run_name=r", "upload_all_profiler_results=true")
    assert r.returncode == 0, r.stdout + r.stderr
    dirs = list((tmp_path / "out" / "r" / "tensorboard" / "plugins" / "profile").iterdir())
    assert len(dirs) == 1                                              # both ranks, one folder
    files = sorted(p.name for p in dirs[0].iterdir())
    host = next(f for f in files if f.endswith("_rank0.xplane.pb"))[: -len("_rank0.xplane.pb")]
    for rank in (0, 1):
        assert f"{host}_rank{rank}.xplane.pb" in files and f"{host}_rank{rank}.trace.json.gz" in files
    names, spans = _trace(dirs[0] / f"{host}_rank0.trace.json.gz")
    comm_tid = [t for t, n in names.items() if n.startswith("collectives")]
    assert len(comm_tid) == 1                                          # the collectives have their own line
    reduce = [e for e in spans if e["tid"] == comm_tid[0] and e["name"] == "reduce_scatter grads"]
    backward = [e for e in spans if re.fullmatch(r"layer \d+ bwd", e["name"])]
    assert reduce and backward
    def overlap(a, b):
        return min(a["ts"] + a["dur"], b["ts"] + b["dur"]) - max(a["ts"], b["ts"])
    overlapping = [(a["name"], b["name"]) for a in reduce for b in backward if overlap(a, b) > 0]
    # 3 profiled steps x (head + 3 of the 4 layers) buckets could overlap a later layer's backward.
    assert len(overlapping) >= 3, (len(reduce), len(backward))
    # Each collective's span carries the bytes this rank sent in it: over the 3 profiled steps,
    # 3 x the closing line's bytes per step.
    per_step = int(re.search(r"collectives: (\d+) bytes sent per step per rank", r.stdout)[1])
    comm = [e for e in spans if e["tid"] == comm_tid[0]]
    assert all(e["args"]["bytes_accessed"] > 0 for e in reduce)
    assert sum(e.get("args", {}).get("bytes_accessed", 0) for e in comm) == 3 * per_step
    # Every rank's op summary reads against rank 0's peaks: the one given, and the bandwidth probed.
    sums = [json.loads((dirs[0] / name).read_text()) for name in ("op_summary.json", "op_summary_rank1.json")]
    assert [s["peak_gflops"] for s in sums] == [446.0, 446.0]
    assert sums[0]["peak_gbytes_per_s"] > 0 and sums[1]["peak_gbytes_per_s"] == sums[0]["peak_gbytes_per_s"]
    assert all(r["pct_bandwidth"] > 0 for r in sums[1]["rows"] if r["category"] == "optimizer")


def test_only_rank0_profiles_by_default(tmp_path):
    r = mpirun(tmp_path, 2, *FAST[:2], "num_threads=1", f"max_target_length={S}", "profiler=xplane", "steps=3",
               "profiler_steps=1", "run_name=r")
    assert r.returncode == 0, r.stderr
    d = next((tmp_path / "out" / "r" / "tensorboard" / "plugins" / "profile").iterdir())
    files = sorted(p.name for p in d.iterdir())
    assert len(files) == 3 and all("_rank1" not in f for f in files), files
    assert any(f.endswith("_rank0.xplane.pb") for f in files)


def test_bad_file_on_one_rank_fails_the_job_naming_it(tmp_path):
    (tmp_path / "good.bin").write_bytes(struct.pack("<4096I", *[i % 256 for i in range(4096)]))
    t0 = time.monotonic()
    r = mpirun(tmp_path, 2, *FAST, "dataset_type=tokens", "steps=3", "run_name=r", timeout=60,
               mpmd=[[f"dataset_path={tmp_path / 'good.bin'}"], [f"dataset_path={tmp_path / 'missing.bin'}"]])
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stepscope: rank 1: data: cannot open tokens file" in r.stderr
    assert "completed step" not in r.stdout
    assert "set-up:" not in r.stdout   # every rank stops before set-up
    assert time.monotonic() - t0 < 30


def _pids_of_rank(run_name, rank):
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"run_name={run_name}".encode() in cmd and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            out.append(int(p.name))
    return out


def test_a_rank_that_dies_ends_the_job(tmp_path):
    run = f"die{os.getpid()}"
    proc = subprocess.Popen([MPIRUN, *MPI_ARGS, "-np", "2", str(BIN), str(CONFIG), f"base_output_directory={tmp_path}",
                             *FAST, "steps=100000", "data_delay_ms=5", f"run_name={run}"],
                            cwd=tmp_path, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        pids = []
        while time.monotonic() < deadline and not pids:
            time.sleep(0.5)
            pids = _pids_of_rank(run, 1)
        assert pids, "rank 1 never started"
        time.sleep(1.0)                                                # let it reach the steps
        os.kill(pids[0], signal.SIGKILL)                               # as the OOM killer would
        out, err = proc.communicate(timeout=60)                        # never a hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert re.search(r"rank 1 .*(signal 9|Killed)", err, re.S), err[-2000:]


def test_divergence_stops_every_rank_at_one_step(tmp_path):
    r = mpirun(tmp_path, 2, *FAST, "steps=50", "learning_rate=1e6", "gradient_clipping_threshold=0", "run_name=r",
               timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    msgs = [l for l in r.stderr.splitlines() if l.startswith("stepscope: rank")]
    assert len(msgs) == 1 and msgs[0].startswith("stepscope: rank 0: "), r.stderr    # said once
    assert re.search(r"(NaN|not finite|Inf)", msgs[0])
    assert len(metrics(tmp_path, "r")) < 50
