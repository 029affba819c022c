"""Run an ASGI app with uvicorn on a loopback port, in a background thread (tests, benchmarks, in-process use)."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(app, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 10.0) -> Iterator[str]:
    """Serve `app` until the block exits; yields its base URL (e.g. http://127.0.0.1:54321)."""
    port = port or free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on {host}:{port} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
