"""What an attacker or a careless operator could do through a request, a backend or the config: no redirect to a
client's Host, no backend garbage relayed as success, no credential shown in any form, Retry-After honoured, error
types, weights that are not numbers, and counters kept across a restart without shared state."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from openai import APIError, OpenAI
from support.gateway import ADMIN, HTTP, KEYS, FakeBackend, admin_tenants, auth, chat_body, config, serve
from support.raw_sockets import chunk, raw_backend, sse_answer
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.api.tokens import MESSAGE_TOKENS, estimate_tokens
from fairserve.gateway import create_app
from fairserve.gateway.settings.urls import redact

pytestmark = pytest.mark.integration

SECRET = "s3cretpw"
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
PROMPT = estimate_tokens("hello there, gateway") + MESSAGE_TOKENS  # chat_body: one message, its role markers


# ---- 4. no redirect built from the client's Host ---------------------------------------------------------------------
def test_a_trailing_slash_is_a_404_never_a_redirect_to_the_clients_host():
    with serve(FakeBackend()) as base:
        paths = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/health", "/metrics"]
        paths += ["/openapi.json", "/admin/tenants", "/admin/reset", "/admin/owners", "/dashboard", "/admin/dashboard"]
        for path in paths:
            for method in ("GET", "POST"):
                r = HTTP.request(
                    method, base + path + "/", headers={**auth("alice"), "host": "evil.example"}, json=chat_body()
                )
                assert r.status_code == 404 and "location" not in r.headers, (method, path, r.status_code)
                assert r.json()["error"]["type"] == "not_found_error"


# ---- 5. a backend's garbage ------------------------------------------------------------------------------------------
GARBAGE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\nnot json!"


def test_a_200_that_is_not_json_is_a_502_charged_nothing_or_retried_elsewhere():
    with raw_backend(lambda n, body: [GARBAGE]) as (bad, _):
        with serve(extra_backends=[bad]) as base:  # the garbage backend alone
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(3), headers=auth("alice"))
            assert r.status_code == 502 and r.json()["error"]["code"] == "backend_error", r.text
            assert "not a JSON object" in r.json()["error"]["message"]
            assert admin_tenants(base)["alice"]["service"] == 0
        good = FakeBackend()
        with serve(good, extra_backends=[bad]) as base:  # it comes first: tried, then the good one
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(3), headers=auth("alice"))
            assert r.status_code == 200 and good.calls == 1
            assert admin_tenants(base)["alice"]["service"] == PROMPT + 2 * 3


def test_a_streamed_event_that_is_not_json_ends_the_stream_with_a_backend_error():
    usage = {"prompt_tokens": PROMPT, "completion_tokens": 1, "total_tokens": PROMPT + 1}
    events = [chunk("Hello"), b"data: {not json\n\n", chunk(" world"), chunk(usage=usage), b"data: [DONE]\n\n"]
    with raw_backend(lambda n, body: sse_answer(events)) as (url, _), serve(extra_backends=[url]) as base:
        client = OpenAI(base_url=base + "/v1", api_key=KEYS["alice"], max_retries=0)
        text = ""
        with pytest.raises(APIError) as e:  # the SDK's own error for an error event: not a JSONDecodeError
            for part in client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            ):
                text += part.choices[0].delta.content or "" if part.choices else ""
        assert text == "Hello" and "not a JSON object" in str(e.value)
        assert admin_tenants(base)["alice"]["service"] > 0  # charged what it produced
    # before any output: tried elsewhere, the client never sees it
    good = FakeBackend()
    with raw_backend(lambda n, body: sse_answer([b"data: garbage\n\n", *events])) as (url, _):
        with serve(good, extra_backends=[url]) as base:
            r = HTTP.post(base + "/v1/chat/completions", json=chat_body(3, stream=True), headers=auth("bob"))
            assert r.status_code == 200 and good.calls == 1 and "garbage" not in r.text and "error" not in r.text


# ---- 6. credentials in every form ------------------------------------------------------------------------------------
def test_redact_hides_the_query_password_and_malformed_urls():
    assert redact(f"redis://h:1/0?password={SECRET}&db=1") == "redis://h:1/0?password=***&db=1"
    assert SECRET not in redact(f"redis:/:{SECRET}@host") and SECRET not in redact(f"http:/u:{SECRET}@h:1")
    assert redact("redis://h:1/0?db=2") == "redis://h:1/0?db=2"
    # NOTE: malformed URLs in config errors: test_gateway_reliability.py


def test_the_query_form_of_a_redis_password_is_shown_nowhere():
    url = f"redis://127.0.0.1:{free_tcp_port()}/0?password={SECRET}"
    proc = subprocess.run(
        [sys.executable, "-m", "fairserve", "gateway", "--backend", "http://127.0.0.1:1", "--tenant", "a:k"]
        + ["--state", url, "--listen", f"127.0.0.1:{free_tcp_port()}"],  # NOTE: not 8080: the README test uses it
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "cannot reach the shared state" in proc.stderr, proc.stderr
    assert SECRET not in proc.stderr and "password=***" in proc.stderr
    with redis_server() as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:  # the password the URL carries
            s.sendall(f"CONFIG SET requirepass {SECRET}\r\n".encode())
            assert s.recv(16).startswith(b"+OK")
        with serve(FakeBackend(), state=f"{server.url}?password={SECRET}") as base:
            health = HTTP.get(base + "/healthz").json()
            assert health["shared_state"]["up"] and SECRET not in json.dumps(health)
            assert health["shared_state"]["url"].endswith("?password=***")


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- 7. Retry-After, error types, weights, restarts ------------------------------------------------------------------
def test_a_backend_that_says_retry_after_is_skipped_and_alone_gives_the_client_a_503_with_it():
    busy, good = FakeBackend(), FakeBackend()
    busy.fail_status, busy.fail_headers = 429, {"Retry-After": "3"}
    with serve(busy, good) as base:
        for _ in range(3):
            assert HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth("alice")).status_code == 200
        assert busy.calls == 1 and good.calls == 3  # asked once, then left alone for 3 s
        assert HTTP.get(base + "/healthz").json()["backends"][0]["busy_for_s"] > 0
    busy.reset().fail_status, busy.fail_headers = 503, {"Retry-After": "7"}
    with serve(busy) as base:
        r = HTTP.post(base + "/v1/chat/completions", json=chat_body(2), headers=auth("alice"))
        assert r.status_code == 503 and r.headers["retry-after"] == "7", (r.status_code, r.text)
        assert r.json()["error"]["code"] == "backend_busy" and admin_tenants(base)["alice"]["service"] == 0


def test_a_405_is_the_clients_error():
    with serve(FakeBackend()) as base:
        r = HTTP.get(base + "/v1/chat/completions", headers=auth("alice"))
        assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf"])
def test_a_weight_that_is_not_a_finite_number_says_so(weight):
    import argparse

    from fairserve.gateway.cli import add_parser, config_from_args

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gateway", "--backend", "http://b:1", "--tenant", f"b:k:{weight}"])
    with pytest.raises(ValueError, match="tenants.0.weight': Input should be a finite number"):
        config_from_args(args)


def test_a_snapshot_keeps_counters_service_and_admin_weights_across_a_restart(tmp_path):
    path = str(tmp_path / "gateway.snapshot")
    fake = FakeBackend()
    with running_server(fake.app) as url:
        cfg = config([url], snapshot=path, snapshot_interval_s=0)
        with running_server(create_app(cfg)) as base:
            for tenant in ("alice", "alice", "bob"):
                assert (
                    HTTP.post(base + "/v1/chat/completions", json=chat_body(4), headers=auth(tenant)).status_code == 200
                )
            assert HTTP.put(base + "/admin/tenants/bob/weight", json={"weight": 3}, headers=ADMIN_H).status_code == 200
            before = admin_tenants(base)
        # the stop (what SIGTERM does) wrote it; a new gateway starts from it
        with running_server(create_app(config([url], snapshot=path))) as base:
            after = admin_tenants(base)
            assert {t: (a["counter"], a["service"], a["weight"]) for t, a in after.items()} == {
                t: (a["counter"], a["service"], a["weight"]) for t, a in before.items()
            }
            assert after["bob"]["weight"] == 3 and after["alice"]["service"] == 2 * (PROMPT + 2 * 4)
        # a weight changed in the config wins over the snapshot's
        with running_server(create_app(config([url], snapshot=path, weight_bob=5.0))) as base:
            assert admin_tenants(base)["bob"]["weight"] == 5
        # without a snapshot: everything from 0
        with running_server(create_app(config([url]))) as base:
            assert admin_tenants(base)["alice"]["service"] == 0
    (tmp_path / "gateway.snapshot").write_text("{not a snapshot")
    with pytest.raises(ValueError, match="cannot be restored.*move it away"):
        create_app(config(["http://127.0.0.1:1"], snapshot=path))
    with pytest.raises(ValueError, match="snapshot"):
        config(["http://127.0.0.1:1"], snapshot=path, state="redis://127.0.0.1:1/0")


def test_a_snapshot_keeps_a_groups_admin_weight_unless_the_config_changed_it(tmp_path):
    from fairserve.core import Ledger, make_policy
    from fairserve.gateway.shared.snapshot import document, restore, write

    path = str(tmp_path / "tree.snapshot")
    configured = {"org/a": 1.0, "org/b": 1.0, "solo": 1.0, "org": 2.0}
    ledger = Ledger(make_policy("vtc"), ["org/a", "org/b", "solo"], {"org": 2.0})
    ledger.set_weight("org", 5.0)  # what PUT /admin/nodes/org/weight does
    write(path, document(ledger, configured))
    again = Ledger(make_policy("vtc"), ["org/a", "org/b", "solo"], {"org": 2.0})
    assert restore(path, again, configured) == 3 and again.groups["org"].weight == 5.0
    changed = Ledger(make_policy("vtc"), ["org/a", "org/b", "solo"], {"org": 3.0})
    restore(path, changed, {**configured, "org": 3.0})
    assert changed.groups["org"].weight == 3.0  # the config's new weight wins
