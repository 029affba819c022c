"""Overhead of shared state (Redis) on one gateway replica, measured side by side in one run: the same emulator
behind `fairserve gateway` without `--state` and with `--state redis://...` (a local redis-server this script starts).

Reports, per gateway: latency of a whole short stream (p50/p99, ms) with one request at a time, the most streamed
requests per second with many at a time, and (with --state) Redis round trips per request during the load; then the
time of one sync as the number of tenants grows (--tenants), with nothing or 10 tenants changed since the last one.
Targets (issue 10): <= 0.5 ms p50 added, >= 0.9x throughput.
Run: .venv/bin/python benchmarks/replicas.py [--requests 400] [--concurrency 32] [--rounds 5] [--tenants 10,1000]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import load_args, measure, table  # noqa: E402  (the same load as the gateway overhead benchmark)
from support.processes import serve  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from fairserve.api.server import free_port  # noqa: E402
from fairserve.core import Ledger, make_policy  # noqa: E402
from fairserve.gateway.config import BackendConfig  # noqa: E402
from fairserve.gateway.scheduler import Backend  # noqa: E402
from fairserve.gateway.shared_state import SharedState, StateSettings  # noqa: E402


async def sync_ms(url: str, tenants: int, changed: int, rounds: int = 20) -> float:
    """Median wall time of one replica's sync() (its Lua round trip and the Python on both sides) with `tenants`
    tenants in Redis and `changed` of them charged since the last sync, another replica charging them."""
    names = [f"t{i}" for i in range(tenants)]

    def replica() -> SharedState:
        ledger = Ledger(make_policy("vtc"), names)
        backends = [Backend(BackendConfig(url="http://b", max_inflight_requests=32))]
        return SharedState(
            StateSettings(url, interval_s=600, prefix=f"bench{tenants}-{changed}"),
            ledger,
            backends,
            tokens_of=lambda r: r.prompt_tokens,
        )

    reader, writer = replica(), replica()
    await reader.start()
    await writer.start()
    times = []
    for k in range(rounds):
        for j in range(changed):
            tenant = names[(k * changed + j) % tenants]
            req = writer.ledger.arrive((k, j), tenant, 10, 10)
            writer.ledger.pop()
            writer.ledger.settle(req)
        await writer.sync()
        t = time.perf_counter()
        await reader.sync()
        times.append(time.perf_counter() - t)
    await reader.stop()
    await writer.stop()
    return statistics.median(times) * 1000


def round_trips(base: str) -> int:
    return httpx.get(base + "/healthz").json()["shared_state"]["round_trips"]


def main() -> int:
    a = load_args("replicas.py", __doc__, tenants=True)
    if a is None:
        return 2
    import shutil
    import tempfile

    binary = shutil.which("redis-server")
    if binary is None:
        print("replicas.py: redis-server is not installed (scripts/setup-redis.sh installs it)", file=sys.stderr)
        return 1
    rows: dict[str, list] = {"gateway": [], "gateway --state": []}
    trips: list[float] = []
    common = ["--tenant=a:key-a", "--no-access-log"]
    with tempfile.TemporaryDirectory() as tmp, serve("emulate", "--time-scale", "1000000") as emulator:
        redis = RedisServer(binary, free_port(), tmp)
        redis.start()
        try:
            backend = f"--backend={emulator},max_requests=256"
            with (
                serve("gateway", backend, *common) as plain,
                serve("gateway", backend, *common, "--state", redis.url) as shared,
            ):
                for _ in range(a.rounds):  # interleaved, so both see the same machine
                    rows["gateway"].append(asyncio.run(measure(plain, a.requests, a.concurrency)))
                    before = round_trips(shared)
                    rows["gateway --state"].append(asyncio.run(measure(shared, a.requests, a.concurrency)))
                    # NOTE: measure() sends 20 warm-up + requests/4 one at a time + requests at once
                    trips.append((round_trips(shared) - before) / (20 + a.requests // 4 + a.requests))
            costs = {(n, c): asyncio.run(sync_ms(redis.url, n, c)) for n in a.tenants for c in (0, 10)}
        finally:
            redis.stop()
    stats = table("gateway", rows)
    g, s = stats["gateway"], stats["gateway --state"]
    print(
        f"added by --state: p50 {s[0] - g[0]:.2f} ms, p99 {s[1] - g[1]:.2f} ms; throughput {s[2] / g[2]:.2f}x; "
        f"Redis round trips per request {statistics.median(trips):.3f} (median of {a.rounds} rounds; includes "
        f"the sync every 20 ms)"
    )
    print()
    print("| tenants | one sync, nothing changed (ms) | one sync, 10 tenants changed (ms) |")
    print("|---:|---:|---:|")
    for n in a.tenants:
        print(f"| {n:,} | {costs[n, 0]:.2f} | {costs[n, 10]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
