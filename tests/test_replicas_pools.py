"""Model pools across gateway replicas sharing state through a real redis-server: with model A saturated by a heavy
tenant on both replicas, model B's requests wait no longer than B's own load makes them, on either replica. The
counterfactual is the strict order (`Dispatch.strict`: one order over every pool, the replicas comparing their heads
whatever the pool), under which the same B load waits behind A's heads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time

import httpx
import pytest
from support.gateway import ADMIN, FakeBackend, auth, config
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.gateway import create_app
from fairserve.gateway.dispatch.pools import Dispatch

pytestmark = pytest.mark.integration

DELAY_S = 0.01  # per token
A_TOKENS, B_TOKENS = 30, 4  # a request for model A holds its backend 0.3 s, one for model B 0.04 s
A_HOLD_S, B_HOLD_S = A_TOKENS * DELAY_S, B_TOKENS * DELAY_S
INTERVAL_S = 0.01  # the replicas' sync interval


@pytest.fixture(scope="module")
def backends():
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(running_server(FakeBackend(delay_s=DELAY_S).app)) for _ in range(2)]


def replica_config(urls: list[str], state: str, usage: str):
    a, b = urls
    return config(
        [
            {"url": a, "max_inflight_requests": 1, "models": ["model-a"]},
            {"url": b, "max_inflight_requests": 2, "models": ["model-b"]},
        ],
        scope="global",
        state=state,
        state_interval_s=INTERVAL_S,
        state_ttl_s=1.0,
        usage_log=usage,
    )


async def request(c: httpx.AsyncClient, base: str, tenant: str, model: str, tokens: int, rid: str = "") -> None:
    body = {"model": model, "prompt": "hello there", "max_tokens": tokens}
    headers = {**auth(tenant), **({"X-Request-Id": rid} if rid else {})}
    r = await c.post(base + "/v1/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text


async def b_load(c: httpx.AsyncClient, gws: list[str], name: str) -> list[str]:
    """Bob's load on model B: 8 requests through each replica, 2 at a time on each (B takes 2: B's own queue)."""

    async def one_replica(k: int, base: str) -> list[str]:
        ids = [f"{name}-{k}-{i}" for i in range(8)]
        sem = asyncio.Semaphore(2)

        async def one(rid: str) -> None:
            async with sem:
                await request(c, base, "bob", "model-b", B_TOKENS, rid)

        await asyncio.gather(*(one(rid) for rid in ids))
        return ids

    return [rid for ids in await asyncio.gather(*(one_replica(k, g) for k, g in enumerate(gws))) for rid in ids]


async def queued(c: httpx.AsyncClient, base: str, tenant: str) -> int:
    rows = (await c.get(base + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"})).json()["tenants"]
    return next(r["queue_length"] for r in rows if r["name"] == tenant)


def run_pools(urls: list[str], tmp_path, name: str) -> tuple[list[float], list[float]]:
    """Two replicas on a fresh Redis: model B's queue waits (from the usage logs) alone, then with alice saturating
    model A through both replicas."""
    logs = [tmp_path / f"{name}-{k}.jsonl" for k in range(2)]
    with redis_server() as redis, contextlib.ExitStack() as stack:
        gws = [stack.enter_context(running_server(create_app(replica_config(urls, redis.url, str(p))))) for p in logs]

        async def go() -> tuple[list[str], list[str]]:
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as c:
                alone = await b_load(c, gws, f"{name}-alone")
                stop = asyncio.Event()

                async def flood(base: str) -> None:
                    while not stop.is_set():
                        await request(c, base, "alice", "model-a", A_TOKENS)

                tasks = [asyncio.create_task(flood(g)) for g in gws for _ in range(4)]
                # NOTE: A saturated on both replicas: within a few A requests (0.3 s each) normally; 30 s is only an
                # upper bound, for a loaded machine
                deadline = time.monotonic() + 30
                while min([await queued(c, g, "alice") for g in gws]) < 2:
                    assert time.monotonic() < deadline, "model A never had a queue on both replicas"
                    await asyncio.sleep(0.02)
                loaded = await b_load(c, gws, f"{name}-loaded")
                assert min([await queued(c, g, "alice") for g in gws]) >= 1  # A stayed saturated
                stop.set()
                await asyncio.gather(*tasks)
                return alone, loaded

        alone, loaded = asyncio.run(go())
    lines = {r["request_id"]: r for p in logs for r in map(json.loads, p.read_text().splitlines())}
    assert all(lines[i]["outcome"] == "ok" and lines[i]["model"] == "model-b" for i in alone + loaded)
    return [lines[i]["queue_wait_s"] for i in alone], [lines[i]["queue_wait_s"] for i in loaded]


def unaffected(alone: list[float], loaded: list[float]) -> bool:
    """B's waits with A saturated are those of B's own load (as in test_gateway_models.py), from the workload: the
    median with a slack of one B request and one sync interval (0.05 s), and the longest short of what waiting behind
    A adds (a B request held behind an A head waits for an A request to end: up to 0.3 s) by that same slack
    (0.25 s)."""
    return (
        statistics.median(loaded) <= statistics.median(alone) + B_HOLD_S + INTERVAL_S
        and max(loaded) <= max(alone) + A_HOLD_S - B_HOLD_S - INTERVAL_S
    )


def test_a_saturated_model_holds_up_no_other_across_replicas(backends, tmp_path, monkeypatch):
    pooled = run_pools(backends, tmp_path, "pooled")
    monkeypatch.setattr(Dispatch, "strict", True)
    strict = run_pools(backends, tmp_path, "strict")
    for what, (alone, loaded) in (("per pool", pooled), ("strict order", strict)):
        print(
            f"{what}: model B queue wait, median / max: alone {statistics.median(alone) * 1e3:.1f} / "
            f"{max(alone) * 1e3:.1f} ms, with model A saturated {statistics.median(loaded) * 1e3:.1f} / "
            f"{max(loaded) * 1e3:.1f} ms"
        )
    assert unaffected(*pooled), pooled
    assert not unaffected(*strict), strict  # the counterfactual: one order over both pools holds B behind A
