"""Rate caps through the gateway, with the official `openai` client and a real redis-server: `rate = { requests = 60
}` on alice lets 60 requests through in a minute and answers the 61st 429 `rate_limited` with Retry-After = the
seconds to the minute's end (an injected clock), while bob, sending at the same time, is served in full; a reload
raises the cap on this minute's count; the next minute counts afresh. Two replicas on one Redis hold one cap in
total."""

from __future__ import annotations

import asyncio
import contextlib

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, auth, chat_body, config, metric
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.gateway import create_app

pytestmark = pytest.mark.integration

T0 = 1_798_761_540.0 + 47.25  # 2026-12-31 23:59:47.25 UTC: 12.75 s before the minute's end
SHORT = dict(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def capped(url: str, redis: str, requests: int):
    """alice with `rate = { requests = N }`, bob with no cap, the counts in `redis`."""
    alice = {"name": "alice", "api_keys": [KEYS["alice"]], "rate": {"requests": requests}}
    # NOTE: a 0.1 s sync interval gives the Redis client a 1 s timeout: a loaded machine does not read as Redis lost
    return config([url], tenants=[alice, {"name": "bob", "api_keys": [KEYS["bob"]]}], state=redis, state_interval_s=0.1)


@contextlib.contextmanager
def gateway_with(cfg, clock: Clock):
    app = create_app(cfg)
    app.state.gateway.rates.book.clock = clock
    with running_server(app) as base:
        yield base, app.state.gateway


def rates(base: str) -> dict:
    return HTTP.get(base + "/admin/rates", headers={"Authorization": f"Bearer {ADMIN}"}).json()


def test_a_cap_of_60_requests_answers_the_61st_429_rate_limited_while_bob_is_served_in_full():
    fake, clock = FakeBackend(), Clock()
    with redis_server() as redis, running_server(fake.app) as url:
        with gateway_with(capped(url, redis.url, 60), clock) as (gw, gateway):

            async def both() -> tuple[list, list]:
                a = AsyncOpenAI(base_url=gw + "/v1", api_key=KEYS["alice"], max_retries=0, timeout=10)
                b = AsyncOpenAI(base_url=gw + "/v1", api_key=KEYS["bob"], max_retries=0, timeout=10)

                async def one(client: AsyncOpenAI) -> object:
                    try:
                        return await client.chat.completions.create(**SHORT)
                    except openai.RateLimitError as e:
                        return e

                alice_got = [one(a) for _ in range(61)]
                bob_got = [one(b) for _ in range(20)]
                got = await asyncio.gather(*alice_got, *bob_got)
                return got[:61], got[61:]

            alice_got, bob_got = asyncio.run(both())
            refused = [r for r in alice_got if isinstance(r, openai.RateLimitError)]
            assert len(refused) == 1 and len(alice_got) - len(refused) == 60  # exactly the cap, concurrent arrivals
            out = refused[0]
            assert out.status_code == 429 and out.code == "rate_limited" and out.body["type"] == "rate_limit_error"
            assert out.response.headers["retry-after"] == "13"  # 12.75 s to the minute's end, rounded up
            assert "2027-01-01T00:00:00+00:00" in out.message
            assert not any(isinstance(r, Exception) for r in bob_got)  # bob's share: every request served
            assert metric(gw, "fairserve_gateway_requests_total", tenant="alice", outcome="rate_limited") == 1
            assert metric(gw, "fairserve_gateway_requests_total", tenant="bob", outcome="ok") == 20
            assert metric(gw, "fairserve_gateway_rate_used", measure="requests", node="alice") == 60
            doc = rates(gw)
            assert doc["enforced"] and not doc["estimated"] and doc["per"] == "minute"
            assert doc["rates"] == {
                "alice": {
                    "requests": {"limit": 60, "used": 60, "remaining": 0, "resets_at": "2027-01-01T00:00:00+00:00"}
                }
            }

            # a reload raises the cap: this minute's count is kept, one more is let through
            gateway.load = lambda: capped(url, redis.url, 61)
            r = HTTP.post(gw + "/admin/reload", headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.status_code == 200, r.text
            sync = OpenAI(base_url=gw + "/v1", api_key=KEYS["alice"], max_retries=0, timeout=10)
            sync.chat.completions.create(**SHORT)
            with pytest.raises(openai.RateLimitError):
                sync.chat.completions.create(**SHORT)
            clock.now = T0 + 13  # the next minute: counted afresh
            sync.chat.completions.create(**SHORT)
            assert rates(gw)["rates"]["alice"]["requests"]["used"] == 1


def test_two_replicas_on_one_redis_hold_one_cap_in_total():
    fake, clock = FakeBackend(), Clock()
    with redis_server() as redis, running_server(fake.app) as url, contextlib.ExitStack() as stack:
        gws = [stack.enter_context(gateway_with(capped(url, redis.url, 5), clock))[0] for _ in range(2)]
        codes = [
            HTTP.post(gws[i % 2] + "/v1/chat/completions", json=chat_body(2), headers=auth("alice")).status_code
            for i in range(8)
        ]
        assert codes == [200] * 5 + [429] * 3  # 3 on one replica, 2 on the other: then both refuse
        assert [rates(gw)["rates"]["alice"]["requests"]["used"] for gw in gws] == [5, 5]
        for gw in gws:
            assert HTTP.post(gw + "/v1/chat/completions", json=chat_body(2), headers=auth("bob")).status_code == 200
