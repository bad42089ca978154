"""torch_python: which Python runs the PyTorch reference (tools/torch_qwen3.py) for the tests
and bench/. Needs only the standard library, so a caller without torch can still ask.

The order: $TORCH_PYTHON where it is set (the caller's choice, even when it cannot import
torch, so that the message names it); else the interpreter running the caller, where it
imports the modules (`tools/install_deps.sh --with-torch` puts torch in .venv, which runs the
tests); else `python3` on PATH."""
import functools
import os
import subprocess
import sys


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
    if imports(sys.executable, modules):
        return sys.executable
    return "python3"
