#!/usr/bin/env bash
# Create (once, then reuse) the virtual environment with Ray that the Ray tier (tests_ray/) and
# benchmarks/sweep.py --ray run in. Prints the venv's python.
#
#   scripts/ray_env.sh            # ~35 s and ~530 MB the first time; instant afterwards
#
# It lives outside the checkout, so every clone on the machine shares it:
#   FAIRSERVE_RAY_VENV   (${XDG_CACHE_HOME:-~/.cache}/fairserve/ray-venv)
#   PYTHON               interpreter that creates the venv (python3, >= 3.11)
#
# fairserve itself is not installed there: the tier runs it from the checkout (PYTHONPATH=src), with fairserve's own
# dependencies (read from pyproject.toml) beside plain `ray` (no extras: no dashboard, nothing else to download).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/fairserve
VENV=${FAIRSERVE_RAY_VENV:-$CACHE/ray-venv}
PYTHON=${PYTHON:-python3}
RAY_VERSION=2.60.0
# what the venv must hold, one requirement a line; a change here (or in fairserve's dependencies) rebuilds it
WANT=$(printf '%s\n' "ray==$RAY_VERSION" "pytest>=8,<10" && "$PYTHON" -c \
    'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$ROOT/pyproject.toml")
install() {
    echo "$WANT" >"$VENV/requirements.txt"
    "$1" -m pip install --quiet --disable-pip-version-check -r "$VENV/requirements.txt" >&2
    "$1" -c 'import ray, numpy' >&2
}

source "$(dirname "$0")/side_venv.sh"
side_venv "$VENV" "$WANT" ray "ray_env: installing ray $RAY_VERSION into $VENV (once; ~35 s, ~530 MB)"
