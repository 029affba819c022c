"""Gateway replicas on a real redis-server, as the replica tests drive them: two counted fake backends, the
replicas' config, streams that record when each token arrived, and the share of the service over a window."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import httpx

from fairserve.api.server import running_server
from fairserve.gateway import create_app
from support.gateway import ADMIN, FakeBackend, auth, chat_body, config

LIMIT = 2  # per backend
TOKENS = 8  # per request
DELAY_S = 0.01  # per token


class Counted:
    """An ASGI app that counts its POSTs in flight, until the answer is complete: its last byte, or a stream's
    `[DONE]` (what follows is the server closing the response, after the client was answered in full)."""

    def __init__(self, app) -> None:
        self.app, self.now, self.peak = app, 0, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        self.now += 1
        self.peak = max(self.peak, self.now)
        open_ = [True]

        async def counted_send(message):
            if (
                open_[0]
                and message["type"] == "http.response.body"
                and (not message.get("more_body") or b"[DONE]" in message.get("body", b""))
            ):
                open_[0] = False
                self.now -= 1
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            if open_[0]:
                self.now -= 1


def counted_backends() -> Iterator[tuple[list[Counted], list[str]]]:
    """Two fake backends, each counting its POSTs in flight, on loopback: (apps, urls) (the `backends` fixture)."""
    apps = [Counted(FakeBackend(delay_s=DELAY_S).app) for _ in range(2)]
    with contextlib.ExitStack() as stack:
        yield apps, [stack.enter_context(running_server(a)) for a in apps]


def replica_config(urls, state=None):
    return config(
        [{"url": u, "max_inflight_requests": LIMIT} for u in urls], state=state, state_interval_s=0.01, state_ttl_s=1.0
    )


async def stream(c: httpx.AsyncClient, base: str, tenant: str, got: dict[str, list[tuple[float, int]]]) -> int:
    """One streamed request of `tenant` through the gateway at `base`: its output tokens go to `got[tenant]` with
    their arrival times. Returns the status."""
    async with c.stream(
        "POST", base + "/v1/chat/completions", json=chat_body(TOKENS, stream=True), headers=auth(tenant)
    ) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                doc = json.loads(line[6:])
                n = sum(bool(ch["delta"].get("content")) for ch in doc["choices"])
                if n:
                    got[tenant].append((time.monotonic(), n))
        return r.status_code


async def drive(
    placement: dict[str, list[tuple[str, int]]], seconds: float, outcomes: list[str] | None = None, during=None
) -> dict[str, list[tuple[float, int]]]:
    """Closed-loop streams: `placement[tenant]` = [(gateway URL, streams)]. Returns each tenant's output tokens
    with their arrival times; `outcomes` collects how each request ended (ok, or the error)."""
    got: dict[str, list[tuple[float, int]]] = {t: [] for t in placement}
    stop = time.monotonic() + seconds

    async def worker(c: httpx.AsyncClient, base: str, tenant: str) -> None:
        while time.monotonic() < stop:
            try:
                status = await stream(c, base, tenant, got)
                if outcomes is not None:
                    outcomes.append("ok" if status == 200 else f"{tenant}: status {status}")
            except httpx.HTTPError as e:
                if outcomes is not None:
                    outcomes.append(f"{tenant}: {type(e).__name__}")
                return  # NOTE: its gateway is gone (the killed replica): this stream stops

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as c:
        tasks = [
            asyncio.create_task(worker(c, base, t))
            for t, where in placement.items()
            for base, n in where
            for _ in range(n)
        ]
        if during is not None:
            await during()
        await asyncio.gather(*tasks)
    return got


def share(got, tenant: str, t0: float, t1: float) -> float:
    """`tenant`'s share of the tokens served in [t0, t1)."""
    sums = {t: sum(n for at, n in xs if t0 <= at < t1) for t, xs in got.items()}
    return sums[tenant] / max(sum(sums.values()), 1)


def middle(got) -> tuple[float, float]:
    times = [at for xs in got.values() for at, _ in xs]
    lo, hi = min(times), max(times)
    return lo + (hi - lo) * 0.25, lo + (hi - lo) * 0.75


HEAVY, LIGHT = 8, 4  # streams: heavy alice on replica 1; light bob, this many on each of replicas 2 and 3


def run_three(urls, state, spreads: list[tuple[float, float]] | None = None) -> dict:
    """Three replicas, heavy alice on the first, light bob on the other two. With `spreads`, the difference of the
    two tenants' virtual counters as a replica reads them (the shared ones) is sampled every 20 ms."""
    with contextlib.ExitStack() as stack:
        gws = [stack.enter_context(running_server(create_app(replica_config(urls, state)))) for _ in range(3)]

        async def sample() -> None:
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN}"}) as c:
                end = time.monotonic() + 3.0
                while time.monotonic() < end:
                    rows = (await c.get(gws[1] + "/admin/tenants")).json()["tenants"]
                    counters = {r["name"]: r["counter"] for r in rows}
                    spreads.append((time.monotonic(), abs(counters["alice"] - counters["bob"])))
                    await asyncio.sleep(0.02)

        placement = {"alice": [(gws[0], HEAVY)], "bob": [(gws[1], LIGHT), (gws[2], LIGHT)]}
        got = asyncio.run(drive(placement, 3.0, during=sample if spreads is not None else None))
    return got
