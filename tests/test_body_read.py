"""A request body that has all arrived is read with no timer (issue 51: the timeout around the read was 3.6% of the
gateway's samples, armed even when nothing could wait); one still arriving is read under the client timeout (under
uvicorn: test_body_read_uvicorn.py)."""

from __future__ import annotations

import asyncio

import pytest

from fairserve.api import body

pytestmark = pytest.mark.unit


class Cycle:
    """What uvicorn's request cycle has of a body: the end of it seen (`more_body` False), a message ready."""

    def __init__(self, data: bytes, arrived: bool) -> None:
        self.data, self.more_body, self.message_event = data, not arrived, asyncio.Event()
        if arrived:
            self.message_event.set()

    async def receive(self) -> dict:
        return {"type": "http.request", "body": self.data, "more_body": False}


@pytest.fixture
def timers(monkeypatch) -> list[float]:
    """The timeouts `read_body` arms."""
    armed: list[float] = []
    real = asyncio.timeout

    def spy(delay: float | None):
        armed.append(delay)
        return real(delay)

    monkeypatch.setattr(body.asyncio, "timeout", spy)
    return armed


def test_a_body_that_has_arrived_is_read_with_no_timer(timers):
    async def go() -> None:
        scope = {"headers": []}
        here = Cycle(b'{"a": 1}', arrived=True)
        assert body.arrived(here.receive)
        assert await body.read_body(scope, here.receive, 100, 30.0) == b'{"a": 1}'
        assert timers == []
        coming = Cycle(b'{"b": 2}', arrived=False)
        assert not body.arrived(coming.receive)
        assert await body.read_body(scope, coming.receive, 100, 30.0) == b'{"b": 2}'
        assert timers == [30.0]

        async def plain() -> dict:  # not uvicorn's: nothing says it has arrived
            return {"type": "http.request", "body": b"x", "more_body": False}

        assert not body.arrived(plain) and await body.read_body(scope, plain, 100, 5.0) == b"x"
        assert timers == [30.0, 5.0]

    asyncio.run(go())
