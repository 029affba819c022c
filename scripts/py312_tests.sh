#!/usr/bin/env bash
# Runs the tests that must hold on every supported Python under Python 3.12 as well (the main suite runs on the
# default python3): tests/test_gateway_disconnect.py, whose gateway must not depend on how a Python version delivers
# cancellations. Arguments replace the default test list. The venv is created once and cached outside the checkout
# (~/.cache/fairserve/py312-venv), refreshed when pyproject.toml changes; the checkout's sources come first on the
# path. Without python3.12: a failure under CI=true, a skip elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FAIRSERVE_CACHE:-$HOME/.cache/fairserve}"
VENV="$CACHE/py312-venv"

find_python() {
    local v
    if command -v python3.12 >/dev/null && python3.12 -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
        command -v python3.12
        return
    fi
    # pyenv's shim answers only for the selected versions: ask pyenv for any 3.12 it has
    if command -v pyenv >/dev/null; then
        v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -1 || true)
        if [ -n "$v" ] && [ -x "$(pyenv root)/versions/$v/bin/python3.12" ]; then
            echo "$(pyenv root)/versions/$v/bin/python3.12"
            return
        fi
    fi
    return 1
}

if ! py=$(find_python); then
    if [ "${CI:-}" = true ]; then
        echo "py312_tests.sh: FAILED: no python3.12 (CI=true needs it: pyenv install 3.12)" >&2
        exit 1
    fi
    echo "py312_tests.sh: SKIPPED: no python3.12 on this machine"
    exit 0
fi

stamp="$VENV/.fairserve-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    mkdir -p "$CACHE"
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    # NOTE: the project's dependencies and pytest only (no torch, no vLLM): the checkout itself comes by PYTHONPATH
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check . 'pytest>=8,<10'
    echo "$want" >"$stamp"
fi
[ $# -gt 0 ] || set -- tests/test_gateway_disconnect.py
echo "py312_tests.sh: $("$VENV/bin/python" -V) on $*"
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
