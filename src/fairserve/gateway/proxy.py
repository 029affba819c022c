"""Forwarding one completion request: read and check it, queue it, wait for the policy, send it to a backend,
retry elsewhere if that backend fails before any output, and relay the answer while charging it."""
from __future__ import annotations

import asyncio
import contextlib

import httpx
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..api.errors import error_response
from .body import PATHS, BodyError, Parsed, parse_body, response_output_tokens, upstream_body, usage_of
from .relay import Relay, RelayResponse, UpstreamFailed
from .scheduler import Backend, Scheduler, Ticket

RETRYABLE = {408, 429}           # and every 5xx: another backend may do better
DISCONNECTED = 499               # nginx's "client closed request"; nobody is left to read it


class Failed(Exception):
    """The backend failed this attempt before any output reached the client."""

    def __init__(self, detail: str, unreachable: bool = False) -> None:
        super().__init__(detail)
        self.unreachable = unreachable


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None if it is larger than `limit` bytes (not read any further then)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _disconnect(request: Request) -> None:
    """Returns when the client goes away (the body has been read, so only `http.disconnect` can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Proxy:
    def __init__(self, sched: Scheduler, client: httpx.AsyncClient) -> None:
        self.sched = sched
        self.cfg = sched.cfg
        self.client = client

    async def handle(self, request: Request, kind: str, tenant: str) -> Response:
        sched, metrics = self.sched, self.sched.metrics
        try:
            raw = await read_body(request, self.cfg.max_body_bytes)
        except ClientDisconnect:
            return Response(status_code=DISCONNECTED)
        if raw is None:
            metrics.requests.labels(tenant, "invalid").inc()
            return error_response(413, f"the request body is larger than {self.cfg.max_body_bytes} bytes",
                                  code="body_too_large")
        try:
            parsed = parse_body(raw, kind, self.sched.count_tokens)
        except BodyError as e:
            metrics.requests.labels(tenant, "invalid").inc()
            return error_response(400, str(e), code="invalid_request", param=e.param)
        ticket = sched.new_ticket(tenant, parsed.prompt_tokens, parsed.max_tokens, parsed.n)
        refused = sched.submit(ticket)
        if refused == "queue_full":
            return error_response(429, f"tenant {tenant!r} has {self.cfg.queue_limit} requests queued already",
                                  code="queue_full", headers={"Retry-After": "1"})
        if refused is not None:
            window = round(getattr(sched.policy, "window_s", 1))
            return error_response(429, f"tenant {tenant!r} is over its request rate ({sched.policy.name})",
                                  code="rate_limited", headers={"Retry-After": str(window)})

        work = asyncio.create_task(self._serve(ticket, parsed, kind))
        gone = asyncio.create_task(_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
        if work.cancelled():
            sched.end(ticket, "client_disconnected")
            return Response(status_code=DISCONNECTED)
        return work.result()

    async def _serve(self, t: Ticket, parsed: Parsed, kind: str) -> Response:
        body = upstream_body(parsed)
        try:
            while True:
                backend = await self.sched.wait(t, self.cfg.queue_ttl_s)
                if backend is None:
                    self.sched.end(t, "timeout", refund=True)
                    return error_response(503, f"the request waited {self.cfg.queue_ttl_s:g} s in the queue "
                                          "without a free backend", code="queue_timeout",
                                          headers={"Retry-After": "1"})
                try:
                    return await self._attempt(t, backend, parsed, kind, body)
                except Failed as e:
                    if not self.sched.backend_failed(t, e.unreachable):
                        self.sched.end(t, "backend_error", refund=True)
                        return error_response(502, f"no backend could serve the request; last error: {e}",
                                              code="backend_error")
        except asyncio.CancelledError:
            self.sched.end(t, "client_disconnected")
            raise
        except BaseException:
            self.sched.end(t, "internal_error")
            raise

    def _headers(self, backend: Backend, stream: bool) -> dict[str, str]:
        h = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
        if backend.cfg.api_key:
            h["authorization"] = f"Bearer {backend.cfg.api_key}"
        return h

    async def _attempt(self, t: Ticket, backend: Backend, parsed: Parsed, kind: str, body: bytes) -> Response:
        req = self.client.build_request("POST", backend.url + PATHS[kind], content=body,
                                        headers=self._headers(backend, parsed.stream))
        try:
            resp = await self.client.send(req, stream=parsed.stream)
        except httpx.HTTPError as e:
            raise Failed(f"{backend.url}: {type(e).__name__}",
                         unreachable=isinstance(e, httpx.ConnectError | httpx.ConnectTimeout)) from None
        try:
            if resp.status_code != 200:
                await resp.aread()
                if resp.status_code >= 500 or resp.status_code in RETRYABLE:
                    raise Failed(f"{backend.url}: HTTP {resp.status_code}")
                self.sched.backend_ok(backend)
                self.sched.end(t, "backend_rejected", refund=True)
                return _passthrough(resp)
            if not parsed.stream:
                self.sched.backend_ok(backend)
                return self._settle(t, resp, kind)
            relay = Relay(self.sched, t, resp, kind, parsed.wants_usage)
            await relay.prefetch()
        except UpstreamFailed as e:
            await resp.aclose()
            raise Failed(f"{backend.url}: {e}") from None
        except httpx.HTTPError as e:
            await resp.aclose()
            raise Failed(f"{backend.url}: {type(e).__name__}") from None
        except BaseException:
            await resp.aclose()
            raise
        self.sched.backend_ok(backend)
        return RelayResponse(relay, headers={"cache-control": "no-cache"})

    def _settle(self, t: Ticket, resp: httpx.Response, kind: str) -> Response:
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        prompt, output = usage_of(doc)
        if output is None:
            output = response_output_tokens(doc, kind, self.sched.count_tokens)
        self.sched.end(t, "ok", prompt_tokens=prompt, output_tokens=output)
        return _passthrough(resp)


def _passthrough(resp: httpx.Response) -> Response:
    return Response(resp.content, status_code=resp.status_code,
                    media_type=resp.headers.get("content-type", "application/json"))
