"""The gateway's scheduler without HTTP: capacity (requests and tokens), least-loaded choice, requeue, refunds."""

from __future__ import annotations

import asyncio

import pytest
from support.gateway import config

from fairserve.core import RequestState, jain_index
from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending
from fairserve.gateway.metrics.prometheus import GatewayMetrics

pytestmark = pytest.mark.unit


def scheduler(*backends: dict, **kw) -> Scheduler:
    metrics = GatewayMetrics()
    s = Scheduler(config(list(backends), **kw), metrics)
    metrics.bind(s)
    return s


def test_token_capacity_and_an_oversized_request_alone():
    async def go() -> None:
        s = scheduler({"url": "http://a", "max_inflight_requests": 10, "max_inflight_tokens": 100})
        t = [s.new_ticket("alice", Footprint(10, 40)) for _ in range(3)]  # 50 tokens each
        for x in t:
            assert s.submit(x) is None
        assert [x.admitted.done() for x in t] == [True, True, False]
        s.close(t[0], Ending("ok", output=3))
        assert t[2].admitted.done() and s.backends[0].tokens == 100
        big = s.new_ticket("bob", Footprint(500, 500))
        s.submit(big)
        assert not big.admitted.done()
        s.close(t[1], Ending("ok"))
        s.close(t[2], Ending("ok"))
        assert big.admitted.done() and s.backends[0].requests == 1  # alone, though over the budget

    asyncio.run(go())


def test_least_loaded_backend():
    async def go() -> None:
        s = scheduler({"url": "http://a", "max_inflight_requests": 2}, {"url": "http://b", "max_inflight_requests": 4})
        tickets = [s.new_ticket("alice", Footprint(5, 5)) for _ in range(6)]
        for x in tickets:
            s.submit(x)
        assert [b.requests for b in s.backends] == [2, 4]
        assert [x.backend.url for x in tickets[:3]] == ["http://a", "http://b", "http://b"]  # by fraction used

    asyncio.run(go())


def test_requeue_keeps_charges_once_and_refunds_a_total_failure():
    async def go() -> None:
        s = scheduler({"url": "http://a"}, {"url": "http://b"})
        t = s.new_ticket("alice", Footprint(10, 5))
        s.submit(t)
        assert t.backend.url == "http://a" and s.ledger.service["alice"] == 10
        assert s.backend_failed(t, unreachable=True)
        assert t.backend.url == "http://b" and s.ledger.service["alice"] == 10  # not charged again
        assert s.backends[0].down_until > 0 and not s.backends[0].healthy
        assert not s.backend_failed(t, unreachable=False)  # no backend left
        assert s.close(t, Ending("backend_error", refund=True))
        assert s.ledger.service["alice"] == 0 and t.req.state is RequestState.ABORTED
        assert s.view().tenants["alice"].running == 0 and all(b.requests == 0 for b in s.backends)
        assert not s.close(t, Ending("ok")) and t.outcome == "backend_error"  # one outcome only

    asyncio.run(go())


def test_a_cooled_down_backend_is_used_again():
    async def go() -> None:
        s = scheduler({"url": "http://a"}, backend_cooldown_s=0.05)
        first = s.new_ticket("alice", Footprint(1, 1))
        s.submit(first)
        s.backends[0].down_until = asyncio.get_running_loop().time() + 30  # as if unreachable
        second = s.new_ticket("bob", Footprint(1, 1))
        s.submit(second)
        assert not second.admitted.done()
        s.backends[0].down_until = asyncio.get_running_loop().time() + 0.05
        s.dispatch()
        assert await s.wait(second, 2.0) is s.backends[0]

    asyncio.run(go())


def test_queue_limit_and_ttl():
    async def go() -> None:
        s = scheduler({"url": "http://a", "max_inflight_requests": 1}, queue_limit=1)
        running, queued, refused = (s.new_ticket("alice", Footprint(1, 1)) for _ in range(3))
        assert s.submit(running) is None and s.submit(queued) is None
        assert s.submit(refused) == "queue_full" and s.view().tenants["alice"].queued == 1
        assert await s.wait(queued, 0.05) is None
        s.close(queued, Ending("timeout", refund=True))
        assert s.view().tenants["alice"].queued == 0 and s.ledger.num_queued == 0

    asyncio.run(go())


def test_jain_index():
    assert jain_index([]) == jain_index([5]) == jain_index([0, 0]) == 1.0
    assert jain_index([1, 1, 1]) == 1.0 and abs(jain_index([1, 0]) - 0.5) < 1e-12
