"""Shared state across gateway replicas, against a real redis-server: counters, service and weights shared, syncs,
the lift over every replica, Redis lost and restarted; replicas are objects in one process here
(tests/test_replicas.py runs gateway processes; the backends' leases: tests/test_shared_state_leases.py)."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.redis_server import redis_server
from support.state_replicas import Clock, Replica, prefix, run, started

from fairserve.gateway.shared.state import PULL, SharedStateError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


def test_counters_service_and_weights_are_shared(redis):
    async def main():
        async with started(redis) as (a, b):
            a.arrive("heavy", prompt=100)  # admitted at once: charged 100
            a.finish()  # + 5 output tokens x 2
            assert a.counter("heavy") == 110 and b.counter("heavy") == 0
            await a.state.sync()
            await b.state.sync()
            assert b.counter("heavy") == 110 and b.ledger.accounts["heavy"].service == 110
            b.ledger.set_weight("light", 2.0)
            b.state.set_weight("light", 2.0)
            await b.state.sync()
            await a.state.sync()
            assert a.ledger.weights["light"] == 2.0
            b.arrive("light", prompt=100)
            b.finish()
            await b.state.sync()
            await a.state.sync()
            assert a.counter("light") == 110 / 2 and a.counter("heavy") == 110  # weighted: service / 2

    run(main())


def test_a_sync_answers_only_the_tenants_changed_since_the_last_one(redis):
    """The answer's size follows the changes, not the tenants: what a sync pulls is what changed since this
    replica's last answer (everything when it has none yet, or when Redis lost its data)."""
    tenants = tuple(f"t{i}" for i in range(50))

    async def main():
        async with started(redis, tenants=tenants, interval_s=600) as (a, b):
            pulled: list[set[str]] = []
            apply = b.state._apply
            b.state._apply = lambda reply, *rest: (
                pulled.append({n.node for n in reply.nodes}),
                apply(reply, *rest),
            )
            await b.state.sync()
            assert pulled[-1] == set()  # b read everything at start; nothing changed since
            a.arrive("t7", prompt=100)
            await a.state.sync()
            await b.state.sync()
            assert pulled[-1] == {"t7"} and b.counter("t7") == 100
            a.state.set_weight("t9", 3.0)
            a.ledger.set_weight("t9", 3.0)
            await a.state.sync()
            await b.state.sync()
            assert pulled[-1] == {"t9"} and b.ledger.weights["t9"] == 3.0
            redis.stop()
            redis.start()  # empty: a new epoch; each replica writes back what it knows
            n = len(pulled)
            for r in (a, b):
                for _ in range(3):  # the first sync on a pooled connection finds it closed
                    if await r.state.sync():
                        break
            await a.state.sync()
            # NOTE: both wrote back every tenant (50 changes each), and an answer carries at most PULL of them
            for _ in range(2 * len(tenants) // PULL + 2):
                await b.state.sync()
                if not pulled[-1]:
                    break
            assert set(tenants) <= set().union(*pulled[n:]) and pulled[-1] == set()
            assert b.counter("t7") == 100 and b.ledger.weights["t9"] == 3.0
            key = a.state.settings.prefix  # Redis has the counter and the admin's weight back
            assert float((await a.state._client.hget(key + ":cs", "t7")).split()[0]) == 100  # "COUNTER SERVICE"
            assert float(await a.state._client.hget(key + ":w", "t9")) == 3.0

    run(main())


def test_a_reset_on_one_replica_zeroes_the_counters_on_all(redis):
    async def main():
        async with started(redis) as (a, b):
            a.arrive("heavy", prompt=100)
            b.arrive("light", prompt=40)
            for r in (a, b, a):
                await r.state.sync()
            assert b.counter("heavy") == 100 and a.counter("light") == 40
            b.ledger.reset()
            b.state.reset()
            for r in (b, a):
                await r.state.sync()
            for r in (a, b):
                assert r.counter("heavy") == r.counter("light") == 0
                assert r.ledger.accounts["heavy"].service == 100  # service received stays

    run(main())


def test_a_sync_whose_answer_is_lost_and_that_is_sent_again_charges_once(redis):
    """Redis stalls (SIGSTOP) while a sync is on its way: the replica gives up waiting, Redis runs the script late,
    and the replica sends the sync again. The shared service is what was served, not twice the stalled batch."""

    async def main():
        async with started(redis, 1) as (a,):
            key, field = a.state.settings.prefix + ":cs", "heavy"

            async def service() -> float | None:  # the second of "COUNTER SERVICE"
                v = await a.state._client.hget(key, field)
                return None if v is None else float(v.split()[1])

            a.arrive("heavy", prompt=100)  # charged 100 at admission
            redis.pause()
            try:
                assert not await a.state.sync()  # times out: its answer is lost
            finally:
                redis.resume()
            # the stalled script did run: Redis has the charge although the replica never heard back
            assert await eventually(service) == 100
            a.finish()  # + 10 for the output, charged while the first sync's answer was lost
            for _ in range(3):  # the first sync on a pooled connection may find it closed
                if await a.state.sync():
                    break
            assert a.state.up
            assert await service() == 110 == a.ledger.accounts["heavy"].service

    run(main())


async def eventually(read, timeout_s: float = 5.0):
    """`await read()` until it gives something other than None, within a bound (None if it never does)."""
    deadline = time.monotonic() + timeout_s
    while (value := await read()) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return value


def test_lift_uses_the_global_minimum_over_backlogged_tenants(redis):
    async def main():
        async with started(redis, limits=((1, None),), tenants=("x", "y", "z")) as (a, b):
            a.arrive("x", prompt=500)  # runs on a's only slot: counter 500
            a.arrive("x", prompt=10)  # queued on a: x is backlogged there
            await a.state.sync()
            await b.state.sync()
            assert [t for _, t in b.state._floor] == ["x"]  # backlogged anywhere: x, on a
            b.arrive("y", prompt=10)  # b: y goes from nothing queued to queued; lifted to x's counter...
            assert b.counter("y") >= 500  # ...(500), then admitted on b's slot and charged 10
            # without the shared floor the lift would look at b's own queue only (empty): no lift at all
            local = Replica(redis.url, prefix(), limits=((1, None),), tenants=("x", "y"))
            local.arrive("y", prompt=10)
            assert local.counter("y") == 10

    run(main())


def test_a_replica_admits_only_while_its_head_is_the_global_minimum(redis):
    async def main():
        async with started(redis, limits=((2, None),)) as (a, b):
            a.arrive("heavy", prompt=1000, n=4)  # heavy: counter soon far above light's
            await a.state.sync()
            b.arrive("light", prompt=10, n=4)
            for _ in range(4):
                await a.state.sync()
                await b.state.sync()
            heavy_head = a.ledger.peek()
            assert heavy_head is not None and not a.state.may_admit(heavy_head)
            a.finish()  # heavy's slots free, but a may not refill them...
            assert all(r.account.tenant == "light" for r in b.running) and not a.running
            for _ in range(3):  # ...and its lease shrinks, so light's replica gets the capacity
                await a.state.sync()
                await b.state.sync()
            assert len(b.running) == 2 and a.backends[0].limit == 0

    run(main())


def test_unreachable_redis_at_start_is_one_clear_error():
    async def main():
        from fairserve.api.server import free_port

        r = Replica(f"redis://127.0.0.1:{free_port()}/0", prefix())
        with pytest.raises(SharedStateError, match="cannot reach the shared state at redis://127.0.0.1:"):
            await r.state.start()

    run(main())


def test_password_is_not_shown_in_errors():
    async def main():
        from fairserve.api.server import free_port

        r = Replica(f"redis://:s3cret@127.0.0.1:{free_port()}/0", prefix())
        with pytest.raises(SharedStateError) as e:
            await r.state.start()
        assert "s3cret" not in str(e.value) and "***@127.0.0.1" in str(e.value)

    run(main())


def test_redis_lost_keeps_serving_locally_then_converges(redis, caplog):
    async def main():
        clock = Clock()
        async with started(redis, ttl_s=0.5, clock=clock) as (a, b):
            assert not any("is back" in m for m in caplog.messages)  # starting is not coming back
            a.arrive("heavy", prompt=100)
            a.finish()
            await a.state.sync()
            await b.state.sync()
            redis.stop()
            assert not await a.state.sync() and not await b.state.sync()
            assert not a.state.up and a.state.status()["degraded"]
            assert [x.limit for x in a.backends] == [1, 1]  # within the lease: what Redis may have granted
            clock.advance(0.5)
            assert not await a.state.sync()
            assert [x.limit for x in a.backends] == [2, 2]  # past it: limit // replicas last seen
            a.arrive("heavy", prompt=50, n=3)  # keeps admitting from local state
            assert len(a.running) == 3
            a.finish()
            b.arrive("light", prompt=30)
            b.finish()
            redis.start()  # a fresh, empty Redis
            await a.state.sync()
            await b.state.sync()
            await a.state.sync()
            assert a.state.up and b.state.up
            assert sum("lost" in m for m in caplog.messages) == 2 and sum("is back" in m for m in caplog.messages) == 2
            for r in (a, b):  # both have everything charged on either
                assert r.counter("heavy") == 110 + 3 * 60 and r.counter("light") == 40

    run(main())


def test_after_redis_restarts_empty_no_lease_grows_until_the_replicas_reported(redis):
    """A fresh Redis knows nothing of the requests in flight: for a moment (hold_s) every lease is what its replica
    has in flight, so the first replica to reconnect cannot take capacity the others are still using."""

    async def main():
        clock = Clock()
        async with started(redis, limits=((2, None),), interval_s=600, hold_s=0.3, clock=clock) as (a, b):
            a.arrive("heavy", n=3)  # one runs on a's spare, two wait
            b.arrive("light", n=3)  # one runs on b's spare, two wait

            def in_flight() -> int:
                return a.backends[0].requests + b.backends[0].requests

            assert in_flight() == 2
            redis.stop()
            redis.start()  # empty
            for r in (a, b, a):
                for _ in range(3):  # the first sync on a pooled connection finds it closed
                    if await r.state.sync():
                        break
                r.admit()
                assert r.state.up and in_flight() <= 2, (len(a.running), len(b.running))
            a.finish()
            clock.advance(0.3)
            for r in (a, b, a, b):
                await r.state.sync()
                r.admit()
                assert in_flight() <= 2
            assert in_flight() == 2  # the slot a freed went to a waiting request once the hold ended

    run(main())


def test_background_sync_runs_every_interval_and_counts_round_trips(redis):
    async def main():
        async with started(redis) as (a, b):
            a.arrive("heavy", prompt=100)
            start, rounds = time.monotonic(), b.state.round_trips
            while b.state.round_trips < rounds + 5 and time.monotonic() - start < 30:
                await asyncio.sleep(0.005)
            elapsed = time.monotonic() - start
            assert b.counter("heavy") == 100  # a's charge reached b with no sync called by hand
            # five syncs, paced by the interval (10 ms), not back to back: at least four intervals apart
            assert b.state.round_trips >= rounds + 5 and elapsed >= 4 * 0.01

    run(main())


def test_policies_without_counters_are_refused(redis):
    with pytest.raises(ValueError, match="shares its counters"):
        Replica(redis.url, prefix(), policy="fcfs")


def test_missing_redis_server_fails_under_ci_and_skips_elsewhere(monkeypatch):
    import support.redis_server as rs

    monkeypatch.setattr(rs.shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true needs a real Redis"):
        rs.redis_server_binary()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="setup-redis.sh"):
        rs.redis_server_binary()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"state": "http://127.0.0.1:6379"}, "must be a Redis URL"),
        ({"state": "redis://127.0.0.1:6379/0", "policy": "fcfs"}, "needs a policy that shares its counters"),
        ({"state": "redis://127.0.0.1:6379/0", "state_interval_s": 5}, "state_interval_s"),
    ],
)
def test_state_config_errors_are_one_line(extra, message):
    from fairserve.gateway import build_config

    data = {"backends": [{"url": "http://127.0.0.1:9"}], "tenants": [{"name": "a", "api_keys": ["k"]}], **extra}
    with pytest.raises(ValueError, match=message) as e:
        build_config(data)
    assert "\n" not in str(e.value)
