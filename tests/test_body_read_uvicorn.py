"""Under a real uvicorn, what `api.body.arrived` reads of its request cycle: a body sent with its headers has all
arrived when the app starts (read with no timer), one sent in pieces later has not (read under the client timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from support.raw_sockets import connect

from fairserve.api import body
from fairserve.api.server import running_server

pytestmark = pytest.mark.integration

ONE_WRITE = b'POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{"a": 1}'


def test_under_uvicorn_a_body_sent_with_its_headers_has_arrived():
    seen: list[bool] = []

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        seen.append(body.arrived(receive))
        await body.read_body(scope, receive, 1 << 20, 10.0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def later() -> AsyncIterator[bytes]:
        yield b'{"a": '
        await asyncio.sleep(0.2)
        yield b"1}"

    with running_server(app) as url:
        # NOTE: headers and body in one write, so the server reads them together (httpx writes them apart: on a
        # loaded machine the body then comes in a read of its own, and the fast path is rightly not taken)
        for _ in range(5):
            with connect(url) as sock:
                sock.sendall(ONE_WRITE)
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")

        async def slow() -> int:
            async with httpx.AsyncClient() as c:
                return (await c.post(url, content=later())).status_code

        assert asyncio.run(slow()) == 200
    assert seen[:5] == [True] * 5 and seen[5] is False
