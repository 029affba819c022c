"""Fairness through the gateway, wired end to end: backend capacity 2 in flight, closed-loop streaming load from two
tenants through HTTP."""

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


# NOTE: these runs go through real HTTP on the wall clock, so they check the wiring only: the share moves from what
# arrival order gives towards what the policy gives, past the line between the two (their geometric mean, from the
# workload). The bounds themselves are proven where the test owns the clock (test_gateway_fair_clock.py).
HEAVY, LIGHT = 6, 2  # alice's and bob's streams: in arrival order (FCFS) alice gets HEAVY / LIGHT of bob's service


def test_vtc_moves_the_share_from_arrival_order_towards_equal():
    line = (HEAVY / LIGHT) ** 0.5  # between VTC's 1 and FCFS's 3
    vtc = run_load("vtc", {"alice": HEAVY, "bob": LIGHT})
    fcfs = run_load("fcfs", {"alice": HEAVY, "bob": LIGHT})
    assert vtc["bob"] > 0 and vtc["alice"] / vtc["bob"] < line < fcfs["alice"] / fcfs["bob"], (vtc, fcfs)


@pytest.mark.parametrize("policy", ["vtc", "vtc-predict"])
def test_weights_one_to_two_move_the_share_towards_two(policy):
    line = 2**0.5  # between the weights' 2 and the 1 that equal streams give unweighted
    served = run_load(policy, {"alice": 4, "bob": 4}, weight_alice=1.0, weight_bob=2.0)
    assert served["alice"] > 0 and served["bob"] / served["alice"] > line, served
