"""Bare sockets on both ends: clients that stall (headers or a body that never finish), and backends that send
exactly the bytes a test chooses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator


def connect(base: str) -> socket.socket:
    """A TCP connection to `base` (http://HOST:PORT)."""
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing the connection (fails if still open after `seconds`)."""
    sock.settimeout(seconds)
    data = b""
    while piece := sock.recv(65536):
        data += piece
    return data


@contextlib.contextmanager
def raw_backend(answer: Callable[[int, bytes], list[bytes] | None]) -> Iterator[tuple[str, list[int]]]:
    """A TCP server on loopback: for the n-th request on any connection (n from 1), writes the pieces
    `answer(n, request)` returns, 5 ms apart, then keeps the connection open (None: closes it without answering;
    an empty piece: closes it there).
    Yields its URL and the list of connection numbers each request came on."""
    seen: list[int] = []
    ready = threading.Event()
    state: dict = {}

    async def main() -> None:
        count = {"conn": 0, "req": 0}

        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            count["conn"] += 1
            number = count["conn"]
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                    body = await reader.readexactly(length)
                    count["req"] += 1
                    seen.append(number)
                    pieces = answer(count["req"], head + body)
                    if pieces is None:
                        writer.close()
                        return
                    for piece in pieces:
                        if not piece:
                            writer.close()
                            return
                        writer.write(piece)
                        await writer.drain()
                        await asyncio.sleep(0.005)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(conn, "127.0.0.1", 0)
        state["port"] = server.sockets[0].getsockname()[1]
        state["stop"] = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        await state["stop"].wait()
        server.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(5)
    try:
        yield f"http://127.0.0.1:{state['port']}", seen
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(5)


def sse_answer(events: list[bytes], split: int = 7, eol: bytes = b"\n") -> list[bytes]:
    """A chunked text/event-stream answer carrying `events`, cut into pieces of `split` bytes."""
    body = b"".join(e.replace(b"\n", eol) for e in events)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    data = head + chunked
    return [data[i : i + split] for i in range(0, len(data), split)]


def chunk(text: str | None = None, usage: dict | None = None) -> bytes:
    doc = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [] if text is None else [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + json.dumps(doc).encode() + b"\n\n"
