"""Shared by the gateway tests (no tests here): a tiny fake OpenAI backend and a gateway on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from fairserve.api.server import running_server
from fairserve.api.tokens import MESSAGE_TOKENS, estimate_tokens, messages_text
from fairserve.gateway import build_config, create_app

KEYS = {"alice": "key-alice", "bob": "key-bob"}
HTTP = httpx.Client(timeout=10)  # one client: building one costs ~40 ms (its TLS context)
ADMIN = "key-admin"


class FakeBackend:
    """Streams N tokens (N = the request's max_tokens, default 5), `delay_s` apart, each `piece` of text.
    Reports usage: prompt = estimate + `prompt_bias`, completion = tokens produced. Fails on demand and records
    streams the client cut off."""

    def __init__(self, delay_s: float = 0.0, piece: str = " tok", prompt_bias: int = 0) -> None:
        self.reset(delay_s, piece, prompt_bias)
        self.app = self._build()

    def reset(self, delay_s: float = 0.0, piece: str = " tok", prompt_bias: int = 0) -> FakeBackend:
        self.delay_s, self.piece, self.prompt_bias = delay_s, piece, prompt_bias
        self.report_usage = True  # False: like a server that ignores include_usage
        self.fail_status: int | None = None  # answer every request with this status
        self.fail_headers: dict[str, str] = {}  # ... and these headers (e.g. Retry-After)
        self.fail_after: int | None = None  # break streams after this many tokens
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's headers
        self.produced: dict[int, int] = {}  # call number -> tokens streamed
        self.cancelled: list[int] = []  # call numbers of streams closed by the client
        self.cancelled_at: dict[int, float] = {}  # call number -> when (time.monotonic) its stream was closed
        self.paused = False  # True: streams produce nothing until it is False again
        return self

    def _usage(self, body: dict[str, Any], chat: bool, produced: int) -> dict[str, int]:
        if chat:  # NOTE: as the gateway estimates it (its messages' text and role markers)
            messages = body.get("messages") or []
            prompt = estimate_tokens(messages_text(messages)) + MESSAGE_TOKENS * len(messages) + self.prompt_bias
        else:
            p = body.get("prompt")
            text = p if isinstance(p, str) else " ".join(x for x in p or [] if isinstance(x, str))
            prompt = estimate_tokens(text) + self.prompt_bias
        return {"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": prompt + produced}

    def _chunk(self, chat: bool, text: str | None, finish: str | None = None) -> dict[str, Any]:
        if chat:
            delta = {"content": text} if text is not None else {"role": "assistant", "content": ""}
            choice = {"index": 0, "delta": delta if finish is None else {}, "finish_reason": finish}
            return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake", "choices": [choice]}
        return {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": "fake",
            "choices": [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}],
        }

    def _build(self) -> FastAPI:
        app = FastAPI()

        async def complete(request: Request, chat: bool):
            try:
                body = json.loads(await request.body())
                assert isinstance(body, dict)
            except Exception:
                return JSONResponse({"error": {"message": "bad json"}}, status_code=400)
            self.calls += 1
            call = self.calls
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            if self.fail_status is not None:
                return JSONResponse(
                    {"error": {"message": "fake failure"}}, status_code=self.fail_status, headers=self.fail_headers
                )
            n = body.get("max_completion_tokens") or body.get("max_tokens") or 5
            n = min(n, 400) if isinstance(n, int) else 5
            if not body.get("stream"):
                await asyncio.sleep(self.delay_s * n)
                self.produced[call] = n
                text = self.piece * n
                choice = (
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                    if chat
                    else {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
                )
                return {
                    "id": "r",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": 0,
                    "model": "fake",
                    "choices": [choice],
                    **({"usage": self._usage(body, chat, n)} if self.report_usage else {}),
                }
            usage = (
                self.report_usage
                and isinstance(body.get("stream_options"), dict)
                and body["stream_options"].get("include_usage")
            )

            async def events():
                done = False
                # NOTE: this test's, even after a reset
                produced, cancelled, cancelled_at = self.produced, self.cancelled, self.cancelled_at
                produced[call] = 0
                try:
                    if chat:
                        yield f"data: {json.dumps(self._chunk(chat, None))}\n\n"
                    for i in range(n):
                        if self.fail_after is not None and i >= self.fail_after:
                            raise RuntimeError("fake backend breaks the stream")
                        await asyncio.sleep(self.delay_s)
                        while self.paused:
                            await asyncio.sleep(0.005)
                        produced[call] += 1
                        yield f"data: {json.dumps(self._chunk(chat, self.piece))}\n\n"
                    yield f"data: {json.dumps(self._chunk(chat, None if chat else '', 'length'))}\n\n"
                    if usage:
                        last = {
                            "id": "c",
                            "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": 0,
                            "model": "fake",
                            "choices": [],
                            "usage": self._usage(body, chat, n),
                        }
                        yield f"data: {json.dumps(last)}\n\n"
                    yield "data: [DONE]\n\n"
                    done = True
                finally:
                    if not done and self.fail_after is None:
                        cancelled.append(call)
                        cancelled_at[call] = time.monotonic()

            return StreamingResponse(events(), media_type="text/event-stream")

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await complete(request, True)

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await complete(request, False)

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "test"}]}

        return app


def config(backends: list[str], **kw: Any):
    """Two tenants (alice, bob), the admin key, `backends` as URLs or backend tables."""
    data: dict[str, Any] = {
        "backends": [b if isinstance(b, dict) else {"url": b} for b in backends],
        "tenants": [{"name": n, "api_keys": [k], "weight": kw.pop(f"weight_{n}", 1.0)} for n, k in KEYS.items()],
        "admin_key": ADMIN,
        "backend_cooldown_s": 0.5,
        "health_interval_s": 0,
    }  # NOTE: no health checks unless a test asks: raw backends count every request
    data.update(kw)
    return build_config(data)


@contextlib.contextmanager
def gateway(urls: list[str], backend_options: dict[str, Any] | None = None, **kw: Any) -> Iterator[str]:
    """A gateway in front of `urls`; yields its base URL."""
    cfg = config([{"url": u, **(backend_options or {})} for u in urls], **kw)
    limits = {"max_header_bytes": cfg.max_header_bytes, "max_headers": cfg.max_headers}  # as the CLI passes them
    with running_server(create_app(cfg), **limits) as base:
        yield base


@contextlib.contextmanager
def serve(
    *fakes: FakeBackend, backend_options: dict[str, Any] | None = None, extra_backends: list[str] = (), **kw: Any
) -> Iterator[str]:
    """Fake backends and a gateway in front of them (extra, e.g. unreachable, backend URLs first)."""
    with contextlib.ExitStack() as stack:
        urls = list(extra_backends) + [stack.enter_context(running_server(f.app)) for f in fakes]
        yield stack.enter_context(gateway(urls, backend_options, **kw))


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.get(tenant, tenant)}"}


def chat_body(tokens: int = 5, stream: bool = False, prompt: str = "hello there, gateway", **kw: Any) -> dict:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "stream": stream,
        **kw,
    }


def admin_tenants(base: str) -> dict[str, dict[str, Any]]:
    doc = HTTP.get(base + "/admin/tenants", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    return {t["name"]: t for t in doc["tenants"]}


def metric(base: str, name: str, **labels: str) -> float:
    """One sample from /metrics (0.0 if absent)."""
    text = HTTP.get(base + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{want}}}" if labels else name):
            return float(value)
    return 0.0


def stream_request(base: str, tenant: str, tokens: int, rcvbuf: int | None = None, **headers: str) -> socket.socket:
    """A raw connection that has sent one streamed chat request (and reads nothing unless the test does);
    `rcvbuf`: its receive buffer (a small one fills at once when the client does not read)."""
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps(chat_body(tokens, stream=True)).encode()
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items()).encode()
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect((host, int(port)))
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
        % (KEYS.get(tenant, tenant).encode(), len(body), extra, body)
    )
    return s


def wait_until(check, timeout_s: float = 5.0, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return check()
