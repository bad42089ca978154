"""benchlib: what the bench/ scripts share: build stepscope, run one child at a time and measure
it (wall time, peak RSS from wait4's rusage, CPU that other processes took meanwhile, an
optional RSS cap), run stepscope or the PyTorch reference (tools/torch_qwen3.py) on a config
and read their per-step times, and print a plain table.

Every child runs alone: the scripts call these one after another, never in parallel, so the
runs do not compete for the two cores or for memory."""
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from stepscope_plan import stepscope_plan  # noqa: E402
from torch_python import torch_python  # noqa: E402
BIN = ROOT / "build" / "stepscope"
CONFIG = ROOT / "configs" / "base.yml"
TORCH_REFERENCE = ROOT / "tools" / "torch_qwen3.py"
GIB = 1024.0 ** 3
# Debian's caching allocators (tools/install_deps.sh installs tcmalloc); first found is used.
ALLOCATORS = ["/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
              "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"]


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _exit_on_sigterm)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def build():
    """make -j2 (a no-op when up to date) so the scripts time the current sources."""
    r = subprocess.run(["make", "-j2"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: make failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def _probe(name, fields, threads, seconds, *extra):
    """The figures build/bench/<name> prints after each of `fields` at the start of a line (None
    for one it did not print, all None where it cannot run), from one run of it."""
    r = subprocess.run([str(ROOT / "build" / "bench" / name), str(threads), str(seconds), *extra],
                       capture_output=True, text=True)
    found = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        words = line.split()
        if len(words) >= 2 and words[0] in fields:
            found[words[0]] = float(words[1])
    return tuple(found.get(f) for f in fields)


def fma_probe(threads, seconds=0.5):
    """TFLOP/s the cores' FMA units deliver right now (build/bench/fma_probe: stepscope's start-up
    probe, best of 5 rounds), or None where it cannot run. On a shared VM it moves by a quarter
    or more within minutes: logged beside each run, it tells a slow round from a slow engine."""
    return _probe("fma_probe", ("fma_probe_tflops",), threads, seconds)[0]


def fma_and_bf16_probes(threads, seconds=0.5):
    """(fma_probe's TFLOP/s, the bf16 unit's) right now, from one run of build/bench/fma_probe
    with its bf16 line (the probe a dtype=bfloat16 run starts with); None where it cannot run."""
    return _probe("fma_probe", ("fma_probe_tflops", "bf16_probe_tflops"), threads, seconds, "bf16")


def fma_and_ymm_probes(threads, seconds=0.5):
    """(fma_probe's TFLOP/s, the same chains at 256 bits) from one run of build/bench/fma_probe
    with its ymm line. Their ratio is ~2 where the CPU runs 512-bit FMAs at full width and ~1
    where it splits them into halves (a Zen 4; the Zen 5 VM in its slow phase), which is when a
    256-bit library such as MKL's on AMD (torch's fp32 GEMM) loses nothing to 512-bit code.
    (fma_probe alone, None) on a build without AVX-512, whose probe is 256 bits wide already."""
    fma, ymm = _probe("fma_probe", ("fma_probe_tflops", "ymm_probe_tflops"), threads, seconds, "ymm")
    return (fma, ymm) if fma else (fma_probe(threads, seconds), None)


def mem_probe(threads, seconds=0.5):
    """GB/s the memory bus delivers right now (build/bench/mem_probe: the better of a STREAM triad
    with streaming stores and an in-place update over 256 MiB arrays, best of their rounds; a
    plain-store triad before 2026-12-07), or None where it cannot run. It moves with the VM's
    neighbours apart from the FMA probe, and bandwidth-bound engines move with it."""
    return _probe("mem_probe", ("mem_probe_gbs",), threads, seconds)[0]


def machine_probes(threads):
    """(fma_probe, mem_probe) now: what the cores and the memory bus deliver around a run."""
    return fma_probe(threads), mem_probe(threads)


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _busy_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


def _rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_child(cmd, log_path, env=None, cwd=None, rss_cap=None, timeout=None):
    """Runs cmd alone, stdout+stderr to log_path. Returns rc, wall seconds, peak RSS bytes (the
    child's ru_maxrss), others_cores (CPU other processes used during the run, in cores: a
    figure near 0 means the run had the machine to itself), and over_cap (killed because its RSS
    passed rss_cap bytes; polled every 20 ms, so a cap needs ~1 GiB of headroom below what the
    machine can give)."""
    hz = os.sysconf("SC_CLK_TCK")
    busy0, t0 = _busy_jiffies(), time.monotonic()
    with open(log_path, "w") as out:
        p = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             start_new_session=True)
    over_cap = timed_out = False
    try:
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if rss_cap and _rss_bytes(p.pid) > rss_cap and not over_cap:
                over_cap = True
                os.killpg(p.pid, signal.SIGKILL)
            if timeout and time.monotonic() - t0 > timeout and not timed_out:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.02)
    except BaseException:
        # Interrupted (Ctrl-C, or SIGTERM via the handler below): the child is in its own
        # session, so take it down too rather than leave it running.
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    wall = time.monotonic() - t0
    child_cpu = ru.ru_utime + ru.ru_stime
    others = max(0.0, ((_busy_jiffies() - busy0) / hz - child_cpu) / wall)
    rc = os.waitstatus_to_exitcode(status)
    return {"rc": rc, "wall": wall, "peak_rss": ru.ru_maxrss * 1024, "others_cores": others,
            "over_cap": over_cap, "timed_out": timed_out, "log": str(log_path)}


def tail(path, n=5):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def plan_of(overrides):
    """stepscope's --dry-run as {key: text}; "refused" holds a refusal (tools/stepscope_plan.py)."""
    return stepscope_plan(overrides, BIN, CONFIG)


def median_step(seconds):
    """Median step time with step 0 (start-up, compilation) left out."""
    timed = seconds[1:] or seconds
    return statistics.median(timed)


def cpu_has_bf16_unit():
    """Whether /proc/cpuinfo lists a bf16 dot-product unit (AVX512-BF16 or AMX-BF16)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


def matmul_peak(overrides, fp32_peak):
    """The peak of a stepscope run's matmul dtype, which is what its device_peak_tflops means:
    twice the fp32 peak for a dtype=bfloat16 run on a CPU with a bf16 dot-product unit (2 flop a
    bf16 pair, both FMA pipes), the fp32 peak otherwise (bf16 is emulated at the fp32 rate)."""
    dtypes = [o.split("=", 1)[1] for o in overrides if o.startswith("dtype=")]
    bf16 = bool(dtypes) and dtypes[-1] == "bfloat16"  # the last one wins, as in stepscope
    return 2 * fp32_peak if bf16 and cpu_has_bf16_unit() else fp32_peak


def run_stepscope(overrides, workdir, name, threads, peak, rss_cap=None, timeout=None, binary=None, config=None):
    """One stepscope run (of `binary`, default build/stepscope, with `config`, default
    configs/base.yml); adds per-step seconds and losses from its metrics.jsonl."""
    cmd = [binary or BIN, config or CONFIG, *overrides, f"num_threads={threads}", f"device_peak_tflops={peak}",
           f"base_output_directory={workdir}", f"run_name={name}", "enable_tensorboard=false"]
    res = run_child(cmd, Path(workdir) / f"{name}.log", rss_cap=rss_cap, timeout=timeout)
    res["cmd"] = " ".join(str(c) for c in cmd)
    metrics = Path(workdir) / name / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    res["seconds"] = [r["perf/step_time_seconds"] for r in rows]
    res["losses"] = [r["learning/loss"] for r in rows]
    return res


def torch_env(threads):
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # no compile workers competing with the step
    allocator = next((a for a in ALLOCATORS if os.path.exists(a)), None)
    if allocator:
        env["LD_PRELOAD"] = allocator
        # Keep freed pages (a caching allocator, as PyTorch has on GPUs): re-faulting a large
        # tensor every step costs ~20 us per 4 KiB page in this VM. Quiet tcmalloc's notes on
        # allocations over 1 GiB.
        env["TCMALLOC_RELEASE_RATE"] = "0"
        env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] = str(1 << 40)
        env["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1"  # the same for jemalloc
    else:
        log("bench: no tcmalloc/jemalloc found (tools/install_deps.sh installs tcmalloc); torch runs with glibc malloc")
    return env, allocator


def require_torch(python=None):
    """Exits with one line naming what is missing when the torch reference cannot start, before
    any run: otherwise every torch run of a half-hour benchmark fails on its own import after
    stepscope's runs have been timed. tools/install_deps.sh installs torch only with --with-torch
    (PyPI's is the CUDA build, ~5 GB installed); the reference imports numpy too. python: default
    tools/torch_python.py's choice ($TORCH_PYTHON, this interpreter or .venv's where it has
    torch, python3)."""
    python = python or torch_python(("numpy", "torch"))
    r = subprocess.run([python, "-c", "import numpy, torch"], capture_output=True, text=True)
    if r.returncode != 0:
        missing = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        sys.exit(f"bench: the PyTorch reference cannot start in {python} ({missing}); "
                 f"install it with: tools/install_deps.sh --with-torch (into .venv, which the benches then find), "
                 f"or {python} -m pip install torch numpy, or set TORCH_PYTHON")


def run_torch(overrides, workdir, name, threads, mode="eager", dtype="float32", rss_cap=None, timeout=None,
              python=None):
    """One run of the PyTorch reference in a child process under the caching allocator, in
    python (default: tools/torch_python.py's choice)."""
    python = python or torch_python(("numpy", "torch"))
    out = Path(workdir) / f"{name}.json"
    cmd = [python, TORCH_REFERENCE, "--bin", BIN, "--config", CONFIG, "--threads", str(threads), "--mode", mode,
           "--dtype", dtype, "--json", out, *overrides]
    env, allocator = torch_env(threads)
    res = run_child(cmd, Path(workdir) / f"{name}.log", env=env, rss_cap=rss_cap, timeout=timeout)
    res["cmd"] = " ".join(str(c) for c in cmd)
    res["allocator"] = allocator
    if out.exists():
        data = json.loads(out.read_text())
        res["seconds"] = [s["seconds"] for s in data["steps"]]
        res["losses"] = [s["loss"] for s in data["steps"]]
        res["torch"] = data["torch"]
    else:
        res["seconds"], res["losses"] = [], []
    return res


def memory_cap(requested_gib=None, headroom_gib=1.0):
    """RSS cap for a child: the requested GiB, but never more than what is available now less
    headroom, so a capped child cannot push other users of the machine out of memory."""
    available = meminfo("MemAvailable") - headroom_gib * GIB
    cap = available if requested_gib is None else min(requested_gib * GIB, available)
    return int(cap)


def gib(nbytes):
    """GiB as text: 2 decimals, 3 below 0.1 GiB."""
    x = nbytes / GIB
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def table(headers, rows):
    """Plain text table, columns right-aligned except the first."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for k, r in enumerate(cells):
        parts = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, len(r))]
        lines.append("  ".join(parts).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
