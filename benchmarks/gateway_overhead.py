"""Gateway overhead against the same emulator, measured side by side in one run: streamed requests sent directly to
`fairserve emulate` and through `fairserve gateway` in front of it.

Reports, per path: latency of a whole short stream (p50/p99, ms) with one request at a time, and the most streamed
requests per second with many at a time. Targets (issue 4): ≤ 1 ms p50 added, ≥ 0.8× direct throughput.
Two gateways run side by side: as a user starts it (uvicorn's access log on) and with `--no-access-log`.
Run: .venv/bin/python benchmarks/gateway_overhead.py [--requests 400] [--concurrency 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.processes import serve  # noqa: E402  (the loopback subprocess helper the tests use)

from fairserve.api.tokens import prompt_of  # noqa: E402

BODY = {"model": "m", "prompt": prompt_of(8), "max_tokens": 4, "stream": True}


async def one(client: httpx.AsyncClient, url: str) -> float:
    t = time.perf_counter()
    async with client.stream("POST", url, json=BODY, headers={"Authorization": "Bearer key-a"}) as r:
        async for _ in r.aiter_lines():
            pass
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}")
    return time.perf_counter() - t


async def measure(base: str, requests: int, concurrency: int) -> tuple[list[float], float]:
    url = base + "/v1/completions"
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        for _ in range(20):
            await one(client, url)  # warm up
        latencies = [await one(client, url) for _ in range(requests // 4)]
        sem = asyncio.Semaphore(concurrency)

        async def limited() -> float:
            async with sem:
                return await one(client, url)

        t = time.perf_counter()
        await asyncio.gather(*(limited() for _ in range(requests)))
        return latencies, requests / (time.perf_counter() - t)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def load_args(prog: str, doc: str, tenants: bool = False) -> argparse.Namespace | None:
    """--requests, --concurrency, --rounds (None, after one line on stderr, when one is below 1); with `tenants`,
    --tenants N,N,... too."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    if tenants:
        p.add_argument("--tenants", type=lambda v: [int(x) for x in v.split(",")], default=[10, 100, 1000, 10000])
    a = p.parse_args()
    if min(a.requests, a.concurrency, a.rounds) < 1:
        print(f"{prog}: --requests, --concurrency and --rounds must be >= 1", file=sys.stderr)
        return None
    return a


def table(first: str, rows: dict[str, list]) -> dict[str, tuple[float, float, float]]:
    """Print p50/p99 latency and the median throughput of each row's rounds; return them by row."""
    stats = {}
    for name, runs in rows.items():
        lat = [x for latencies, _ in runs for x in latencies]
        stats[name] = (pct(lat, 0.5), pct(lat, 0.99), statistics.median(r for _, r in runs))
    print(f"| {first} | stream latency p50 (ms) | p99 (ms) | streamed requests/s |")
    print("|---|---:|---:|---:|")
    for name, (p50, p99, rps) in stats.items():
        print(f"| {name} | {p50:.2f} | {p99:.2f} | {rps:.0f} |")
    print()
    return stats


def main() -> int:
    a = load_args("gateway_overhead.py", __doc__)
    if a is None:
        return 2
    rows: dict[str, list] = {"direct": [], "gateway": [], "gateway --no-access-log": []}
    gateway_args = ["--tenant=a:key-a"]
    # NOTE: time scale 1e6 makes the emulated GPU instant, so what is measured is HTTP and scheduling
    with serve("emulate", "--time-scale", "1000000") as emulator:
        backend = f"--backend={emulator},max_requests=256"
        with (
            serve("gateway", backend, *gateway_args) as gateway,
            serve("gateway", backend, *gateway_args, "--no-access-log") as quiet,
        ):
            for _ in range(a.rounds):  # interleaved, so all paths see the same machine
                for name, url in zip(rows, (emulator, gateway, quiet), strict=True):
                    rows[name].append(asyncio.run(measure(url, a.requests, a.concurrency)))
    stats = table("path", rows)
    d = stats["direct"]
    for name in ("gateway", "gateway --no-access-log"):
        g = stats[name]
        print(
            f"added by {name}: p50 {g[0] - d[0]:.2f} ms, p99 {g[1] - d[1]:.2f} ms; throughput {g[2] / d[2]:.2f}× direct"
        )
    found = [m for m in ("uvloop", "httptools") if importlib.util.find_spec(m)]
    print(
        f"({a.rounds} rounds of {a.requests} requests; uvloop/httptools installed for uvicorn: "
        f"{', '.join(found) or 'neither'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
