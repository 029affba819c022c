#!/usr/bin/env bash
# Make sure `redis-server` (Redis 7, Debian's package) is installed: the shared-state tests start their own instance.
# As root it installs the package when missing; as another user it says what to install and fails.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "setup-redis: redis-server is missing: install Debian's redis-server package (sudo apt-get install -y redis-server)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq redis-server >/dev/null
command -v redis-server >/dev/null
