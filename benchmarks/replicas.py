"""Shared state (Redis) across gateway replicas, in three parts (`--parts`, default all), each measured side by side
in one run against a local redis-server this script starts (loopback only, stopped at the end):

- overhead: the same instant emulator behind `fairserve gateway` without `--state` and with `--state redis://...`:
  latency of a whole short stream (p50/p99, ms) one request at a time, the most streamed requests per second with
  many at a time, and Redis round trips per request. Targets: <= 0.5 ms p50 added, >= 0.9x throughput.
- fleet: three replicas sharing Redis against one gateway on the same two emulated backends (max_requests=20 each)
  and the same traffic (`overload`, each client pinned to one replica), rounds interleaved (benchmarks/fleet.py).
  Goals: >= 0.95x the throughput; backends at their limit in >= 95% of 100 ms samples taken while anything is
  queued; the below-share client's mean time to first token within 1.5x of one gateway's.
- sync: the time of one sync as the number of tenants grows (--tenants), with nothing changed, 10 tenants charged on
  this replica, and 10 more charged elsewhere; the replica's CPU and Redis's time in the script (INFO commandstats).
  Goals at 10,000 tenants with 10 changed: <= 0.5 ms on the replica, <= 0.2 ms in Redis; flat in the tenants.
  (The load of many replicas on one Redis: benchmarks/redis_load.py.)
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
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import fleet  # noqa: E402
from gateway_overhead import measure, table  # noqa: E402  (the same load as the gateway overhead benchmark)
from redis_load import SimReplica, seed  # noqa: E402
from support.processes import serve  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from fairserve.api.server import free_port  # noqa: E402
from fairserve.core import Ledger, make_policy  # noqa: E402
from fairserve.gateway.dispatch.pools import Backend  # noqa: E402
from fairserve.gateway.settings.backends import BackendConfig  # noqa: E402
from fairserve.gateway.shared.scripts import SYNC_LUA  # noqa: E402
from fairserve.gateway.shared.state import SharedState, StateSettings  # noqa: E402


@dataclass
class SyncCost:
    wall_ms: float  # median time of one sync() as the replica sees it: its Python, the round trip, the script
    cpu_ms: float  # median CPU time of this process during one sync(): the replica's own part
    redis_ms: float  # median time Redis spent in the script (INFO commandstats before and after each sync)


def bench_replica(url: str, prefix: str, names: list[str]) -> SharedState:
    """A replica without HTTP: a ledger of `names` and one backend, syncing only when told to."""
    backends = [Backend(BackendConfig(url="http://b", max_inflight_requests=32))]
    state = SharedState(StateSettings(url, interval_s=600, prefix=prefix), backends, tokens_of=lambda r: 1)
    Ledger(make_policy("vtc"), names, peers=state)
    return state


def charge(state: SharedState, tenants: list[str], key: object) -> None:
    """One request of each of `tenants`, admitted and finished: 10 prompt tokens, 10 output tokens."""
    for tenant in tenants:
        req = state.ledger.arrive((key, tenant), tenant, 10, 10)
        assert req is not None
        state.ledger.pop()
        state.ledger.output(req, 10)
        state.ledger.settle(req)


async def evalsha_usec(client) -> tuple[int, float]:
    stats = await client.info("commandstats")
    row = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(row["calls"]), float(row["usec"])


CASES = ((0, 0), (10, 0), (10, 10))  # tenants charged (here, elsewhere) since the last sync


class Pair:
    """Two replicas of `tenants` tenants on a key prefix of their own: `reader`, whose syncs are measured, and
    `writer`, which charges other tenants before each (so the reader's answer carries them)."""

    def __init__(self, url: str, tenants: int) -> None:
        self.names = [f"t{i}" for i in range(tenants)]
        self.reader, self.writer = (bench_replica(url, f"bench{tenants}", self.names) for _ in range(2))
        self.costs: dict[tuple[int, int], list[tuple[float, float, float]]] = {c: [] for c in CASES}
        self.k = 0

    async def start(self) -> None:
        await self.writer.start()
        charge(self.writer, self.names, "seed")  # NOTE: every tenant known to Redis, as in a gateway that has run
        await self.writer.sync()
        await self.reader.start()  # NOTE: its first sync reads every tenant: then it is up to date
        await self.writer.sync()

    async def measure(self, here: int, elsewhere: int) -> None:
        """One sync of the reader, `here` tenants charged on it since its last sync and `elsewhere` on the writer."""
        n = len(self.names)
        picks = [self.names[(self.k + j) % n] for j in range(here + elsewhere)]
        self.k += here + elsewhere
        charge(self.writer, picks[here:], self.k)
        await self.writer.sync()
        charge(self.reader, picks[:here], self.k)
        calls0, usec0 = await evalsha_usec(self.reader._client)
        c, t = time.process_time(), time.perf_counter()
        await self.reader.sync()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        calls1, usec1 = await evalsha_usec(self.reader._client)
        if calls1 == calls0 + 1:  # NOTE: the INFO calls themselves are not scripts
            self.costs[here, elsewhere].append((wall, cpu, usec1 - usec0))

    def cost(self, case: tuple[int, int]) -> SyncCost:
        walls, cpus, usecs = zip(*self.costs[case], strict=True)
        return SyncCost(
            statistics.median(walls) * 1000, statistics.median(cpus) * 1000, statistics.median(usecs) / 1000
        )

    async def stop(self) -> None:
        await self.reader.stop()
        await self.writer.stop()


async def sync_costs(url: str, tenants: list[int], rounds: int = 40) -> dict[int, Pair]:
    """`rounds` syncs per tenant count and case, interleaved (round by round over all of them), so that every count
    sees the same machine and the same Redis."""
    pairs = {n: Pair(url, n) for n in tenants}
    for pair in pairs.values():
        await pair.start()
    for k in range(rounds + 2):  # NOTE: the first two rounds warm up after the first syncs' large answers
        for n in tenants[k % len(tenants) :] + tenants[: k % len(tenants)]:
            for case in CASES:
                await pairs[n].measure(*case)
        if k == 1:
            for pair in pairs.values():
                pair.costs = {c: [] for c in CASES}
    for pair in pairs.values():
        await pair.stop()
    return pairs


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
    p.add_argument("--tenants", type=lambda v: [int(x) for x in v.split(",")], default=[10, 100, 1000, 10000, 100000])
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
    pairs = asyncio.run(sync_costs(redis_url, a.tenants))
    print(
        "| tenants | nothing changed: sync | 10 changed: sync | of it on the replica (CPU) | of it in Redis "
        "| 10 changed here and 10 elsewhere: sync | of it in Redis |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.tenants:
        idle, ten, both = (pairs[n].cost(c) for c in CASES)
        print(
            f"| {n:,} | {idle.wall_ms:.2f} ms | {ten.wall_ms:.2f} ms | {ten.cpu_ms:.2f} ms | {ten.redis_ms:.3f} ms "
            f"| {both.wall_ms:.2f} ms | {both.redis_ms:.3f} ms |"
        )
    print(
        "(medians of 40 syncs per row, the rows interleaved; goals at 10,000 tenants, 10 changed: <= 0.5 ms on the "
        "replica, <= 0.2 ms in Redis)\n"
    )


def keyspace_table(binary: str, tmp: str, rounds: int = 400) -> None:
    """Why Redis's part may grow with the tenants though no step of the script walks them: the same sync (the load
    benchmark's simulated replica, 10 random tenants charged), interleaved, against a Redis holding 10,000 tenants
    alone; one holding 10,000 beside 100,000 under another prefix; those 100,000; and those 100,000 with the charges
    drawn from 1,000 of them (the same structures, a small working set). Equal times for the last three but the
    third: the growth is the cache misses of a large working set, not work."""
    servers = [RedisServer(binary, free_port(), f"{tmp}/{k}") for k in range(2)]
    for k, server in enumerate(servers):
        Path(f"{tmp}/{k}").mkdir()
        server.start()
    try:
        (small, large), cases = servers, {}
        seed(small.url, 10_000, "a")
        seed(large.url, 10_000, "b")
        seed(large.url, 100_000, "c")
        for name, server, prefix, tenants, hot in (
            ("10,000 tenants, alone in its Redis", small, "a", 10_000, None),
            ("10,000 tenants, beside 100,000 others", large, "b", 10_000, None),
            ("100,000 tenants", large, "c", 100_000, None),
            ("100,000 tenants, the charges drawn from 1,000", large, "c", 100_000, 1000),
        ):
            cases[name] = Probe(server.url, prefix, tenants, hot)
        for _ in range(rounds):
            for probe in cases.values():
                probe.sync()
        print("| the same sync against | Redis's time per sync (median) |\n|---|---:|")
        for name, probe in cases.items():
            print(f"| {name} | {statistics.median(probe.usec) / 1000:.3f} ms |")
        print(f"(medians of {rounds} syncs each, interleaved; INFO commandstats)\n")
        for probe in cases.values():
            probe.client.close()
    finally:
        for server in servers:
            server.stop()


class Probe:
    """One simulated replica's syncs (benchmarks/redis_load.py), each timed inside Redis (INFO commandstats)."""

    def __init__(self, url: str, prefix: str, tenants: int, hot: int | None) -> None:
        import redis

        names = [f"t{i}" for i in range(tenants)]
        self.client = redis.Redis.from_url(url)
        self.script = self.client.register_script(SYNC_LUA)
        self.sim = SimReplica(f"probe-{prefix}-{hot}", names[:hot] if hot else names, 10, tenants, prefix)
        self.sim.answered(self.script(args=self.sim.args()))
        self.usec: list[float] = []

    def sync(self) -> None:
        args = self.sim.args()
        before = self.client.info("commandstats")["cmdstat_evalsha"]["usec"]
        self.sim.answered(self.script(args=args))
        self.usec.append(self.client.info("commandstats")["cmdstat_evalsha"]["usec"] - before)


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
                keyspace_table(binary, tmp)
        finally:
            redis.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
