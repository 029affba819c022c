"""The gateway's upstream hop (aiohttp) and SSE relay, against backends that send exactly the bytes a test chooses:
keep-alive reuse, a kept-alive connection the backend closed, CRLF/CR events split across reads, bodies delimited by
the connection's end, read timeouts, no cookie jar, and backends behind an HTTP proxy from the environment."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.gateway import KEYS, FakeBackend, chat_body, gateway, serve
from support.raw_sockets import chunk, raw_backend, sse_answer

from fairserve.api.server import running_server
from fairserve.gateway.dispatch.pools import Backend
from fairserve.gateway.relay.failures import Failed
from fairserve.gateway.relay.upstream import Upstream, UpstreamError
from fairserve.gateway.settings.backends import BackendConfig

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {KEYS['alice']}"}


EVENTS = [
    chunk("Hello"),
    chunk(" world"),
    chunk(usage={"prompt_tokens": 3, "completion_tokens": 2}),
    b"data: [DONE]\n\n",
]


def stream_text(base: str) -> tuple[str, list[dict]]:
    with httpx.Client(timeout=10) as c:
        r = c.post(base + "/v1/chat/completions", json=chat_body(2, stream=True), headers=AUTH)
        assert r.status_code == 200, r.text
    docs = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return "".join(d["choices"][0]["delta"].get("content", "") for d in docs if d["choices"]), docs


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_events_split_across_reads_and_any_line_end(eol):
    with raw_backend(lambda n, body: sse_answer(EVENTS, split=5, eol=eol)) as (url, _), gateway([url]) as base:
        text, docs = stream_text(base)
    assert text == "Hello world"
    assert all("usage" not in d for d in docs)  # the client did not ask for usage


def test_connection_is_kept_alive_across_requests():
    with raw_backend(lambda n, body: sse_answer(EVENTS, split=4096)) as (url, seen), gateway([url]) as base:
        for _ in range(3):
            assert stream_text(base)[0] == "Hello world"
    assert seen == [1, 1, 1]


def test_a_kept_alive_connection_the_backend_closed_is_retried_on_a_new_one():
    # request 2 arrives on the kept-alive connection, which the backend closes without an answer
    def answer(n, body):
        return None if n == 2 else sse_answer(EVENTS, split=4096)

    with raw_backend(answer) as (url, seen), gateway([url]) as base:
        assert stream_text(base)[0] == "Hello world"
        assert stream_text(base)[0] == "Hello world"
    assert seen == [1, 1, 2]


def test_body_delimited_by_the_end_of_the_connection_and_read_timeouts():
    doc = {"id": "r", "choices": [{"index": 0, "message": {"content": "hi"}}]}
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n"

    async def read(url: str, timeout: float) -> bytes:
        up = Upstream(connect_timeout=2, read_timeout=timeout)
        resp = await up.post(url, "/v1/chat/completions", b"{}", [])
        assert resp.status_code == 200 and resp.header(b"content-type") == b"application/json"
        try:
            return await resp.read()
        finally:
            resp.close()

    # b"" last: the backend closes the connection after its answer, which ends the body
    with raw_backend(lambda n, body: [head, json.dumps(doc).encode(), b""]) as (url, _):
        assert json.loads(asyncio.run(read(url, 5))) == doc
    # kept open: the body never ends, and the read times out
    with raw_backend(lambda n, body: [head, json.dumps(doc).encode()]) as (url, _):
        with pytest.raises(UpstreamError) as e:
            asyncio.run(read(url, 0.3))
        assert e.value.kind == "ReadTimeout"


def test_cookies_a_backend_sets_are_not_sent_on_later_requests():
    requests: list[bytes] = []

    def answer(n: int, request: bytes) -> list[bytes]:
        requests.append(request)
        head, _, rest = sse_answer(EVENTS, split=1 << 16)[0].partition(b"\r\n")
        return [head + b"\r\nset-cookie: session=tenant-a\r\n" + rest]

    with raw_backend(answer) as (url, _), gateway([url]) as base:
        for _ in range(2):
            assert stream_text(base)[0] == "Hello world"
    assert len(requests) == 2 and all(b"cookie" not in r.lower().partition(b"\r\n\r\n")[0] for r in requests)


def test_unreachable_backend_is_a_connect_error():
    async def run() -> None:
        up = Upstream(connect_timeout=2, read_timeout=2)
        with pytest.raises(UpstreamError) as e:
            await up.post("http://127.0.0.1:9", "/v1/completions", b"{}", [])
        assert (
            e.value.kind == "ConnectError"
            and Failed.of(Backend(BackendConfig(url="http://x")), e.value.kind).unreachable
        )

    asyncio.run(run())


def test_backend_behind_a_proxy_from_the_environment(monkeypatch):
    fake = FakeBackend()
    # NOTE: the fake backend doubles as the proxy: it answers the absolute-form request sent to a proxy
    with running_server(fake.app) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.delenv("no_proxy", raising=False)
        with gateway(["http://backend.invalid:8000"]) as base, httpx.Client(timeout=10, trust_env=False) as c:
            r = c.post(base + "/v1/chat/completions", json=chat_body(3, stream=True), headers=AUTH)
    assert r.status_code == 200 and r.text.count("tok") == 3 and fake.calls == 1


def test_client_body_goes_upstream_with_include_usage_added():
    fake = FakeBackend()
    with serve(fake) as base, httpx.Client(timeout=10) as c:
        raw = b'{"model": "m", "messages": [{"role": "user", "content": "h\\u00e9"}], "stream": true} \n'
        r = c.post(base + "/v1/chat/completions", content=raw, headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 200
    assert fake.bodies[0] == {
        "model": "m",
        "messages": [{"role": "user", "content": "hé"}],
        "stream": True,
        "max_tokens": 512,  # NOTE: the gateway's bound, sent when the client sets none
        "stream_options": {"include_usage": True},
    }
