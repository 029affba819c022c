"""Shared state (Redis) across gateway replicas, in three parts (`--parts`, default all), each measured side by side
in one run against a local redis-server this script starts (loopback only, stopped at the end):

- overhead: the same instant emulator behind `fairserve gateway` without `--state` and with `--state redis://...`:
  latency of a whole short stream (p50/p99, ms) one request at a time, the most streamed requests per second with
  many at a time, and Redis round trips per request. Targets: <= 0.5 ms p50 added, >= 0.9x throughput.
- fleet: three replicas sharing Redis against one gateway on the same two emulated backends (max_requests=20 each)
  and the same traffic (`overload`, each client pinned to one replica), rounds interleaved (benchmarks/fleet.py).
  Goals: >= 0.95x the throughput; backends at their limit in >= 95% of 100 ms samples taken while anything is
  queued; the below-share client's mean time to first token within 1.5x of one gateway's.
- sync: the time of one sync as the number of tenants grows (--tenants), with nothing or 10 tenants changed.
Run: .venv/bin/python benchmarks/replicas.py [--parts overhead,fleet,sync] [--rounds 5] [--fleet-rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import fleet  # noqa: E402
from gateway_overhead import measure, table  # noqa: E402  (the same load as the gateway overhead benchmark)
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
        backends = [Backend(BackendConfig(url="http://b", max_inflight_requests=32))]
        state = SharedState(
            StateSettings(url, interval_s=600, prefix=f"bench{tenants}-{changed}"),
            backends,
            tokens_of=lambda r: r.prompt_tokens,
        )
        Ledger(make_policy("vtc"), names, peers=state)
        return state

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


def parse_args() -> argparse.Namespace | None:
    p = argparse.ArgumentParser(prog="replicas.py", description=__doc__.splitlines()[0])
    p.add_argument("--parts", type=lambda v: v.split(","), default=list(PARTS), help="overhead,fleet,sync")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fleet-rounds", type=int, default=3)
    p.add_argument("--fleet-duration", type=float, default=150.0, help="workload seconds per replay")
    p.add_argument("--time-scale", type=float, default=10.0, help="of the emulators and the replay")
    p.add_argument("--tenants", type=lambda v: [int(x) for x in v.split(",")], default=[10, 100, 1000, 10000])
    a = p.parse_args()
    if min(a.requests, a.concurrency, a.rounds, a.fleet_rounds) < 1 or set(a.parts) - set(PARTS):
        print(f"replicas.py: --parts from {','.join(PARTS)}; counts must be >= 1", file=sys.stderr)
        return None
    return a


PARTS = ("overhead", "fleet", "sync")


def overhead(redis_url: str, a: argparse.Namespace) -> None:
    rows: dict[str, list] = {"gateway": [], "gateway --state": []}
    trips: list[float] = []
    common = ["--tenant=a:key-a", "--no-access-log"]
    with serve("emulate", "--time-scale", "1000000") as emulator:
        backend = f"--backend={emulator},max_requests=256"
        with (
            serve("gateway", backend, *common) as plain,
            serve("gateway", backend, *common, "--state", redis_url) as shared,
        ):
            for _ in range(a.rounds):  # interleaved, so both see the same machine
                rows["gateway"].append(asyncio.run(measure(plain, a.requests, a.concurrency)))
                before = round_trips(shared)
                rows["gateway --state"].append(asyncio.run(measure(shared, a.requests, a.concurrency)))
                # NOTE: measure() sends 20 warm-up + requests/4 one at a time + requests at once
                trips.append((round_trips(shared) - before) / (20 + a.requests // 4 + a.requests))
    stats = table("gateway", rows)
    g, s = stats["gateway"], stats["gateway --state"]
    print(
        f"added by --state: p50 {s[0] - g[0]:.2f} ms, p99 {s[1] - g[1]:.2f} ms; throughput {s[2] / g[2]:.2f}x; "
        f"Redis round trips per request {statistics.median(trips):.3f} (median of {a.rounds} rounds; includes "
        f"the sync every 20 ms)\n"
    )


def sync_table(redis_url: str, a: argparse.Namespace) -> None:
    costs = {(n, c): asyncio.run(sync_ms(redis_url, n, c)) for n in a.tenants for c in (0, 10)}
    print("| tenants | one sync, nothing changed (ms) | one sync, 10 tenants changed (ms) |")
    print("|---:|---:|---:|")
    for n in a.tenants:
        print(f"| {n:,} | {costs[n, 0]:.2f} | {costs[n, 10]:.2f} |")
    print()


def main() -> int:
    a = parse_args()
    if a is None:
        return 2
    binary = shutil.which("redis-server")
    if binary is None:
        print("replicas.py: redis-server is not installed (scripts/setup-redis.sh installs it)", file=sys.stderr)
        return 1
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(binary, free_port(), tmp)
        redis.start()
        try:
            if "overhead" in a.parts:
                overhead(redis.url, a)
            if "fleet" in a.parts:
                status |= fleet(serve, redis.url, a.fleet_rounds, "overload", a.fleet_duration, a.time_scale, 20)
                print()
            if "sync" in a.parts:
                sync_table(redis.url, a)
        finally:
            redis.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
