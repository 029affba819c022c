"""What the gateway's profile showed cheap to remove (issue 51), each kept out of the hot path: a backend's answer
that has arrived (all of it, or a piece buffered) is read with no timer, one not yet in under the read timeout; a
request id the gateway makes is 32 hex digits of 16 random bytes, with no UUID object; a backend's name (its URL
with credentials hidden, read at each dispatch) is worked out once per URL."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import deque

import pytest
from support.gateway import config

from fairserve.gateway.instance import Gateway
from fairserve.gateway.relay import upstream
from fairserve.gateway.settings.urls import redact

pytestmark = pytest.mark.unit


class Content:
    """What `UpstreamResponse` reads of aiohttp's body stream."""

    def __init__(self, pieces: list[bytes], eof: bool) -> None:
        self._buffer, self.eof = deque(pieces), eof

    def is_eof(self) -> bool:
        return self.eof

    async def readany(self) -> bytes:
        return self._buffer.popleft() if self._buffer else b""


class Answer:
    status, raw_headers = 200, ()

    def __init__(self, content: Content) -> None:
        self.content = content


def test_an_answer_that_has_arrived_is_read_with_no_timer(monkeypatch):
    armed: list[float] = []
    real = asyncio.timeout
    monkeypatch.setattr(upstream.asyncio, "timeout", lambda delay: armed.append(delay) or real(delay))

    async def go() -> None:
        whole = upstream.UpstreamResponse(Answer(Content([b"ab", b"c"], eof=True)), 0.0, 30.0)
        assert await whole.read() == b"abc" and armed == []
        piece = upstream.UpstreamResponse(Answer(Content([b"x"], eof=False)), 0.0, 30.0)
        assert await piece.next_chunk() == b"x" and armed == []  # a piece buffered: it has arrived
        piece._content.eof = False  # nothing buffered, the end not seen: it may wait
        assert await piece.next_chunk() is None and armed == [30.0]

    asyncio.run(go())


def test_a_request_id_the_gateway_makes_is_32_hex_digits_with_no_uuid(monkeypatch):
    def refused() -> None:
        raise AssertionError("a UUID object per request")

    monkeypatch.setattr(uuid, "uuid4", refused)
    gw = Gateway(config(["http://a:1"]))
    made = {gw.identify({"headers": [(b"authorization", b"Bearer ka")]})[1] for _ in range(100)}
    assert len(made) == 100 and all(re.fullmatch(r"[0-9a-f]{32}", x) for x in made)
    assert gw.identify({"headers": [(b"x-request-id", b"mine-1")]})[1] == "mine-1"


def test_a_backends_name_is_worked_out_once_per_url():
    url = "http://user:secret@b.example:8000/v1?api_key=k"
    assert redact(url) == "http://***@b.example:8000/v1?api_key=***"
    hits = redact.cache_info().hits
    assert redact(url) == "http://***@b.example:8000/v1?api_key=***" and redact.cache_info().hits == hits + 1
