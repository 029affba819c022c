"""Server-sent events that stop as soon as the client disconnects (the emulator's and `fairserve serve`'s)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    """text/event-stream that stops (cancelling its generator, hence the job) as soon as the client disconnects,
    and drops the connection, without the terminating chunk, when the generator yields None."""

    def __init__(self, events: AsyncIterator[bytes | None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pump.cancel()
            watch.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            await self.events.aclose()      # type: ignore[attr-defined]

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for data in self.events:
            if data is None:
                return      # the server closes the connection: the app never finished the body
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
