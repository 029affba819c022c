"""Three gateway replicas sharing Redis against one gateway, on the same two emulated backends and the same traffic
(the README's replica recipe): the part of `benchmarks/replicas.py` that measures the replicas at full speed.

Each round replays the workload (default `overload`, `--placement by-client`: each client pinned to one target, so
one replica holds only client-0's requests, another only client-1's, the third none) once through one gateway and
once through the three replicas, back to back, so both see the same machine. While it runs, every 100 ms a sampler
reads the emulators' requests held (running + waiting, from their /metrics) and, from the gateways' /healthz, their
queued requests and their requests in flight; the samples taken while any gateway reports something queued count
towards "at the limit": backends holding at least 95% of their summed limit (38 of 40). The gateways' own count
tells the leases apart from the hop between gateway and backend (a request that ended at the backend and the
next one not yet arrived there).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass

import httpx

from fairserve.bench.report import bench_duration, summarize_bench
from fairserve.bench.runner import run_bench_async
from fairserve.workloads import get_workload

KEYS = {"client-0": "sk-alice", "client-1": "sk-bob"}
TENANTS = ["--tenant=alice:sk-alice", "--tenant=bob:sk-bob"]


@dataclass
class Run:
    service_per_s: float
    shares: dict[str, float]  # each client's part of the service
    ttft_s: dict[str, float | None]  # mean time to first token, workload seconds
    diff: float  # the largest backlogged difference
    jain: float | None
    at_limit: float  # fraction of the samples taken while something was queued: the backends' count
    at_limit_gw: float  # the same, by the gateways' count of requests in flight
    held: float  # median requests the backends held in those samples
    samples: int


async def _held(c: httpx.AsyncClient, url: str) -> float:
    text = (await c.get(url + "/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
    )


async def _sample(emulators: list[str], gateways: list[str], stop: asyncio.Event, out: list[tuple[float, int, int]]):
    async with httpx.AsyncClient(timeout=5) as c:
        while not stop.is_set():
            t = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                held = sum(await asyncio.gather(*(_held(c, e) for e in emulators)))
                docs = await asyncio.gather(*(c.get(g + "/healthz") for g in gateways))
                rows = [d.json() for d in docs]
                inflight = sum(b["in_flight_requests"] for r in rows for b in r["backends"])
                out.append((held, sum(r["queued"] for r in rows), inflight))
            await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - t)))


async def replay(gateways: list[str], emulators: list[str], limit: int, workload: str, duration: float, scale: float):
    w = get_workload(workload, duration_s=duration)
    stop, samples = asyncio.Event(), []
    sampler = asyncio.create_task(_sample(emulators, gateways, stop, samples))
    records = await run_bench_async(",".join(gateways), w.arrivals, KEYS, time_scale=scale, placement="by-client")
    stop.set()
    await sampler
    s = summarize_bench(records, bench_duration(records, w.duration_s))
    busy = [held for held, queued, _ in samples if queued]
    busy_gw = [inflight for _, queued, inflight in samples if queued]
    total = sum(c.service for c in s.clients.values()) or 1.0
    return Run(
        s.service_per_s,
        {k: c.service / total for k, c in s.clients.items()},
        {k: c.response_mean_s for k, c in s.clients.items()},
        s.max_backlogged_diff,
        s.jain_index,
        sum(h >= 0.95 * limit for h in busy) / len(busy) if busy else 1.0,
        sum(h >= 0.95 * limit for h in busy_gw) / len(busy_gw) if busy_gw else 1.0,
        statistics.median(busy) if busy else 0.0,
        len(busy),
    )


def fleet(serve, redis_url: str, rounds: int, workload: str, duration: float, scale: float, max_requests: int) -> int:
    """Print the side-by-side table; 0 when every goal is met at the median."""
    with contextlib.ExitStack() as stack:
        emulators = [stack.enter_context(serve("emulate", "--time-scale", str(scale))) for _ in range(2)]
        backends = [f"--backend={e},max_requests={max_requests}" for e in emulators]
        common = [*backends, *TENANTS, "--no-access-log"]
        one = stack.enter_context(serve("gateway", *common))
        three = [stack.enter_context(serve("gateway", *common, "--state", redis_url)) for _ in range(3)]
        limit = 2 * max_requests
        runs: dict[str, list[Run]] = {"one gateway": [], "three replicas": []}
        for _ in range(rounds):  # NOTE: interleaved, so both see the same machine
            runs["one gateway"].append(asyncio.run(replay([one], emulators, limit, workload, duration, scale)))
            runs["three replicas"].append(asyncio.run(replay(three, emulators, limit, workload, duration, scale)))
    return report(runs)


def report(runs: dict[str, list[Run]]) -> int:
    def med(name: str, f) -> float:
        return statistics.median(f(r) for r in runs[name])

    print(
        "| setup | service/s | client-0 share | client-1 share | client-0 TTFT | client-1 TTFT | backlogged diff "
        "| Jain | at the limit (of samples) | by the gateways' count | requests held (median) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, rs in runs.items():
        for k, r in enumerate(rs, 1):
            t0, t1 = r.ttft_s.get("client-0"), r.ttft_s.get("client-1")
            jain = "n/a" if r.jain is None else f"{r.jain:.3f}"  # NOTE: None: fewer than two clients backlogged
            print(
                f"| {name} ({k}) | {r.service_per_s:,.0f} | {r.shares.get('client-0', 0):.3f} | "
                f"{r.shares.get('client-1', 0):.3f} | {t0 or 0:.2f} s | {t1 or 0:.2f} s | {r.diff:,.0f} | "
                f"{jain} | {r.at_limit:.0%} ({r.samples}) | {r.at_limit_gw:.0%} | {r.held:.0f} |"
            )
    one, three = "one gateway", "three replicas"
    ratio = med(three, lambda r: r.service_per_s) / med(one, lambda r: r.service_per_s)
    ttft = med(three, lambda r: r.ttft_s["client-0"] or 0) / max(med(one, lambda r: r.ttft_s["client-0"] or 0), 1e-9)
    at_limit = med(three, lambda r: r.at_limit)
    print(
        f"\nthree replicas / one gateway (medians of {len(runs[one])} rounds): throughput {ratio:.2f}× (goal ≥ 0.95), "
        f"backends at the limit {at_limit:.0%} of samples while queued (goal ≥ 95%, one gateway "
        f"{med(one, lambda r: r.at_limit):.0%}; by the gateways' count {med(three, lambda r: r.at_limit_gw):.0%} "
        f"vs {med(one, lambda r: r.at_limit_gw):.0%}), below-share client-0's mean TTFT {ttft:.2f}× (goal ≤ 1.5)"
    )
    return 0 if ratio >= 0.95 and at_limit >= 0.95 and ttft <= 1.5 else 1
