"""/metrics of a gateway with many configured tenants, few of them in use: how large a scrape is, how long it takes,
and what it does to the latency of chat requests sent meanwhile.

The gateway runs in its own process (`fairserve gateway --config FILE --no-access-log`), from the source tree given
by `--src` (default: this checkout's), so two trees can be measured the same way; its backend is a fake that answers
at once (in this process), and every tenant in use has sent one request. Reported: the scrape's size and series, its
median time over `--scrapes` scrapes, and the p50/p99 latency of chat requests (one at a time, from tenants in use)
for `--seconds` s without scrapes and for `--seconds` s of back-to-back scrapes (from another process).
Goals (issue 20): at 10,000 configured and 1,000 active tenants, a scrape <= 2 MiB and <= 0.2 s; chat p99 during
scrapes <= 50 ms.
Run: .venv/bin/python benchmarks/metrics_scrape.py [--src OTHER/src] [--tenants 10000] [--active 1000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.gateway import FakeBackend  # noqa: E402  (the fake backend the tests use)
from support.processes import fairserve_process  # noqa: E402

from fairserve.api.server import running_server  # noqa: E402

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1}


def toml(backend: str, tenants: int) -> str:
    lines = ['admin_key = "bench-admin"', "health_interval_s = 0", "queue_limit = 1024"]
    lines.append(f'backends = [{{ url = "{backend}", max_inflight_requests = 64 }}]')
    lines += [f'[[tenants]]\nname = "tenant-{i:05d}"\napi_keys = ["key-{i:05d}"]' for i in range(tenants)]
    return "\n".join(lines) + "\n"


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def chat_loop(c: httpx.AsyncClient, base: str, active: int, until: float) -> list[float]:
    out, i = [], 0
    while time.perf_counter() < until:
        key = f"key-{i % active:05d}"
        t = time.perf_counter()
        r = await c.post(base + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
        out.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text
        i += 1
    return out


# NOTE: the scrapes come from a process of their own, so that reading 1-40 MiB answers does not delay the chat
# client's own loop (it would be counted as the gateway's latency)
SCRAPER = """
import sys, time, httpx
base, seconds = sys.argv[1], float(sys.argv[2])
until, n = time.perf_counter() + seconds, 0
with httpx.Client(timeout=120) as c:
    while time.perf_counter() < until:
        c.get(base + "/metrics").raise_for_status()
        n += 1
print(n)
"""


async def measure(base: str, active: int, scrapes: int, seconds: float) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=60) as c:
        sem = asyncio.Semaphore(16)

        async def first(i: int) -> None:
            async with sem:
                h = {"Authorization": f"Bearer key-{i:05d}"}
                (await c.post(base + "/v1/chat/completions", json=BODY, headers=h)).raise_for_status()

        await asyncio.gather(*(first(i) for i in range(active)))
        times, size, series = [], 0, 0
        for _ in range(scrapes):
            t = time.perf_counter()
            r = await c.get(base + "/metrics", timeout=120)
            times.append(time.perf_counter() - t)
            size = len(r.content)
            series = sum(1 for line in r.text.splitlines() if line and not line.startswith("#"))
        quiet = await chat_loop(c, base, active, time.perf_counter() + seconds)
        scraper = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, base, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        busy = await chat_loop(c, base, active, time.perf_counter() + seconds)
        n = int(scraper.communicate(timeout=seconds + 300)[0])
    return {
        "size_mib": size / 2**20,
        "series": series,
        "scrape_s": statistics.median(times),
        "quiet_p50_ms": 1000 * percentile(quiet, 0.5),
        "quiet_p99_ms": 1000 * percentile(quiet, 0.99),
        "busy_p50_ms": 1000 * percentile(busy, 0.5),
        "busy_p99_ms": 1000 * percentile(busy, 0.99),
        "scrapes": n,
        "chats": len(busy),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default=str(ROOT / "src"), help="the fairserve source tree the gateway runs from")
    p.add_argument("--tenants", type=int, default=10_000)
    p.add_argument("--active", type=int, default=1_000)
    p.add_argument("--scrapes", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--quick", action="store_true", help="2,000 tenants, 200 active, 3 s each")
    a = p.parse_args()
    if a.quick:
        a.tenants, a.active, a.seconds, a.scrapes = 2_000, 200, 3.0, 3
    fake = FakeBackend()
    with running_server(fake.app) as backend, tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "gateway.toml"
        cfg.write_text(toml(backend, a.tenants))
        os.environ["PYTHONPATH"] = a.src
        with fairserve_process("gateway", "--config", str(cfg), "--no-access-log", timeout_s=120) as (base, _):
            m = asyncio.run(measure(base, a.active, a.scrapes, a.seconds))
    print(f"source: {a.src}; {a.tenants:,} tenants configured, {a.active:,} active\n")
    print("| scrape size | series | scrape time (median) | chat p50 / p99, quiet | chat p50 / p99, during scrapes |")
    print("|---|---|---|---|---|")
    print(
        f"| {m['size_mib']:.2f} MiB | {m['series']:,} | {m['scrape_s']:.3f} s | "
        f"{m['quiet_p50_ms']:.1f} / {m['quiet_p99_ms']:.1f} ms | "
        f"{m['busy_p50_ms']:.1f} / {m['busy_p99_ms']:.1f} ms ({m['scrapes']} scrapes, {m['chats']} requests) |"
    )


if __name__ == "__main__":
    main()
