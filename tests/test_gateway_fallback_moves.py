"""Queued requests moved to a fallback (gateway/dispatch/fallback.py), at the scheduler, no HTTP: a pool going down
moves its queued requests even when the fallback's pool is made by the move; the request whose own failure took its
pool down is moved too; a request that failed once (its quota hold taken) and then moved holds anew, and its end
releases no one else's hold; a moved request leaves its own ledger uncharged."""

from __future__ import annotations

import asyncio

import pytest
from support.gateway import config

from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending
from fairserve.gateway.metrics.prometheus import GatewayMetrics

pytestmark = pytest.mark.unit

BIG = {"url": "http://a", "max_inflight_requests": 1, "models": ["big"]}
BIG_2 = {"url": "http://a2", "max_inflight_requests": 1, "models": ["big"]}
SMALL = {"url": "http://b", "max_inflight_requests": 8, "models": ["small"]}


def scheduler(backends, **kw) -> Scheduler:
    metrics = GatewayMetrics()
    sched = Scheduler(config(backends, fallbacks={"big": ["small"]}, **kw), metrics)
    metrics.bind(sched)
    return sched


def test_a_pool_going_down_moves_its_queued_requests_to_a_fallback_pool_not_made_yet():
    async def go() -> None:
        sched = scheduler([BIG, SMALL])
        held, queued = (sched.new_ticket("alice", Footprint(5, 5), model="big") for _ in range(2))
        assert sched.submit(held) is None and sched.submit(queued) is None and not queued.admitted.done()
        assert len(sched.pools.pools) == 1  # no request for small yet: its pool is made by the move
        sched.backend_down(sched.backends[0], "test")
        assert queued.model == "small" and queued.fell_back_from == "big" and queued.admitted.done()
        assert queued.admitted.result().url == "http://b"

    asyncio.run(go())


def test_the_request_whose_failure_took_its_pool_down_moves_too():
    async def go() -> None:
        sched = scheduler([BIG, SMALL], fail_fast_s=5)
        t = sched.new_ticket("alice", Footprint(5, 5), model="big")
        assert sched.submit(t) is None and t.admitted.done()
        assert sched.backend_failed(t, unreachable=True)  # its backend refused the connection: the pool is down
        assert t.model == "small" and t.admitted.done() and t.admitted.result().url == "http://b"

    asyncio.run(go())


def test_a_requeued_request_that_moves_holds_anew_and_releases_no_one_elses_hold():
    async def go() -> None:
        quota = {"tokens": 1000, "per": "day"}
        sched = scheduler(
            [BIG, BIG_2, SMALL],
            health_interval_s=0,
            tenants=[{"name": "alice", "api_keys": ["key-alice"], "quota": quota}],
        )
        gate = sched.quota_gate
        assert gate is not None

        def held() -> float:
            return sum(u.held for k, u in gate.book.store.uses.items() if k[0] == "alice" and k[3] == "tokens")

        t, other = (
            sched.new_ticket("alice", Footprint(10, 10), model="big"),
            sched.new_ticket("alice", Footprint(100, 100), model="small"),
        )
        for x in (t, other):
            assert sched.submit(x) is None and x.admitted.done()
            x.holding = asyncio.get_running_loop().create_task(gate.hold(x))
            await x.holding
        assert held() == 220
        sched.backends[1].requests = 1  # big's other backend is busy: the failed request queues for it
        assert sched.backend_failed(t, why="HTTP 500") and not t.admitted.done()
        assert sched.fallbacks.move(t) and t.model == "small" and t.holding is None  # its hold went with the move
        await asyncio.sleep(0)
        assert held() == 200  # other's
        t.holding = asyncio.get_running_loop().create_task(gate.hold(t))  # as the proxy does at its dispatch
        await t.holding
        assert held() == 220
        sched.close(t, Ending("ok", 10, 10))
        for _ in range(3):
            await asyncio.sleep(0)
        assert held() == 200  # only its own released: other still holds its 200
        assert sched.pools.route("big").ledger.accounts["alice"].service == 0  # uncharged where it first ran

    asyncio.run(go())
