#!/usr/bin/env bash
# fairserve's two set-up commands. Each creates (or reuses) ./.venv and installs what it needs.
#   ./dev.sh demo   run the main job: `fairserve reproduce`, the paper's evaluation on the simulated engine
#   ./dev.sh test   run the whole test suite
#   ./dev.sh serve  run `fairserve serve` (an OpenAI server on transformers, scheduled by VTC); arguments pass through
set -euo pipefail
cd "$(dirname "$0")"
VENV="${FAIRSERVE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

setup() {
    local stamp="$VENV/.fairserve-installed"
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        # NOTE: torch first, pinned: 2.13.0 is the CPU build this project develops on (on its dev machines pip takes
        # it from local disk); the range in pyproject.toml would otherwise pull the newest, a multi-GB CUDA build
        "$VENV/bin/python" -c 'import torch' 2>/dev/null ||
            "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.13.0
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]'
        touch "$stamp"
    fi
}

case "${1:-}" in
    demo) setup; shift; exec "$VENV/bin/fairserve" reproduce "$@" ;;
    test) setup; shift; exec "$VENV/bin/python" -m pytest "$@" ;;
    serve) setup; shift; exec "$VENV/bin/fairserve" serve "$@" ;;
    *) echo "usage: ./dev.sh demo|test|serve [extra arguments]" >&2; exit 2 ;;
esac
