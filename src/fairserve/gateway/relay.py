"""The upstream hop and the relaying of one streamed (SSE) response.

`Upstream` is a small HTTP/1.1 client (asyncio protocol + the `httptools` parser, keep-alive pool per backend): one
write per request, bytes in, no per-request task. It is the gateway's hot path; `/v1/models` still uses httpx.

`Relay` passes a backend's events through unchanged while their output tokens are charged. The gateway always asks
the backend for `include_usage`; the usage chunk settles the account and is stripped from what the client sees
unless the client asked for it. `prefetch()` reads up to the first event with output, so a backend that fails before
producing anything can still be retried elsewhere, and the client never sees it.
"""
from __future__ import annotations

import asyncio
import collections
import json
import ssl
import urllib.request
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httptools
import httpx
import orjson

from ..api.errors import error_body
from .body import delta_tokens, loads, usage_of
from .scheduler import Scheduler, Ticket

HIGH_WATER = 1 << 18        # pause reading a backend whose answer the client does not take this fast


class UpstreamFailed(Exception):
    """The backend failed before producing any output."""


class UpstreamError(Exception):
    """The upstream hop failed: `kind` names how (ConnectError, ConnectTimeout, ReadTimeout, ReadError,
    RemoteProtocolError); `unreachable`: no connection could be made."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.unreachable = kind in ("ConnectError", "ConnectTimeout")


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def sse_compact(data: Any) -> bytes:
    """`sse()` by orjson (compact, UTF-8): for chunks re-encoded on every event."""
    try:
        return b"data: " + orjson.dumps(data) + b"\n\n"
    except (TypeError, orjson.JSONEncodeError):     # what orjson refuses (huge ints, lone surrogates)
        return sse(data)


# ---- the upstream HTTP/1.1 client ------------------------------------------------------------------------------------
class _Conn(asyncio.Protocol):
    """One keep-alive connection; carries one response at a time."""

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.complete = False
        self.framed = False              # content-length or chunked: the end is known without EOF
        self.keep_alive = False
        self.got_bytes = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None

    # -- protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError("RemoteProtocolError", str(e)))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.headers_done and not self.complete and not self.framed and self.error is None:
            self.complete = True         # a body delimited by the end of the connection
            self._wake()
        elif not self.complete:
            self._fail(UpstreamError("ReadError" if self.got_bytes or exc else "RemoteProtocolError",
                                     "the backend closed the connection"))

    def pause_writing(self) -> None:     # a request is one write; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # -- parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        for name, value in self.headers:
            if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
                self.framed = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()      # read now: the parser resets after this
        self.complete = True
        self._wake()

    # -- waiting
    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, err: UpstreamError) -> None:
        if self.error is None:
            self.error = err
        self._wake()

    async def wait(self, timeout: float) -> None:
        w = self.waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, self._timed_out, w)
        try:
            await w
        finally:
            timer.cancel()
            self.waiter = None

    def _timed_out(self, w: asyncio.Future[None]) -> None:
        if not w.done():
            self._fail(UpstreamError("ReadTimeout"))


class _Origin:
    """Where one backend is (scheme, host, port, path prefix) and its idle connections."""

    def __init__(self, url: str, pool: Upstream) -> None:
        u = urlsplit(url)
        self.pool = pool
        self.tls = u.scheme == "https"
        self.host = u.hostname or "localhost"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc.rpartition("@")[2]
        proxies = urllib.request.getproxies_environment()
        self.proxied = u.scheme in proxies and not urllib.request.proxy_bypass_environment(self.host, proxies)
        self.idle: list[_Conn] = []

    async def connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        kw: dict[str, Any] = {}
        if self.tls:
            kw = {"ssl": self.pool.ssl_context(), "server_hostname": self.host}
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self), self.host, self.port, **kw), self.pool.connect_timeout)
        except TimeoutError:
            raise UpstreamError("ConnectTimeout") from None
        except (OSError, ssl.SSLError) as e:
            raise UpstreamError("ConnectError", str(e)) from None
        return conn

    def take_idle(self) -> _Conn | None:
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None


class UpstreamResponse:
    """A backend's answer: status and headers at once, the body as it arrives."""

    def __init__(self, conn: _Conn, read_timeout: float) -> None:
        self.conn = conn
        self.status_code = conn.status
        self.headers = conn.headers
        self.read_timeout = read_timeout
        self.closed = False

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body (all that has arrived, joined), or None at its end."""
        conn = self.conn
        while True:
            if conn.chunks:
                data = b"".join(conn.chunks) if len(conn.chunks) > 1 else conn.chunks[0]
                conn.chunks.clear()
                conn.buffered = 0
                if conn.paused and conn.transport is not None:
                    conn.paused = False
                    conn.transport.resume_reading()
                return data
            if conn.complete:
                return None
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.read_timeout)

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Back to the pool if the answer was read to its end on a reusable connection, else closed."""
        if self.closed:
            return
        self.closed = True
        conn = self.conn
        if conn.complete and not conn.chunks and conn.error is None and not conn.lost and conn.keep_alive:
            conn._reset()
            conn.reused = True
            conn.origin.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()


class _HttpxResponse:
    """`UpstreamResponse` over an httpx response (backends behind a proxy)."""

    _closing: ClassVar[set[asyncio.Task[None]]] = set()     # closes in flight, kept from the GC

    def __init__(self, resp: httpx.Response, read_timeout: float) -> None:
        self.resp = resp
        self.status_code = resp.status_code
        self.headers = [(k.lower(), v) for k, v in resp.headers.raw]
        self.read_timeout = read_timeout
        self._chunks = resp.aiter_bytes()
        self.closed = False

    header = UpstreamResponse.header

    async def next_chunk(self) -> bytes | None:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        except httpx.HTTPError as e:
            raise UpstreamError(type(e).__name__) from None

    read = UpstreamResponse.read

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            task = asyncio.get_running_loop().create_task(self.resp.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


class Upstream:
    """HTTP/1.1 keep-alive client for the backends: `await post(url, path, body, headers)`."""

    def __init__(self, connect_timeout: float, read_timeout: float) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._origins: dict[str, _Origin] = {}
        self._ssl: ssl.SSLContext | None = None
        self._httpx: httpx.AsyncClient | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()      # what httpx verifies with (certifi, SSL_CERT_FILE/DIR)
        return self._ssl

    def origin(self, url: str) -> _Origin:
        o = self._origins.get(url)
        if o is None:
            o = self._origins[url] = _Origin(url, self)
        return o

    async def post(self, url: str, path: str, body: bytes,
                   headers: list[tuple[str, str]]) -> UpstreamResponse | _HttpxResponse:
        """Send; return once the status line and headers are in. A kept-alive connection the backend closed in
        the meantime (nothing received) is retried once on a new one."""
        o = self.origin(url)
        if o.proxied:
            return await self._via_httpx(url + path, body, headers)
        head = [f"POST {o.prefix}{path} HTTP/1.1\r\nhost: {o.host_header}\r\ncontent-length: {len(body)}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers]
        head.append("\r\n")
        request = "".join(head).encode("latin-1") + body
        while True:
            conn = o.take_idle()
            if conn is None:
                conn = await o.connect()
            try:
                return await self._exchange(conn, request)
            except UpstreamError:
                if conn.transport is not None:
                    conn.transport.close()
                if conn.reused and not conn.got_bytes:
                    continue
                raise
            except BaseException:
                if conn.transport is not None:
                    conn.transport.close()
                raise

    async def _exchange(self, conn: _Conn, request: bytes) -> UpstreamResponse:
        if conn.lost or conn.transport is None:
            raise UpstreamError("ReadError", "the backend closed the connection")
        conn.transport.write(request)
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait(self.read_timeout)
        return UpstreamResponse(conn, self.read_timeout)

    async def _via_httpx(self, url: str, body: bytes, headers: list[tuple[str, str]]) -> _HttpxResponse:
        """A backend behind an HTTP(S) proxy from the environment: httpx, which speaks to proxies."""
        if self._httpx is None:
            self._httpx = httpx.AsyncClient(timeout=httpx.Timeout(self.read_timeout, connect=self.connect_timeout))
        client = self._httpx
        try:
            resp = await client.send(client.build_request("POST", url, content=body, headers=headers), stream=True)
        except httpx.HTTPError as e:
            raise UpstreamError(type(e).__name__) from None
        return _HttpxResponse(resp, self.read_timeout)

    async def aclose(self) -> None:
        if self._httpx is not None:
            await self._httpx.aclose()
        for o in self._origins.values():
            for conn in o.idle:
                if conn.transport is not None:
                    conn.transport.close()
            o.idle.clear()


# ---- relaying a streamed answer --------------------------------------------------------------------------------------
class Relay:
    def __init__(self, sched: Scheduler, ticket: Ticket, upstream: UpstreamResponse, kind: str,
                 wants_usage: bool) -> None:
        self.sched, self.ticket, self.upstream = sched, ticket, upstream
        self.kind, self.wants_usage = kind, wants_usage
        self._pending = b""            # bytes of an event not complete yet
        self._eof = False
        self._buffer: list[bytes] = []  # what prefetch read, for the client
        self._usage: tuple[int | None, int | None] = (None, None)
        self._done = False              # saw the backend's [DONE]

    async def _events(self) -> list[bytes] | None:
        """The complete events that have arrived (at least one), without their blank line; None at the end."""
        while not self._eof:
            data = await self.upstream.next_chunk()
            if data is None:
                self._eof = True
                break
            buf = self._pending + data if self._pending else data
            if b"\r" in buf:            # SSE allows CRLF and CR line ends: make them LF (keep a CR that may pair)
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

    def _process(self, event: bytes) -> tuple[bytes | None, int, bool]:
        """(bytes for the client or None to drop, output tokens in it, whether it is a backend error event)."""
        raw = event + b"\n\n"
        if event.startswith(b"data: ") and b"\n" not in event:
            data = event[6:]
        else:
            lines = event.split(b"\n")
            data = b"\n".join(x[6:] if x.startswith(b"data: ") else x[5:] for x in lines if x.startswith(b"data:"))
            if not any(x.startswith(b"data:") for x in lines):
                return raw, 0, False
        if data.strip() == b"[DONE]":
            self._done = True
            return raw, 0, False
        try:
            doc = loads(data)
        except (ValueError, RecursionError):
            return raw, 0, False
        if not isinstance(doc, dict):
            return raw, 0, False
        if doc.get("error"):
            return raw, 0, True
        if "usage" in doc:
            if isinstance(doc["usage"], dict):
                self._usage = usage_of(doc)
            if not self.wants_usage:
                if not doc.get("choices"):
                    return None, 0, False
                doc = {k: v for k, v in doc.items() if k != "usage"}
                raw = sse_compact(doc)
        return raw, delta_tokens(doc, self.kind, self.sched.count_tokens), False

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
                        if produced:      # the error comes after output: the client sees it
                            self._buffer.append(raw)  # type: ignore[arg-type]
                            self._failed = True
                            return
                        raise UpstreamFailed("the backend sent an error event before any output")
                    if tokens:
                        self.sched.policy.on_output(self.ticket.req, tokens)
                        produced = True
                    if raw is not None:
                        self._buffer.append(raw)
                if produced:
                    return
        except UpstreamError as e:
            raise UpstreamFailed(f"the backend stream broke before any output: {e.kind}") from None
        if not self._done and self._usage == (None, None):
            raise UpstreamFailed("the backend stream ended before any output")

    _failed = False

    def _finish(self) -> None:
        prompt, output = self._usage
        self.sched.end(self.ticket, "ok", prompt_tokens=prompt, output_tokens=output)

    async def send_body(self, send: Any) -> None:
        """Stream the rest to the client as ASGI body messages; settles the ticket (except on a disconnect)."""
        # NOTE: settle before forwarding [DONE]: a client may hang up as soon as it reads it
        if self._failed:
            self.sched.end(self.ticket, "backend_error")
            await send({"type": "http.response.body", "body": b"".join(self._buffer), "more_body": False})
            return
        if self._done:
            self._finish()
        out = self._buffer
        self._buffer = []
        try:
            while not self._done:
                if out:
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                    out = []
                events = await self._events()
                if events is None:
                    break
                for event in events:
                    raw, tokens, failed = self._process(event)
                    if tokens:
                        self.sched.policy.on_output(self.ticket.req, tokens)
                    if failed:
                        self.sched.end(self.ticket, "backend_error")
                    elif self._done:
                        self._finish()
                    if raw is not None:
                        out.append(raw)
                    if failed:
                        await send({"type": "http.response.body", "body": b"".join(out), "more_body": False})
                        return
                    if self._done:
                        break
        except UpstreamError as e:
            self.sched.end(self.ticket, "backend_error")
            out.append(sse(error_body(502, f"the backend failed mid-stream ({e.kind}); the response is incomplete",
                                      code="backend_error")))
            await send({"type": "http.response.body", "body": b"".join(out), "more_body": False})
            return
        if not self._done:
            if self._usage == (None, None):
                self.sched.end(self.ticket, "backend_error")
                out.append(sse(error_body(502, "the backend stream ended early; the response is incomplete",
                                          code="backend_error")))
            else:
                self._finish()
        await send({"type": "http.response.body", "body": b"".join(out), "more_body": False})
        if self._done:
            await self._drain()

    async def _drain(self) -> None:
        """After [DONE] (and the client's last byte), read the backend's empty rest, briefly, so that the
        connection can be kept alive."""
        self.upstream.read_timeout = min(self.upstream.read_timeout, 2.0)
        try:
            while await self.upstream.next_chunk() is not None:
                pass
        except UpstreamError:
            pass

    def close(self) -> None:
        """Always runs last: a stream that did not end by itself was cut off by the client."""
        self.sched.end(self.ticket, "client_disconnected")
        self.upstream.close()
