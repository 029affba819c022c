"""Faults of gateway replicas sharing state through a real redis-server, through HTTP: Redis unreachable at start,
a replica killed, Redis stopped and restarted mid-run. What is checked is the wiring (every replica keeps serving,
rejoins, frees or takes capacity; nothing is lost; the backends' limits hold); bounds are proven on the test's clock
(test_replicas_clock.py).

The workload is test_replicas.py's: two fake backends (limit 2 in flight each, counted at the backend itself) behind
three replicas; the heavy tenant (alice) streams only through replica 1, the light tenant (bob) through replicas 2
and 3, both backlogged."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from typing import Any

import httpx
import pytest
from support.gateway import ADMIN, KEYS, admin_tenants, wait_until
from support.processes import fairserve_process
from support.redis_server import redis_server
from support.state_replicas import HEAVY, LIGHT, LIMIT, counted_backends, drive, replica_config, settled, until

from fairserve.api.server import free_port, running_server
from fairserve.gateway import create_app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def backends():
    with counted_backends() as pair:
        yield pair


def gateway_process(urls, state: str):
    """A gateway replica in its own process (tests/processes.py), sharing `state`."""
    return fairserve_process(
        "gateway",
        "--state",
        state,
        "--state-interval",
        "0.01",
        "--no-access-log",
        "--log-level",
        "warning",
        "--admin-key",
        ADMIN,
        *(x for u in urls for x in ("--backend", f"{u},max_requests={LIMIT}")),
        *(x for n, k in KEYS.items() for x in ("--tenant", f"{n}:{k}")),
    )


def test_unreachable_redis_at_start_is_one_line_and_exit_2(backends):
    _, urls = backends
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairserve",
            "gateway",
            "--listen",
            f"127.0.0.1:{free_port()}",  # NOTE: not the default 8080, which a README recipe may hold meanwhile
            "--state",
            f"redis://127.0.0.1:{free_port()}/0",
            "--backend",
            urls[0],
            "--tenant",
            "alice:key-alice",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fairserve: error: cannot reach the shared state at redis://")


def test_a_killed_replica_frees_its_capacity_and_the_others_keep_serving(redis, backends):
    apps, urls = backends
    state = f"{redis.url[:-1]}1"  # a database of its own
    for a in apps:
        a.peak = 0
    with contextlib.ExitStack() as stack:
        (g1, p1), (g2, _), (g3, _) = (stack.enter_context(gateway_process(urls, state)) for _ in range(3))
        outcomes: list[str] = []
        seen: dict[str, list[int]] = {}

        async def kill_replica_1():
            async with httpx.AsyncClient(timeout=30) as c:

                async def served(gs: tuple[str, ...]) -> list[float]:
                    """The requests each of `gs` has ended ok (its own /metrics)."""
                    docs = [settled((await c.get(g + "/metrics")).text) for g in gs]
                    return [sum(row["ok"] for row in doc.values()) for doc in docs]

                async def grew(gs: tuple[str, ...], base: list[float], by: int) -> bool:
                    return all(n >= b + by for n, b in zip(await served(gs), base, strict=True))

                async def live_leases_hold_the_limit() -> bool:
                    docs = [(await c.get(g + "/healthz")).json()["backends"] for g in (g2, g3)]
                    return [sum(x[j]["limit_requests"] for x in docs) for j in range(2)] == [LIMIT, LIMIT]

                async def bob_fills_both() -> bool:
                    return [a.peak for a in apps] == [LIMIT, LIMIT]

                # every replica serving (alice through replica 1, bob through 2 and 3) before the kill
                base = await served((g1, g2, g3))
                await until(lambda: grew((g1, g2, g3), base, 1), 30.0, "every replica served a request")
                p1.kill()  # no goodbye: its leases must expire (TTL 3 s)
                # NOTE: from the moment the live replicas' leases hold every slot, bob alone must fill both backends
                await until(live_leases_hold_the_limit, 30.0, "the live replicas hold each backend's whole limit")
                seen["before"] = [a.peak for a in apps]
                for a in apps:
                    a.peak = 0
                await until(bob_fills_both, 30.0, "bob alone fills both backends")
                # and a stretch more within the limit: every bob stream ends two more requests
                base = await served((g2, g3))
                await until(lambda: grew((g2, g3), base, 2 * LIGHT), 30.0, "two more requests per bob stream")
                seen["after"] = [a.peak for a in apps]

        placement = {"alice": [(g1, HEAVY)], "bob": [(g2, LIGHT), (g3, LIGHT)]}
        asyncio.run(drive(placement, 120.0, outcomes, kill_replica_1))
        # every bob request ended ok; the only failures are alice's streams cut by the kill, one per stream
        failed = [o for o in outcomes if o != "ok"]
        assert len(failed) <= HEAVY and all(o.startswith("alice: ") for o in failed), failed
        # the limit held over the whole run, the hand-over included; once the dead replica's leases expired, bob (more
        # streams than slots) filled both backends, more than the half he had while alice was served
        # NOTE: slots in use, not tokens per second: a rate would measure the machine's load as much as the leases
        assert max(seen["before"]) <= LIMIT and seen["after"] == [LIMIT, LIMIT], seen

        # idle now: the two live replicas hold each backend's whole limit (their spare), and the dead one has left the
        # live set (at the next expiry sweep)
        def leases() -> list[int]:
            docs = [httpx.get(g + "/healthz").json()["backends"] for g in (g2, g3)]
            return [sum(x[j]["limit_requests"] for x in docs) for j in range(2)]

        assert wait_until(lambda: leases() == [LIMIT, LIMIT], 30.0), leases()
        assert wait_until(
            lambda: (lambda st: st["up"] and st["replicas"] == 2)(httpx.get(g2 + "/healthz").json()["shared_state"]),
            timeout_s=30.0,
        ), httpx.get(g2 + "/healthz").json()


OWN = [["alice"], ["bob"], ["bob"]]  # the tenant each replica serves (alice through replica 1, bob through 2 and 3)


def test_redis_stopped_and_restarted_mid_run(backends):
    """Both tenants backlogged on three replicas; Redis stopped and restarted empty under load. The wiring: every
    replica keeps serving while Redis is down (degraded, /healthz still 200), rejoins when it is back, and the
    counters move again on every replica, also the tenant it does not serve (only the shared state moves that one);
    no request fails, nothing is lost or charged twice (each tenant's shared service is what the replicas settled
    for it, exactly); once the leases are back within the limits, the backends stay within them. Bounds: on the
    test's clock (test_replicas_clock.py)."""
    apps, urls = backends
    # NOTE: a Redis of its own (this test stops it); the default TTL (3 s), as test_replicas.py's three replicas: a
    # replica whose syncs time out on a loaded machine keeps its lease that long before it takes max(1, LIMIT // 3)
    with redis_server() as redis, contextlib.ExitStack() as stack:
        cfg = replica_config(urls, redis.url, 3.0)
        gws = [stack.enter_context(running_server(create_app(cfg.model_copy(deep=True)))) for _ in range(3)]
        outcomes: list[str] = []
        seen: dict[str, Any] = {}

        async def bounce_redis():
            async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {ADMIN}"}) as c:

                async def healthz() -> list[dict]:
                    return [(await c.get(g + "/healthz")).json() for g in gws]

                async def views() -> list[dict[str, tuple[float, float]]]:
                    """Each replica's (counter, service) of each tenant, as its ledger reads them."""
                    docs = [(await c.get(g + "/admin/tenants")).json()["tenants"] for g in gws]
                    return [{t["name"]: (t["counter"], t["service"]) for t in doc} for doc in docs]

                async def moved(base: list[dict[str, tuple[float, float]]], tenants: list[list[str]]) -> bool:
                    """On every replica k, the counters of `tenants[k]` grew since `base`."""
                    now = await views()
                    return all(now[k][t][0] > base[k][t][0] for k in range(3) for t in tenants[k])

                async def synced_since(before: list[dict]) -> bool:
                    """Every replica up, and it has answered a sync sent after `before` was read (two more sent: the
                    first of them was answered, or it would not be up)."""
                    now = await healthz()
                    return all(
                        n["shared_state"]["up"]
                        and n["shared_state"]["round_trips"] >= b["shared_state"]["round_trips"] + 2
                        for n, b in zip(now, before, strict=True)
                    )

                async def frozen() -> bool:
                    """Every slot held by a stalled stream and every charge in Redis, read by every replica: the views
                    agree and stay so across a sync of each (a stream that was ending frees a slot, which a request
                    then takes: its charge shows)."""
                    if [a.now for a in apps] != [LIMIT, LIMIT]:
                        return False
                    before, first = await healthz(), await views()
                    await until(lambda: synced_since(before), 30.0, "every replica synced")
                    second = await views()
                    return first[0] == first[1] == first[2] == second[0] == second[1] == second[2] and [
                        a.now for a in apps
                    ] == [LIMIT, LIMIT]

                async def rejoined() -> bool:
                    return all(h["shared_state"]["up"] and h["shared_state"]["replicas"] == 3 for h in await healthz())

                async def leases_within_limits() -> bool:
                    """Every replica up and the leases within each backend's limit: from here no replica admits past it
                    (a lease covers what its replica has in flight, and Redis grants no more than the limit)."""
                    rows = [h["shared_state"] for h in await healthz()]
                    return all(r["up"] for r in rows) and all(
                        sum(r["backends"][j]["lease_requests"] for r in rows) <= LIMIT for j in range(2)
                    )

                async def served() -> list[float]:
                    """The requests each replica has ended ok (its own /metrics)."""
                    return [sum(x["ok"] for x in settled((await c.get(g + "/metrics")).text).values()) for g in gws]

                async def served_more(base: list[float], more: list[int]) -> bool:
                    now = await served()
                    return all(n >= b + m for n, b, m in zip(now, base, more, strict=True))

                async def degraded() -> bool:
                    return all(h["shared_state"]["degraded"] for h in await healthz())

                # both tenants served and backlogged on every replica
                base = await views()
                await until(lambda: moved(base, OWN), 30.0, "every replica served its tenant")
                # NOTE: Redis restarted empty takes each tenant's counter and service from the first replica that
                # writes them back (docs/gateway.md): what another replica flushed after that one's last sync would
                # be lost. So Redis stops while nothing is charged: the backends paused, every slot held by a stalled
                # stream, every charge in Redis and read by every replica; then nothing may be lost or charged twice
                for a in apps:
                    a.fake.paused = True
                try:
                    await until(frozen, 30.0, "every slot held, every charge synced")
                    seen["frozen"] = await views()
                    await asyncio.to_thread(redis.stop)
                finally:
                    for a in apps:
                        a.fake.paused = False
                # every replica degraded, still serving: /healthz 200 and ok, its own tenant's counter moving
                took = seen["took"] = {"degraded": await until(degraded, 30.0, "every replica degraded")}
                took["served"] = await until(lambda: moved(seen["frozen"], OWN), 30.0, "served while Redis is down")
                seen["down"] = [await c.get(g + "/healthz") for g in gws], (await c.get(gws[0] + "/metrics")).text
                await asyncio.to_thread(redis.start)  # empty: no persistence
                took["rejoined"] = await until(rejoined, 30.0, "every replica back and seeing the three")
                # the counters move again on every replica, both tenants: the one it does not serve only through Redis
                base = await views()
                took["moved"] = await until(lambda: moved(base, [["alice", "bob"]] * 3), 30.0, "counters moved")
                # the limits hold again once the leases are back within them (while Redis was down each replica took
                # max(1, LIMIT // 3) of a backend past its lease, and a fresh Redis first leases what each has in
                # flight): from there, two more requests per stream on every replica within the limit
                took["within"] = await until(leases_within_limits, 30.0, "the leases back within the limits")
                for a in apps:
                    a.peak = a.now
                base = await served()
                await until(lambda: served_more(base, [2 * HEAVY, 2 * LIGHT, 2 * LIGHT]), 30.0, "two more per stream")
                seen["peaks"] = [a.peak for a in apps]

        placement = {"alice": [(gws[0], HEAVY)], "bob": [(gws[1], LIGHT), (gws[2], LIGHT)]}
        got = asyncio.run(drive(placement, 240.0, outcomes, bounce_redis))
        print("seconds after the step before: " + ", ".join(f"{k} {v:.2f}" for k, v in seen["took"].items()))
        assert outcomes and all(o == "ok" for o in outcomes), set(outcomes)  # no request failed
        down, metrics = seen["down"]
        assert all(r.status_code == 200 and r.json()["status"] == "ok" for r in down), [r.text for r in down]
        assert all(r.json()["shared_state"]["degraded"] for r in down)
        assert "fairserve_gateway_shared_state_up 0.0" in metrics
        assert max(seen["peaks"]) <= LIMIT, seen["peaks"]
        # nothing lost: nothing left queued or in flight on any replica; each replica settled every output token the
        # clients received
        assert wait_until(
            lambda: all(t["queue_length"] == 0 and t["in_flight"] == 0 for g in gws for t in admin_tenants(g).values()),
            30.0,
        ), [admin_tenants(g) for g in gws]
        rows = [settled(httpx.get(g + "/metrics").text) for g in gws]
        charged = {
            t: sum(cfg.w_p * r[t]["prompt"] + cfg.w_q * r[t]["output"] for r in rows if t in r)
            for t in ("alice", "bob")
        }
        for t in ("alice", "bob"):
            assert sum(r[t]["output"] for r in rows if t in r) == sum(n for _, n in got[t]), (t, rows)

        # once the last charges are synced the replicas agree, and each tenant's shared service is what the replicas
        # settled for it: nothing lost in the outage, nothing charged twice when the replicas wrote it back
        def services() -> list[dict[str, float]]:
            return [{n: t["service"] for n, t in admin_tenants(g).items()} for g in gws]

        assert wait_until(lambda: services() == [charged] * 3, 30.0), (services(), charged)
        assert all(httpx.get(g + "/healthz").json()["shared_state"]["up"] for g in gws)
        assert "fairserve_gateway_shared_state_up 1.0" in httpx.get(gws[0] + "/metrics").text
