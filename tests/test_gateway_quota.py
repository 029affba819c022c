"""Quotas through the gateway: a tenant runs out mid-run (the official `openai` client's RateLimitError, code
insufficient_quota, Retry-After = the window's end), a queued request answered 429 when dispatched, the window rolling
over with an injected clock, two replicas on a real redis-server holding the quota in total, across a restart of that
Redis (empty) and while it answers nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest
from openai import OpenAI
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, auth, chat_body, config, metric, stream_request, wait_until
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.gateway import create_app
from fairserve.gateway.admission.footprint import Footprint

pytestmark = pytest.mark.integration

LIMIT, MAX_TOKENS = 100, 10
T0 = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC)  # 30 s before the day's (and the year's) end


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def tenants(quota: dict, group: bool = False) -> dict:
    """alice (with `quota`, or in the group `org` that has it) and bob (no quota)."""
    alice = "org/alice" if group else "alice"
    out = {
        "tenants": [
            {"name": alice, "api_keys": [KEYS["alice"]], **({} if group else {"quota": quota})},
            {"name": "bob", "api_keys": [KEYS["bob"]]},
        ]
    }
    if group:
        out["groups"] = [{"name": "org", "quota": quota}]
    return out


@contextlib.contextmanager
def gateway_with(urls: list[str], clock: Clock | None = None, **kw):
    app = create_app(config([{"url": u, **kw.pop("backend", {})} for u in urls], **kw))
    if clock is not None:
        app.state.gateway.sched.quotas.book.clock = clock
    with running_server(app) as base:
        yield base


def quotas(base: str) -> dict:
    return HTTP.get(base + "/admin/quotas", headers={"Authorization": f"Bearer {ADMIN}"}).json()


def test_a_tenant_runs_out_mid_run_and_its_window_rolls_over():
    fake, clock = FakeBackend(), Clock()
    with running_server(fake.app) as url, gateway_with([url], clock, **tenants({"tokens": LIMIT, "per": "day"})) as gw:
        alice = OpenAI(base_url=gw + "/v1", api_key=KEYS["alice"], max_retries=0, timeout=10)
        used = served = 0
        with pytest.raises(openai.RateLimitError) as refused:
            for _ in range(50):
                r = alice.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=MAX_TOKENS
                )
                used += r.usage.total_tokens
                served += 1
        bound = r.usage.prompt_tokens + MAX_TOKENS  # NOTE: the gateway's estimate is the fake's count
        assert refused.value.code == "insufficient_quota" and refused.value.status_code == 429
        assert refused.value.response.headers["retry-after"] == "30"  # the end of the UTC day
        assert refused.value.body["type"] == "insufficient_quota"
        assert LIMIT <= used < LIMIT + bound and served == -(-LIMIT // bound)  # let through while used < limit
        doc = quotas(gw)["quotas"]["alice"]
        assert doc["per"] == "day" and doc["tokens"]["used"] == used and doc["tokens"]["remaining"] == 0
        assert doc["tokens"]["resets_at"] == "2027-01-01T00:00:00+00:00"
        row = next(
            t
            for t in HTTP.get(gw + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()["tenants"]
            if t["name"] == "alice"
        )
        assert row["quota"]["tokens"]["used"] == used
        assert metric(gw, "fairserve_gateway_quota_used", measure="tokens", node="alice") == used
        assert metric(gw, "fairserve_gateway_quota_remaining", measure="tokens", node="alice") == 0
        assert 'node="bob"' not in HTTP.get(gw + "/metrics").text  # no quota, no quota series
        bob = HTTP.post(gw + "/v1/chat/completions", json=chat_body(MAX_TOKENS), headers=auth("bob"))
        assert bob.status_code == 200  # below (without) a quota: served as usual
        clock.now += timedelta(seconds=31)  # a new day
        assert HTTP.post(gw + "/v1/chat/completions", json=chat_body(3), headers=auth("alice")).status_code == 200
        assert quotas(gw)["quotas"]["alice"]["tokens"]["used"] > 0


def test_a_queued_request_whose_group_quota_ran_out_is_answered_429_when_dispatched():
    fake = FakeBackend(delay_s=0.05)
    kw = tenants({"tokens": 5, "per": "hour"}, group=True)
    with (
        running_server(fake.app) as url,
        gateway_with([url], Clock(), backend={"max_inflight_requests": 1}, **kw) as gw,
    ):
        blocker = stream_request(gw, "bob", 200)  # holds the one slot until it is closed
        try:
            assert wait_until(lambda: metric(gw, "fairserve_gateway_tenant_inflight_requests", tenant="bob") == 1)

            async def two() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=10) as c:
                    sent = [
                        asyncio.ensure_future(
                            c.post(gw + "/v1/chat/completions", json=chat_body(3), headers=auth("alice"))
                        )
                        for _ in range(2)
                    ]
                    while metric(gw, "fairserve_gateway_queue_length", tenant="org/alice") < 2:
                        await asyncio.sleep(0.01)
                    blocker.close()  # NOTE: the slot frees: both queued requests passed the arrival check
                    return await asyncio.gather(*sent)

            first, second = sorted(asyncio.run(two()), key=lambda r: r.status_code)
        finally:
            blocker.close()
        assert first.status_code == 200  # 0 used < 5: let through, it used more than the quota
        assert second.status_code == 429 and second.json()["error"]["code"] == "insufficient_quota"
        assert 0 < int(second.headers["retry-after"]) <= 30
        doc = quotas(gw)["quotas"]["org"]["tokens"]
        assert doc["used"] == first.json()["usage"]["total_tokens"] and doc["held"] == 0  # the refused one: nothing


def test_two_replicas_on_redis_hold_the_quota_in_total():
    fake, limit, requests = FakeBackend(delay_s=0.005), 310, 40
    # NOTE: holds and settles go to Redis at once, whatever the sync interval; 0.1 s gives the Redis client a 1 s
    # timeout (10 intervals), so a loaded machine stalling this process's loops does not read as Redis lost (then each
    # replica enforces its share of what was left, a looser bound than the one checked here)
    kw = dict(tenants({"tokens": limit, "per": "month"}), state_interval_s=0.1, state_ttl_s=1.0)
    with redis_server() as redis, running_server(fake.app) as url, contextlib.ExitStack() as stack:
        gws = [stack.enter_context(gateway_with([url], state=redis.url, **kw)) for _ in range(2)]

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=10) as c:
                return await asyncio.gather(
                    *(
                        c.post(gws[i % 2] + "/v1/chat/completions", json=chat_body(MAX_TOKENS), headers=auth("alice"))
                        for i in range(requests)
                    )
                )

        got = asyncio.run(burst())
        ok = [r.json()["usage"] for r in got if r.status_code == 200]
        assert {r.status_code for r in got} == {200, 429}
        used = sum(u["total_tokens"] for u in ok)
        bound = max(u["prompt_tokens"] for u in ok) + MAX_TOKENS
        assert limit <= used < limit + bound  # the stated overshoot: at most one request's bound, both replicas
        for gw in gws:
            assert wait_until(lambda gw=gw: quotas(gw)["quotas"]["alice"]["tokens"]["held"] == 0)
            assert quotas(gw)["quotas"]["alice"]["tokens"]["used"] == used  # both read the one count
        print(json.dumps({"limit": limit, "used": used, "bound": bound, "served": len(ok)}))


def alice_until_refused(gws: list[str], most: int) -> tuple[int, int, int]:
    """alice's requests one at a time, to each replica in turn, until one is refused (429) or `most` were served:
    the tokens served, how many requests were, and the largest bound one held (its prompt + max_tokens)."""
    used = served = bound = 0
    for i in range(most):
        r = HTTP.post(gws[i % len(gws)] + "/v1/chat/completions", json=chat_body(MAX_TOKENS), headers=auth("alice"))
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "insufficient_quota"
            break
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        used, served, bound = used + usage["total_tokens"], served + 1, max(bound, usage["prompt_tokens"] + MAX_TOKENS)
    return used, served, bound


def settled(gws: list[str], used: int) -> bool:
    """Every replica reads `used` tokens and nothing held, from Redis (not from its own estimate)."""
    for doc in map(quotas, gws):
        row = doc["quotas"]["alice"].get("tokens", {})
        if doc.get("estimated") or row.get("held") != 0 or row.get("used") != used:
            return False
    return True


def shared_up(gws: list[str]) -> bool:
    return all(HTTP.get(gw + "/healthz").json()["shared_state"]["up"] for gw in gws)


def test_quota_use_survives_a_redis_restart():
    fake, limit = FakeBackend(), 240
    kw = dict(tenants({"tokens": limit, "per": "day"}), state_interval_s=0.01, state_ttl_s=1.0)
    with redis_server() as redis, running_server(fake.app) as url, contextlib.ExitStack() as stack:
        gws = [stack.enter_context(gateway_with([url], Clock(), state=redis.url, **kw)) for _ in range(2)]
        before, _, bound = alice_until_refused(gws, 8)  # about half the quota, over both replicas
        assert before < limit - bound and wait_until(lambda: settled(gws, before))
        redis.stop()
        redis.start()  # the same port, empty: no persistence
        assert wait_until(lambda: shared_up(gws))
        after, served, _ = alice_until_refused(gws, 40)
        print(json.dumps({"limit": limit, "before_restart": before, "after_restart": after, "bound": bound}))
        assert served < 40  # refused again within the window: not a fresh quota
        assert limit <= before + after < limit + bound  # one quota across the restart, overshot by one bound at most
        # NOTE: each replica wrote back only its own part: the two parts add up to what was served, not twice it
        assert wait_until(lambda: settled(gws, before + after))
        assert alice_until_refused(gws, 2)[1] == 0  # and Redis, read again, refuses too


def test_quotas_hold_while_redis_answers_nothing_and_its_use_is_counted_when_it_does():
    fake, limit = FakeBackend(), 240
    kw = dict(tenants({"tokens": limit, "per": "day"}), state_interval_s=0.01, state_ttl_s=1.0)
    with redis_server() as redis, running_server(fake.app) as url, contextlib.ExitStack() as stack:
        gws = [stack.enter_context(gateway_with([url], Clock(), state=redis.url, **kw)) for _ in range(2)]
        before, _, bound = alice_until_refused(gws, 8)
        assert wait_until(lambda: settled(gws, before))
        redis.pause()  # SIGSTOP: connections stay open, nothing answers
        try:
            assert wait_until(lambda: not any(shared_up([gw]) for gw in gws), 10.0)
            during, served, _ = alice_until_refused(gws, 40)
            status = quotas(gws[0])
        finally:
            redis.resume()
        print(json.dumps({"limit": limit, "before_outage": before, "during_outage": during, "served": served}))
        # NOTE: each of the 2 replicas lets alice use its half of what was left, plus one request's bound
        assert served < 40 and limit <= before + during < limit + 2 * bound
        assert status["enforced"] and status["estimated"] and status["quotas"]["alice"]["tokens"]["remaining"] == 0
        assert wait_until(lambda: settled(gws, before + during))  # what was served meanwhile is counted in Redis


def test_a_quota_call_redis_cannot_answer_is_answered_from_the_replicas_own_count_with_one_warning(caplog):
    from types import SimpleNamespace

    from fairserve.core import LinearCost
    from fairserve.gateway.quota.book import Cost, Exhausted, Hold
    from fairserve.gateway.quota.gate import QuotaGate
    from fairserve.tenancy import QuotaConfig

    async def lost(*args, **kw):
        raise ConnectionError("redis is gone")

    client = SimpleNamespace(register_script=lambda text: lost, hmget=lost)
    settings = SimpleNamespace(prefix="p", hold_s=0.5)
    shared = SimpleNamespace(_client=client, settings=settings, replica="r1", epoch="e1", replicas=2, up=True)
    shared.clock = lambda: 0.0
    gate = QuotaGate({"alice": QuotaConfig(per="day", tokens=40)}, clock=Clock())
    gate.use_redis(shared)
    ticket = type(
        "T", (), {"tenant": "alice", "footprint": Footprint(10, 10), "cost": LinearCost(), "pool": None, "budget": None}
    )

    async def scenario():
        assert await gate.check("alice") is None  # nothing read this window, nothing used here
        first = asyncio.ensure_future(gate.hold(ticket))
        assert isinstance(await first, Hold)
        # NOTE: 2 replicas last seen alive: this one's 20 held counts as 40 used of 40
        assert isinstance(await gate.hold(ticket), Exhausted) and isinstance(await gate.check("alice"), Exhausted)
        gate.settle(first, Cost(15, 15))  # it used 15 of its bound of 20: 30 of 40 now
        await gate.drain()
        assert isinstance(await gate.hold(ticket), Hold)
        doc = await gate.all_status()
        assert doc["enforced"] and doc["estimated"] and doc["quotas"]["alice"]["tokens"]["used"] == 70

    with caplog.at_level("WARNING", "fairserve.gateway"):
        asyncio.run(scenario())
    assert [r.message for r in caplog.records] == [
        "quotas are enforced from this replica's own count while Redis cannot be reached (ConnectionError)"
    ]
