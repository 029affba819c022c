"""Model pools in the gateway's scheduler, without HTTP: a request goes only to a backend that serves its model, an
unknown model is refused, a full pool holds up no other pool (in either counter scope), per-model prices, and the
counter scopes (per_model: a ledger per pool; global: one account per tenant over the fleet)."""

from __future__ import annotations

import asyncio

import pytest
from support.gateway import config

from fairserve.gateway.config import build_config
from fairserve.gateway.prometheus import GatewayMetrics
from fairserve.gateway.scheduler import Ending, Scheduler, UnknownModel

A = {"url": "http://a", "max_inflight_requests": 1, "models": ["model-a", "lora-a"]}
B = {"url": "http://b", "max_inflight_requests": 1, "models": ["model-b"]}


def scheduler(*backends: dict, **kw) -> Scheduler:
    metrics = GatewayMetrics()
    s = Scheduler(config(list(backends), **kw), metrics)
    metrics.bind(s)
    return s


def test_requests_go_only_to_the_backends_of_their_model():
    async def go() -> None:
        s = scheduler({**A, "max_inflight_requests": 8}, {**B, "max_inflight_requests": 8})
        tickets = [s.new_ticket("alice", 5, 5, model=m) for m in ["model-a", "model-b", "lora-a"] * 3]
        for t in tickets:
            assert s.submit(t) is None
        assert [t.backend.url for t in tickets] == ["http://a", "http://b", "http://a"] * 3
        with pytest.raises(UnknownModel, match="'gpt-9' does not exist.*lora-a, model-a, model-b"):
            s.new_ticket("alice", 5, 5, model="gpt-9")

    asyncio.run(go())


def test_with_one_pool_the_backend_answers_for_a_model_it_does_not_list():
    async def go() -> None:
        s = scheduler({**A, "max_inflight_requests": 8}, {**A, "url": "http://a2"})
        t = s.new_ticket("alice", 5, 5, model="gpt-9")
        assert s.submit(t) is None and t.backend.url in ("http://a", "http://a2")

    asyncio.run(go())


@pytest.mark.parametrize("scope", ["per_model", "global"])
def test_a_full_pool_holds_up_no_other_pool(scope):
    async def go() -> None:
        s = scheduler(A, B, scope=scope)
        heavy = [s.new_ticket("alice", 5, 5, model="model-a") for _ in range(5)]
        for t in heavy:
            s.submit(t)
        assert [t.admitted.done() for t in heavy] == [True] + [False] * 4
        light = s.new_ticket("bob", 5, 5, model="model-b")
        s.submit(light)
        assert light.admitted.done() and light.backend.url == "http://b"  # past the four queued for model-a
        # the requests passed over are back in their order, charged nothing for being looked at
        assert s.view().tenants["alice"].queued == 4 and s.view().tenants["alice"].service == 5
        s.close(heavy[0], Ending("ok", 5, 5))
        assert heavy[1].admitted.done() and not heavy[2].admitted.done()
        # alice's own request for model-b is not held up by her queued model-a requests either
        mine = s.new_ticket("alice", 5, 5, model="model-b")
        s.submit(mine)
        s.close(light, Ending("ok", 5, 5))
        assert mine.admitted.done() and mine.backend.url == "http://b"
        assert len(s.pools.ledgers) == (2 if scope == "per_model" else 1)

    asyncio.run(go())


def test_per_model_scope_counts_each_pool_apart_and_global_counts_the_fleet():
    async def go(scope: str) -> tuple[float, float]:
        s = scheduler(A, B, scope=scope)
        t = s.new_ticket("alice", 100, 50, model="model-a")
        s.submit(t)
        s.close(t, Ending("ok", 100, 50))
        a, b = (s.pools.route(m).ledger for m in ("model-a", "model-b"))
        return a.service.get("alice", 0.0), b.service.get("alice", 0.0)

    assert asyncio.run(go("per_model")) == (200.0, 0.0)
    assert asyncio.run(go("global")) == (200.0, 200.0)  # one ledger


def test_per_model_prices():
    async def go() -> None:
        s = scheduler(A, B, scope="global", prices={"model-a": {"w_p": 4, "w_q": 8}})
        big, small = s.new_ticket("alice", 10, 3, model="model-a"), s.new_ticket("bob", 10, 3, model="model-b")
        for t in (big, small):
            s.submit(t)
            s.output(t, 3)
            s.close(t, Ending("ok", 10, 3))
        service = s.view().tenants
        assert service["alice"].service == 4 * 10 + 8 * 3 and service["bob"].service == 10 + 2 * 3

    asyncio.run(go())


def test_the_admin_view_sums_the_pools():
    async def go() -> None:
        s = scheduler(A, B)
        for m in ("model-a", "model-b"):
            t = s.new_ticket("alice", 10, 0, model=m)
            s.submit(t)
            s.close(t, Ending("ok", 10, 0))
        assert s.view().tenants["alice"].service == 20
        tenants, _, counter_of = s.accounts()
        assert tenants["alice"].service == 20 and counter_of(tenants["alice"]) == 20
        s.set_weight("alice", 2)
        assert all(x.accounts["alice"].weight == 2 for x in s.pools.ledgers)

    asyncio.run(go())


def test_per_model_scope_with_shared_state_or_a_snapshot_is_refused():
    base = {"backends": [A], "tenants": [{"name": "t", "api_keys": ["k"]}]}
    with pytest.raises(ValueError, match='scope: "per_model" cannot be combined with state'):
        build_config({**base, "scope": "per_model", "state": "redis://127.0.0.1:1/0"})
    with pytest.raises(ValueError, match="cannot be combined with snapshot"):
        build_config({**base, "scope": "per_model", "snapshot": "x.json"})
    assert build_config({**base, "snapshot": "x.json"}).counter_scope == "global"
    assert build_config(base).counter_scope == "per_model"
