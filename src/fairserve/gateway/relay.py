"""Relaying one streamed (SSE) response: events pass through unchanged while their output tokens are charged.

The gateway always asks the backend for `include_usage`; the usage chunk settles the account and is stripped from
what the client sees unless the client asked for it. `prefetch()` reads up to the first event with output, so a
backend that fails before producing anything can still be retried elsewhere, and the client never sees it.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..api.errors import error_body
from .body import delta_tokens, usage_of
from .scheduler import Scheduler, Ticket


class UpstreamFailed(Exception):
    """The backend failed before producing any output."""


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


class Relay:
    def __init__(self, sched: Scheduler, ticket: Ticket, upstream: httpx.Response, kind: str,
                 wants_usage: bool) -> None:
        self.sched, self.ticket, self.upstream = sched, ticket, upstream
        self.kind, self.wants_usage = kind, wants_usage
        self._lines = upstream.aiter_lines()
        self._buffer: list[bytes] = []
        self._usage: tuple[int | None, int | None] = (None, None)
        self._done = False      # saw the backend's [DONE]

    async def _event(self) -> list[str] | None:
        lines: list[str] = []
        async for line in self._lines:
            if line:
                lines.append(line)
            elif lines:
                return lines
        return lines or None

    def _process(self, lines: list[str]) -> tuple[bytes | None, int, bool]:
        """(bytes for the client or None to drop, output tokens in it, whether it is a backend error event)."""
        raw = ("\n".join(lines) + "\n\n").encode()
        data = "\n".join(x[5:].removeprefix(" ") for x in lines if x.startswith("data:"))
        if not data:
            return raw, 0, False
        if data.strip() == "[DONE]":
            self._done = True
            return raw, 0, False
        try:
            doc = json.loads(data)
        except json.JSONDecodeError:
            return raw, 0, False
        if not isinstance(doc, dict):
            return raw, 0, False
        if doc.get("error"):
            return raw, 0, True
        if isinstance(doc.get("usage"), dict):
            self._usage = usage_of(doc)
        if "usage" in doc and not self.wants_usage:
            if not doc.get("choices"):
                return None, 0, False
            doc = {k: v for k, v in doc.items() if k != "usage"}
            raw = sse(doc)
        return raw, delta_tokens(doc, self.kind, self.sched.count_tokens), False

    async def _next(self) -> tuple[bytes | None, int, bool] | None:
        """The next event, processed, with its output tokens charged; None at the end of the stream."""
        lines = await self._event()
        if lines is None:
            return None
        raw, tokens, failed = self._process(lines)
        if tokens:
            self.sched.policy.on_output(self.ticket.req, tokens)
        return raw, tokens, failed

    async def prefetch(self) -> None:
        """Read events until the first with output (or the end). Raises UpstreamFailed if the backend fails first."""
        try:
            while not self._done:
                event = await self._next()
                if event is None:
                    break
                raw, tokens, failed = event
                if failed:
                    raise UpstreamFailed("the backend sent an error event before any output")
                if raw is not None:
                    self._buffer.append(raw)
                if tokens:
                    return
        except httpx.HTTPError as e:
            raise UpstreamFailed(f"the backend stream broke before any output: {e!r}") from None
        if not self._done and self._usage == (None, None):
            raise UpstreamFailed("the backend stream ended before any output")

    def _finish(self) -> None:
        prompt, output = self._usage
        self.sched.end(self.ticket, "ok", prompt_tokens=prompt, output_tokens=output)

    async def body(self) -> AsyncIterator[bytes]:
        # NOTE: settle before forwarding [DONE]: a client may hang up as soon as it reads it
        if self._done:
            self._finish()
        for raw in self._buffer:
            yield raw
        self._buffer.clear()
        try:
            while not self._done:
                event = await self._next()
                if event is None:
                    break
                raw, _, failed = event
                if failed:
                    self.sched.end(self.ticket, "backend_error")
                elif self._done:
                    self._finish()
                if raw is not None:
                    yield raw
                if failed:
                    return
        except httpx.HTTPError as e:
            self.sched.end(self.ticket, "backend_error")
            yield sse(error_body(502, f"the backend failed mid-stream ({type(e).__name__}); the response is "
                                      "incomplete", code="backend_error"))
            return
        if self._done:
            return
        if self._usage == (None, None):
            self.sched.end(self.ticket, "backend_error")
            yield sse(error_body(502, "the backend stream ended early; the response is incomplete",
                                 code="backend_error"))
            return
        self._finish()

    async def close(self) -> None:
        """Always runs last: a stream that did not end by itself was cut off by the client."""
        with anyio.CancelScope(shield=True):
            self.sched.end(self.ticket, "client_disconnected")
            await self.upstream.aclose()


class RelayResponse(StreamingResponse):
    """A StreamingResponse whose relay is closed however the response ends (even if it never started)."""

    def __init__(self, relay: Relay, headers: dict[str, str] | None = None) -> None:
        super().__init__(relay.body(), media_type="text/event-stream", headers=headers)
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
                await self.relay.close()
