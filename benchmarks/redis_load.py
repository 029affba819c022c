"""One Redis under the syncs of many gateway replicas: simulated replicas in a few processes, each with its own
replica id, issuing the real sync script (`SYNC_LUA`, its arguments laid out by `sync_args` as a replica lays them
out) every `--interval` seconds, each sync carrying `--changed` tenants charged (and a backlog that changes), against
`--tenants` tenants already in Redis. Measured over `--duration` seconds after every replica's first sync: Redis's
CPU (INFO cpu, the server's own user + system time) as a fraction of one core, the syncs per second served, and the
latency of one sync as the replica sees it (p50, p99). Goals (50 replicas, 2,500 syncs/s, 10,000 tenants, 10 changed
per sync, 30 s): Redis CPU below 50% of one core, p99 <= 5 ms.

Run: .venv/bin/python benchmarks/redis_load.py [--replicas 50] [--processes 5] [--tenants 10000] [--duration 30]
"""

from __future__ import annotations

import argparse
import heapq
import multiprocessing as mp
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.redis_server import RedisServer  # noqa: E402

from fairserve.api.server import free_port  # noqa: E402
from fairserve.gateway.redis_scripts import ANSWER, SYNC_LUA, leave_args, sync_args  # noqa: E402
from fairserve.gateway.shared_state import PULL  # noqa: E402

PREFIX = "load"
BACKENDS = ("http://b0", "http://b1")
EPOCH = ANSWER.index("epoch")  # then since, weights since


class SimReplica:
    """What a replica sends and reads back, without its ledger: its id, batch numbers, what it last read (epoch,
    change numbers), the tenants it reported backlogged."""

    def __init__(self, rid: str, tenants: list[str], changed: int, seed: int) -> None:
        self.rid, self.tenants, self.changed = rid, tenants, changed
        self.rng = random.Random(seed)
        self.number = 0
        self.read = ("", "0", "0")
        self.backlog: list[str] = []
        self.first = True

    def args(self) -> list[object]:
        self.number += 1
        picks = self.rng.sample(self.tenants, self.changed)
        charges = [x for t in picks for x in (t, "20.0", "20.0", "", "0", "0")]
        # NOTE: a backlog that moves: two of the charged tenants start queueing, the two oldest stop
        added = [t for t in picks[:2] if t not in self.backlog]
        gone = self.backlog[:2] if len(self.backlog) >= 8 else []
        self.backlog = [t for t in self.backlog if t not in gone] + added
        mode = "=" if self.first else "+"
        self.first = False
        backends = [[url, 20, 0, 1, 0, 2, 0, 1, 0, 1, 0] for url in BACKENDS]
        return sync_args(
            PREFIX, self.rid, 3000, 500, "", (*self.read, PULL), f"{self.rid}:{self.number}", False, charges, [], [],
            (mode, added, gone), "", backends,
        )  # fmt: skip

    def answered(self, reply: list[object]) -> None:
        epoch, seq, wseq = (v.decode() if isinstance(v, bytes) else str(v) for v in reply[EPOCH : EPOCH + 3])
        self.read = (epoch, seq, wseq)


def _process(url: str, rids: list[str], a: argparse.Namespace, ready, go, out) -> None:
    """This process's replicas, each syncing every `a.interval` on a schedule of its own (a blocking client: the
    least CPU per sync on this side, so that the load is Redis's)."""
    import redis

    tenants = [f"t{i}" for i in range(a.tenants)]
    client = redis.Redis.from_url(url)
    script = client.register_script(SYNC_LUA)
    sims = [SimReplica(rid, tenants, a.changed, hash(rid)) for rid in rids]
    for sim in sims:  # NOTE: the first sync reads every tenant: not part of the steady state measured
        sim.answered(script(args=sim.args()))
    ready.put(len(sims))
    go.wait()
    start = time.perf_counter()
    stop = start + a.duration
    # NOTE: spread over the interval, as independent replicas are
    due = [(start + sim.rng.random() * a.interval, k) for k, sim in enumerate(sims)]
    heapq.heapify(due)
    lat: list[float] = []
    while True:
        at, k = heapq.heappop(due)
        if at >= stop:
            break
        wait = at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        sim = sims[k]
        args = sim.args()
        t = time.perf_counter()
        sim.answered(script(args=args))
        lat.append(time.perf_counter() - t)
        heapq.heappush(due, (at + a.interval, k))
    for sim in sims:
        script(args=leave_args(PREFIX, sim.rid, sim.rid))
    out.put(lat)
    client.close()


def _seed(url: str, tenants: int) -> None:
    """Every tenant charged once, through the script, by a replica that then leaves."""
    import redis

    client = redis.Redis.from_url(url)
    script = client.register_script(SYNC_LUA)
    names = [f"t{i}" for i in range(tenants)]
    for k in range(0, tenants, 1000):
        charges = [x for t in names[k : k + 1000] for x in (t, "10.0", "10.0", "", "0", "0")]
        args = sync_args(PREFIX, "seed", 1, 0, "", ("", "0", "0", 0), f"seed:{k + 1}", False, charges, [], [],
                         ("+", [], []), "", [])  # fmt: skip
        script(args=args)
    client.close()


def _cpu(url: str) -> float:
    import redis

    client = redis.Redis.from_url(url)
    info = client.info("cpu")
    client.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> int:
    p = argparse.ArgumentParser(prog="redis_load.py", description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=50)
    p.add_argument("--processes", type=int, default=5)
    p.add_argument("--tenants", type=int, default=10_000)
    p.add_argument("--changed", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.02, help="seconds between one replica's syncs")
    p.add_argument("--duration", type=float, default=30.0)
    a = p.parse_args()
    if min(a.replicas, a.processes, a.tenants, a.changed) < 1 or a.changed > a.tenants or a.interval <= 0:
        print("redis_load.py: counts must be >= 1 (--changed at most --tenants), --interval > 0", file=sys.stderr)
        return 2
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis_load.py: redis-server is not installed (scripts/setup-redis.sh installs it)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(binary, free_port(), tmp)
        redis.start()
        try:
            _seed(redis.url, a.tenants)
            ctx = mp.get_context("spawn")
            ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
            rids = [f"r{k}" for k in range(a.replicas)]
            procs = [
                ctx.Process(target=_process, args=(redis.url, rids[k :: a.processes], a, ready, go, out))
                for k in range(a.processes)
            ]
            for proc in procs:
                proc.start()
            started = sum(ready.get(timeout=120) for _ in procs)
            cpu0 = _cpu(redis.url)
            go.set()
            lat = [x for _ in procs for x in out.get(timeout=a.duration + 120)]
            cpu1 = _cpu(redis.url)
            for proc in procs:
                proc.join()
        finally:
            redis.stop()
    lat.sort()
    cpu = (cpu1 - cpu0) / a.duration  # NOTE: the load ran for --duration of the wall time measured
    p99 = lat[int(0.99 * (len(lat) - 1))] * 1000
    print(
        "| replicas | processes | tenants | changed per sync | syncs/s | Redis CPU (of one core) | sync p50 "
        "| sync p99 |\n"
        f"|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {started} | {a.processes} | {a.tenants:,} | {a.changed} | {len(lat) / a.duration:,.0f} | {cpu:.0%} | "
        f"{statistics.median(lat) * 1000:.2f} ms | {p99:.2f} ms |"
    )
    ok = cpu < 0.5 and p99 <= 5.0
    print(f"\ngoals (Redis CPU < 50% of one core, p99 <= 5 ms): {'met' if ok else 'missed'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
