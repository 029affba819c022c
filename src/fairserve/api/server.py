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

HEADER_TIMEOUT_S = 30.0     # a client's request line and headers must arrive within this
DRAIN_TIMEOUT_S = 30.0      # on SIGTERM, in-flight requests get this long; the rest are cancelled


def header_timeout_protocol(timeout_s: float) -> type:
    """uvicorn's HTTP protocol, closing a connection whose request line and headers take longer than `timeout_s`
    (uvicorn itself waits forever for them: a slow-headers client would hold the connection)."""

    class HeaderTimeout(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _armed_cycle: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            cycle = getattr(self, "cycle", None)
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm()         # the next request on a kept-alive connection: its headers are timed too
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._armed_cycle = getattr(self, "cycle", None)
            self._header_timer = asyncio.get_running_loop().call_later(timeout_s, self._expire)

        def _expire(self) -> None:
            self._header_timer = None
            # NOTE: no new request began since the timer was armed: its headers are still incomplete
            if getattr(self, "cycle", None) is self._armed_cycle and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeout


def server_options(header_timeout_s: float = HEADER_TIMEOUT_S,
                   drain_timeout_s: float = DRAIN_TIMEOUT_S) -> dict[str, Any]:
    """uvicorn's settings for a fairserve server (`uvicorn.run(app, **server_options(...))`): request headers timed
    out after `header_timeout_s`; on shutdown (SIGTERM, SIGINT) in-flight requests get `drain_timeout_s` to finish,
    then are cancelled."""
    return {"http": header_timeout_protocol(header_timeout_s), "timeout_graceful_shutdown": drain_timeout_s}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(app, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 10.0,
                   **kw: Any) -> Iterator[str]:
    """Serve `app` until the block exits; yields its base URL (e.g. http://127.0.0.1:54321). `kw`: `server_config`'s
    (header_timeout_s, drain_timeout_s)."""
    with running(app, host, port, timeout_s, **kw) as (url, _):
        yield url


@contextlib.contextmanager
def running(app, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 10.0,
            **kw: Any) -> Iterator[tuple[str, uvicorn.Server]]:
    """`running_server`, yielding the uvicorn server too (`server.should_exit = True` starts its shutdown, as a
    SIGTERM does)."""
    port = port or free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                           **server_options(**kw)))
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
