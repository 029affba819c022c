"""The tenant tree across gateway replicas on a real redis-server: NVIDIA Dynamo's skewed-ingress case (class
weights hold when each class arrives through its own replica) and a group's counter lift among siblings backlogged on
any replica."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from support.gateway import ADMIN, KEYS, wait_until
from support.gateway_replicas import LIMIT, counted_backends, drive, share, stream
from support.redis_server import redis_server

from fairserve.api.server import running_server
from fairserve.gateway import build_config, create_app

DYNAMO = {"class-a/u0": "k-a0", "class-a/u1": "k-a1", "class-b/u0": "k-b0", "class-b/u1": "k-b1"}


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def backends():
    yield from counted_backends()


def test_dynamo_case_skewed_ingress_keeps_class_weights_4_to_1(redis, backends):
    """NVIDIA Dynamo's design notes measure a 4:1 class weighting collapsing to 163:162 with two routers when all
    of class A enters through one and all of class B through the other. Here each class is a group of the tenant
    tree (weights 4 and 1 on the groups, two tenants in each), class A through replica 1 and class B through
    replica 2, both backlogged: class A's share of the service stays within 2.5 points of 0.8 (4:1)."""
    _, urls = backends
    cfg = build_config(
        {
            "backends": [{"url": u, "max_inflight_requests": LIMIT} for u in urls],
            "tenants": [{"name": t, "api_keys": [k]} for t, k in DYNAMO.items()],
            "groups": [{"name": "class-a", "weight": 4}, {"name": "class-b", "weight": 1}],
            "admin_key": ADMIN,
            "health_interval_s": 0,
            "state": redis.url,
            "state_interval_s": 0.01,
            "state_ttl_s": 1.0,
        }
    )
    keys = dict(KEYS)
    KEYS.update(DYNAMO)  # NOTE: `auth` in drive() looks tenants' keys up here
    try:
        with running_server(create_app(cfg)) as r1, running_server(create_app(cfg.model_copy(deep=True))) as r2:
            placement = {t: [(r1 if t.startswith("class-a") else r2, 4)] for t in DYNAMO}
            got = asyncio.run(drive(placement, 6.0))
            # a group's weight set on one replica holds on the other
            admin = {"Authorization": f"Bearer {ADMIN}"}
            assert httpx.put(r1 + "/admin/nodes/class-b/weight", json={"weight": 2}, headers=admin).status_code == 200

            def weight_there() -> float:
                tree = httpx.get(r2 + "/admin/tree", headers=admin).json()["tree"]
                return next(n["weight"] for n in tree if n["path"] == "class-b")

            assert wait_until(lambda: weight_there() == 2, 2.0)
    finally:
        KEYS.clear()
        KEYS.update(keys)
    times = [at for xs in got.values() for at, _ in xs]
    lo, hi = min(times), max(times)
    t0, t1 = lo + 0.2 * (hi - lo), lo + 0.9 * (hi - lo)  # NOTE: after the ramp-up, before the streams stop
    a = sum(share(got, t, t0, t1) for t in DYNAMO if t.startswith("class-a"))
    ratio = a / (1 - a)
    print(f"Dynamo case, two replicas: class A : class B = {ratio:.2f} : 1 (share {a:.3f})")
    # NOTE: the share, not the ratio, within 2.5 points of 0.8: a / (1 - a) swings by 0.15 per point near 0.8
    # (measured 0.790-0.817, ratios 3.76-4.46); without the tree-aware comparison a is about 0.49
    assert abs(a - 0.8) <= 0.025, (ratio, a)


LIFT_TREE = {"org/g/u0": "k-g0", "org/h/u0": "k-h0"}  # sibling groups org/g and org/h, one tenant each
STREAMS = 8  # per tenant: more than the 4 slots of both backends, so a tenant with streams is backlogged


def node(tree: list[dict], path: str) -> dict:
    for n in tree:
        if n["path"] == path:
            return n
        if path.startswith(n["path"] + "/"):
            return node(n["children"], path)
    raise KeyError(path)


def test_a_group_idle_on_every_replica_comes_back_lifted_to_its_sibling_served_elsewhere(redis, backends):
    """org/g idles on both replicas while its sibling org/h is served through replica 2; then org/g comes back
    through replica 1, where none of its siblings is queued. Its counter is lifted to org/h's (the lift among
    siblings backlogged on any replica), so it hoards no credit: from the moment both are backlogged, the service
    splits by the weights (1:1), not all to org/g until it caught up."""
    _, urls = backends
    cfg = build_config(
        {
            "backends": [{"url": u, "max_inflight_requests": LIMIT} for u in urls],
            "tenants": [{"name": t, "api_keys": [k]} for t, k in LIFT_TREE.items()],
            "admin_key": ADMIN,
            "health_interval_s": 0,
            "state": redis.url,
            "state_interval_s": 0.01,
            "state_ttl_s": 1.0,
        }
    )
    g, h = LIFT_TREE
    admin = {"Authorization": f"Bearer {ADMIN}"}
    got: dict[str, list[tuple[float, int]]] = {g: [], h: []}

    def tokens(tenant: str, since: float = 0.0) -> int:
        return sum(n for at, n in got[tenant] if at >= since)

    async def until(check, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, "condition not met in time"
            await asyncio.sleep(0.01)

    async def main(r1: str, r2: str) -> tuple[float, float, float, float]:
        stop = asyncio.Event()
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as c:

            async def worker(base: str, tenant: str) -> None:
                while not stop.is_set():
                    await stream(c, base, tenant, got)

            async def counters(base: str) -> tuple[float, float]:
                tree = (await c.get(base + "/admin/tree", headers=admin)).json()["tree"]
                return node(tree, "org/g")["counter"], node(tree, "org/h")["counter"]

            tasks = [asyncio.create_task(worker(r2, h)) for _ in range(STREAMS)]
            await until(lambda: tokens(h) >= 600, 30.0)  # org/h alone: its counter far above idle org/g's
            g_before, h_before = await counters(r1)
            t0 = time.monotonic()  # org/g's streams start: both backlogged from here
            tasks += [asyncio.create_task(worker(r1, g)) for _ in range(STREAMS)]
            await until(lambda: tokens(g, t0) > 0, 10.0)
            g_back, _ = await counters(r1)
            await until(lambda: tokens(g, t0) + tokens(h, t0) >= 800, 30.0)
            stop.set()
            await asyncio.gather(*tasks)
        return g_before, h_before, g_back, tokens(g, t0) / (tokens(g, t0) + tokens(h, t0))

    keys = dict(KEYS)
    KEYS.update(LIFT_TREE)  # NOTE: `auth` in stream() looks tenants' keys up here
    try:
        with running_server(create_app(cfg)) as r1, running_server(create_app(cfg.model_copy(deep=True))) as r2:
            g_before, h_before, g_back, share_g = asyncio.run(main(r1, r2))
    finally:
        KEYS.clear()
        KEYS.update(keys)
    print(f"org/g counter {g_before:.0f} idle, {g_back:.0f} back (org/h {h_before:.0f}); org/g's share {share_g:.3f}")
    assert g_before < h_before / 10  # idle everywhere, its counter far below its sibling's...
    assert g_back >= h_before  # ...and lifted to it (or more: org/h's counter grew since) on coming back
    assert abs(share_g - 0.5) < 0.06, share_g  # the weights from then on: no credit hoarded while idle
