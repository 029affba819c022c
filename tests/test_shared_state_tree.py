"""The tenant tree across replicas, against a real redis-server: a group's counter and service shared as a tenant's,
and the counter lift of a group among its siblings backlogged on any replica (replicas are objects in one process;
tests/test_replicas.py runs gateways)."""

from __future__ import annotations

import pytest
from support.redis_server import redis_server
from support.state_replicas import run, started

pytestmark = pytest.mark.integration

TREE = ("org/g/a", "org/h/b")  # two sibling groups under `org`, one tenant in each


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


def group(replica, path: str) -> float:
    return replica.ledger.groups[path].counter


def test_a_group_idle_everywhere_is_lifted_to_its_sibling_backlogged_on_another_replica(redis):
    async def main():
        async with started(redis, limits=((2, None),), tenants=TREE, interval_s=600) as (a, b):
            a.arrive("org/g/a")  # g served a little through a (10 + 5 output x 2), then idle everywhere
            a.finish()
            b.arrive("org/h/b", prompt=1000, n=3)  # h: one runs on b's lease (1,000), two wait: backlogged on b
            for r in (a, b, a):
                assert await r.state.sync()
            assert group(a, "org/g") == 20 and group(a, "org/h") == 1000  # charges below a group: shared
            a.arrive("org/g/a", n=3)  # g comes back on a, where none of its siblings is queued...
            assert group(a, "org/g") == 30  # ...so the local lift finds no floor (one runs: charged 10)
            assert await a.state.sync()  # Redis: g backlogged on no replica before, h backlogged on b
            assert group(a, "org/g") == 1000 + 10  # lifted to h's counter, net of the 10 charged since
            assert await b.state.sync()
            assert group(b, "org/g") == 1010  # the same lifted counter on every replica
            # g, now backlogged (on a), is not lifted again when it queues on b too (it was not idle): its counter
            # moves by its charges only, and the same on both
            served = a.ledger.groups["org/g"].service
            b.arrive("org/g/a", n=2)
            a.finish()
            for r in (a, b, a):
                assert await r.state.sync()
            charged = a.ledger.groups["org/g"].service - served
            assert charged > 0 and group(a, "org/g") == group(b, "org/g") == 1010 + charged

    run(main())


def test_a_group_at_the_top_is_lifted_at_once_and_its_lift_reaches_the_other_replicas(redis):
    """At the top of the tree the replica knows the floor from its last answer: the lift is local at once, and sent."""

    async def main():
        async with started(redis, limits=((2, None),), tenants=("g/a", "h/b"), interval_s=600) as (a, b):
            b.arrive("h/b", prompt=1000, n=3)
            for r in (b, a):
                assert await r.state.sync()
            a.arrive("g/a", n=3)
            assert group(a, "g") == 1000 + 10  # h is backlogged on b: g is lifted to it at once (then charged 10)
            for r in (a, b):
                assert await r.state.sync()
            assert group(b, "g") == 1010

    run(main())


def test_no_lift_below_the_top_for_a_policy_without_it(redis):
    """LCF is VTC without the lift (the paper's baseline that hoards credit): the shared state does not lift."""

    async def main():
        async with started(redis, limits=((2, None),), tenants=TREE, interval_s=600, policy="lcf") as (a, b):
            b.arrive("org/h/b", prompt=1000, n=3)
            for r in (b, a):
                assert await r.state.sync()
            a.arrive("org/g/a", n=3)
            assert await a.state.sync()
            assert group(a, "org/g") == 10 and group(a, "org/h") == 1000

    run(main())


def test_apply_remote_without_groups_sets_a_group_and_leaves_the_groups_above_alone():
    """What the shared state writes into the ledger: a tenant's remote values without moving its groups (their own
    values come too), and a group's by its path."""
    from fairserve.core import Ledger, make_policy

    led = Ledger(make_policy("vtc"), TREE)
    led.apply_remote("org/g/a", 5.0, 20.0, groups=False)
    assert led.counter_of("org/g/a") == 5.0 and led.groups["org/g"].service == 0.0  # the group above: untouched
    led.apply_remote("org/g", 7.0, 28.0, groups=False)
    g, org = led.groups["org/g"], led.groups["org"]
    assert (g.counter, g.service, org.counter, org.service) == (7.0, 28.0, 0.0, 0.0)
    led.apply_remote("org/h/b", 3.0, 12.0)  # by default the groups above move as a charge here would
    assert (led.groups["org/h"].service, org.service, org.counter) == (12.0, 12.0, 12.0)
