"""stepscope_plan: the resolved config and plan that `stepscope CONFIG key=value ... --dry-run`
prints, as a dict, for the Python tools (tools/torch_qwen3.py, bench/). Needs only the standard
library, so callers that do not run torch need not import it."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BIN = ROOT / "build" / "stepscope"
DEFAULT_CONFIG = ROOT / "configs" / "base.yml"


def stepscope_plan(overrides, binary=DEFAULT_BIN, config=DEFAULT_CONFIG):
    """{key: text} of every `key: value` line of the dry run. When stepscope refuses the config,
    "refused" holds its message; a plan refused only for memory still carries all its numbers
    (memory_total_bytes among them), one refused for a bad key has none."""
    cmd = [str(binary), str(config), *overrides, "--dry-run"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    plan = {}
    for line in r.stdout.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            plan[key.strip()] = value.strip()
        elif line.endswith(":"):
            plan[line[:-1].strip()] = ""
    if r.returncode != 0:
        plan["refused"] = r.stderr.strip() or f"{' '.join(cmd)}: exit {r.returncode}"
    return plan
