#!/usr/bin/env bash
# Create (once, then reuse) the virtual environment with LiteLLM's proxy that benchmarks/gateway_overhead.py runs
# side by side with fairserve's gateway (the benchmark uses it when the venv exists). Prints the venv's python.
#
#   scripts/litellm_env.sh             # ~1 minute the first time (from the package registry); instant afterwards
#
# It lives outside the checkout, so every clone on the machine shares it:
#   FAIRSERVE_LITELLM_VENV   (${XDG_CACHE_HOME:-~/.cache}/fairserve/litellm-venv)
#   PYTHON                   interpreter that creates the venv (python3, >= 3.11)
#
# Only the set-up downloads: the benchmark starts the proxy offline (the model cost map from the package, telemetry
# off, no database). fairserve itself is not installed there; the benchmark runs the proxy as a separate process.
# NOTE: pinned to one release, not a range: a LiteLLM release on the registry was once compromised, so a new one is
# taken only by changing the pin here (which rebuilds the venv) after looking at it. 1.108.7 is the last whose
# `proxy` extra installs from the registry this project uses (from 1.108.8 on it needs a `litellm-proxy`
# distribution that the registry does not have).
set -euo pipefail

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/fairserve
VENV=${FAIRSERVE_LITELLM_VENV:-$CACHE/litellm-venv}
PYTHON=${PYTHON:-python3}
LITELLM_VERSION=1.108.7
# what the venv must hold; a change here rebuilds it
WANT="litellm[proxy]==$LITELLM_VERSION"

install() {
    "$1" -m pip install --quiet --disable-pip-version-check "$WANT" >&2
    LITELLM_LOCAL_MODEL_COST_MAP=True "$1" -c 'import litellm.proxy.proxy_server' >&2
}

source "$(dirname "$0")/side_venv.sh"
side_venv "$VENV" "$WANT" litellm "litellm_env: installing $WANT into $VENV (once; ~1 minute)"
