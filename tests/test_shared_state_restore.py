"""Redis restarted empty, against a real redis-server: every replica writes back what it knows, and where two know
one tenant at different values the larger (the later: a tenant's service and counter only grow between resets)
stands, whichever replica reconnects first. Replicas are objects in one process (tests/support/state_replicas.py)."""

from __future__ import annotations

import pytest
from support.redis_server import redis_server
from support.state_replicas import run, started

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


async def reconnect(*replicas) -> None:
    for r in replicas:
        for _ in range(3):  # NOTE: the first sync on a pooled connection finds it closed
            if await r.state.sync():
                break


@pytest.mark.parametrize("first", ["stale", "fresh"])
def test_after_redis_restarts_empty_the_latest_copy_of_a_tenant_stands(redis, first):
    async def main():
        async with started(redis, interval_s=600) as (a, b):  # NOTE: syncs by hand only
            a.arrive("heavy", prompt=100)
            a.finish()  # 100 + 5 output tokens x 2
            await a.state.sync()
            await b.state.sync()
            assert b.counter("heavy") == 110
            a.arrive("heavy", prompt=50)
            a.finish()
            await a.state.sync()  # Redis: 170; b's copy is still 110 (it has not synced since)
            assert a.counter("heavy") == 170 and b.counter("heavy") == 110
            redis.stop()
            redis.start()  # empty
            # NOTE: each finds the new epoch, writes back what it knows, then reads what the other wrote back
            order = (b, a) if first == "stale" else (a, b)
            await reconnect(*order, *order, *order)
            for r in (a, b):
                assert r.counter("heavy") == 170 and r.ledger.accounts["heavy"].service == 170, first

    run(main())
