"""Server-sent events that stop as soon as the client disconnects (the emulator's and `fairserve serve`'s)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import error_body, error_response
from .protocol import sse


class EventStream(StreamingResponse):
    """text/event-stream that stops (cancelling its generator, hence the job) as soon as the client disconnects,
    drops the connection, without the terminating chunk, when the generator yields None, and ends with an error
    event (code "shutdown") when the server's drain runs out before the stream does."""

    def __init__(self, events: AsyncIterator[bytes | None]) -> None:
        # NOTE: `_pump` reads `events` itself (None is this class's signal to drop the connection): Starlette never does
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})  # type: ignore[arg-type]
        self.events = events
        self.started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        cut = False
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # NOTE: not the client (that ends `watch`): the server cancels what is left when its drain runs out
            cut = True
            if (task := asyncio.current_task()) is not None:
                task.uncancel()
        finally:
            pump.cancel()
            watch.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            await self.events.aclose()  # type: ignore[attr-defined]
        if cut:
            await shutting_down(self.started, scope, receive, send)

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self.started = True
        async for data in self.events:
            if data is None:
                return  # the server closes the connection: the app never finished the body
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def connection_of(send: Send) -> Any | None:
    """The connection behind an ASGI `send`, where the server is uvicorn: its request cycle, with `disconnected`
    (True from the moment the client's connection is lost) and `transport`. None under another server.

    NOTE: uvicorn's `send()` returns silently once the client is gone, and its `http.disconnect` arrives only
    through `receive()`: a streaming loop that checks `disconnected` after each send stops at once, whether or not
    a watcher's cancellation has landed."""
    cycle = getattr(send, "__self__", None)
    if isinstance(getattr(cycle, "disconnected", None), bool) and hasattr(cycle, "transport"):
        return cycle
    return None


LAST_WRITE_S = 1.0  # the error event or 503 of a request cut off by the drain: at most this long to go out


async def shutting_down(started: bool, scope: Scope, receive: Receive, send: Send, server: str = "server") -> None:
    """End a request the server's drain cut off: an error event if its stream has started, else a 503. A client
    that does not read gets LAST_WRITE_S for it, then its connection is closed."""
    conn = connection_of(send)
    try:
        async with asyncio.timeout(LAST_WRITE_S):
            await _last_words(started, scope, receive, send, server)
    except TimeoutError:
        if conn is not None:
            conn.transport.abort()


async def _last_words(started: bool, scope: Scope, receive: Receive, send: Send, server: str) -> None:
    with contextlib.suppress(Exception):  # NOTE: the client may be gone too; nothing is left to tell it
        if started:
            body = sse(error_body(503, f"the {server} is shutting down; the response is incomplete", code="shutdown"))
            await send({"type": "http.response.body", "body": body, "more_body": False})
        else:
            await error_response(503, f"the {server} is shutting down", code="shutdown", headers={"Retry-After": "1"})(
                scope, receive, send
            )
