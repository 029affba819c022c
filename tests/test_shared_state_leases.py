"""The backends' capacity shared by gateway replicas, against a real redis-server (replicas as objects in one
process, tests/support/state_replicas.py): each replica's lease of a backend's limit, syncs while it waits for
capacity, a dead replica's lease expiring, and the leases never adding up to more than the limit."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.redis_server import redis_server
from support.state_replicas import Clock, Replica, run, started

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


async def until(condition, timeout_s: float = 5.0) -> None:
    """Wait until `condition()` holds, within a bound."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_two_replicas_with_one_tenant_each_keep_the_backend_full(redis):
    """Each replica's queue holds one tenant, both backlogged, their counters close (what VTC keeps them): as
    requests end and the replicas sync in turn, the backend's whole limit stays in use, and service alternates."""

    async def main():
        async with started(redis, limits=((4, None),), interval_s=600) as (a, b):
            a.arrive("heavy", n=40)
            b.arrive("light", n=40)
            for r in (a, b, a, b):
                await r.state.sync()
            in_use = []
            for _ in range(30):
                for r in (a, b):
                    r.finish(1)
                    await r.state.sync()
                    r.admit()
                in_use.append(a.backends[0].requests + b.backends[0].requests)
            assert min(in_use[2:]) >= 3 and sorted(in_use)[len(in_use) // 2] == 4, in_use
            assert abs(a.counter("heavy") - a.counter("light")) <= 3 * 20  # within a few requests (20 each)

    run(main())


def test_a_replica_waiting_for_capacity_syncs_at_its_interval_not_back_to_back(redis):
    """Early syncs move capacity: one when a replica starts waiting, none for every dispatch while it waits."""

    async def main():
        async with started(redis, limits=((2, None),), interval_s=0.05, early_syncs=True) as (a, b):
            a.arrive("heavy", n=4)
            for r in (a, a):
                await r.state.sync()
            a.admit()
            b.arrive("light", n=3)  # one runs on b's spare; two wait: a keeps the rest of the limit busy
            start = b.state.round_trips
            await asyncio.sleep(0.5)
            assert b.ledger.num_queued == 2 and b.state.status()["waiting_for_capacity"]
            assert b.state.round_trips - start <= 0.5 / 0.05 + 3, b.state.round_trips - start

    run(main())


def test_a_replica_waiting_for_capacity_syncs_as_soon_as_another_gives_it_back(redis):
    """No periodic syncs (interval 600 s): what moves the capacity is a's early sync giving it back, and the wake-up
    that sync publishes to b, which is waiting for it."""

    async def main():
        async with started(redis, limits=((4, None),), interval_s=600, early_syncs=True) as (a, b):
            a.arrive("heavy", prompt=100, n=6)  # a takes what b's spare leaves: 3 running, 3 queued
            await until(lambda: sum(x.requests for x in a.backends) == 3)
            b.arrive("light", n=3)  # one runs on b's spare, two wait: b reports itself waiting
            await until(lambda: b.state.status()["waiting_for_capacity"])
            await b.state.sync()  # NOTE: the status says what the sync sent: this one has surely reached Redis
            await a.state.sync()  # a hears that b waits for a smaller counter: heavy may not be admitted
            trips = b.state.round_trips
            a.finish(1)  # a's slot is free and a may not use it: a gives it back at once, b is woken
            await until(lambda: b.ledger.num_queued == 1)
            assert sum(x.requests for x in b.backends) == 2 and b.state.round_trips - trips <= 3

    run(main())


def test_status_shows_each_backends_limit_and_this_replicas_lease(redis):
    async def main():
        async with started(redis, limits=((4, None), (3, 90))) as (a, b):
            a.arrive("heavy", n=6)
            await a.state.sync()
            a.admit()
            rows = a.state.status()["backends"]
            assert [(x["url"], x["limit_requests"], x["limit_tokens"]) for x in rows] == [
                ("http://b0", 4, None),
                ("http://b1", 3, 90),
            ]
            assert [x["lease_requests"] for x in rows] == [x.limit for x in a.backends]
            assert rows[1]["lease_tokens"] == a.backends[1].token_limit and rows[1]["lease_tokens"] <= 90
            assert (
                sum(x["lease_requests"] for x in rows) + sum(x["lease_requests"] for x in b.state.status()["backends"])
                <= 7
            )

    run(main())


def test_one_replica_alone_reaches_the_full_limit_and_a_dead_ones_lease_expires(redis):
    async def main():
        clock = Clock()
        async with started(redis, ttl_s=0.5, clock=clock) as (a, b):
            a.arrive("heavy", n=20)
            await a.state.sync()  # b is idle: a may use everything but b's spare
            a.admit()
            assert [x.requests for x in a.backends] == [3, 3]
            await b.state.stop()  # b leaves: a reaches the full limit
            await a.state.sync()
            assert [x.limit for x in a.backends] == [4, 4] and [x.requests for x in a.backends] == [4, 4]
            c = Replica(redis.url, a.state.settings.prefix, ttl_s=0.5, clock=clock)  # joins later
            await c.state.start()
            c.arrive("light", n=4)
            assert sum(x.requests for x in c.backends) == 0  # a holds the whole limit
            a.state._task.cancel()  # a dies without leaving (its task stops syncing)
            a.state._client = None
            clock.advance(0.7)  # past the TTL
            await c.state.sync()
            assert sum(x.requests for x in c.backends) == 4 and "heavy" not in {t for _, t in c.state._floor}
            await c.state.stop()

    run(main())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["arrive", "finish", "send", "answer"]), st.integers(1, 6)),
        max_size=40,
    )
)
def test_leases_never_add_up_to_more_than_the_limit(redis, steps):
    """Whatever the interleaving of arrivals, completions, syncs sent and syncs answered on three replicas (a replica
    keeps admitting while its sync is in flight), the requests in flight on a backend, summed over replicas, stay
    within its max_inflight_requests / max_inflight_tokens."""

    async def main():
        limits = ((3, None), (5, 60))
        async with started(redis, 3, limits=limits, ttl_s=600, interval_s=600) as rs:
            pending: dict[int, asyncio.Task] = {}
            for i, op, k in steps:
                r = rs[i]
                if op == "arrive":
                    r.arrive(("heavy", "light")[k % 2], prompt=5 * k, n=k)
                elif op == "finish":
                    r.finish(k)
                elif i in pending:
                    await pending.pop(i)
                elif op == "send":
                    pending[i] = asyncio.get_running_loop().create_task(r.state.sync())
                    await asyncio.sleep(0)  # the sync has read this replica's state and is on its way
                for j, (lr, lt) in enumerate(limits):
                    assert sum(x.backends[j].requests for x in rs) <= lr
                    if lt is not None:
                        assert sum(x.backends[j].tokens for x in rs) <= lt
            await asyncio.gather(*pending.values())

    run(main())


def test_admissions_while_a_sync_is_in_flight_stay_within_the_lease_it_grants(redis):
    """The race the leases must survive: a replica gives up its lease in a sync (nothing queued) and, before the
    answer comes, admits new arrivals under the old one; the other replica then gets what was given up."""

    async def main():
        async with started(redis, 1, limits=((2, None),), interval_s=600) as (a,):
            a.arrive("heavy", n=2)  # one admitted at once (the spare), one after a sync: a's lease is 2
            await a.state.sync()
            a.admit()
            assert len(a.running) == 2
            a.finish()
            b = Replica(redis.url, a.state.settings.prefix, limits=((2, None),), interval_s=600)
            await b.state.start()
            b.arrive("light", n=3)  # waits: a holds the whole limit; b's need is on record
            await b.state.sync()
            assert b.running == [] and b.backends[0].limit == 0
            flight = asyncio.get_running_loop().create_task(a.state.sync())
            await asyncio.sleep(0)
            a.arrive("light", n=2)  # under a's old lease of 2, only the part its next lease keeps
            await flight
            await b.state.sync()
            b.admit()
            assert a.backends[0].requests + b.backends[0].requests <= 2, (len(a.running), len(b.running))
            assert len(a.running) == 1 and len(b.running) == 1
            await b.state.stop()

    run(main())
