"""Quotas (gateway/quota/book.py, quota_store.py): UTC windows, the hold that bounds the overshoot, roll-over with an
injected clock, the same rules shared by two replicas in a real redis-server, and each replica's own part written
back when that Redis lost its data."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta, timezone

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from support.redis_server import redis_server

from fairserve.gateway.quota.book import Cost, Exhausted, Hold, Quota, QuotaBook, window
from fairserve.gateway.quota.store import RedisQuotaStore

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def run(coro):
    return asyncio.run(coro)


def test_windows_are_aligned_to_utc():
    assert window("hour", T0) == (datetime(2026, 12, 31, 23, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert window("day", T0)[1] == datetime(2027, 1, 1, tzinfo=UTC)
    assert window("month", T0) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    feb = datetime(2028, 2, 29, 12, tzinfo=UTC)
    assert window("month", feb) == (datetime(2028, 2, 1, tzinfo=UTC), datetime(2028, 3, 1, tzinfo=UTC))
    east = datetime(2027, 1, 1, 1, 30, tzinfo=timezone(timedelta(hours=2)))  # 23:30 UTC the day before
    assert window("day", east)[0] == datetime(2026, 12, 31, tzinfo=UTC)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"per": "week", "tokens": 5}, "one of hour, day, month"),
        ({"per": "day"}, "needs `tokens`, `service`"),
        ({"per": "day", "tokens": 0}, "number > 0"),
        ({"per": "day", "service": float("inf")}, "number > 0"),
        ({"per": "day", "tokens": True}, "number > 0"),
    ],
)
def test_bad_quotas_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        Quota(**bad)


def test_a_tenant_runs_out_then_its_window_rolls_over():
    clock = Clock()
    book = QuotaBook({"acme": Quota("hour", tokens=100)}, clock=clock)

    async def scenario():
        first = await book.hold(["acme"], Cost(60, 120))
        assert isinstance(first, Hold) and await book.check(["acme"]) is None
        second = await book.hold(["acme"], Cost(60, 120))  # 60 held < 100: let through, may end at 120
        assert isinstance(second, Hold)
        out = await book.hold(["acme"], Cost(1, 2))
        assert isinstance(out, Exhausted) and (out.path, out.measure, out.used) == ("acme", "tokens", 120)
        assert out.retry_after_s == 30 and "resets at 2027-01-01T00:00:00+00:00" in out.message()
        await book.settle(first, Cost(10, 20))  # it used less than its bound
        await book.settle(second, Cost(50, 100))
        status = (await book.status("acme"))["tokens"]
        assert (status["used"], status["held"], status["remaining"]) == (60, 0, 40)
        clock.now += timedelta(seconds=31)  # a new hour: nothing used yet
        assert await book.check(["acme"]) is None and (await book.status("acme"))["tokens"]["used"] == 0

    run(scenario())


def test_a_request_is_counted_in_the_window_it_started_in():
    clock = Clock()
    book = QuotaBook({"acme": Quota("hour", tokens=100)}, clock=clock)

    async def scenario():
        hold = await book.hold(["acme"], Cost(50, 0))
        clock.now += timedelta(minutes=5)
        await book.settle(hold, Cost(40, 0))
        assert (await book.status("acme"))["tokens"]["used"] == 0  # the new hour is untouched
        clock.now -= timedelta(minutes=5)
        assert (await book.status("acme"))["tokens"]["used"] == 40

    run(scenario())


def test_a_group_quota_holds_its_tenants_in_total_and_service_is_a_second_measure():
    book = QuotaBook({"org": Quota("day", tokens=1000, service=150), "org/b": Quota("day", tokens=10)}, clock=Clock())

    async def scenario():
        a = await book.hold(["org/a", "org"], Cost(40, 100))
        assert isinstance(a, Hold) and len(a.keys) == 2  # org's two measures; org/a has none
        b = await book.hold(["org/b", "org"], Cost(5, 60))  # service: 100 held < 150
        assert isinstance(b, Hold)
        out = await book.hold(["org/a", "org"], Cost(1, 1))
        assert isinstance(out, Exhausted) and (out.path, out.measure) == ("org", "service")
        assert await book.check(["other"]) is None  # a tenant without any quota
        assert await book.hold(["other"], Cost(10**9, 10**9)) == Hold(())

    run(scenario())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 1000), st.lists(st.tuples(st.integers(1, 300), st.floats(0, 1)), min_size=1, max_size=40))
def test_the_overshoot_is_at_most_one_requests_bound(limit, requests):
    """However requests start and end, a window's use ends within limit + the largest bound."""
    book = QuotaBook({"t": Quota("day", tokens=limit)}, clock=Clock())
    rng = random.Random(limit)

    async def scenario():
        running: list[tuple[Hold, int, float]] = []
        for bound, share in requests:
            got = await book.hold(["t"], Cost(bound, 0))
            if isinstance(got, Hold):
                running.append((got, bound, share))
            if running and rng.random() < 0.5:
                hold, b, s = running.pop(rng.randrange(len(running)))
                await book.settle(hold, Cost(round(b * s), 0))
        for hold, b, s in running:
            await book.settle(hold, Cost(round(b * s), 0))
        return (await book.status("t"))["tokens"]

    status = run(scenario())
    assert status["held"] == 0 and status["used"] <= limit + max(b for b, _ in requests)


def test_two_replicas_share_a_quota_in_redis():
    with redis_server() as server:

        async def scenario():
            client = aioredis.from_url(server.url)
            try:
                clock = Clock()
                quotas = {"acme": Quota("hour", tokens=1000)}
                books = [QuotaBook(quotas, RedisQuotaStore(client, "qtest"), clock) for _ in range(2)]
                holds = await asyncio.gather(*(books[i % 2].hold(["acme"], Cost(100, 0)) for i in range(30)))
                let_through = [h for h in holds if isinstance(h, Hold)]
                assert len(let_through) == 10  # atomic check-and-hold: exactly limit / bound, whatever the order
                refused = next(h for h in holds if isinstance(h, Exhausted))
                assert refused.retry_after_s == 30 and refused.used == 1000
                await asyncio.gather(*(books[i % 2].settle(h, Cost(100, 0)) for i, h in enumerate(let_through)))
                status = (await books[1].status("acme"))["tokens"]
                assert (status["used"], status["held"], status["remaining"]) == (1000, 0, 0)
                clock.now += timedelta(seconds=31)
                assert isinstance(await books[0].hold(["acme"], Cost(100, 0)), Hold)  # the next hour
                ttl = await client.ttl(f"qtest:quota:hour:{int(datetime(2027, 1, 1, tzinfo=UTC).timestamp())}:acme")
                assert 0 < ttl  # kept a while past its window, then dropped by Redis
            finally:
                await client.aclose()

        asyncio.run(scenario())


def test_each_replica_writes_its_own_part_back_after_redis_lost_its_data():
    from fairserve.gateway.quota.store import DataLost, MirroredStore, OwnUse

    with redis_server() as server:

        async def scenario():
            client = aioredis.from_url(server.url)
            try:
                await client.set("qtest:e", "1")  # the shared state's epoch
                clock, quotas = Clock(), {"acme": Quota("hour", tokens=1000)}
                owns = [OwnUse(), OwnUse()]
                stores = [RedisQuotaStore(client, "qtest", f"r{i}", lambda: "1") for i in range(2)]
                books = [QuotaBook(quotas, MirroredStore(s, own), clock) for s, own in zip(stores, owns, strict=True)]
                holds = [await books[i % 2].hold(["acme"], Cost(100, 0)) for i in range(5)]
                for i, h in enumerate(holds[:3]):
                    await books[i % 2].settle(h, Cost(80, 0))
                before = (await books[0].status("acme"))["tokens"]
                assert (before["used"], before["held"]) == (240, 200)
                await client.flushall()  # Redis lost its data
                key = ("acme", "hour", window("hour", T0)[0], "tokens")
                with pytest.raises(DataLost):  # nothing is read or held on it before the write-back
                    await stores[0].try_hold([(key, 1000.0, 1.0)], [T0])
                with pytest.raises(DataLost):
                    await stores[1].read(key)
                for _ in range(2):  # NOTE: twice: a write-back sets each part, so it can be repeated
                    for store, own in zip(stores, owns, strict=True):
                        await store.restore(own.parts())
                await client.set("qtest:e", "1")  # NOTE: the shared state's next sync sets an epoch again
                after = (await books[1].status("acme"))["tokens"]
                assert (after["used"], after["held"]) == (240, 200)  # each part once: the total as before
                for i, h in enumerate(holds[3:], 3):
                    await books[i % 2].settle(h, Cost(50, 0))
                status = (await books[1].status("acme"))["tokens"]
                assert (status["used"], status["held"]) == (340, 0)
            finally:
                await client.aclose()

        asyncio.run(scenario())
