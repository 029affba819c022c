"""A connection's writes within one pass of the event loop, sent in one system call (`Coalesced`, the transport the
servers' HTTP protocol writes to: api/server.py). uvicorn writes a response's status line and headers when it gets
`http.response.start`, then its body, each straight to the socket: two sends of a few hundred bytes for one answer,
where each send on a socket does the TCP work of the packet it makes. Here the second joins the first, sent once
the pass is over (`call_soon`), so a non-streamed answer is one send, and a stream's chunks made in one pass go
together. Nothing is held past the pass: a close or `write_eof` sends what is held first, an abort drops it."""

from __future__ import annotations

import asyncio
from typing import Any


class Coalesced:
    """`transport` (an asyncio transport), its writes held until the end of the loop's pass and sent as one; every
    other call goes to it as it is."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        # NOTE: a copy of anything mutable: the caller may reuse its buffer once `write` returns
        self._held.append(data if isinstance(data, bytes) else bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what is held, in one write."""
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return int(self._transport.get_write_buffer_size()) + sum(map(len, self._held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
