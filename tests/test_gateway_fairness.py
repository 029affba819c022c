"""Fairness through the gateway: backend capacity 2 in flight, closed-loop streaming load from two tenants."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.gateway import FakeBackend, admin_tenants, auth, chat_body, serve, wait_until

pytestmark = pytest.mark.integration

TARGET_TOKENS = 500  # the load runs until the tenants together received this many output tokens
TIMEOUT_S = 60.0


async def _served(base: str, concurrency: dict[str, int]) -> dict[str, int]:
    """Output tokens each tenant received until TARGET_TOKENS were served in all (event-driven, not a wall-clock
    window); every tenant keeps `concurrency` streams open."""
    served = dict.fromkeys(concurrency, 0)
    enough = asyncio.Event()

    async def worker(c: httpx.AsyncClient, tenant: str) -> None:
        while True:
            async with c.stream(
                "POST", base + "/v1/chat/completions", json=chat_body(10, stream=True), headers=auth(tenant)
            ) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and not enough.is_set():
                        doc = json.loads(line[6:])
                        served[tenant] += sum(bool(ch["delta"].get("content")) for ch in doc["choices"])
                        if sum(served.values()) >= TARGET_TOKENS:
                            enough.set()

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as c:
        tasks = [asyncio.create_task(worker(c, t)) for t, n in concurrency.items() for _ in range(n)]
        await asyncio.wait_for(enough.wait(), TIMEOUT_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return served


def run_load(policy: str, concurrency: dict[str, int], **weights: float) -> dict[str, int]:
    fake = FakeBackend(delay_s=0.01)
    with serve(fake, backend_options={"max_inflight_requests": 2}, policy=policy, **weights) as base:
        served = asyncio.run(_served(base, concurrency))
        # every cut-off stream was aborted and nothing is left queued or in flight
        assert wait_until(
            lambda: all(t["queue_length"] == 0 and t["in_flight"] == 0 for t in admin_tenants(base).values())
        )
    return served


def test_vtc_serves_backlogged_tenants_equally():
    served = run_load("vtc", {"alice": 6, "bob": 2})
    assert served["bob"] > 100
    assert 0.75 < served["alice"] / served["bob"] < 1.33, served


def test_fcfs_favours_the_heavy_tenant():
    served = run_load("fcfs", {"alice": 6, "bob": 2})
    assert served["alice"] / served["bob"] > 1.8, served


@pytest.mark.parametrize("policy", ["vtc", "vtc-predict"])
def test_weights_one_to_two(policy):
    served = run_load(policy, {"alice": 4, "bob": 4}, weight_alice=1.0, weight_bob=2.0)
    assert 1.5 < served["bob"] / served["alice"] < 2.7, served
