"""One Redis under the syncs of many gateway replicas: simulated replicas in a few processes, each with its own
replica id and its own connection, one sync at a time, issuing the real sync script (`SYNC_LUA` by EVALSHA, its
arguments laid out by `sync_codec.encode` as a replica lays them out) every `--interval` seconds, each sync carrying
`--changed` random tenants charged (and a backlog that changes: two of them start queueing, the two oldest stop),
against `--tenants` tenants already in Redis. The load processes are lean, so that the load measured is Redis's and
the latency measured is not the generator's own wait for a CPU: each replica's EVALSHA is joined from parts encoded
once (its id, the tenants' rows, the backends) and the parts that change per sync (what it last read, its batch
number, the charged tenants, its backlog's changes); at each replica's second sync, before the measurement, the
bytes are checked equal to `sync_codec.encode`'s. Replies are read by hiredis where it is installed
(redis-py's own C parser), by a small Python parser otherwise; every connection of a process is served by one
selector loop. `--pin auto` runs Redis on one CPU and the load processes on the others (for a machine of its own:
on one shared with other jobs a pinned Redis cannot move off a busy core). Measured over `--duration` seconds after
every replica's first sync: Redis's CPU (INFO cpu, the server's own user + system time) as a fraction of one core
and per sync, the script's own time per sync (INFO commandstats: wall time inside Redis), the syncs per second
served, the latency of one sync as the replica sees it (p50, p99), the load processes' CPU, and the machine's load
average (1 min) as the run starts and ends.
Goals (50 replicas, 2,500 syncs/s, 10,000 tenants, 10 changed per sync, 30 s): Redis CPU below 50% of one core,
p99 <= 5 ms.

Run: .venv/bin/python benchmarks/redis_load.py [--replicas 50] [--processes 2] [--tenants 10000] [--duration 30]
     [--pin off|auto|0:1]
"""

from __future__ import annotations

import argparse
import heapq
import multiprocessing as mp
import os
import random
import selectors
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import resp  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from fairserve.api.server import free_port  # noqa: E402
from fairserve.gateway.shared.codec import (
    AT,
    CHANGES,
    HEAD,
    SECTIONS,
    WHOLE,
    BatchHead,
    Charge,
    LeaseAsk,
    SyncBatch,
    encode,
    leave,
    row_args,
)
from fairserve.gateway.shared.scripts import SYNC_LUA  # noqa: E402
from fairserve.gateway.shared.state import PULL  # noqa: E402

PREFIX = "load"
BACKENDS = ("http://b0", "http://b1")
CHARGE = (20.0, 20.0, None, 0.0, 0.0)  # a `Charge` after its node: service, counter, no lift, base counter, service
BACKEND_ROWS = tuple(LeaseAsk(url, 20, 0, 1, 0, 2, 0, 1, 0, 1, 0) for url in BACKENDS)  # limit 20, 1 in use, 1 wanted


class SimReplica:
    """What a replica sends and reads back, without its ledger: its id, batch numbers, what it last read (epoch,
    change numbers), the tenants it reported backlogged."""

    def __init__(self, rid: str, tenants: list[str], changed: int, seed: int, prefix: str = PREFIX) -> None:
        self.rid, self.tenants, self.changed, self.prefix = rid, tenants, changed, prefix
        self.rng = random.Random(seed)
        self.number = 0
        self.read = ("", "0", "0")
        self.backlog: list[str] = []
        self.first = True

    def step(self) -> tuple[list[int], list[int], list[int], str]:
        """The next sync's changes, as indices into `tenants`: those charged, those now backlogged here, those no
        longer, and the backlog mode ("=" the whole list at the first sync, then "+" changes)."""
        self.number += 1
        picks = self.rng.sample(range(len(self.tenants)), self.changed)
        # NOTE: a backlog that moves: two of the charged tenants start queueing, the two oldest stop
        added = [t for t in picks[:2] if t not in self.backlog]
        gone = self.backlog[:2] if len(self.backlog) >= 8 else []
        self.backlog = [t for t in self.backlog if t not in gone] + added
        mode = WHOLE if self.first else CHANGES
        self.first = False
        return picks, added, gone, mode

    def args(self, step: tuple[list[int], list[int], list[int], str] | None = None) -> list[object]:
        """The sync script's ARGV for the next sync (or for `step`), laid out by `sync_codec.encode`."""
        picks, added, gone, mode = step or self.step()
        names = self.tenants
        epoch, since, weights_since = self.read
        head = BatchHead(self.prefix, self.rid, 3000, 500, None, epoch, since, weights_since, PULL,
                         f"{self.rid}:{self.number}", False, mode, True)  # fmt: skip
        return encode(
            SyncBatch(
                head,
                charges=[Charge(names[t], *CHARGE) for t in picks],
                backlogged=[names[t] for t in added],
                unbacklogged=[names[t] for t in gone],
                backends=BACKEND_ROWS,
            )
        )

    def answered(self, reply: list[object]) -> None:
        """What the answer says this replica has read (lean: the three parts, not the whole answer decoded)."""
        epoch, seq, wseq = (reply[AT[part]] for part in ("epoch", "since", "weights_since"))
        self.read = (_text(epoch), _text(seq), _text(wseq))


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Encoder:
    """The EVALSHA of one simulated replica's syncs in RESP, from parts encoded once: the bytes `resp.command("EVALSHA",
    sha, 0, *sim.args(step))` gives (checked before the measurement), at a fraction of the cost."""

    def __init__(self, sha: str, sim: SimReplica, names: list[bytes], charges: list[bytes]) -> None:
        self.sim, self.names, self.charges = sim, names, charges
        self.head = b"".join(resp.bulk(x) for x in ("EVALSHA", sha, 0, sim.prefix, sim.rid, 3000, 500, ""))
        self.tail = b"".join(
            resp.bulk(x) for x in ("", len(BACKEND_ROWS), *(x for b in BACKEND_ROWS for x in row_args(b)))
        )
        self.fixed = b"".join(resp.bulk(x) for x in ("0", CHANGES, "1", sim.changed))  # reset, mode, lifts, charges
        # NOTE: all but the backlog's tenants: EVALSHA, its sha, 0 keys, the head, a count or argument per section
        self.count = 3 + len(HEAD) + len(SECTIONS) + (1 + len(CHARGE)) * sim.changed + 11 * len(BACKEND_ROWS)

    def encode(self, step: tuple[list[int], list[int], list[int], str]) -> bytes:
        picks, added, gone, mode = step
        sim, names = self.sim, self.names
        fixed = self.fixed if mode == CHANGES else self.fixed.replace(b"$1\r\n+\r\n", b"$1\r\n=\r\n", 1)
        return b"".join((
            b"*%d\r\n" % (self.count + len(added) + len(gone)), self.head,
            *(resp.bulk(x) for x in (*sim.read, PULL, f"{sim.rid}:{sim.number}")), fixed,
            *(self.charges[t] for t in picks), b"$1\r\n0\r\n$1\r\n0\r\n",
            resp.bulk(len(added)), *(names[t] for t in added),
            resp.bulk(len(gone)), *(names[t] for t in gone), self.tail,
        ))  # fmt: skip


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus`."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def _process(url: str, rids: list[str], a: argparse.Namespace, sha: str, ready, go, out) -> None:
    """This process's replicas, each with a connection of its own and one sync at a time, syncing every `a.interval`
    on a schedule of its own. Lean, so that the load is Redis's: the commands are encoded by hand and the connections
    served by one selector loop."""
    if a.pin is not None:
        os.sched_setaffinity(0, a.pin[1])
    host, port = url.split("//")[1].split("/")[0].split(":")
    tenants = [f"t{i}" for i in range(a.tenants)]
    sims = [SimReplica(rid, tenants, a.changed, hash(rid)) for rid in rids]
    names = [resp.bulk(t) for t in tenants]
    charges = [b"".join(resp.bulk(x) for x in row_args(Charge(t, *CHARGE))) for t in tenants]
    encoders = [Encoder(sha, sim, names, charges) for sim in sims]
    socks = [socket.create_connection((host, int(port))) for _ in sims]
    readers = [resp.reader() for _ in sims]
    sel = selectors.DefaultSelector()
    for k, sock in enumerate(socks):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sel.register(sock, selectors.EVENT_READ, k)

    import redis

    client = redis.Redis.from_url(url)
    script = client.register_script(SYNC_LUA)
    for k, sim in enumerate(sims):  # NOTE: the first sync reads every tenant: not part of the steady state measured
        sim.answered(script(args=sim.args()))
        step = sim.step()  # NOTE: the lean encoding is checked against the plain one, then sent
        command = encoders[k].encode(step)
        if command != resp.command("EVALSHA", sha, 0, *sim.args(step)):
            raise AssertionError("redis_load.py: the lean encoding differs from sync_codec.encode's")
        socks[k].sendall(command)
        while (reply := readers[k].get()) is None:
            readers[k].feed(socks[k].recv(65536))
        sim.answered(reply)  # type: ignore[arg-type]
    ready.put(len(sims))
    go.wait()
    cpu0, start = time.process_time(), time.perf_counter()
    stop = start + a.duration
    # NOTE: spread over the interval, as independent replicas are
    due = [(start + sim.rng.random() * a.interval, k) for k, sim in enumerate(sims)]
    heapq.heapify(due)
    sent: dict[int, float] = {}  # replica -> when its sync in flight was sent
    owed: set[int] = set()  # replicas whose next sync fell due while one was in flight
    lat: list[float] = []

    def send(k: int) -> None:
        socks[k].sendall(encoders[k].encode(sims[k].step()))
        sent[k] = time.perf_counter()

    while due or sent:
        now = time.perf_counter()
        while due and due[0][0] <= now:
            at, k = heapq.heappop(due)
            if k in sent:
                owed.add(k)
            else:
                send(k)
            if at + a.interval < stop:
                heapq.heappush(due, (at + a.interval, k))
        timeout = max(0.0, due[0][0] - time.perf_counter()) if due else None
        for key, _ in sel.select(timeout):
            k = key.data
            readers[k].feed(socks[k].recv(65536))
            reply = readers[k].get()
            if reply is None:
                continue
            lat.append(time.perf_counter() - sent.pop(k))
            sims[k].answered(reply)  # type: ignore[arg-type]
            if k in owed:
                owed.discard(k)
                send(k)
    cpu = time.process_time() - cpu0
    for sim in sims:
        script(args=leave(PREFIX, sim.rid, sim.rid))
    out.put((lat, cpu))
    client.close()
    for sock in socks:
        sock.close()


def seed(url: str, tenants: int, prefix: str = PREFIX) -> None:
    """Every tenant charged once, through the script, by a replica that then leaves."""
    import redis

    client = redis.Redis.from_url(url)
    script = client.register_script(SYNC_LUA)
    names = [f"t{i}" for i in range(tenants)]
    for k in range(0, tenants, 1000):
        head = BatchHead(prefix, "seed", 1, 0, None, "", "0", "0", 0, f"seed:{k + 1}", False, CHANGES, True)
        charges = [Charge(t, 10.0, 10.0, None, 0.0, 0.0) for t in names[k : k + 1000]]
        script(args=encode(SyncBatch(head, charges=charges)))
    client.close()


def _sha(url: str) -> str:
    import redis

    client = redis.Redis.from_url(url)
    sha = client.script_load(SYNC_LUA)
    client.close()
    return sha.decode() if isinstance(sha, bytes) else str(sha)


def _cpu(url: str) -> tuple[float, int, int]:
    """Redis's CPU seconds so far, and its EVALSHA calls and their microseconds (INFO commandstats)."""
    import redis

    client = redis.Redis.from_url(url)
    info, stats = client.info("cpu"), client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    client.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), int(stats["calls"]), int(stats["usec"])


def _pinning(value: str, cpus: set[int]) -> tuple[set[int], set[int]] | None:
    """--pin: "auto" (Redis on the first CPU this may use, the load on the others, when there are two or more),
    "off", or "REDIS_CPUS:LOAD_CPUS" (comma-separated)."""
    if value == "off" or (value == "auto" and len(cpus) < 2):
        return None
    if value == "auto":
        first = min(cpus)
        return {first}, cpus - {first}
    redis_cpus, load_cpus = ({int(x) for x in side.split(",")} for side in value.split(":"))
    return redis_cpus, load_cpus


def main() -> int:
    p = argparse.ArgumentParser(prog="redis_load.py", description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=50)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--tenants", type=int, default=10_000)
    p.add_argument("--changed", type=int, default=10)
    p.add_argument("--interval", type=float, default=0.02, help="seconds between one replica's syncs")
    p.add_argument("--duration", type=float, default=30.0)
    # NOTE: off by default: on a machine shared with other jobs, a pinned Redis cannot move off a busy core
    p.add_argument("--pin", default="off", help='"off", "auto" or REDIS_CPUS:LOAD_CPUS, e.g. 0:1')
    a = p.parse_args()
    try:
        a.pin = _pinning(a.pin, os.sched_getaffinity(0))
    except ValueError:
        print("redis_load.py: --pin is auto, off or REDIS_CPUS:LOAD_CPUS (e.g. 0:1)", file=sys.stderr)
        return 2
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
            assert redis.proc is not None
            if a.pin is not None:
                _pin(redis.proc.pid, a.pin[0])
            seed(redis.url, a.tenants)
            sha = _sha(redis.url)
            ctx = mp.get_context("spawn")
            ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
            rids = [f"r{k}" for k in range(a.replicas)]
            procs = [
                ctx.Process(target=_process, args=(redis.url, rids[k :: a.processes], a, sha, ready, go, out))
                for k in range(a.processes)
            ]
            for proc in procs:
                proc.start()
            started = sum(ready.get(timeout=120) for _ in procs)
            load0 = os.getloadavg()[0]
            cpu0 = _cpu(redis.url)
            go.set()
            results = [out.get(timeout=a.duration + 120) for _ in procs]
            cpu1 = _cpu(redis.url)
            load1 = os.getloadavg()[0]
            for proc in procs:
                proc.join()
        finally:
            redis.stop()
    lat = sorted(x for r, _ in results for x in r)
    calls = cpu1[1] - cpu0[1]
    script_ms = (cpu1[2] - cpu0[2]) / max(1, calls) / 1000
    cpu_ms = (cpu1[0] - cpu0[0]) / max(1, calls) * 1000
    cpu = (cpu1[0] - cpu0[0]) / a.duration  # NOTE: the load ran for --duration of the wall time measured
    load_cpu = sum(c for _, c in results) / a.duration
    p99 = lat[int(0.99 * (len(lat) - 1))] * 1000
    pinned = "off" if a.pin is None else f"Redis on CPU {sorted(a.pin[0])}, load on {sorted(a.pin[1])}"
    print(
        "| replicas | processes | tenants | changed per sync | syncs/s | Redis CPU (of one core) "
        "| Redis CPU per sync | script time per sync | sync p50 | sync p99 | load generators' CPU "
        "| machine load average (1 min: start, end) |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {started} | {a.processes} | {a.tenants:,} | {a.changed} | {len(lat) / a.duration:,.0f} | {cpu:.0%} | "
        f"{cpu_ms:.3f} ms | {script_ms:.3f} ms | {statistics.median(lat) * 1000:.2f} ms | {p99:.2f} ms | "
        f"{load_cpu:.0%} | {load0:.1f}, {load1:.1f} |\n"
        f"(pinning: {pinned})"
    )
    ok = cpu < 0.5 and p99 <= 5.0
    print(f"\ngoals (Redis CPU < 50% of one core, p99 <= 5 ms): {'met' if ok else 'missed'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
