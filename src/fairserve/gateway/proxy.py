"""Forwarding one completion request: read and check it, queue it, wait for the policy, send it to a backend,
retry elsewhere if that backend fails before any output, and relay the answer while charging it.

This is the hot path, so it speaks ASGI directly (no Request/Response objects on the way of a streamed answer)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..api.body import DISCONNECTED, ClientGone, read_body
from ..api.errors import error_response
from ..api.protocol import parse_json
from ..api.streaming import shutting_down
from .body import PATHS, BodyError, Parsed, parse_body, response_output_tokens, upstream_body, usage_of
from .config import redact_text
from .relay import Relay, UpstreamError, UpstreamFailed, UpstreamResponse
from .scheduler import Backend, Ending, Scheduler, Ticket

RETRYABLE = {408, 429}  # and every 5xx: another backend may do better
WATCH_AFTER_S = 0.02  # when a request starts watching for its client's disconnect
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class Failed(Exception):
    """The backend failed this attempt before any output reached the client: `unreachable` (no connection),
    `lost` (the connection broke before an answer) or `timeout` (no answer in time: a 504 if no backend is left)."""

    def __init__(self, detail: str, unreachable: bool = False, lost: bool = False, timeout: bool = False) -> None:
        super().__init__(detail)
        self.unreachable, self.lost, self.timeout = unreachable, lost, timeout

    @classmethod
    def of(cls, backend: Backend, kind: str, detail: str = "") -> Failed:
        """The failure of an upstream hop that broke (`UpstreamError.kind`)."""
        return cls(
            redact_text(f"{backend.name}: {detail or kind}"),
            unreachable=kind in ("ConnectError", "ConnectTimeout"),
            lost=kind in ("ReadError", "RemoteProtocolError"),
            timeout=kind == "ReadTimeout",
        )


class Proxy:
    def __init__(self, sched: Scheduler, upstream: Any) -> None:
        self.sched = sched
        self.cfg = sched.cfg
        self.upstream = upstream

    async def handle(self, scope: Scope, receive: Receive, send: Send, kind: str, tenant: str) -> None:
        sched, metrics = self.sched, self.sched.metrics
        try:
            raw = await read_body(scope, receive, self.cfg.max_body_bytes, self.cfg.client_timeout_s)
        except ClientGone:
            return await Response(status_code=DISCONNECTED)(scope, receive, send)
        if isinstance(raw, Response):  # 408 (a stalled upload) or 413
            metrics.requests.labels(tenant, "client_timeout" if raw.status_code == 408 else "invalid").inc()
            return await raw(scope, receive, send)
        try:
            parsed = parse_body(raw, kind, self.sched.count_tokens)
        except BodyError as e:
            metrics.requests.labels(tenant, "invalid").inc()
            return await error_response(400, str(e), code="invalid_request", param=e.param)(scope, receive, send)
        ticket = sched.new_ticket(tenant, parsed.prompt_tokens, parsed.max_tokens, parsed.n)
        refused = sched.submit(ticket)
        if refused == "queue_full":
            return await error_response(
                429,
                f"tenant {tenant!r} has {self.cfg.queue_limit} requests queued already",
                code="queue_full",
                headers={"Retry-After": "1"},
            )(scope, receive, send)
        if refused is not None:
            window = round(sched.ledger.policy.retry_after_s)
            return await error_response(
                429,
                f"tenant {tenant!r} is over its request rate ({sched.ledger.policy.name})",
                code="rate_limited",
                headers={"Retry-After": str(window)},
            )(scope, receive, send)

        # NOTE: one watcher for the whole request: when the client goes away it cancels this task, whether the
        # request is queued, waiting for the backend, or streaming; the cancellation is then absorbed here. It
        # starts WATCH_AFTER_S in: most short requests are over by then, and a disconnect is noticed that late
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        gone = False
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        def start_watching() -> None:
            nonlocal watcher
            watcher = loop.create_task(watch())

        timer = loop.call_later(WATCH_AFTER_S, start_watching)
        default = "internal_error"
        try:
            await self._serve(ticket, parsed, kind, scope, receive, send)
        except asyncio.CancelledError:
            if not gone:
                # NOTE: not the client: the server's drain ran out (SIGTERM + drain_timeout_s); the request ends
                # with an error the client can read, charged what it produced
                default = "shutdown"
                task.uncancel()
                await shutting_down(bool(scope.get("fairserve.streaming")), scope, receive, send, "gateway")
            else:
                default = "client_disconnected"
                task.uncancel()
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
            # NOTE: the one place an accepted request ends: the ending its path recorded (a stream records "ok"
            # before its last bytes, as the client may hang up the moment it reads them), else how it was cut off
            sched.close(ticket, ticket.ending or Ending(default))

    async def _serve(self, t: Ticket, parsed: Parsed, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve `t` and record its ending on it (`t.ending`); `handle` settles it."""
        body = upstream_body(parsed)
        while True:
            backend = await self.sched.wait(t)
            if backend is None:
                t.ending = Ending("timeout", refund=True)
                response = error_response(
                    503,
                    f"the request waited {self.cfg.queue_ttl_s:g} s in the queue without a free backend",
                    code="queue_timeout",
                    headers={"Retry-After": "1"},
                )
                return await response(scope, receive, send)
            try:
                sent = upstream_body(parsed, t.tenant) if backend.cfg.engine_tenant else body
                return await self._attempt(t, backend, parsed, kind, sent, scope, receive, send)
            except Failed as e:
                if not self.sched.backend_failed(t, e.unreachable, e.lost, str(e)):
                    t.ending = Ending("backend_error", refund=True)
                    if e.timeout:
                        response = error_response(
                            504, f"no backend answered in time; last error: {e}", code="backend_timeout"
                        )
                    else:
                        response = error_response(
                            502, f"no backend could serve the request; last error: {e}", code="backend_error"
                        )
                    return await response(scope, receive, send)

    def _headers(self, backend: Backend, stream: bool) -> list[tuple[str, str]]:
        h = [
            ("content-type", "application/json"),
            ("accept", "text/event-stream" if stream else "application/json"),
            ("accept-encoding", "identity"),
            ("user-agent", "fairserve-gateway"),
        ]
        if backend.cfg.api_key:
            h.append(("authorization", f"Bearer {backend.cfg.api_key}"))
        return h

    async def _attempt(
        self,
        t: Ticket,
        backend: Backend,
        parsed: Parsed,
        kind: str,
        body: bytes,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        try:
            resp = await self.upstream.post(backend.url, PATHS[kind], body, self._headers(backend, parsed.stream))
        except UpstreamError as e:
            raise Failed.of(backend, e.kind) from None
        relay = None
        try:
            if resp.status_code != 200:
                content = await resp.read()
                if resp.status_code >= 500 or resp.status_code in RETRYABLE:
                    raise Failed(f"{backend.name}: HTTP {resp.status_code}")
                self.sched.backend_ok(backend)
                t.ending = Ending("backend_rejected", refund=True)
                return await _passthrough(resp, content)(scope, receive, send)
            if not parsed.stream:
                content = await resp.read()
                self.sched.backend_ok(backend)
                return await self._answer(t, resp, content, kind)(scope, receive, send)
            relay = Relay(self.sched, t, resp, kind, parsed.wants_usage)
            await relay.prefetch()
        except UpstreamFailed as e:
            resp.close()
            raise Failed.of(backend, e.kind, str(e)) from None
        except UpstreamError as e:
            resp.close()
            raise Failed.of(backend, e.kind) from None
        except BaseException:
            resp.close()
            raise
        finally:
            if relay is None:
                resp.close()
        self.sched.backend_ok(backend)
        scope["fairserve.streaming"] = True
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await relay.send_body(send)
        finally:
            relay.close()

    def _answer(self, t: Ticket, resp: UpstreamResponse, content: bytes, kind: str) -> Response:
        try:
            doc = parse_json(content)
        except ValueError:
            doc = None
        prompt, output = usage_of(doc)
        if output is None:
            output = response_output_tokens(doc, kind, self.sched.count_tokens)
        t.ending = Ending("ok", prompt, output)
        return _passthrough(resp, content)


def _passthrough(resp: UpstreamResponse, content: bytes) -> Response:
    media = resp.header(b"content-type")
    return Response(
        content,
        status_code=resp.status_code,
        media_type=media.decode("latin-1") if media is not None else "application/json",
    )
