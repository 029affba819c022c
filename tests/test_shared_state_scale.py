"""Shared state at scale, against a real redis-server: a sync carries what changed, not what exists (the costs
themselves are measured by benchmarks/replicas.py and benchmarks/redis_load.py)."""

from __future__ import annotations

import pytest
from support.redis_server import redis_server
from support.state_replicas import Clock, Replica, prefix, run, started

from fairserve.core import Ledger, make_policy
from fairserve.gateway.shared.state import PULL

pytestmark = pytest.mark.integration

TENANTS = tuple(f"t{i}" for i in range(2000))


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


class NoScan(dict):
    """The ledger's accounts, refusing to be walked: a sync that passes over all tenants fails."""

    def _walk(self, *_):
        raise AssertionError("the sync walked all accounts")

    __iter__ = items = values = keys = _walk  # type: ignore[assignment]  # NOTE: every way of walking a dict


def test_a_sync_sends_only_what_changed_without_a_pass_over_the_accounts(redis):
    async def main():
        async with started(redis, tenants=TENANTS, interval_s=600) as (a, b):
            sent = []
            script = a.state._sync_script

            async def recorded(args):
                sent.append(args)
                return await script(args=args)

            a.state._sync_script = recorded
            a.ledger.accounts = NoScan(a.ledger.accounts)
            a.arrive("t5", prompt=100)
            a.arrive("t1500", prompt=40)
            a.finish()
            assert await a.state.sync()
            assert int(sent[-1][13]) == 2  # two charges of 2,000 tenants (sync_args: the count of charges)
            assert len(sent[-1]) < 60  # and nothing else grows with the tenants
            assert await b.state.sync()
            assert b.counter("t5") == 110 and b.counter("t1500") == 50
            assert await a.state.sync()
            assert int(sent[-1][13]) == 0

    run(main())


def test_an_answer_carries_at_most_pull_tenants_changed_elsewhere_and_the_rest_follow(redis):
    async def main():
        async with started(redis, tenants=TENANTS, interval_s=600) as (a, b):
            busy = TENANTS[: 5 * PULL]
            for t in busy:  # one request each, admitted and finished on b
                req = b.ledger.arrive(("x", t), t, 7, 5)
                b.ledger.pop()
                b.ledger.output(req, 5)
                b.ledger.settle(req)
            assert await b.state.sync()
            pulled = []
            apply = a.state.changes.apply
            a.state.changes.apply = lambda ledger, answer, *rest, **kw: (
                pulled.append(len(answer.nodes)),
                apply(ledger, answer, *rest, **kw),
            )
            for _ in range(5):
                assert await a.state.sync()
            assert max(pulled) <= PULL and sum(pulled) >= len(busy)
            assert all(a.counter(t) == 17 for t in busy)  # 7 prompt + 5 output tokens x 2

    run(main())


def test_a_tenant_backlogged_here_and_charged_elsewhere_comes_with_the_next_answer(redis):
    async def main():
        async with started(redis, limits=((1, None),), tenants=TENANTS, interval_s=600) as (a, b):
            a.arrive("t0", n=3)  # one slot: t0 waits on a, backlogged
            assert await a.state.sync()
            assert a.ledger.accounts["t0"].queued >= 2
            base = a.counter("t0")
            for t in (*TENANTS[2 : 2 + 3 * PULL], "t0"):  # t0 last: the newest of many changes elsewhere
                req = b.ledger.arrive(("x", t), t, 7, 5)
                b.ledger.pop()
                b.ledger.output(req, 5)
                b.ledger.settle(req)
            assert await b.state.sync()
            assert await a.state.sync()  # one answer: at most PULL of the others, but t0 surely
            assert a.counter("t0") == base + 17
            assert sum(a.counter(t) > 0 for t in TENANTS[2 : 2 + 3 * PULL]) <= PULL

    run(main())


def test_the_lift_floor_follows_the_backlog_on_any_replica(redis):
    async def main():
        async with started(redis, limits=((2, None),), tenants=TENANTS[:100], interval_s=600) as (a, b):
            a.arrive("t1", prompt=500)  # runs on a's slot (each replica holds one of the two)
            a.arrive("t2", prompt=300)  # t2 waits on a: backlogged, counter 0
            b.arrive("t3", prompt=900)  # runs on b's slot: counter 900
            b.arrive("t3", prompt=10)  # t3 waits on b
            for r in (a, b, a):
                assert await r.state.sync()
            assert [t for _, t in a.state._floor] == ["t2", "t3"]  # the two smallest backlogged, of 100
            a.finish()  # t2 admitted on a: no longer backlogged anywhere
            assert not a.ledger.accounts["t2"].queued
            for r in (a, b, a):
                assert await r.state.sync()
            assert [t for _, t in a.state._floor] == ["t3"]
            a.arrive("t4")  # nothing queued on a: t4 is lifted to the floor over every replica, t3's 900
            assert a.counter("t4") >= 900

    run(main())


def test_a_replica_that_redis_forgot_sends_its_whole_backlog_again(redis):
    async def main():
        clock = Clock()
        async with started(redis, limits=((1, None),), ttl_s=0.5, clock=clock, interval_s=600) as (a, b):
            a.arrive("heavy", n=3)  # one runs, two wait: heavy is backlogged on a
            for r in (a, b):
                assert await r.state.sync()
            assert [t for _, t in b.state._floor] == ["heavy"]
            clock.advance(0.7)  # a was silent past the TTL: Redis forgets it, its backlog with it
            assert await b.state.sync()
            assert b.state._floor == []
            assert await a.state.sync()  # Redis answers that it did not know a...
            assert await a.state.sync()  # ...which sends its backlog in full
            assert await b.state.sync()
            assert [t for _, t in b.state._floor] == ["heavy"]

    run(main())


def test_the_shared_state_hears_the_ledger_through_its_listener_and_leaves_the_policy_alone(redis):
    r = Replica(redis.url, prefix())
    policy = make_policy("vtc")
    ledger = Ledger(policy, ["a", "org/b"], peers=r.state)  # NOTE: no wrapping: any policy object, as built
    assert vars(policy).keys().isdisjoint({"on_charge", "enqueue", "dequeue", "remove"})  # nothing patched on it
    changes = r.state.changes
    changes.take()
    ledger.arrive(1, "org/b", 10)
    req = ledger.pop()
    assert set(changes.dirty) == {ledger.accounts["org/b"], ledger.groups["org"]}
    assert changes.dirty[ledger.accounts["org/b"]] == (0.0, 0.0)  # the values before the first change
    assert changes.pool_tokens == {changes.pool_of(req): 0}  # queued, then admitted: its tokens left the pool
    with pytest.raises(ValueError, match="shares its counters"):
        Ledger(make_policy("fcfs"), ["a"], peers=Replica(redis.url, prefix()).state)
