"""Reading a request body with a size limit and a deadline, for every server (the gateway, `fairserve serve`)."""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import Receive, Scope

from .errors import error_response

DISCONNECTED = 499  # nginx's "client closed request"; nobody is left to read it


class ClientGone(Exception):
    """The client went away before its body was read."""


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes | Response:
    """The body, or the error to answer instead: 408 when it did not arrive within `timeout_s` (a stalled upload),
    413 when it is larger than `limit` bytes (not read any further then). ClientGone on a disconnect. A body that has
    all arrived (most: they come with their headers) is read with no timer: nothing can wait."""
    try:
        if arrived(receive):
            raw = await _read(scope, receive, limit)
        else:
            async with asyncio.timeout(timeout_s):
                raw = await _read(scope, receive, limit)
    except TimeoutError:
        return error_response(
            408,
            f"the request body did not arrive within {timeout_s:g} s",
            code="request_timeout",
            headers={"Connection": "close"},
        )
    if raw is None:
        return error_response(413, f"the request body is larger than {limit} bytes", code="body_too_large")
    return raw


def arrived(receive: Receive) -> bool:
    """Whether the whole body has arrived, so that reading it cannot wait: where the server is uvicorn, its request
    cycle (behind `receive`) has the end of the body and a message ready. False under another server."""
    cycle = getattr(receive, "__self__", None)
    event = getattr(cycle, "message_event", None)
    return getattr(cycle, "more_body", True) is False and isinstance(event, asyncio.Event) and event.is_set()


async def _read(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                return None
            break
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
