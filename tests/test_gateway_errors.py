"""Every error path of the gateway, and the one outcome each accepted request ends in."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import APIError, OpenAI
from support.gateway import HTTP, KEYS, FakeBackend, admin_tenants, auth, chat_body, gateway, metric, wait_until

from fairserve.api.server import free_port, running_server
from fairserve.api.tokens import MESSAGE_TOKENS, estimate_tokens

pytestmark = pytest.mark.integration

PROMPT = estimate_tokens("hello there, gateway") + MESSAGE_TOKENS  # chat_body: one message, its role markers
REQS = "fairserve_gateway_requests_total"


@pytest.fixture(scope="module")
def backends():
    """Two fake backends for the whole module (reset for each test): starting servers is the slow part."""
    a, b = FakeBackend(), FakeBackend()
    with running_server(a.app) as url_a, running_server(b.app) as url_b:
        yield (a, url_a), (b, url_b)


@pytest.fixture
def fake(backends):
    (a, url), _ = backends
    return a.reset(), url


@pytest.fixture
def fake2(backends):
    _, (b, url) = backends
    return b.reset(), url


@pytest.fixture(scope="module")
def gw(backends):
    with gateway([backends[0][1]], max_body_bytes=2000) as base:
        yield base


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic key-alice"}, {"Authorization": "Bearer"}]
)
def test_401_without_a_known_key(gw, headers):
    r = HTTP.post(gw + "/v1/chat/completions", json=chat_body(), headers=headers)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b"[1, 2]"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}'),
        ("/v1/chat/completions", b'{"model": "m"}'),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}'),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": "x"}], "max_tokens": -3}'),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": "x"}], "stream": "yes"}'),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": [{"text": 5}]}]}'),
        ("/v1/completions", b'{"model": "m"}'),
        ("/v1/completions", b'{"model": "m", "prompt": {"a": 1}}'),
        ("/v1/completions", b"\xff\xfe"),
    ],
)
def test_400_for_malformed_bodies(gw, path, body):
    r = HTTP.post(gw + path, content=body, headers=auth("alice"))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_413_for_large_bodies_and_openai_style_404(gw):
    before = metric(gw, REQS, tenant="bob", outcome="invalid")
    r = HTTP.post(gw + "/v1/chat/completions", json=chat_body(prompt="x" * 5000), headers=auth("bob"))
    assert r.status_code == 413 and "error" in r.json()
    assert metric(gw, REQS, tenant="bob", outcome="invalid") == before + 1
    r = HTTP.get(gw + "/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert HTTP.get(gw + "/v1/chat/completions").status_code == 405


async def _stream(base: str, tenant: str, tokens: int) -> int:
    async with httpx.AsyncClient(timeout=30) as c:
        async with c.stream(
            "POST", base + "/v1/chat/completions", json=chat_body(tokens, stream=True), headers=auth(tenant)
        ) as r:
            await r.aread()
            return r.status_code


def test_429_when_the_tenant_queue_is_full_and_503_past_the_ttl(fake):
    async def scenario(base: str) -> None:
        busy = asyncio.create_task(_stream(base, "alice", 40))  # occupies the one slot ~2 s
        assert await asyncio.to_thread(wait_until, lambda: admin_tenants(base)["alice"]["in_flight"] == 1)
        queued = asyncio.create_task(_stream(base, "bob", 2))
        assert await asyncio.to_thread(wait_until, lambda: admin_tenants(base)["bob"]["queue_length"] == 1)
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth("bob"))
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert await queued == 503  # waited past the 0.6 s TTL
        busy.cancel()

    fake[0].reset(delay_s=0.05)
    with gateway([fake[1]], backend_options={"max_inflight_requests": 1}, queue_limit=1, queue_ttl_s=0.6) as base:
        asyncio.run(scenario(base))
        assert metric(base, REQS, tenant="bob", outcome="queue_full") == 1
        assert metric(base, REQS, tenant="bob", outcome="timeout") == 1
        assert wait_until(lambda: metric(base, REQS, tenant="alice", outcome="client_disconnected") == 1)
        assert admin_tenants(base)["bob"]["service"] == 0


def test_rpm_policy_rejects_with_retry_after(fake):
    with gateway([fake[1]], policy="rpm:1") as base:
        assert HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers=auth("alice")).status_code == 200
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers=auth("alice"))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
        assert metric(base, REQS, tenant="alice", outcome="rejected") == 1
        assert HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers=auth("bob")).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_failed_backend_then_the_next_one_charged_once(fake, fake2, stream):
    (bad, bad_url), (good, good_url) = fake, fake2
    bad.fail_status = 500
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway([dead, bad_url, good_url]) as base:
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(4, stream=stream), headers=auth("alice"))
        assert r.status_code == 200 and r.text.count(" tok") == 4
        assert bad.calls == 1 and good.calls == 1
        assert admin_tenants(base)["alice"]["service"] == PROMPT + 2 * 4
        assert metric(base, REQS, tenant="alice", outcome="ok") == 1
        health = {b["url"]: b["healthy"] for b in HTTP.get(base + "/healthz").json()["backends"]}
        assert health[dead] is False


def test_502_when_every_backend_fails_and_nothing_is_charged(fake):
    bad, url = fake
    bad.fail_status = 503
    with gateway([f"http://127.0.0.1:{free_port()}", url]) as base:
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(stream=True), headers=auth("bob"))
        assert r.status_code == 502 and r.json()["error"]["code"] == "backend_error"
        assert metric(base, REQS, tenant="bob", outcome="backend_error") == 1
        assert admin_tenants(base)["bob"]["service"] == 0
        bad.fail_status = 404  # a client error is the client's: passed through, not retried
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers=auth("bob"))
        assert r.status_code == 404 and r.json()["error"]["message"] == "fake failure"
        assert metric(base, REQS, tenant="bob", outcome="backend_rejected") == 1


def test_failure_mid_stream_ends_with_an_error_event(fake):
    fake[0].fail_after = 3
    with gateway([fake[1]]) as base:
        client = OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0)
        got = []
        with pytest.raises(APIError):
            for chunk in client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello there, gateway"}], max_tokens=10, stream=True
            ):
                got.append(chunk.choices[0].delta.content if chunk.choices else None)
        assert "".join(g or "" for g in got) == " tok" * 3
        assert wait_until(lambda: metric(base, REQS, tenant="alice", outcome="backend_error") == 1)
        assert admin_tenants(base)["alice"]["service"] == PROMPT + 2 * 3  # charged what it produced


def test_disconnect_while_queued_leaves_the_queue(fake):
    async def scenario(base: str) -> None:
        busy = asyncio.create_task(_stream(base, "alice", 30))
        assert await asyncio.to_thread(wait_until, lambda: admin_tenants(base)["alice"]["in_flight"] == 1)
        queued = asyncio.create_task(_stream(base, "bob", 5))
        assert await asyncio.to_thread(wait_until, lambda: admin_tenants(base)["bob"]["queue_length"] == 1)
        queued.cancel()
        assert await asyncio.to_thread(wait_until, lambda: admin_tenants(base)["bob"]["queue_length"] == 0)
        busy.cancel()

    backend = fake[0].reset(delay_s=0.05)
    with gateway([fake[1]], backend_options={"max_inflight_requests": 1}) as base:
        asyncio.run(scenario(base))
        assert wait_until(lambda: metric(base, REQS, tenant="bob", outcome="client_disconnected") == 1)
        assert admin_tenants(base)["bob"]["service"] == 0 and backend.calls == 1


def test_disconnect_mid_stream_cancels_upstream_and_charges_what_was_produced(fake):
    fake, url = fake
    fake.reset(delay_s=0.02)
    with gateway([url]) as base:
        seen = 0
        with HTTP.stream(
            "POST", base + "/v1/chat/completions", json=chat_body(100, stream=True), headers=auth("alice"), timeout=10
        ) as r:
            for line in r.iter_lines():
                if '"content": " tok"' in line:
                    seen += 1
                    if seen == 5:
                        break
        assert wait_until(lambda: fake.cancelled == [1], timeout_s=3.0)
        assert wait_until(lambda: metric(base, REQS, tenant="alice", outcome="client_disconnected") == 1)
        charged = admin_tenants(base)["alice"]["service"] - PROMPT
        assert 2 * seen <= charged <= 2 * fake.produced[1] < 2 * 100
        assert metric(base, "fairserve_gateway_output_tokens_total", tenant="alice") == charged / 2


@pytest.mark.parametrize("stream", [False, True])
def test_counters_match_usage_after_reconciliation(fake, stream):
    # the backend counts 1 token per 8-character piece (the estimate says 2) and 7 more prompt tokens
    fake[0].reset(piece="two tok!", prompt_bias=7)
    with gateway([fake[1]]) as base:
        for _ in range(3):
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(6, stream=stream), headers=auth("bob"))
            assert r.status_code == 200
            if stream:
                assert "usage" not in r.text
        bob = admin_tenants(base)["bob"]
        assert bob["service"] == 3 * ((PROMPT + 7) + 2 * 6)
        assert bob["counter"] == bob["service"]
        assert metric(base, "fairserve_gateway_prompt_tokens_total", tenant="bob") == 3 * (PROMPT + 7)
        assert metric(base, "fairserve_gateway_output_tokens_total", tenant="bob") == 3 * 6


@pytest.mark.parametrize("stream", [False, True])
def test_without_usage_the_estimate_is_charged(fake, stream):
    fake[0].reset(piece="two tok!").report_usage = False  # 8 characters: 2 tokens by the estimate
    with gateway([fake[1]]) as base:
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(4, stream=stream), headers=auth("alice"))
        assert r.status_code == 200 and r.text.count("two tok!") == 4
        assert admin_tenants(base)["alice"]["service"] == PROMPT + 2 * 8
        assert metric(base, REQS, tenant="alice", outcome="ok") == 1


def test_tenant_header_only_from_a_trusted_proxy(fake):
    for trusted in (False, True):
        with gateway([fake[1]], trusted_proxy=trusted) as base:
            h = {**auth("alice"), "X-Tenant-Id": "bob"}
            assert HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers=h).status_code == 200
            t = admin_tenants(base)
            assert (t["bob"]["service"] > 0) is trusted and (t["alice"]["service"] > 0) is not trusted
            h["X-Tenant-Id"] = "mallory"
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers=h)
            assert r.status_code == (401 if trusted else 200)
