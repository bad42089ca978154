"""Reader-side checks of the files stepscope writes: runs build/tests/test_formats with
STEPSCOPE_SAMPLE_DIR so it writes a sample profile (XPlane, Chrome JSON, tfevents), then
opens them with independent readers: XProf's own converters, protoc against the schema in
tests/proto/xplane.proto, Python's gzip+json, and TensorBoard's EventAccumulator.

Needs: pytest; optional (tests skip without them): xprof, tensorboard, protoc on PATH."""
import gzip
import json
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("STEPSCOPE_BUILD", "build"))
BINARY = (BUILD if BUILD.is_absolute() else ROOT / BUILD) / "tests" / "test_formats"
PROTO = ROOT / "tests" / "proto" / "xplane.proto"
RUN = "plugins/profile/2026_01_01_00_00_00"
STEPS = [0, 1, 2, 3]
EPOCH_NS = 1767225600 * 10**9


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    if not BINARY.exists():
        pytest.skip(f"{BINARY} not built")
    out = tmp_path_factory.mktemp("sample")
    env = dict(os.environ, STEPSCOPE_SAMPLE_DIR=str(out))
    r = subprocess.run([str(BINARY)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / RUN / "testhost.xplane.pb").exists(), r.stdout + r.stderr
    return out


# ---- protoc text format -> nested dicts -----------------------------------------------------

def parse_text_format(text):
    """Parse protoc --decode output into {field: [values]} dicts (messages nest)."""
    root, stack = {}, []
    cur = root
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line == "}":
            cur = stack.pop()
        elif line.endswith("{"):
            child = {}
            cur.setdefault(line[:-1].strip(), []).append(child)
            stack.append(cur)
            cur = child
        else:
            key, value = line.split(":", 1)
            value = value.strip()
            if value.startswith('"'):
                value = value[1:-1].encode("latin-1").decode("unicode_escape")
            elif re.fullmatch(r"-?\d+", value):
                value = int(value)
            else:
                value = float(value)
            cur.setdefault(key, []).append(value)
    assert not stack
    return root


def one(msg, key, default=None):
    return msg.get(key, [default])[0]


def assert_nested(spans, what):
    """spans: (begin, end) sorted by begin asc, end desc. No partial overlaps."""
    stack = []
    for b, e in spans:
        while stack and stack[-1] <= b:
            stack.pop()
        assert not stack or e <= stack[-1], f"{what}: span ({b}, {e}) overlaps its parent ending {stack[-1]}"
        stack.append(e)


# ---- (1) the real XProf reader --------------------------------------------------------------

def test_xprof_reader_finds_steps(sample):
    try:
        from xprof.convert import raw_to_tool_data
    except Exception as e:  # ImportError, or a broken native extension
        pytest.skip(f"xprof not importable: {e!r}")
    path = str(sample / RUN / "testhost.xplane.pb")
    tools = raw_to_tool_data.xspace_to_tool_names([path])
    assert any(t.startswith("trace_viewer") for t in tools), tools
    assert "overview_page" in tools, tools

    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})
    trace = json.loads(data)
    names = {ev.get("args", {}).get("step_name") or ev.get("name") for ev in trace["traceEvents"]}
    assert {f"train {n}" for n in STEPS} <= names
    threads = {ev["args"]["name"] for ev in trace["traceEvents"] if ev.get("name") == "thread_name"}
    assert {"compute0", "compute1", "data_loader"} <= threads

    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "overview_page", {})
    tables = json.loads(data)
    step_table = next(t for t in tables if any(c.get("id") == "stepnum" for c in t.get("cols", [])))
    assert [row["c"][0]["v"] for row in step_table["rows"]] == [f"train {n}" for n in STEPS]
    assert all(row["c"][-1]["v"] > 0 for row in step_table["rows"])   # step time, ms
    # the data wait (30 us a step) is the steps' input time
    cols = [c["id"] for c in step_table["cols"]]
    assert [row["c"][cols.index("infeedTimeMs")]["v"] for row in step_table["rows"]] == [pytest.approx(0.030)] * 4

    # the host op table: compute0's kernels by "<part>/<name>", the category the type; compute1's
    # chunks are the same work, not counted twice
    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "framework_op_stats", {})
    table = json.loads(data)[0]
    ids = [c["id"] for c in table["cols"]]
    rows = {r["operation"]: r for r in (dict(zip(ids, (c.get("v") for c in row["c"]))) for row in table["rows"])}
    assert rows.pop("IDLE")["type"] == "IDLE"
    # type, calls and us a step: each of 2 layers runs forward, then backward at twice the time
    want = {"attention/matmul qkv_proj": ("matmul", 16, 2 * 120 * 3), "attention/flash_attention": ("attention", 16, 2 * 200 * 3),
            "attention/matmul o_proj": ("matmul", 16, 2 * 60 * 3), "mlp/matmul gate_up_down": ("matmul", 16, 2 * 300 * 3),
            "norms/rmsnorm": ("norm", 32, 2 * 2 * 20 * 3), "lm_head/cross_entropy": ("xent", 4, 150),
            "embed/embed": ("embed", 4, 20), "optimizer/adamw_update": ("optimizer", 4, 100), "data/data wait": ("data", 4, 30)}
    assert {op: (r["type"], r["occurrences"], r["total_time"]) for op, r in rows.items()} == \
        {op: (t, n, pytest.approx(us_per_step * 4)) for op, (t, n, us_per_step) in want.items()}
    assert not any("chunk" in op for op in rows)


# ---- (2) protoc against the schema from FORMATS.md ------------------------------------------

@pytest.fixture(scope="module")
def xspace(sample):
    if not shutil.which("protoc"):
        pytest.skip("protoc not on PATH")
    raw = (sample / RUN / "testhost.xplane.pb").read_bytes()
    args = ["protoc", f"-I{PROTO.parent}", PROTO.name]
    text = subprocess.run(args[:1] + ["--decode=tensorflow.profiler.XSpace"] + args[1:], input=raw,
                          capture_output=True, check=True).stdout
    # Deterministic bytes: re-encoding the decoded text must give the file back.
    again = subprocess.run(args[:1] + ["--encode=tensorflow.profiler.XSpace"] + args[1:], input=text,
                           capture_output=True, check=True).stdout
    assert again == raw, "file differs from protobuf's deterministic serialization"
    return parse_text_format(text.decode())


def test_protoc_structure(xspace):
    assert xspace["hostnames"] == ["testhost"]
    (plane,) = xspace["planes"]
    assert one(plane, "id", 0) == 0 and one(plane, "name") == "/host:CPU"
    lines, memory, counters = plane["lines"][:-2], plane["lines"][-2], plane["lines"][-1]
    assert [one(l, "name") for l in lines] == ["compute0", "compute1", "data_loader"]
    assert [one(l, "id") for l in lines] == [4101, 4102, 4103]
    assert all(one(l, "timestamp_ns") == EPOCH_NS for l in plane["lines"])

    emeta = {e["key"][0]: e["value"][0] for e in plane["event_metadata"]}
    smeta = {e["key"][0]: e["value"][0] for e in plane["stat_metadata"]}
    assert sorted(emeta) == list(range(1, len(emeta) + 1))
    assert all(one(v, "id") == k for k, v in emeta.items())
    assert all(one(v, "id") == k for k, v in smeta.items())
    stat_names = {one(v, "name"): k for k, v in smeta.items()}
    assert len(stat_names) == len(smeta)
    assert {"_r", "step_num", "flops"} <= set(stat_names)
    assert "group_id" not in stat_names   # would switch XProf's own step grouping off

    for line in lines:
        events = line["events"]
        assert all("offset_ps" in e for e in events)   # oneof: present even when 0
        spans = [(one(e, "offset_ps"), one(e, "offset_ps") + one(e, "duration_ps", 0)) for e in events]
        assert spans == sorted(spans, key=lambda s: (s[0], -(s[1] - s[0])))
        assert_nested(spans, one(line, "name"))
        for e in events:
            assert one(e, "metadata_id") in emeta

    steps = []
    for e in lines[0]["events"]:
        stats = {smeta[one(s, "metadata_id")]["name"][0]: s for s in e.get("stats", [])}
        if "_r" in stats:
            assert emeta[one(e, "metadata_id")]["name"] == ["train"]
            assert one(stats["_r"], "int64_value") == 1
            assert "int64_value" in stats["step_num"]    # int64, written even for 0
            steps.append(one(stats["step_num"], "int64_value"))
        elif "flops" in stats:
            assert one(stats["flops"], "uint64_value") > 0
    assert steps == STEPS

    # compute0's kernels carry XProf's tf_op, an interned string "<part>/<name>:<category>" (a
    # ref_value naming a stat metadata); containers and compute1's chunks carry none
    containers = {"train", "forward", "backward", "layer0/forward", "layer1/forward", "layer0/backward", "layer1/backward"}
    for line in lines[:2]:
        for e in line["events"]:
            name = one(emeta[one(e, "metadata_id")], "name")
            stats = {one(smeta[one(s, "metadata_id")], "name"): s for s in e.get("stats", [])}
            if one(line, "name") == "compute0" and name not in containers:
                op = one(smeta[one(stats["tf_op"], "ref_value")], "name")
                assert re.fullmatch(rf"[a-z_]+/{re.escape(name)}:[a-z]+", op), (name, op)
                assert ("_ipl_stage_name" in stats) == (name == "data wait")
            else:
                assert "tf_op" not in stats, name

    # the compute lane's rate counters, last: XProf's "_counters_" line (TSL's id for it), one
    # zero-length event a sample and counter, its one stat a non-negative double of its series
    assert one(counters, "name") == "_counters_" and one(counters, "id") == 2**63 - 1
    series = {"compute lane GFLOP/s": "GFLOP/s", "compute lane GB/s": "GB/s"}
    for e in counters["events"]:
        assert "duration_ps" not in e and len(e["stats"]) == 1
        (st,) = e["stats"]
        assert smeta[one(st, "metadata_id")]["name"] == [series[one(emeta[one(e, "metadata_id")], "name")]]
        assert one(st, "double_value") >= 0
    assert any(one(e["stats"][0], "double_value") > 0 for e in counters["events"])

    # the memory plan: its own line (an id XProf reserves for derived lines, which its op
    # statistics skip), one zero-length MemoryAllocation a buffer at the first step's start, with
    # the running totals against the capacity; a buffer of several dtypes has no data_type
    assert one(memory, "name") == "memory plan" and one(memory, "id") == 0xdeadbeef + 7
    allocs = []
    for e in memory["events"]:
        assert emeta[one(e, "metadata_id")]["name"] == ["MemoryAllocation"] and "duration_ps" not in e
        assert one(e, "offset_ps") == 0
        allocs.append({one(smeta[one(st, "metadata_id")], "name"): one(st, "int64_value", one(st, "str_value"))
                       for st in e["stats"]})
    assert allocs == [
        {"allocator_name": "stepscope memory plan", "bytes_allocated": 4000000, "bytes_available": 6000000,
         "peak_bytes_in_use": 4000000, "requested_bytes": 4000000, "allocation_bytes": 4000000, "addr": 0,
         "tf_op": "parameters", "region_type": "persist", "data_type": 1},
        {"allocator_name": "stepscope memory plan", "bytes_allocated": 6000000, "bytes_available": 4000000,
         "peak_bytes_in_use": 6000000, "requested_bytes": 2000000, "allocation_bytes": 2000000, "addr": 4000000,
         "tf_op": "bf16 weights", "region_type": "persist", "data_type": 14},
        {"allocator_name": "stepscope memory plan", "bytes_allocated": 7000000, "bytes_available": 3000000,
         "peak_bytes_in_use": 7000000, "requested_bytes": 1000000, "allocation_bytes": 1000000, "addr": 6000000,
         "tf_op": "scratch", "region_type": "temp"}]


# ---- (3) Chrome trace JSON --------------------------------------------------------------------

def test_chrome_trace_json(sample):
    raw = (sample / RUN / "testhost.trace.json.gz").read_bytes()
    d = zlib.decompressobj(wbits=31)
    text = d.decompress(raw).decode()
    assert d.eof and d.unused_data == b"", "expected exactly one gzip member"
    assert text == gzip.decompress(raw).decode()
    assert text.startswith('{"traceEvents":[')
    doc = json.loads(text)
    assert list(doc)[0] == "traceEvents"
    events = doc["traceEvents"]

    threads = {ev["tid"]: ev["args"]["name"] for ev in events if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert threads == {4101: "compute0", 4102: "compute1", 4103: "data_loader"}
    assert any(ev["ph"] == "M" and ev["name"] == "process_name" for ev in events)

    spans = [ev for ev in events if ev["ph"] == "X"]
    assert min(ev["ts"] for ev in spans) == 0
    by_tid = {}
    for ev in spans:
        assert ev["pid"] == 1 and ev["dur"] >= 0 and ev["tid"] in threads
        # integer ns, so compare in ns to keep the nesting check exact
        by_tid.setdefault(ev["tid"], []).append((round(ev["ts"] * 1000), round((ev["ts"] + ev["dur"]) * 1000)))
    for tid, s in by_tid.items():
        assert_nested(sorted(s, key=lambda x: (x[0], -(x[1] - x[0]))), threads[tid])

    steps = [ev for ev in spans if ev["name"] == "train"]
    assert [ev["args"]["step_num"] for ev in sorted(steps, key=lambda e: e["ts"])] == STEPS
    assert all(ev["tid"] == 4101 for ev in steps)
    assert any("flops" in ev.get("args", {}) for ev in spans)
    # the compute lane's rates: two counter tracks of one series each, never negative
    counters = [ev for ev in events if ev["ph"] == "C"]
    assert {ev["name"] for ev in counters} == {"compute lane GFLOP/s", "compute lane GB/s"}
    assert all(ev["pid"] == 1 and ev["ts"] >= 0 and len(ev["args"]) == 1 and min(ev["args"].values()) >= 0
               for ev in counters)
    assert max(ev["args"]["GFLOP/s"] for ev in counters if ev["name"] == "compute lane GFLOP/s") > 0


# ---- (4) TensorBoard event file ---------------------------------------------------------------

def test_tfevents_tensorboard(sample):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except Exception as e:
        pytest.skip(f"tensorboard not importable: {e!r}")
    files = list((sample / "tb").glob("events.out.tfevents.*"))
    assert [f.name for f in files] == ["events.out.tfevents.1767225600.testhost"]
    acc = EventAccumulator(str(sample / "tb"))
    acc.Reload()
    assert {"learning/loss", "perf/step_time_seconds"} <= set(acc.Tags()["scalars"])
    loss = acc.Scalars("learning/loss")
    assert [e.step for e in loss] == STEPS
    assert [e.value for e in loss] == [10.0, 9.0, 8.0, 7.0]
    assert [e.wall_time for e in loss] == [1767225601.0 + s for s in STEPS]
    assert all(e.value == 0.25 for e in acc.Scalars("perf/step_time_seconds"))


def test_op_summary_json(sample):
    doc = json.loads((sample / "op_summary.json").read_text())
    assert doc["num_steps"] == len(STEPS) and doc["lane"] == "compute0"
    rows = {(r["category"], r["part"]): r for r in doc["rows"]}
    total = rows[("total (train steps)", "")]
    other = rows[("other (outside kernels)", "")]
    kernels = sum(r["total_ms"] for (c, p), r in rows.items() if p == "" and r is not total and r is not other)
    assert kernels + other["total_ms"] == pytest.approx(total["total_ms"])
    assert total["total_ms"] == pytest.approx(doc["step_ms"])
