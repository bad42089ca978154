#!/usr/bin/env bash
# Installs everything stepscope builds and tests with, on Debian 12 as root: the C toolchain
# and libraries from Debian, and a Python venv (.venv) with the readers the tests check our
# files with (pytest, TensorBoard's event reader, XProf's XPlane converter) and Intel oneMKL,
# which stepscope loads at run time for its matmuls on Intel CPUs (gemm_library=auto).
# --with-torch also puts PyTorch, safetensors and transformers in the venv: the PyTorch
# reference (tools/torch_qwen3.py) that tests/py/test_torch_reference.py checks stepscope against
# and bench/ times it against. Off by default: PyPI's torch is the CUDA build, about 3 GB to
# download and 5 GB installed, for a CPU tool; .ci/run asks for it so that CI runs those tests.
set -euo pipefail
with_torch=0
for arg in "$@"; do
    case "$arg" in
        --with-torch) with_torch=1 ;;
        *) echo "install_deps.sh: unknown option '$arg' (the only option is --with-torch)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# clang + libclang-rt-dev: the libFuzzer targets (make fuzz); valgrind: the end-to-end leak test;
# libtcmalloc-minimal4: the caching allocator bench/ gives the PyTorch reference.
apt-get install -y -qq gcc make pkg-config libopenmpi-dev openmpi-bin libdnnl-dev libyaml-dev libcjson-dev libcmocka-dev \
    zlib1g-dev protobuf-compiler python3 python3-venv python3-pip clang libclang-rt-dev valgrind libtcmalloc-minimal4 >/dev/null
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check pytest numpy tensorboard xprof mkl
if [ "$with_torch" = 1 ]; then
    # python3-dev: torch.compile's C++ kernels include Python.h (bench/vs_torch.py's compile runs)
    apt-get install -y -qq python3-dev >/dev/null
    .venv/bin/pip install -q --disable-pip-version-check torch safetensors transformers
fi
