"""The official `openai` client through the gateway: chat and completions, streamed and not; models, health."""

from __future__ import annotations

import pytest
from openai import OpenAI
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, admin_tenants, auth, chat_body, metric, serve

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gw():
    fake = FakeBackend()
    with serve(fake, models=["configured-model"]) as base:
        yield base, fake


def client(base: str, tenant: str = "alice") -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=10)


def test_chat_non_stream(gw):
    base, _ = gw
    r = client(base).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert r.choices[0].message.content == " tok" * 4
    assert r.usage.completion_tokens == 4


def test_chat_stream_hides_the_usage_it_added(gw):
    base, fake = gw
    chunks = list(
        client(base).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " tok" * 6
    assert all(c.choices and c.usage is None for c in chunks)
    assert fake.bodies[-1]["stream_options"] == {"include_usage": True}  # the gateway asked for it


def test_chat_stream_with_usage_when_asked(gw):
    base, _ = gw
    chunks = list(
        client(base, "bob").chat.completions.create(
            model="fake-model",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 3 and chunks[-1].choices == []


def test_completions_both_ways(gw):
    base, _ = gw
    c = client(base)
    r = c.completions.create(model="fake-model", prompt="once upon a time", max_tokens=2)
    assert r.choices[0].text == " tok tok" and r.usage.completion_tokens == 2
    text = "".join(
        ch.choices[0].text
        for ch in c.completions.create(model="fake-model", prompt=["a", "b"], max_tokens=3, stream=True)
        if ch.choices
    )
    assert text == " tok" * 3


def test_models_proxied_health_and_metrics(gw):
    base, _ = gw
    assert [m.id for m in client(base).models.list()] == ["fake-model"]
    assert HTTP.get(base + "/v1/models").status_code == 401
    assert HTTP.get(base + "/v1/models", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
    health = HTTP.get(base + "/healthz").json()
    assert health["status"] == "ok" and health["backends"][0]["healthy"]
    text = HTTP.get(base + "/metrics").text
    for name in (
        "fairserve_gateway_service_total",
        "fairserve_gateway_prompt_tokens_total",
        "fairserve_gateway_output_tokens_total",
        "fairserve_gateway_queue_length",
        "fairserve_gateway_queue_wait_seconds_bucket",
        "fairserve_gateway_requests_total",
        "fairserve_gateway_backlogged_counter_spread",
        "fairserve_gateway_jain_index",
        "fairserve_gateway_backend_inflight_requests",
        "fairserve_gateway_backend_inflight_tokens",
        "fairserve_gateway_counter",
    ):
        assert name in text, name
    assert metric(base, "fairserve_gateway_requests_total", tenant="alice", outcome="ok") >= 1
    assert admin_tenants(base)["alice"]["service"] > 0


def test_models_fallback_to_configured_names():
    with serve(extra_backends=["http://127.0.0.1:9"], models=["configured-model"]) as base:
        r = HTTP.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEYS['bob']}"})
        assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["configured-model"]


def test_engine_tenant_names_the_tenant_to_the_engine():
    fake = FakeBackend()
    with serve(fake, backend_options={"engine_tenant": True}) as base:
        body = chat_body(3, vllm_xargs={"other": 1})
        assert HTTP.post(base + "/v1/chat/completions", json=body, headers=auth("bob")).status_code == 200
    assert fake.bodies[-1]["vllm_xargs"] == {"other": 1, "fairserve_client": "bob"}
    plain = FakeBackend()
    with serve(plain) as base:
        HTTP.post(base + "/v1/chat/completions", json=chat_body(3), headers=auth("bob"))
    assert "vllm_xargs" not in plain.bodies[-1]
