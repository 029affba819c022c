"""Running an ASGI app with uvicorn: the settings every fairserve server shares (a timeout on request headers, a
bounded drain on shutdown), and a loopback server in a background thread (tests, benchmarks, in-process use)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

HEADER_TIMEOUT_S = 30.0  # a client's request line and headers must arrive within this
DRAIN_TIMEOUT_S = 30.0  # on SIGTERM, in-flight requests get this long; the rest are cancelled


def header_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's HTTP protocol, closing a connection that has spent longer than `timeout_s` without a request in
    progress: a request line and headers that do not arrive (uvicorn itself waits forever for them, so a slow-headers
    client would hold the connection). One sweep every `timeout_s / 2` checks every connection, so nothing is added
    per request; a stalled connection is closed between `timeout_s` and 1.5 × `timeout_s`."""
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

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.waiting_since = time.monotonic()
            open_.add(self)
            if not sweeping:
                sweeping.append(asyncio.get_running_loop().call_later(timeout_s / 2, sweep))

        def connection_lost(self, exc: Exception | None) -> None:
            open_.discard(self)
            super().connection_lost(exc)

    return HeaderTimeout


def server_options(
    header_timeout_s: float = HEADER_TIMEOUT_S, drain_timeout_s: float = DRAIN_TIMEOUT_S
) -> dict[str, Any]:
    """uvicorn's settings for a fairserve server (`uvicorn.run(app, **server_options(...))`): request headers timed
    out after `header_timeout_s`; on shutdown (SIGTERM, SIGINT) in-flight requests get `drain_timeout_s` to finish,
    then are cancelled."""
    return {"http": header_timeout_protocol(header_timeout_s), "timeout_graceful_shutdown": drain_timeout_s}


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
