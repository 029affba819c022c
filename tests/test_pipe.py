"""The buffer between a stream's backend and its client (gateway/relay/pipe.py): its bounds, per stream and in total."""

from __future__ import annotations

import asyncio

import pytest

from fairserve.gateway.relay.pipe import Buffers, Pipe

pytestmark = pytest.mark.unit


async def blocked(put) -> bool:
    """Whether `put` (a coroutine) waits for room rather than returning at once."""
    task = asyncio.ensure_future(put)
    for _ in range(3):
        await asyncio.sleep(0)
    done = task.done()
    task.cancel()
    return not done


def test_a_reader_stops_at_the_streams_bound_and_goes_on_when_its_client_takes():
    async def go() -> None:
        buffers = Buffers()
        pipe = Pipe(buffers, limit=10, total=100, first=[b"ab"])
        assert not await blocked(pipe.put([b"cdef"]))  # 6 < 10: room for more
        assert await blocked(pipe.put([b"ghij"]))  # 10: full
        assert (pipe.size, buffers.used) == (10, 10)
        parts, more = await pipe.take()
        assert b"".join(parts) == b"abcdefghij" and more and (pipe.size, buffers.used) == (0, 0)
        pipe.end([b"end"])
        assert await pipe.take() == ([b"end"], False)

    asyncio.run(go())


def test_the_total_bound_holds_every_stream_but_each_may_hold_one_read():
    async def go() -> None:
        buffers = Buffers()
        a, b = Pipe(buffers, 100, 8, []), Pipe(buffers, 100, 8, [])
        assert await blocked(a.put([b"x" * 8]))  # the total is reached
        # NOTE: b holds nothing: it may take one read, so that it never waits on a's client
        assert await blocked(b.put([b"y" * 3])) and buffers.used == 11
        assert await blocked(b.put([b"z"]))  # ... and then waits too
        a.release()  # a's client left: its bytes go back to the total
        assert buffers.used == 4 and not await blocked(b.put([]))

    asyncio.run(go())


def test_a_writer_waits_for_data_and_sees_the_end():
    async def go() -> None:
        pipe = Pipe(Buffers(), 10, 10, [])
        taking = asyncio.ensure_future(pipe.take())
        await asyncio.sleep(0)
        assert not taking.done()
        pipe.end([])
        assert await taking == ([], False)

    asyncio.run(go())
