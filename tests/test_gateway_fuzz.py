"""Hypothesis: no request body or header makes the gateway itself answer 5xx."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, auth, serve

pytestmark = pytest.mark.integration

FIELDS = [
    "model",
    "messages",
    "prompt",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream_options",
    "include_usage",
    "role",
    "content",
    "text",
    "weight",
    "type",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 10**12),
    st.integers(2**31 - 2, 10**40),
    st.sampled_from([10**400, -(10**400)]),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.just("fake-model"),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4)),
    max_leaves=12,
)
messages = st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), values, max_size=3), max_size=3)
near_valid = st.fixed_dictionaries(
    {"model": st.one_of(st.just("fake-model"), values), "messages": st.one_of(messages, values)},
    optional={
        "prompt": values,
        "stream": st.one_of(st.booleans(), values),
        "max_tokens": st.integers(-1, 50) | values,
        "stream_options": values,
        "n": values,
        "weight": values,
    },
)
bodies = st.one_of(
    near_valid.map(lambda d: json.dumps(d).encode()),
    values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.text(max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.just(b'{"model": "m", "messages": [{"content": "' + b"x" * 3000 + b'"}]}'),
)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20).map(str.strip)
authorization = st.one_of(
    st.none(),
    header_text,
    st.sampled_from([f"Bearer {KEYS['alice']}", f"bearer {KEYS['bob']}", f"Bearer {ADMIN}", "Bearer", "Basic abc"]),
)
paths = st.sampled_from(
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/healthz",
        "/metrics",
        "/admin/tenants",
        "/admin/reset",
        "/admin/tenants/alice/weight",
        "/admin/tenants/x/weight",
        "/v1/nothing",
    ]
)


FAKE = FakeBackend()


@pytest.fixture(scope="module")
def gw():
    with serve(FAKE, trusted_proxy=True, max_body_bytes=2048, queue_limit=4) as base:
        yield base


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n"])
@pytest.mark.parametrize("value", [b"2147483648", b"1" + b"0" * 30, b"1" + b"0" * 400])
def test_integers_past_the_maximum_are_refused_not_forwarded(gw, field, value):
    before = len(FAKE.bodies)
    r = HTTP.post(
        gw + "/v1/chat/completions",
        headers={**auth("alice"), "Content-Type": "application/json"},
        content=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "%s": %s}' % (field.encode(), value),
    )
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == field and len(FAKE.bodies) == before


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    method=st.sampled_from(["POST", "GET", "PUT"]),
    path=paths,
    body=bodies,
    auth=authorization,
    tenant=st.one_of(st.none(), st.sampled_from(["alice", "bob", "eve"]), header_text),
    content_type=st.one_of(st.none(), st.sampled_from(["application/json", "text/plain"]), header_text),
)
def test_no_5xx_from_the_gateway(gw, method, path, body, auth, tenant, content_type):
    headers = {
        k: v
        for k, v in [("Authorization", auth), ("X-Tenant-Id", tenant), ("Content-Type", content_type)]
        if v is not None
    }
    with HTTP.stream(method, gw + path, content=body if method != "GET" else None, headers=headers) as r:
        r.read()
        assert r.status_code < 500, (r.status_code, r.text[:300])
        if r.status_code >= 400 and path.startswith("/v1"):
            assert "error" in json.loads(r.text)
