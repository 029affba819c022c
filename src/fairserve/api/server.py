"""Running an ASGI app with uvicorn: the settings every fairserve server shares (a timeout on request headers, a
bounded drain on shutdown), and a loopback server in a background thread (tests, benchmarks, in-process use)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .errors import error_body

HEADER_TIMEOUT_S = 30.0  # a client's request line and headers must arrive within this
DRAIN_TIMEOUT_S = 30.0  # on SIGTERM, in-flight requests get this long; the rest are cancelled
MAX_HEADER_BYTES = 32 * 1024  # a request line and its headers, together (nginx's default buffers: 4 x 8 KiB)
MAX_HEADERS = 100  # header fields in one request (Apache's LimitRequestFields)
HTTPTOOLS = AutoHTTPProtocol.__name__ == "HttpToolsProtocol"


def _too_large(what: str) -> bytes:
    body = json.dumps(error_body(431, f"the request's {what}", code="headers_too_large")).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )


def header_timeout_protocol(
    timeout_s: float, max_header_bytes: int = MAX_HEADER_BYTES, max_headers: int = MAX_HEADERS
) -> type:
    """uvicorn's HTTP protocol, closing a connection that has spent longer than `timeout_s` without a request in
    progress: a request line and headers that do not arrive (uvicorn itself waits forever for them, so a slow-headers
    client would hold the connection). One sweep every `timeout_s / 2` checks every connection, so nothing is added
    per request; a stalled connection is closed between `timeout_s` and 1.5 × `timeout_s`.

    With uvicorn's httptools parser it also answers 431 and closes the connection when a request line and its
    headers pass `max_header_bytes` together, or carry more than `max_headers` fields (httptools has no limit of its
    own: it would hold a header of any size in memory); with h11, uvicorn's `h11_max_incomplete_event_size` bounds
    the size (`server_options`)."""
    open_: set[Any] = set()
    sweeping: list[asyncio.TimerHandle] = []

    def sweep() -> None:
        sweeping.clear()
        now = time.monotonic()
        for conn in list(open_):
            cycle = getattr(conn, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                conn.waiting_since = None  # a request is being served: not stalled
            elif conn.waiting_since is None or conn.waiting_cycle is not cycle:
                conn.waiting_since, conn.waiting_cycle = now, cycle
            elif now - conn.waiting_since >= timeout_s and not conn.transport.is_closing():
                conn.transport.close()
        if open_:
            sweeping.append(asyncio.get_running_loop().call_later(timeout_s / 2, sweep))

    class HeaderTimeout(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        waiting_since: float | None = None
        waiting_cycle: Any = None
        in_head = True  # a request line and headers are arriving
        head_bytes = 0  # of the request line and the header fields parsed so far
        pending = 0  # received while `in_head` (a head whose end has not come yet)
        fields = 0
        refused = False  # answered 431: nothing more is parsed or answered on this connection

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.waiting_since = time.monotonic()
            open_.add(self)
            if not sweeping:
                sweeping.append(asyncio.get_running_loop().call_later(timeout_s / 2, sweep))

        def connection_lost(self, exc: Exception | None) -> None:
            open_.discard(self)
            super().connection_lost(exc)

        if HTTPTOOLS:

            def data_received(self, data: bytes) -> None:
                if self.refused:
                    return
                super().data_received(data)
                if self.in_head and not self.refused:  # NOTE: all of `data` was head: its end has not come
                    self.pending += len(data)
                    if self.pending > max_header_bytes:
                        self.refuse(f"line and headers are larger than {max_header_bytes} bytes")

            def refuse(self, what: str) -> None:
                self.refused = True
                self.transport.write(_too_large(what))
                self.transport.close()

            def on_message_begin(self) -> None:
                self.in_head, self.head_bytes, self.pending, self.fields = True, 0, 0, 0
                super().on_message_begin()

            def on_url(self, url: bytes) -> None:
                self.head_bytes += len(url)
                if not self.refused:
                    super().on_url(url)

            def on_header(self, name: bytes, value: bytes) -> None:
                if self.refused:
                    return
                self.fields += 1
                self.head_bytes += len(name) + len(value) + 4
                if self.fields > max_headers:
                    return self.refuse(f"headers are more than {max_headers} fields")
                if self.head_bytes > max_header_bytes:
                    return self.refuse(f"line and headers are larger than {max_header_bytes} bytes")
                super().on_header(name, value)

            def on_headers_complete(self) -> None:
                self.in_head = False
                if not self.refused:
                    super().on_headers_complete()

            def on_body(self, body: bytes) -> None:
                if not self.refused:
                    super().on_body(body)

            def on_message_complete(self) -> None:
                if not self.refused:
                    super().on_message_complete()

            def send_400_response(self, msg: str) -> None:
                if not self.refused:
                    super().send_400_response(msg)

    return HeaderTimeout


def server_options(
    header_timeout_s: float = HEADER_TIMEOUT_S,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
    max_header_bytes: int = MAX_HEADER_BYTES,
    max_headers: int = MAX_HEADERS,
) -> dict[str, Any]:
    """uvicorn's settings for a fairserve server (`uvicorn.run(app, **server_options(...))`): request headers timed
    out after `header_timeout_s` and bounded in size and count (431); on shutdown (SIGTERM, SIGINT) in-flight
    requests get `drain_timeout_s` to finish, then are cancelled."""
    return {
        "http": header_timeout_protocol(header_timeout_s, max_header_bytes, max_headers),
        "timeout_graceful_shutdown": drain_timeout_s,
        "h11_max_incomplete_event_size": max_header_bytes,
    }


def check_listen_free(host: str, port: int) -> None:
    """ValueError with one line if `host:port` cannot be listened on (in use, or not an address of this machine),
    before a server prints that it listens there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # NOTE: as uvicorn binds: a TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except OSError as e:
            why = "the address is already in use" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
            raise ValueError(f"cannot listen on {host}:{port}: {why}") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(
    app, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 10.0, **kw: Any
) -> Iterator[str]:
    """Serve `app` until the block exits; yields its base URL (e.g. http://127.0.0.1:54321). `kw`: `server_config`'s
    (header_timeout_s, drain_timeout_s)."""
    with running(app, host, port, timeout_s, **kw) as (url, _):
        yield url


@contextlib.contextmanager
def running(
    app, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 10.0, **kw: Any
) -> Iterator[tuple[str, uvicorn.Server]]:
    """`running_server`, yielding the uvicorn server too (`server.should_exit = True` starts its shutdown, as a
    SIGTERM does)."""
    port = port or free_port(host)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", **server_options(**kw))
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on {host}:{port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout_s + kw.get("drain_timeout_s", DRAIN_TIMEOUT_S))
