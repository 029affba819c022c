"""An internet-facing gateway: /metrics that scales with the tenants in use, constant-time key checks, throttled
wrong keys (per address and per key, never a valid key), bounded headers, request ids end to end, and TLS."""

from __future__ import annotations

import hmac
import logging
import re
import ssl
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, admin_tenants, auth, chat_body, serve, wait_until
from support.raw_sockets import closed_within, connect

from fairserve.api.server import free_port, running_server
from fairserve.gateway import build_config, create_app

pytestmark = pytest.mark.integration

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


# ---- 3. /metrics with many tenants ----------------------------------------------------------------------------------
def test_metrics_show_only_tenants_in_use_and_no_created_series():
    n, used = 2000, 20
    tenants = [{"name": f"t{i:04d}", "api_keys": [f"k{i}"]} for i in range(n)]
    fake = FakeBackend()
    with running_server(fake.app) as url:
        cfg = build_config(
            {"backends": [{"url": url}], "tenants": tenants, "admin_key": ADMIN, "health_interval_s": 0}
            | {"metrics_window_s": 1.0}
        )
        with running_server(create_app(cfg)) as base:
            for i in range(used):
                r = HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth(f"k{i}"))
                assert r.status_code == 200
            text = HTTP.get(base + "/metrics").text
            families = {f.name: f for f in text_string_to_metric_families(text)}  # valid exposition text
            assert set(re.findall(r'tenant="([^"]+)"', text)) == {f"t{i:04d}" for i in range(used)}
            assert "_created" not in text and len(text.splitlines()) < 40 * used + 60
            assert {s.labels["outcome"] for s in families["fairserve_gateway_requests"].samples} == {"ok"}
            assert len(admin_tenants(base)) == n  # the admin API still lists every tenant
            # a second later the tenants leave the exposition; their counts come back with their next request
            assert wait_until(lambda: 'tenant="t0000"' not in HTTP.get(base + "/metrics").text, 5)
            assert HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth("k0")).status_code == 200
            again = HTTP.get(base + "/metrics").text
            assert 'fairserve_gateway_requests_total{outcome="ok",tenant="t0000"} 2.0' in again


# ---- 8. keys, 401s, headers, request ids, TLS -----------------------------------------------------------------------
def test_admin_and_metrics_keys_are_compared_in_constant_time(monkeypatch):
    seen = []
    real = hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    with serve(FakeBackend(), metrics_key="mk-secret") as base:
        assert HTTP.get(base + "/admin/tenants", headers=ADMIN_H).status_code == 200
        assert HTTP.get(base + "/metrics", headers={"Authorization": "Bearer mk-secret"}).status_code == 200
        # a key that is not ASCII is refused like any other wrong key
        assert HTTP.get(base + "/admin/tenants", headers={"Authorization": b"Bearer k\xe9y"}).status_code == 401
        assert HTTP.get(base + "/metrics", headers={"Authorization": b"Bearer k\xe9y"}).status_code == 401
    assert (ADMIN.encode(), ADMIN.encode()) in seen and (b"mk-secret", b"mk-secret") in seen


def test_wrong_keys_from_one_address_throttle_its_wrong_keys_never_its_valid_ones():
    with serve(FakeBackend(), auth_failure_limit=5, auth_failure_window_s=60.0, metrics_key="mk-secret") as base:
        tries = [("POST", "/v1/chat/completions"), ("GET", "/admin/tenants"), ("GET", "/v1/models")]
        tries += [("POST", "/v1/completions"), ("POST", "/admin/reset")]
        for i, (method, path) in enumerate(tries):  # every 401 counts, each with another key (a scan)
            r = HTTP.request(method, base + path, json=chat_body(), headers={"Authorization": f"Bearer guess-{i}"})
            assert r.status_code == 401
        for headers in ({"Authorization": "Bearer guess-5"}, {}):  # a wrong key, or none: refused before any work
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=headers)
            assert r.status_code == 429 and r.json()["error"]["code"] == "auth_throttled"
            assert 1 <= int(r.headers["retry-after"]) <= 60
        assert HTTP.get(base + "/admin/tenants", headers={"Authorization": "Bearer guess-6"}).status_code == 429
        # the neighbours behind the same address, and its operator, are served as ever
        assert HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth("alice")).status_code == 200
        assert HTTP.get(base + "/v1/models", headers=auth("bob")).status_code == 200
        assert HTTP.get(base + "/admin/tenants", headers=ADMIN_H).status_code == 200
        assert HTTP.get(base + "/metrics", headers={"Authorization": "Bearer mk-secret"}).status_code == 200
        assert HTTP.get(base + "/admin/tenants", headers=auth("alice")).status_code == 403  # a tenant's key: as ever
        assert (
            HTTP.get(base + "/healthz").status_code == HTTP.get(base + "/livez").status_code == 200
        )  # probes: never throttled
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers={"Authorization": "Bearer guess-7"})
        assert r.status_code == 429  # and wrong keys still are not


def test_one_wrong_key_is_throttled_from_every_address(monkeypatch):
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)  # NOTE: uvicorn's default: X-Forwarded-For from loopback
    with serve(FakeBackend(), auth_failure_limit=3, auth_failure_window_s=60.0) as base:

        def post(key: str, address: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}", "X-Forwarded-For": address}
            return HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=headers)

        for i in range(3):  # three pods, one stale key: no address has failed twice
            assert post("stale-key", f"10.0.0.{i}").status_code == 401
        r = post("stale-key", "10.0.9.9")  # the key, from an address that never failed
        assert r.status_code == 429 and r.json()["error"]["code"] == "auth_throttled"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert post("other-wrong-key", "10.0.9.9").status_code == 401  # the address is not throttled: each is its own
        assert post(KEYS["alice"], "10.0.0.0").status_code == 200


def test_headers_are_bounded_in_size_and_count():
    with serve(FakeBackend(), max_header_bytes=8192, max_headers=20) as base:
        for extra in (b"".join(b"x-h%d: v\r\n" % i for i in range(25)), b"x-big: " + b"v" * 10000 + b"\r\n"):
            with connect(base) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + extra + b"\r\n")
                data = closed_within(s, 5)
            assert data.startswith(b"HTTP/1.1 431") and b"headers_too_large" in data, data[:200]
        with connect(base) as s:  # a big header sent slowly is refused before it ends
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ")
            for _ in range(9):  # NOTE: no more than it takes: unread bytes would make the close a reset
                s.sendall(b"v" * 1000)
                time.sleep(0.01)
            assert closed_within(s, 5).startswith(b"HTTP/1.1 431")
        ok = HTTP.get(base + "/healthz", headers={f"x-h{i}": "v" * 100 for i in range(15)})
        assert ok.status_code == 200


def test_a_request_id_is_taken_or_made_sent_upstream_returned_and_logged(caplog):
    fake = FakeBackend()
    caplog.set_level(logging.DEBUG, logger="fairserve.gateway")
    with serve(fake) as base:
        for stream in (False, True):
            r = HTTP.post(
                base + "/v1/chat/completions",
                json=chat_body(2, stream=stream),
                headers={**auth("alice"), "x-request-id": "req-42.a"},
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == "req-42.a"
            assert fake.headers[-1]["x-request-id"] == "req-42.a"
        for given in ({}, {"x-request-id": "x" * 200}, {"x-request-id": "a b"}):  # none, or not one we keep
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers={**auth("bob"), **given})
            made = r.headers["x-request-id"]
            assert re.fullmatch(r"[0-9a-f]{32}", made) and fake.headers[-1]["x-request-id"] == made
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "who-1"})
        assert r.status_code == 401 and r.headers["x-request-id"] == "who-1"
    assert any("request req-42.a" in m and "ok" in m for m in caplog.messages), caplog.messages


def test_tls_with_a_self_signed_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        capture_output=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairserve", "gateway", "--listen", f"127.0.0.1:{port}", "--tenant", "a:k"]
        + ["--backend", "http://127.0.0.1:1", "--health-interval", "0"]
        + ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        trusted = ssl.create_default_context(cafile=str(cert))

        def up() -> bool:
            try:
                return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=trusted, timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        assert wait_until(up, 30) and proc.poll() is None
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served there
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        with pytest.raises(httpx.ConnectError):  # nor is a certificate nobody vouches for trusted
            httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=2)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert f"https://127.0.0.1:{port}" in err
    bad = subprocess.run(
        [sys.executable, "-m", "fairserve", "gateway", "--backend", "http://b:1", "--tenant", "a:k"]
        + ["--ssl-certfile", str(tmp_path / "missing.pem")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "ssl_certfile: no such file" in bad.stderr and "Traceback" not in bad.stderr
