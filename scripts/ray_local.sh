#!/usr/bin/env bash
# Run COMMAND beside a Ray head started for it alone: on loopback, inside a private network namespace (only `lo`,
# so Ray's start-up probes of cloud metadata addresses fail without a packet leaving the machine) and a private
# process namespace (`ray stop` sees only this head; whatever is left is killed when COMMAND ends).
#
#   scripts/ray_local.sh [--cpus N] [--temp-dir DIR] -- COMMAND [ARGS...]
#
# COMMAND runs with RAY_ADDRESS=127.0.0.1:6379. The `ray` CLI is taken from $RAY, else from PATH. Needs root (or
# unprivileged user namespaces) and util-linux's unshare and iproute2's ip. Exit status: COMMAND's, or 97 when the
# namespaces or the head could not be set up. Timings of the start and the stop go to stderr.
set -euo pipefail

cpus=2
tmp=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cpus) cpus=$2; shift 2 ;;
        --temp-dir) tmp=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "usage: $0 [--cpus N] [--temp-dir DIR] -- COMMAND [ARGS...]" >&2; exit 2 ;;
    esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [--cpus N] [--temp-dir DIR] -- COMMAND [ARGS...]" >&2; exit 2; }

if [[ "${_FAIRSERVE_RAY_NS:-}" != 1 ]]; then
    for tool in unshare ip; do
        command -v "$tool" >/dev/null || { echo "ray_local: $tool is not installed" >&2; exit 97; }
    done
    if ! err=$(unshare --net --pid --fork --mount-proc -- true 2>&1); then
        echo "ray_local: cannot create private network and process namespaces (unshare: $err)" >&2
        exit 97
    fi
    exec unshare --net --pid --fork --mount-proc -- env _FAIRSERVE_RAY_NS=1 "$0" --cpus "$cpus" \
        ${tmp:+--temp-dir "$tmp"} -- "$@"
fi

ray=${RAY:-$(command -v ray || true)}
[[ -n "$ray" ]] || { echo "ray_local: the ray CLI was not found (\$RAY, PATH)" >&2; exit 97; }
ip link set lo up
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_AUTH_MODE=disabled
# NOTE: Ray's unix sockets live under the temp dir and their paths must stay under 108 bytes: a short folder
if [[ -z "$tmp" ]]; then
    tmp=$(mktemp -d /tmp/fsray.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
fi
t0=$(date +%s.%N)
if ! "$ray" start --head --node-ip-address=127.0.0.1 --port=6379 --include-dashboard=false --disable-usage-stats \
        --include-log-monitor=false --num-cpus="$cpus" --object-store-memory=100000000 --temp-dir="$tmp" \
        >"$tmp/ray-start.log" 2>&1; then
    echo "ray_local: ray start failed:" >&2
    tail -n 20 "$tmp/ray-start.log" >&2
    exit 97
fi
t1=$(date +%s.%N)
echo "ray_local: Ray head on 127.0.0.1:6379 started in $(awk "BEGIN {printf \"%.1f\", $t1 - $t0}") s" >&2
rc=0
RAY_ADDRESS=127.0.0.1:6379 "$@" || rc=$?
t2=$(date +%s.%N)
"$ray" stop >"$tmp/ray-stop.log" 2>&1 || true
t3=$(date +%s.%N)
echo "ray_local: Ray head stopped in $(awk "BEGIN {printf \"%.1f\", $t3 - $t2}") s" >&2
exit "$rc"
