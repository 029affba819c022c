"""Secrets, health and metrics access, and values that could overflow the accounting, wherever they enter."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.gateway import ADMIN, HTTP, FakeBackend, auth, chat_body, config, serve, wait_until

from fairserve.api.protocol import MAX_INT
from fairserve.api.server import free_port, running_server
from fairserve.core import Ledger, make_policy
from fairserve.gateway import build_config, create_app
from fairserve.gateway.http.body import usage_of
from fairserve.gateway.settings.urls import redact, redact_text

pytestmark = pytest.mark.integration

SECRET = "s3cretpw"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


# ---- secrets ---------------------------------------------------------------------------------------------------------
def test_redact_removes_credentials_from_urls_and_text():
    assert redact(f"http://user:{SECRET}@127.0.0.1:8001/v1") == "http://***@127.0.0.1:8001/v1"
    assert redact("http://127.0.0.1:8001") == "http://127.0.0.1:8001"
    assert SECRET not in redact_text(f"Cannot connect to http://u:{SECRET}@h:1/x and https://{SECRET}@y")


@pytest.mark.parametrize(
    "key, value",
    [
        ("state", f"http://:{SECRET}@h:1/0"),
        ("backends.0.url", f"ftp://u:{SECRET}@h:1"),
        ("backends.0.metrics_url", f"ftp://u:{SECRET}@h"),
        ("state", f"redis:/:{SECRET}@host"),  # malformed: shown masked from the scheme to the @
        ("backends.0.url", f"http:/u:{SECRET}@h:1"),
        ("backends.0.metrics_url", f"http:/u:{SECRET}@h"),
    ],
)
def test_a_refused_url_is_shown_without_its_credentials(key, value):
    from fairserve.gateway.settings.config import build_config

    backend = {"url": value} if key == "backends.0.url" else {"url": "http://b:1"}
    if key == "backends.0.metrics_url":
        backend["metrics_url"] = value
    overrides = {"backends": [backend], "tenants": [{"name": "a", "api_keys": ["k"]}]}
    if key == "state":
        overrides["state"] = value
    with pytest.raises(ValueError, match=f"config key '{key}'") as e:
        build_config(overrides)
    assert SECRET not in str(e.value) and "***@h" in str(e.value)


def test_credentials_in_the_url_never_leave_the_process():
    fake = FakeBackend()
    with running_server(fake.app) as url:
        cred = url.replace("http://", f"http://user:{SECRET}@")
        down = f"http://user:{SECRET}@127.0.0.1:{free_port()}"
        with running_server(create_app(config([down, cred], health_interval_s=0.1))) as base:
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(3), headers=auth("alice"))
            assert r.status_code == 200
            assert wait_until(lambda: not HTTP.get(base + "/healthz").json()["backends"][0]["healthy"])
            shown = [HTTP.get(base + p).text for p in ("/healthz", "/health", "/metrics", "/openapi.json")]
            assert all(SECRET not in text for text in shown) and "***@127.0.0.1" in shown[0]
        # a backend that fails every request: the 502's message names it without its password
        fake.fail_status = 500
        with running_server(create_app(config([cred]))) as base:
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(3), headers=auth("alice"))
            assert r.status_code == 502 and SECRET not in r.text and "***@" in r.text
    assert fake.calls >= 2  # the credentials were used upstream (Basic auth)


def test_credentials_in_the_url_and_an_api_key_is_a_start_up_error():
    with pytest.raises(ValueError, match="not both") as e:
        config([{"url": f"http://user:{SECRET}@127.0.0.1:1", "api_key": "K"}])
    assert SECRET not in str(e.value)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairserve",
            "gateway",
            "--backend",
            f"http://u:{SECRET}@127.0.0.1:1,api_key=K",
            "--tenant",
            "a:k",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not both" in proc.stderr and SECRET not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_metrics_key_protects_metrics_and_must_be_its_own():
    with serve(FakeBackend(), metrics_key="mk") as base:
        assert HTTP.get(base + "/metrics").status_code == 401
        assert HTTP.get(base + "/metrics", headers=auth("alice")).status_code == 401
        assert HTTP.get(base + "/metrics", headers={"Authorization": "Bearer mk"}).status_code == 200
        assert HTTP.get(base + "/healthz").status_code == 200  # load balancers need no key
    with pytest.raises(ValueError, match="metrics_key"):
        config(["http://a:1"], metrics_key=ADMIN)


# ---- health ----------------------------------------------------------------------------------------------------------
def test_healthz_is_503_while_no_backend_is_healthy_and_200_once_one_is():
    fake = FakeBackend()
    port = free_port()
    # NOTE: fail_fast_s 30: the request waits for the backend to come back, which it does within that
    app = create_app(config([f"http://127.0.0.1:{port}"], health_interval_s=0.1, queue_ttl_s=30, fail_fast_s=30))
    with running_server(app) as base:
        assert wait_until(lambda: HTTP.get(base + "/healthz").status_code == 503)
        for path in ("/healthz", "/health"):
            doc = HTTP.get(base + path).json()
            assert doc["status"] == "unavailable" and "unreachable" in doc["reason"]
        with httpx.Client(timeout=30) as c, ThreadPoolExecutor(1) as pool:
            # a request while it is down waits instead of failing; the backend comes up; it is served
            pending = pool.submit(c.post, base + "/v1/chat/completions", json=chat_body(3), headers=auth("bob"))
            assert wait_until(lambda: HTTP.get(base + "/healthz").json()["queued"] == 1)
            with running_server(fake.app, port=port):
                assert pending.result(30).status_code == 200
                assert HTTP.get(base + "/health").status_code == 200
    assert fake.calls == 1  # no client request was spent finding out it was down


def test_with_every_backend_down_a_request_fails_fast_saying_so():
    """No backend of the pool up: a queued request fails `fail_fast_s` after the pool went down, a later one at
    once, each a 503 `backend_unavailable` naming the backend, with a Retry-After (through the official client)."""
    port = free_port()
    app = create_app(config([f"http://127.0.0.1:{port}"], health_interval_s=0.1, queue_ttl_s=300, fail_fast_s=1))
    with running_server(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="key-alice", max_retries=0, timeout=30)
        assert wait_until(lambda: HTTP.get(base + "/healthz").status_code == 503)
        down_at = time.monotonic()  # NOTE: within a check (0.1 s) of when the gateway saw it down
        for waited_at_most in (1.0 + 1.0, 0.5):  # queued until the pool's second, then one arriving after it
            t = time.monotonic()
            with pytest.raises(openai.APIStatusError) as err:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            e = err.value
            assert e.status_code == 503 and e.body["code"] == "backend_unavailable", e.body
            assert f"127.0.0.1:{port}" in e.message and "unreachable" in e.message
            assert int(e.response.headers["retry-after"]) >= 1
            assert time.monotonic() - t < waited_at_most  # not queue_ttl_s (300 s)
        assert time.monotonic() - down_at >= 0.9  # the first waited for the pool's second, not less
        rows = {r["name"]: r for r in HTTP.get(base + "/admin/tenants", headers=ADMIN_H).json()["tenants"]}
        assert rows["alice"]["queue_length"] == 0 and rows["alice"]["service"] == 0  # refunded, nothing left queued


# ---- values that could overflow the accounting -----------------------------------------------------------------------
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**1100), max_value=2**1100),
    st.sampled_from([5e-324, 1e-300, 1e-7, 1e-6, 1e6, 1e308, 10**30]),
)


@settings(max_examples=150, deadline=None)
@given(weight=numbers, w_p=numbers, w_q=numbers, prompt=st.integers(0, MAX_INT), output=st.integers(0, MAX_INT))
def test_any_config_accepted_keeps_every_counter_finite(weight, w_p, w_q, prompt, output):
    data = {
        "backends": [{"url": "http://a:1"}],
        "w_p": w_p,
        "w_q": w_q,
        "tenants": [{"name": "a", "api_keys": ["k"], "weight": weight}, {"name": "b", "api_keys": ["j"]}],
    }
    try:
        cfg = build_config(data)
    except (ValueError, OverflowError) as e:
        assert isinstance(e, ValueError) and "\n" not in str(e)
        return
    ledger = Ledger(make_policy(cfg.policy, w_p=cfg.w_p, w_q=cfg.w_q), ["a", "b"], cfg.weights())
    for i in range(3):  # the largest counts a request can carry, thrice
        req = ledger.arrive(i, "a", prompt, MAX_INT)
        ledger.pop()
        ledger.output(req, output)
        ledger.settle(req, prompt=prompt, output=output)
    assert all(math.isfinite(t.counter) and math.isfinite(t.service) for t in ledger.view().tenants.values())


def test_usage_a_backend_reports_is_bounded():
    assert usage_of({"usage": {"prompt_tokens": 10**400, "completion_tokens": 2**31}}) == (None, None)
    assert usage_of({"usage": {"prompt_tokens": MAX_INT, "completion_tokens": -1}}) == (MAX_INT, None)


@pytest.fixture(scope="module")
def live():
    fake = FakeBackend()
    with running_server(fake.app) as url, running_server(create_app(config([url]))) as base:
        yield base, fake


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(weight=numbers, max_tokens=st.one_of(numbers, st.none()), usage=st.integers(0, 2**70))
def test_any_value_accepted_keeps_the_admin_api_and_metrics_answering(live, weight, max_tokens, usage):
    base, fake = live
    # NOTE: json.dumps writes NaN and Infinity (which the gateway must refuse) where httpx' json= would raise
    r = HTTP.put(base + "/admin/tenants/bob/weight", content=json.dumps({"weight": weight}), headers=ADMIN_H)
    assert r.status_code in (200, 400)
    fake.prompt_bias = usage  # the backend reports absurd usage; the gateway must bound it
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": max_tokens})
    r = HTTP.post(base + "/v1/completions", content=body, headers={**auth("bob"), "content-type": "application/json"})
    assert r.status_code in (200, 400)
    tenants = HTTP.get(base + "/admin/tenants", headers=ADMIN_H)
    assert tenants.status_code == 200
    assert all(math.isfinite(t[k]) for t in tenants.json()["tenants"] for k in ("counter", "service", "weight"))
    assert HTTP.get(base + "/metrics").status_code == 200
    assert HTTP.put(base + "/admin/tenants/bob/weight", json={"weight": 1e6}, headers=ADMIN_H).status_code == 200


def test_huge_integers_and_tiny_weights_are_refused_where_they_enter():
    with serve(FakeBackend()) as base:
        for raw in (b"10" + b"0" * 30, b"1" + b"0" * 400):
            body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + raw + b"}"
            r = HTTP.post(
                base + "/v1/chat/completions",
                content=body,
                headers={**auth("alice"), "content-type": "application/json"},
            )
            assert r.status_code == 400 and "too large" in r.json()["error"]["message"]
        for weight in (b"5e-324", b"1e-300", b"1e308", b"1" + b"0" * 400):
            r = HTTP.put(base + "/admin/tenants/bob/weight", content=b'{"weight": ' + weight + b"}", headers=ADMIN_H)
            assert r.status_code == 400, weight
    import argparse

    from fairserve.gateway.cli import add_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    for flag in ("--tenant=a:k1:1e-320", "--w-p=1e308", "--w-q=inf", "--default-max-tokens=99999999999"):
        args = parser.parse_args(["gateway", "--backend", "http://b:1", "--tenant", "x:k", flag])
        with pytest.raises(ValueError):
            config_from_args(args)
