"""Gateway overhead against the same emulator, measured side by side in one run: streamed requests sent directly to
`fairserve emulate` and through `fairserve gateway` in front of it.

Reports, per path: latency of a whole short stream (p50/p99, ms) with one request at a time, and the most streamed
requests per second with many at a time. Targets (issue 4): ≤ 1 ms p50 added, ≥ 0.8× direct throughput.
Two gateways run side by side: as a user starts it (uvicorn's access log on) and with `--no-access-log`.
`--base DIR`: a third gateway (with `--no-access-log`) runs DIR's checkout of fairserve (its `src/`), interleaved with
the others, so that a change is measured against the code before it in one run.
Run: .venv/bin/python benchmarks/gateway_overhead.py [--requests 400] [--concurrency 32] [--rounds 5] [--base DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def load_args(prog: str, doc: str, tenants: bool = False, base: bool = False) -> argparse.Namespace | None:
    """--requests, --concurrency, --rounds (None, after one line on stderr, when one is below 1); with `tenants`,
    --tenants N,N,... too."""
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    if base:
        p.add_argument("--base", type=Path, help="another checkout of fairserve, measured side by side")
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
    a = load_args("gateway_overhead.py", __doc__, base=True)
    if a is None:
        return 2
    rows: dict[str, list] = {"direct": [], "gateway": [], "gateway --no-access-log": []}
    gateway_args = ["--tenant=a:key-a"]
    if a.base is not None:
        if not (a.base / "src" / "fairserve").is_dir():
            print(f"gateway_overhead.py: --base {a.base}: no src/fairserve there", file=sys.stderr)
            return 2
        rows[f"gateway --no-access-log ({a.base})"] = []
    # NOTE: time scale 1e6 makes the emulated GPU instant, so what is measured is HTTP and scheduling
    with serve("emulate", "--time-scale", "1000000") as emulator, contextlib.ExitStack() as stack:
        backend = f"--backend={emulator},max_requests=256"
        urls = [
            emulator,
            stack.enter_context(serve("gateway", backend, *gateway_args)),
            stack.enter_context(serve("gateway", backend, *gateway_args, "--no-access-log")),
        ]
        if a.base is not None:
            env = {"PYTHONPATH": str(a.base.resolve() / "src")}
            urls.append(stack.enter_context(serve("gateway", backend, *gateway_args, "--no-access-log", env=env)))
        for _ in range(a.rounds):  # interleaved, so all paths see the same machine
            for name, url in zip(rows, urls, strict=True):
                rows[name].append(asyncio.run(measure(url, a.requests, a.concurrency)))
    stats = table("path", rows)
    d = stats["direct"]
    for name in list(rows)[1:]:
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
