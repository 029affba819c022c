#!/usr/bin/env bash
# VTC inside vLLM on a real GPU: the `overload` workload against vLLM's default FCFS scheduler and against
# fairserve's VTCScheduler, same server settings, then fairness and throughput side by side (docs/vllm.md).
#
# Needs an NVIDIA GPU, Python >= 3.11, and either internet or a local wheel cache (PIP_FIND_LINKS /
# PIP_INDEX_URL) plus the model in the Hugging Face cache. About 7 minutes with vLLM already installed
# (a warm pip cache or an existing $VENV); a first install downloads several GB more.
#
# Settings (environment):
#   MODEL          model to serve                       (Qwen/Qwen2.5-0.5B-Instruct)
#   VLLM_VERSION   vLLM to install                      (0.33.0, the version fairserve's scheduler targets)
#   VENV           virtual environment to create/reuse  (~/.cache/fairserve-gpu-venv)
#   SKIP_INSTALL   1: use $VENV as it is
#   PORT           server port                          (8765)
#   WALL_S         arrival window per run, wall seconds (90: the 360 s workload replayed 4x faster)
#   DRAIN_S        per-request limit, wall seconds      (30: a run ends at most this long after its last arrival)
#   MAX_NUM_SEQS   vLLM --max-num-seqs                  (8: small, so the GPU is the bottleneck and requests queue)
#   OUT_DIR        where logs and JSON go               (fairserve-results/gpu_check in the repo)
#   PYTHON         interpreter for the venv             (python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
VLLM_VERSION=${VLLM_VERSION:-0.33.0}
VENV=${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fairserve-gpu-venv}
PORT=${PORT:-8765}
WALL_S=${WALL_S:-90}
DRAIN_S=${DRAIN_S:-30}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-8}
OUT_DIR=${OUT_DIR:-$ROOT/fairserve-results/gpu_check}
PYTHON=${PYTHON:-python3}
STARTUP_S=${STARTUP_S:-240}
WORKLOAD_S=360     # the overload workload's length (src/fairserve/workloads/synthetic.py)

SERVER_PID=""
BENCH_PID=""

log() { printf '[gpu_check %3ds] %s\n' "$SECONDS" "$*"; }

stop_server() {
    local pid=$SERVER_PID
    SERVER_PID=""
    [[ -n "$pid" ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        # the server runs in its own session: signal the whole group (API server and engine core processes)
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    if [[ -n "$BENCH_PID" ]]; then
        kill -TERM "$BENCH_PID" 2>/dev/null || true
        wait "$BENCH_PID" 2>/dev/null || true
        BENCH_PID=""
    fi
    stop_server
}

# long steps run in the background with `wait`, so a signal is handled at once, not when the step ends
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

need_gpu() {
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no NVIDIA GPU found (nvidia-smi -L failed); this check needs one" >&2
        exit 2
    fi
    nvidia-smi -L
}

install() {
    if [[ "${SKIP_INSTALL:-0}" == 1 ]]; then
        log "using $VENV as it is"
    else
        [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
        log "installing vllm==$VLLM_VERSION and fairserve into $VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q "vllm==$VLLM_VERSION"
        "$VENV/bin/python" -m pip install -q -e "$ROOT"
    fi
    "$VENV/bin/python" -c \
        'import vllm, fairserve.engines.vllm_scheduler as m; m.VTCScheduler; print("vllm", vllm.__version__)'
}

wait_ready() {
    local name=$1 deadline=$((SECONDS + STARTUP_S))
    while ((SECONDS < deadline)); do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "gpu_check: the $name server exited during startup; the end of its log:" >&2
            tail -n 40 "$OUT_DIR/$name.server.log" >&2
            exit 1
        fi
        if "$VENV/bin/python" - "$PORT" <<'EOF' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
EOF
            return 0
        fi
        sleep 2
    done
    echo "gpu_check: the $name server was not ready after ${STARTUP_S}s; the end of its log:" >&2
    tail -n 40 "$OUT_DIR/$name.server.log" >&2
    exit 1
}

# run NAME [extra vllm serve arguments...]: start a server, bench it, stop it
run() {
    local name=$1
    shift
    log "starting vLLM ($name)"
    # setsid: the server and its engine processes form one process group that stop_server can signal
    setsid "$VENV/bin/vllm" serve "$MODEL" --port "$PORT" --max-num-seqs "$MAX_NUM_SEQS" --max-model-len 2048 \
        --gpu-memory-utilization 0.5 --enforce-eager --no-enable-prefix-caching "$@" \
        >"$OUT_DIR/$name.server.log" 2>&1 &
    SERVER_PID=$!
    wait_ready "$name"
    log "benchmarking $name: overload, ${WALL_S}s of arrivals (time scale $SCALE)"
    "$VENV/bin/fairserve" bench --target "http://127.0.0.1:$PORT" --workload overload --time-scale "$SCALE" \
        --keys '*=none' --model "$MODEL" --client-xargs --timeout "$DRAIN_S" \
        --json "$OUT_DIR/$name.json" >"$OUT_DIR/$name.bench.txt" 2>&1 &
    BENCH_PID=$!
    if ! wait "$BENCH_PID"; then
        BENCH_PID=""
        cat "$OUT_DIR/$name.bench.txt" >&2
        echo "gpu_check: fairserve bench failed against the $name server" >&2
        exit 1
    fi
    BENCH_PID=""
    cat "$OUT_DIR/$name.bench.txt"
    stop_server
}

need_gpu
mkdir -p "$OUT_DIR"
install
SCALE=$(awk -v w="$WALL_S" -v d="$WORKLOAD_S" 'BEGIN { printf "%.3f", d / w }')

run fcfs
FAIRSERVE_POLICY=vtc run vtc --scheduler-cls fairserve.engines.vllm_scheduler.VTCScheduler
if ! grep -q "waiting queue ordered by vtc" "$OUT_DIR/vtc.server.log"; then
    echo "gpu_check: WARNING: the vtc server log does not show fairserve's startup line; check" \
        "$OUT_DIR/vtc.server.log for the scheduler class" >&2
fi

log "side by side (times in workload seconds)"
"$VENV/bin/python" - "$OUT_DIR/fcfs.json" "$OUT_DIR/vtc.json" <<'EOF'
import json, sys

runs = {name: json.load(open(path))["summary"] for name, path in zip(("fcfs", "vtc"), sys.argv[1:])}


def fmt(v):
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return "-" if v is None else str(v)


rows = [("output tokens/s", lambda s: s["output_tokens_per_s"]),
        ("service/s", lambda s: s["service_per_s"]),
        ("Jain's index (1 = fair)", lambda s: s["jain_index"]),
        ("max backlogged service diff", lambda s: s["max_backlogged_diff"])]
for client in sorted(runs["fcfs"]["clients"]):
    for label, key in (("service", "service"), ("finished", "finished"), ("unfinished", "unfinished"),
                       ("response mean s", "response_mean_s"), ("response p90 s", "response_p90_s")):
        rows.append((f"{client} {label}", lambda s, c=client, k=key: s["clients"].get(c, {}).get(k)))
width = max(len(r[0]) for r in rows)
print(f"{'':{width}}  {'fcfs':>12}  {'vtc':>12}")
for label, get in rows:
    print(f"{label:{width}}  {fmt(get(runs['fcfs'])):>12}  {fmt(get(runs['vtc'])):>12}")
EOF
log "done; logs and JSON in $OUT_DIR"
