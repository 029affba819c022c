#!/usr/bin/env bash
# The Ray tier: `fairserve sweep --ray` against a real Ray head of its own (tests_ray/), in the venv of
# scripts/ray_env.sh (created once, ~35 s, cached outside the checkout). Under CI=true a Ray that cannot be installed
# or started fails the tier; elsewhere that is a skip with the reason. FAIRSERVE_RAY_TIER=0 leaves the tier out (not
# in CI). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${FAIRSERVE_RAY_TIER:-1}" = 0 ] && [ "${CI:-}" != true ]; then
    echo "ray_tests: Ray tier SKIPPED (FAIRSERVE_RAY_TIER=0)"
    exit 0
fi
if ! py=$(scripts/ray_env.sh); then
    if [ "${CI:-}" = true ]; then
        echo "ray_tests: Ray tier FAILED: could not set up Ray (scripts/ray_env.sh)" >&2
        exit 1
    fi
    echo "ray_tests: Ray tier SKIPPED: could not set up Ray (scripts/ray_env.sh, above)"
    exit 0
fi
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m pytest -p no:cacheprovider tests_ray "$@"
