"""The relaying of one streamed (SSE) response from a backend (gateway/relay/upstream.py) to the client.

`Relay` passes a backend's events through unchanged while their output tokens are charged. The gateway always asks
the backend for `include_usage`; the usage chunk settles the account and is stripped from what the client sees
unless the client asked for it. `prefetch()` reads up to the first event with output, so a backend that fails before
producing anything can still be retried elsewhere, and the client never sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ...api.errors import error_body
from ...api.protocol import parse_json, sse
from ...api.responses import FINAL_EVENTS
from ..admission.scheduler import Scheduler
from ..admission.ticket import Ending, Ticket
from ..http.body import RESPONSES, delta_tokens, responses_delta_tokens, usage_of
from .pipe import Buffers, Pipe
from .stalls import Watched
from .upstream import UpstreamError, UpstreamFailed, UpstreamResponse

GARBLED = "the backend sent an event that is not a JSON object"


class Relay:
    def __init__(
        self,
        sched: Scheduler,
        ticket: Ticket,
        upstream: UpstreamResponse,
        kind: str,
        wants_usage: bool,
        buffers: Buffers | None = None,
    ) -> None:
        self.sched, self.ticket, self.upstream = sched, ticket, upstream
        self.buffers = buffers if buffers is not None else Buffers()
        self.kind, self.wants_usage = kind, wants_usage
        self._pending = b""  # bytes of an event not complete yet
        self._eof = False
        self._buffer: list[bytes] = []  # what prefetch read, for the client
        self._usage: tuple[int | None, int | None] = (None, None)
        self._done = False  # saw the backend's [DONE]
        self.watched: Watched | None = None  # the stall watch's record of this stream (gateway/relay/stalls.py)

    async def _events(self) -> list[bytes] | None:
        """The complete events that have arrived (at least one), without their blank line; None at the end."""
        while not self._eof:
            data = await self.upstream.next_chunk()
            if data is None:
                self._eof = True
                break
            buf = self._pending + data if self._pending else data
            if b"\r" in buf:  # SSE allows CRLF and CR line ends: make them LF (keep a CR that may pair)
                tail = b"\r" if buf.endswith(b"\r") else b""
                buf = (buf[:-1] if tail else buf).replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
            if b"\n\n" not in buf:
                self._pending = buf
                continue
            *events, self._pending = buf.split(b"\n\n")
            events = [e.lstrip(b"\n") for e in events]
            events = [e for e in events if e]
            if events:
                return events
        rest = self._pending.strip(b"\r\n")
        self._pending = b""
        return [rest] if rest else None

    def _process(self, event: bytes) -> tuple[bytes | None, int, str]:
        """(bytes for the client or None to drop, output tokens in it, and if the stream failed there, why: the
        backend's own error event, passed on, or an event that is not JSON, replaced by a `backend_error` event)."""
        raw = event + b"\n\n"
        if event.startswith(b"data: ") and b"\n" not in event:
            data = event[6:]
        else:
            lines = event.split(b"\n")
            data = b"\n".join(x[6:] if x.startswith(b"data: ") else x[5:] for x in lines if x.startswith(b"data:"))
            if not any(x.startswith(b"data:") for x in lines):
                return raw, 0, ""
        if data.strip() == b"[DONE]":
            self._done = True
            return raw, 0, ""
        try:
            doc = parse_json(data, surrogates=True)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):  # NOTE: the OpenAI SDK fails on such an event: the backend's stream is broken
            return sse(error_body(502, GARBLED + "; the response is incomplete", code="backend_error")), 0, GARBLED
        if self.kind == RESPONSES:
            return self._response_event(doc, raw)
        if doc.get("error"):
            return raw, 0, "the backend sent an error event"
        if "usage" in doc:
            if isinstance(doc["usage"], dict):
                self._usage = usage_of(doc)
            if not self.wants_usage:
                if not doc.get("choices"):
                    return None, 0, ""
                doc = {k: v for k, v in doc.items() if k != "usage"}
                raw = sse(doc)
        return raw, delta_tokens(doc, self.kind, self.sched.count_tokens), ""

    def _response_event(self, doc: dict[str, Any], raw: bytes) -> tuple[bytes | None, int, str]:
        """A Responses stream event: its text deltas are charged; the final event (`response.completed`, or
        `.incomplete`) carries the usage it is reconciled to and ends the stream (there is no [DONE]); `error` and
        `response.failed` are the backend's failure, passed on."""
        kind = doc.get("type")
        if kind == "error" or kind == "response.failed":
            return raw, 0, f"the backend sent {kind!r}"
        if kind in FINAL_EVENTS:
            self._done = True
            self._usage = usage_of(doc.get("response"), RESPONSES)
            return raw, 0, ""
        return raw, responses_delta_tokens(doc, self.sched.count_tokens), ""

    async def prefetch(self) -> None:
        """Read events until the first with output (or the end). Raises UpstreamFailed if the backend fails first.
        Events that arrived with that one are processed (and charged) too."""
        try:
            while not self._done:
                events = await self._events()
                if events is None:
                    break
                produced = False
                for event in events:
                    if self._done:
                        break
                    raw, tokens, failed = self._process(event)
                    if failed:
                        if produced:  # the error comes after output: the client sees it
                            self._buffer.append(raw)  # type: ignore[arg-type]
                            self._failed = True
                            return
                        raise UpstreamFailed(f"{failed} before any output")
                    if tokens:
                        self.sched.output(self.ticket, tokens)
                        produced = True
                    if raw is not None:
                        self._buffer.append(raw)
                if produced:
                    return
        except UpstreamError as e:
            raise UpstreamFailed(f"the backend stream broke before any output: {e.kind}", e.kind) from None
        if not self._done and self._usage == (None, None):
            raise UpstreamFailed("the backend stream ended before any output")

    _failed = False

    def _finish(self) -> None:
        prompt, output = self._usage
        self.ticket.ending = Ending("ok", prompt, output)

    def _broke(self) -> None:
        self.ticket.ending = Ending("backend_error")

    async def _send(self, send: Any, out: list[bytes], more: bool) -> None:
        body = b"".join(out)
        if self.watched is not None:
            self.watched.written += len(body)
        await send({"type": "http.response.body", "body": body, "more_body": more})

    async def send_body(self, send: Any, left: Callable[[], bool] = lambda: False) -> None:
        """Stream the rest to the client as ASGI body messages, recording how the stream ended on the ticket
        (nothing if the client left first). The backend is read as fast as it sends, into the stream's buffer
        (gateway/relay/pipe.py), and its slot is freed when it has sent everything (`Scheduler.generated`), whether or
        not the client has read it all. `left()`: whether the client has gone, asked after every send (the
        server's send returns silently once it has): the stream stops there, and nothing more is read."""
        # NOTE: recorded before [DONE] is forwarded: a client may hang up as soon as it reads it
        if self._failed:
            self._broke()
            await self._send(send, self._buffer, False)
            return
        if self._done:
            self._finish()
        cfg = self.sched.cfg
        pipe = Pipe(self.buffers, cfg.client_buffer_bytes, cfg.client_buffer_total_bytes, self._buffer)
        self._buffer = []
        reader = asyncio.get_running_loop().create_task(self._read(pipe))
        try:
            more = True
            while more:
                out, more = await pipe.take()
                await self._send(send, out, more)
                if left():
                    return
            await reader  # NOTE: its read of the backend's rest after [DONE] keeps the connection alive
        finally:
            reader.cancel()
            pipe.release()

    async def _read(self, pipe: Pipe) -> None:
        """The backend's events into `pipe`, charged as they arrive, until its end (then its slot is freed)."""
        out: list[bytes] = []
        try:
            while not self._done:
                events = await self._events()
                if events is None:
                    break
                for event in events:
                    raw, tokens, failed = self._process(event)
                    if tokens:
                        self.sched.output(self.ticket, tokens)
                    if failed:
                        self._broke()
                    elif self._done:
                        self._finish()
                    if raw is not None:
                        out.append(raw)
                    if failed:
                        return pipe.end(out)
                    if self._done:
                        break
                if not self._done:
                    await pipe.put(out)
                    out = []
        except UpstreamError as e:
            self._broke()
            if e.kind == "ReadTimeout":
                failure = error_body(
                    504,
                    f"the backend sent nothing for {self.upstream.read_timeout:g} s mid-stream; "
                    "the response is incomplete",
                    code="backend_timeout",
                )
            else:
                failure = error_body(
                    502, f"the backend failed mid-stream ({e.kind}); the response is incomplete", code="backend_error"
                )
            out.append(sse(failure))
            return pipe.end(out)
        except BaseException:
            pipe.end(out)  # NOTE: the writer must not wait for more
            raise
        if not self._done:
            if self._usage == (None, None):
                self._broke()
                out.append(
                    sse(
                        error_body(
                            502, "the backend stream ended early; the response is incomplete", code="backend_error"
                        )
                    )
                )
            else:
                self._finish()
        pipe.end(out)
        if self._done:
            await self._drain()
            # NOTE: after the backend's end of the response, not at [DONE]: it counts the request as running until
            # then, and its slot must not take another request before (a failed stream keeps its slot to the end)
            self.sched.generated(self.ticket)

    async def _drain(self) -> None:
        """After [DONE], read the backend's empty rest to its end, briefly, so that the connection can be kept alive
        (and the backend's slot freed: `send_body`)."""
        self.upstream.read_timeout = min(self.upstream.read_timeout, 2.0)
        try:
            while await self.upstream.next_chunk() is not None:
                pass
        except UpstreamError:
            pass

    def close(self) -> None:
        self.upstream.close()
