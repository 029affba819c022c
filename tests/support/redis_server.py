"""A real `redis-server` for the shared-state tests: its own process on a free loopback port, in a temp dir, no
persistence. Missing `redis-server`: a clear skip, except under CI=true, where it fails (scripts/setup-redis.sh
installs it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fairserve.api.server import free_port


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        why = "redis-server is not installed (scripts/setup-redis.sh installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why + ": CI=true needs a real Redis")
        pytest.skip(why)
    return path


@dataclass
class RedisServer:
    """One `redis-server` process; `stop()` and `start()` again on the same port (data is not kept)."""

    binary: str
    port: int
    dir: str
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing until `resume()` (a stalled Redis)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="fairserve-redis-") as tmp:
        server = RedisServer(redis_server_binary(), free_port(), tmp)
        server.start()
        try:
            yield server
        finally:
            server.stop()
