#!/usr/bin/env bash
# The browser of the dashboard's tests (tests/test_dashboard_browser.py): Debian's chromium, launched by path by
# Playwright (Playwright's own browser download is not used). Installs it with apt when it is missing and this runs as
# root; otherwise says in one line what to install. Exit status 0 when chromium is there afterwards.
set -euo pipefail

CHROMIUM="${FAIRSERVE_CHROMIUM:-/usr/bin/chromium}"

if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-chromium: installing Debian's chromium with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    [ -x "$CHROMIUM" ] && exit 0
    echo "setup-chromium: apt-get installed chromium but $CHROMIUM is not there; set FAIRSERVE_CHROMIUM" >&2
    exit 1
fi
echo "setup-chromium: no Chromium at $CHROMIUM: install it (Debian/Ubuntu: sudo apt-get install chromium) or set FAIRSERVE_CHROMIUM to its path" >&2
exit 1
