"""Talking to a test server over a bare socket, for clients that stall (headers or a body that never finish)."""

import socket


def connect(base: str) -> socket.socket:
    """A TCP connection to `base` (http://HOST:PORT)."""
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing the connection (fails if still open after `seconds`)."""
    sock.settimeout(seconds)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data
