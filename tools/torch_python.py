"""torch_python: which Python runs the PyTorch reference (tools/torch_qwen3.py) for the tests
and bench/. Needs only the standard library, so a caller without torch can still ask.

The order: $TORCH_PYTHON where it is set (the caller's choice, even when it cannot import
torch, so that the message names it); else the interpreter running the caller, where it
imports the modules; else the project's .venv, where it does (`tools/install_deps.sh
--with-torch` puts torch there, so `bench/vs_torch.py` under the system python3 finds it);
else `python3` on PATH."""
import functools
import os
import subprocess
import sys
from pathlib import Path

VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"


def imports(python, modules, timeout=300):
    """Whether `python` imports every one of modules (names)."""
    try:
        r = subprocess.run([python, "-c", "import " + ", ".join(modules)], capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@functools.lru_cache(maxsize=None)
def torch_python(modules=("torch",)):
    """The interpreter to run the reference with (see the module's text for the order); asked once
    per modules a process, since each ask imports torch in a child (seconds)."""
    chosen = os.environ.get("TORCH_PYTHON")
    if chosen:
        return chosen
    for python in (sys.executable, str(VENV_PYTHON)):
        if python and imports(python, modules):
            return python
    return "python3"
