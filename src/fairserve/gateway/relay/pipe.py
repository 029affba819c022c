"""The buffer between a stream's backend and its client (nginx's `proxy_buffering`): the relay reads the backend
as fast as it generates, so that the backend's slot frees at generation speed, not at the client's reading speed,
and a tenant whose clients read slowly (or not at all) holds its slots no longer than its generations take.

A stream buffers at most `client_buffer_bytes`, and all streams together `client_buffer_total_bytes`; past either,
the relay stops reading that backend until its client takes some (the backend's flow control), except that every
stream may hold one read's worth, so that none waits on the others' clients.
"""

from __future__ import annotations

import asyncio


class Buffers:
    """The bytes buffered over every stream of a gateway, against its total bound."""

    def __init__(self) -> None:
        self.used = 0


class Pipe:
    """One stream's buffer: `put` by its reader (the backend's events), `take` by its writer (to the client)."""

    def __init__(self, buffers: Buffers, limit: int, total: int, first: list[bytes]) -> None:
        self.buffers, self.limit, self.total = buffers, limit, total
        self.parts: list[bytes] = []
        self.size = 0
        self.ended = False
        self._changed = asyncio.Event()  # NOTE: one event: the reader waits only with data in, the writer only without
        self._add(first)

    def _add(self, parts: list[bytes]) -> None:
        n = sum(map(len, parts))
        self.parts += parts
        self.size += n
        self.buffers.used += n
        self._changed.set()

    async def put(self, parts: list[bytes]) -> None:
        """Buffer `parts`; return once there is room for more."""
        self._add(parts)
        while self.size and (self.size >= self.limit or self.buffers.used >= self.total):
            self._changed.clear()
            await self._changed.wait()

    def end(self, parts: list[bytes]) -> None:
        """The last of the stream."""
        self._add(parts)
        self.ended = True

    async def take(self) -> tuple[list[bytes], bool]:
        """All that is buffered (waiting for some), and whether more will come."""
        while not self.parts and not self.ended:
            self._changed.clear()
            await self._changed.wait()
        parts = self.parts
        self.release()
        return parts, not self.ended

    def release(self) -> None:
        """Drop what is buffered (taken, or its client is gone), giving its bytes back to the total."""
        self.buffers.used -= self.size
        self.parts, self.size = [], 0
        self._changed.set()
