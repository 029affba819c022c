"""Keys by API across replicas, through HTTP with the official `openai` client and a real redis-server: a key made on
one replica serves at once on both, survives a restart of both (it is kept in Redis, hashed), and once revoked is
refused on both within a second, while the tenant's other keys still serve; its last use, noted on one replica, is
listed by the other; a Redis that lost its data gets the keys back from the replicas. A tenant made with a key serves
on both at once, outlives their restart and goes with its last key; a key whose tenant a replica is still applying
waits for it there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import openai
import pytest
import redis as redis_py
from openai import OpenAI
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, config, wait_until
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.gateway import create_app
from fairserve.tenancy import key_digest

pytestmark = pytest.mark.integration

SHORT = dict(model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


@contextlib.contextmanager
def replicas(backend: str, redis: str) -> Iterator[list[str]]:
    """Two gateways on one Redis (a 0.1 s sync interval: a 1 s Redis timeout, so a loaded machine is not Redis lost)."""
    with contextlib.ExitStack() as stack:
        cfg = config([backend], state=redis, state_interval_s=0.1)
        yield [stack.enter_context(running_server(create_app(cfg))) for _ in range(2)]


def chat(base: str, key: str) -> str:
    """The tenant's answer through the official client, or the error code it raised."""
    try:
        OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=10).chat.completions.create(**SHORT)
    except openai.AuthenticationError as e:
        assert e.status_code == 401
        return str(e.code)
    return "ok"


def listed(base: str) -> dict[str, dict]:
    doc = HTTP.get(base + "/admin/keys", headers=AS_ADMIN).json()
    assert doc["store"] == "redis"
    return {row["id"]: row for row in doc["keys"]}


def test_a_key_made_on_one_replica_serves_on_both_survives_their_restart_and_is_revoked_everywhere_within_1s():
    fake = FakeBackend()
    with redis_server() as redis, running_server(fake.app) as url:
        with replicas(url, redis.url) as (a, b):
            r = HTTP.post(a + "/admin/keys", json={"tenant": "alice", "name": "ci"}, headers=AS_ADMIN)
            assert r.status_code == 201, r.text
            made = r.json()
            other = HTTP.post(b + "/admin/keys", json={"tenant": "alice"}, headers=AS_ADMIN).json()
            assert [chat(a, made["key"]), chat(b, made["key"]), chat(b, other["key"])] == ["ok"] * 3  # at once
            assert fake.calls == 3
            with redis_py.Redis.from_url(redis.url) as client:
                stored = b"".join(client.hvals("fairserve:keys"))
            assert key_digest(made["key"]).encode() in stored and made["key"].encode() not in stored
            # b noted the use; a lists it (flushed to Redis within a poll)
            assert wait_until(lambda: listed(a)[made["id"]]["last_used_at"] is not None, 2.0)

        with replicas(url, redis.url) as (a, b):  # both restarted: the keys are Redis's
            assert set(listed(a)) == set(listed(b)) == {made["id"], other["id"]}
            assert [chat(a, made["key"]), chat(b, made["key"])] == ["ok", "ok"]

            r = HTTP.delete(f"{a}/admin/keys/{made['id']}", headers=AS_ADMIN)
            revoked_at = time.monotonic()
            assert r.status_code == 200 and r.json()["revoked"] is True
            assert chat(a, made["key"]) == "invalid_api_key"  # at once where it was revoked
            while chat(b, made["key"]) == "ok":
                assert time.monotonic() - revoked_at < 1.0, "the other replica still serves a revoked key after 1 s"
            assert time.monotonic() - revoked_at < 1.0
            # the negative control: alice's other keys still serve on both replicas
            for base in (a, b):
                assert chat(base, other["key"]) == "ok" and chat(base, KEYS["alice"]) == "ok"
            assert wait_until(lambda: set(listed(b)) == {other["id"]}, 1.0)

            # Redis loses its data (a restart without persistence): the replicas write back the keys they hold
            with redis_py.Redis.from_url(redis.url) as client:
                client.flushall()
                assert wait_until(lambda: client.hkeys("fairserve:keys") == [other["id"].encode()], 2.0)
            assert chat(a, other["key"]) == "ok" and chat(a, made["key"]) == "invalid_api_key"


def tenants_of(base: str) -> set[str]:
    """The top-level tenants a replica serves (`GET /admin/tree`'s)."""
    return {n["path"] for n in HTTP.get(base + "/admin/tree", headers=AS_ADMIN).json()["tree"] if n["kind"] == "tenant"}


def test_a_tenant_made_with_a_key_on_one_replica_serves_on_both_outlives_their_restart_and_goes_with_its_key():
    fake = FakeBackend()
    with redis_server() as redis, running_server(fake.app) as url:
        with replicas(url, redis.url) as (a, b):
            body = {"tenant": "carol", "new_tenant": {"weight": 3, "rate": {"requests": 100}}}
            made = HTTP.post(a + "/admin/keys", json=body, headers=AS_ADMIN).json()
            assert [chat(b, made["key"]), chat(a, made["key"])] == ["ok", "ok"]  # at once, on the other too
            assert "carol" in tenants_of(a) and "carol" in tenants_of(b)
            r = HTTP.post(b + "/admin/keys", json={**body, "name": "again"}, headers=AS_ADMIN)
            assert r.status_code == 409 and r.json()["error"]["code"] == "tenant_exists"
        with replicas(url, redis.url) as (a, b):  # both restarted: the tenant is Redis's, as its key
            assert [chat(a, made["key"]), chat(b, made["key"])] == ["ok", "ok"]
            rates = HTTP.get(b + "/admin/rates", headers=AS_ADMIN).json()["rates"]
            assert rates["carol"]["requests"]["limit"] == 100
            # Redis loses its data: the replicas write the tenant back with its key
            with redis_py.Redis.from_url(redis.url) as client:
                client.flushall()
                assert wait_until(lambda: client.hkeys("fairserve:keys:tenants") == [b"carol"], 2.0)
            with redis_py.Redis.from_url(redis.url) as client:  # a record that does not decode is revoked all the same
                client.hset("fairserve:keys", "key_junk", "not json")
            assert HTTP.delete(f"{a}/admin/keys/key_junk", headers=AS_ADMIN).status_code == 200
            assert HTTP.delete(f"{b}/admin/keys/{made['id']}", headers=AS_ADMIN).status_code == 200
            assert wait_until(lambda: "carol" not in tenants_of(a), 1.0)  # gone with its last key, everywhere
            assert chat(a, made["key"]) == "invalid_api_key" and "carol" not in tenants_of(b)
            with redis_py.Redis.from_url(redis.url) as client:
                assert client.hkeys("fairserve:keys:tenants") == [] and not client.exists("fairserve:keys:of:carol")


def test_a_key_whose_new_tenant_a_replica_is_still_applying_waits_for_it_not_401():
    """B's poll reads a tenant made on A and its key, and puts the tenant in place slowly (a reload at many tenants
    takes seconds; here one made 1 s long): the key asked of B meanwhile is served once the tenant is in place."""
    fake = FakeBackend()
    with redis_server() as redis, running_server(fake.app) as url, contextlib.ExitStack() as stack:
        cfg = config([url], state=redis.url, state_interval_s=0.1)
        a = stack.enter_context(running_server(create_app(cfg)))
        app_b = create_app(cfg)
        b = stack.enter_context(running_server(app_b))
        gw_b = app_b.state.gateway
        applying = gw_b.use_tenants

        async def slowly() -> None:
            await asyncio.sleep(1.0)
            await applying()

        gw_b.use_tenants = slowly
        body = {"tenant": "carol", "new_tenant": {"weight": 2}}
        made = HTTP.post(a + "/admin/keys", json=body, headers=AS_ADMIN).json()
        assert wait_until(lambda: gw_b.keys.book.knows(made["key"]), 2.0)  # B's poll has read the key...
        assert wait_until(lambda: gw_b.keys._applying is not None, 0.5)  # ... and is putting its tenant in place
        assert chat(b, made["key"]) == "ok" and "carol" in tenants_of(b)
