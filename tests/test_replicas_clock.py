"""Fairness across gateway replicas, proven where the test owns the clock: each replica the gateway's own `Scheduler`
(ledger, dispatch, capacity check) with the real `SharedState` against a real redis-server, in front of two backends
the test plays step by step (every running request gets one output token per 10 ms step; each replica syncs every
second step, Δ = 20 ms, and at the next step when it asks to sync early). No sleep, no wall clock: a run is the same
on any machine, however loaded (tests/support/stepped_replicas.py, `Stepped`). tests/test_replicas.py and
tests/test_replicas_faults.py check the same wiring through HTTP.

The bound on the service difference of two backlogged tenants (or nodes, per unit of weight) is docs/gateway.md's
"Running several replicas", from the workload:

    B(N) = 2·max(w_p·L_in, w_q·M) + 2·Δ·S + (N + ⌈Δ·F⌉)·U

the single-gateway term Theorem 4.4's, M the output tokens in flight on all backends (as
tests/test_gateway_fair_clock.py states it: with 4 slots one gateway alone reaches 192 here, above twice one request's
cost), U = w_p·L_in + w_q·L_out one request's cost, S the cost per second all backends serve, F the requests ending
per second, N the replicas. Each claim has a negative control that must fail the same check:

- three replicas with shared state give a heavy tenant (12 streams, on replica 1) and a light one (6 streams on each of
  replicas 2 and 3) equal service within B(3); the same replicas without shared state (independent ledgers) break it;
- the backends' limit (2 each) holds over the three replicas together with shared state; without it each replica
  takes the whole limit;
- Dynamo's case: class groups weighted 4:1, class A through replica 1 and class B through replica 2, get service 4:1
  (service per weight within B(2)); without shared counters, and with shared state but without the groups (the
  tenants' own counters compared), they get 1:1;
- a group idle on both replicas comes back (through the replica where none of its siblings is queued) lifted to its
  sibling served elsewhere: from then on the two split the service 1:1 within B(2); without the lift (LCF) it hoards
  the credit it did not use;
- Redis stopped mid-run (past the leases' TTL: the replicas independent, the light tenant ahead) and restarted empty:
  nothing is lost or charged twice, and once every replica is back VTC pays the gap back at the full service rate,
  so that from then on it stays within B(3), and the backends within their limit; while Redis stays down the same
  check fails."""

from __future__ import annotations

import asyncio
import math

import pytest
from support.redis_server import redis_server
from support.stepped_replicas import Stepped, Stream

from fairserve.core import theorem_bound
from fairserve.gateway import build_config

pytestmark = pytest.mark.integration

LIMIT, BACKENDS = 2, 2  # in flight per backend
SLOTS = LIMIT * BACKENDS
PROMPT, OUTPUT = 10, 20  # tokens per request
W_P, W_Q = 1, 2
STEP_S, EVERY = 0.01, 2  # one token per running request per step; a sync every EVERY steps
DELTA = STEP_S * EVERY
U = W_P * PROMPT + W_Q * OUTPUT  # one request's cost: 50
F = SLOTS / OUTPUT / STEP_S  # requests ending per second: 20
S = SLOTS * W_Q / STEP_S + F * W_P * PROMPT  # cost served per second: 1,000


def bound(replicas: int) -> float:
    """docs/gateway.md's bound for `replicas` replicas (weights 1; per unit of weight with the smallest weight 1)."""
    return theorem_bound(PROMPT, SLOTS * OUTPUT, W_P, W_Q) + 2 * DELTA * S + (replicas + math.ceil(DELTA * F)) * U


B3, B2 = bound(3), bound(2)  # 320 + 40 + 4·50 = 560; 320 + 40 + 3·50 = 510


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


def cfg(tenants, state: str | None, groups=(), policy: str = "vtc"):
    return build_config(
        {
            "backends": [{"url": f"http://b{i}", "max_inflight_requests": LIMIT} for i in range(BACKENDS)],
            "tenants": [{"name": t, "api_keys": [f"key-{k}"]} for k, t in enumerate(tenants)],
            "groups": [{"name": g, "weight": w} for g, w in groups],
            "policy": policy,
            "w_p": W_P,
            "w_q": W_Q,
            "health_interval_s": 0,
            **({"state": state, "state_interval_s": DELTA} if state else {}),
        }
    )


def run(config, replicas: int, streams: list[Stream], steps: int) -> Stepped:
    return asyncio.run(Stepped(config, replicas, streams, PROMPT, OUTPUT, STEP_S, EVERY).run(steps))


def gaps(r: Stepped, x, y, since: int = 0) -> list[float]:
    """x(service) - y(service) after every step from `since`, where both nodes' tenants are backlogged; `x` and `y`
    read a step's service (its tally over all replicas) and its queued requests."""
    h0 = r.history[since - 1] if since else {}
    out = []
    for h, q in zip(r.history[since:], r.queued[since:], strict=True):
        a, b = x(h, h0, q), y(h, h0, q)
        if a is not None and b is not None:
            out.append(a - b)
    return out


def node(*tenants: str, weight: float = 1.0):
    """The service of `tenants` together since the window's start, per `weight`; None unless each has something
    queued (on any replica)."""

    def read(h, h0, q):
        if not all(q.get(t) for t in tenants):
            return None
        return sum(h.get(t, 0.0) - h0.get(t, 0.0) for t in tenants) / weight

    return read


# ---- three replicas, two tenants ----------------------------------------------------------------------------------
THREE = [Stream(0, "alice", 12), Stream(1, "bob", 6), Stream(2, "bob", 6)]  # every replica more than the 4 slots
STEPS = 1000


@pytest.fixture(scope="module")
def three(redis):
    return {
        "shared": run(cfg(["alice", "bob"], redis.url), 3, THREE, STEPS),
        "independent": run(cfg(["alice", "bob"], None), 3, THREE, STEPS),
    }


def bob_share(r: Stepped) -> tuple[float, float]:
    """bob's share of the service over the run, and its margin around 0.5 that B(3) implies: |A - B| <= B(3) gives
    |B / (A + B) - 0.5| <= B(3) / (2 (A + B))."""
    a, b = r.history[-1]["alice"], r.history[-1]["bob"]
    return b / (a + b), B3 / (2 * (a + b))


def test_three_replicas_with_shared_state_give_two_backlogged_tenants_equal_service_within_the_bound(three):
    r = three["shared"]
    diffs = gaps(r, node("alice"), node("bob"))
    assert len(diffs) == STEPS  # both backlogged throughout
    print(f"largest service gap {max(map(abs, diffs)):.0f} (bound {B3:.0f})")
    assert max(map(abs, diffs)) <= B3, max(diffs, key=abs)  # measured 200
    share, margin = bob_share(r)
    print(f"bob's share {share:.3f} (margin {margin:.3f})")
    assert abs(share - 0.5) <= margin, (share, margin)  # measured 0.499, margin 0.029
    # every replica's counters, as its ledger reads them (the shared ones, up to a sync late), within the bound too
    seen = max(abs(v["alice"] - v["bob"]) for views in r.views for v in views)
    assert seen <= B3, seen  # measured 200
    # nothing lost, nothing charged twice: every replica's shared service is what the backends served
    assert all(f["alice"] == r.history[-1]["alice"] and f["bob"] == r.history[-1]["bob"] for f in r.final), r.final


def test_three_independent_replicas_break_the_bound(three):
    # the negative control: the same replicas without shared state, the same check: bob's two replicas hold twice
    # alice's slots, so he gets two shares of three
    r = three["independent"]
    diffs = gaps(r, node("alice"), node("bob"))
    assert len(diffs) == STEPS
    print(f"largest service gap {max(map(abs, diffs)):.0f} (bound {B3:.0f})")
    assert max(map(abs, diffs)) > 4 * B3, max(diffs, key=abs)  # measured 10,040
    share, margin = bob_share(r)
    print(f"bob's share {share:.3f} (margin {margin:.3f})")
    assert abs(share - 0.5) > margin, (share, margin)  # measured 0.667, margin 0.009


def test_the_backend_limit_holds_over_all_replicas_with_shared_state(three):
    running = three["shared"].running
    assert {url: max(n) for url, n in running.items()} == {"http://b0": LIMIT, "http://b1": LIMIT}, running
    # work-conserving: the replicas together keep the backends full but while a slot moves between them
    assert all(sum(n) >= 0.9 * LIMIT * STEPS for n in running.values()), [sum(n) for n in running.values()]


def test_without_shared_state_each_replica_takes_the_whole_limit(three):
    # the negative control: the same check, which independent replicas fail (each holds LIMIT on each backend)
    running = three["independent"].running
    assert {url: max(n) for url, n in running.items()} == {"http://b0": 3 * LIMIT, "http://b1": 3 * LIMIT}


# ---- NVIDIA Dynamo's case: class groups weighted 4:1 through different replicas ------------------------------------
CLASSES = ["class-a/u0", "class-a/u1", "class-b/u0", "class-b/u1"]
WEIGHTS = [("class-a", 4), ("class-b", 1)]
DYNAMO_STEPS = 2000


def dynamo(config, tenants: list[str]) -> tuple[list[float], float, float]:
    """Class A's tenants through replica 1, class B's through replica 2, 6 streams each: the gaps of service per
    weight (4 and 1), class A's share over the run, and the share's margin around 0.8 that B(2) implies
    (|A/4 - B| <= B(2) gives |A / (A + B) - 0.8| <= 0.8·B(2) / (A + B))."""
    r = run(config, 2, [Stream(0 if t.startswith("class-a") else 1, t, 6) for t in tenants], DYNAMO_STEPS)
    diffs = gaps(r, node(*tenants[:2], weight=4), node(*tenants[2:]))
    assert len(diffs) == DYNAMO_STEPS  # both classes backlogged throughout
    a, b = (sum(r.history[-1][t] for t in ts) for ts in (tenants[:2], tenants[2:]))
    worst = max(map(abs, diffs))
    print(f"largest gap of service per weight {worst:.0f} (bound {B2:.0f}); class A's share {a / (a + b):.3f}")
    return diffs, a / (a + b), 0.8 * B2 / (a + b)


def test_dynamo_case_class_groups_weighted_4_to_1_through_different_replicas_get_4_to_1(redis):
    diffs, share, margin = dynamo(cfg(CLASSES, redis.url, WEIGHTS), CLASSES)
    assert max(map(abs, diffs)) <= B2, max(diffs, key=abs)  # measured 175
    assert abs(share - 0.8) <= margin, (share, margin)  # measured 0.799, margin 0.021


def test_dynamo_case_without_shared_counters_collapses_to_1_to_1(redis):
    # the negative control: the same tree on each replica, no shared state: each replica sees one class only
    diffs, share, margin = dynamo(cfg(CLASSES, None, WEIGHTS), CLASSES)
    assert max(map(abs, diffs)) > 4 * B2, max(diffs, key=abs)  # measured 15,030
    assert abs(share - 0.8) > margin, (share, margin)  # measured 0.500 (margin 0.010)


def test_dynamo_case_without_the_groups_collapses_to_1_to_1(redis):
    # the negative control: shared state, the same tenants without their groups (each tenant's own counter compared,
    # as Dynamo's routers do): the same check fails
    flat = [t.replace("/", "-") for t in CLASSES]
    diffs, share, margin = dynamo(cfg(flat, redis.url), flat)
    assert max(map(abs, diffs)) > 4 * B2, max(diffs, key=abs)  # measured 7,158
    assert abs(share - 0.8) > margin, (share, margin)  # measured 0.500 (margin 0.021)


# ---- a group idle everywhere comes back lifted to its sibling served through another replica ----------------------
G, H = "org/g/u0", "org/h/u0"  # sibling groups org/g and org/h, one tenant each
BACK, LIFT_STEPS = 300, 1300  # org/h alone through replica 2 for BACK steps; then org/g through replica 1 too


def lift(redis, policy: str) -> list[float]:
    """The service org/g and org/h get from the moment org/g comes back, compared at every step after (both
    backlogged)."""
    streams = [Stream(1, H, 8), Stream(0, G, 8, start=BACK)]
    r = run(cfg([G, H], redis.url, policy=policy), 2, streams, LIFT_STEPS)
    diffs = gaps(r, node(G), node(H), since=BACK)
    assert len(diffs) >= LIFT_STEPS - BACK - 1  # both backlogged from org/g's first queued request
    assert r.history[BACK - 1]["org/h"] > 4 * B2  # org/h's lead: far more than the bound
    print(f"{policy}: largest service gap since org/g came back {max(map(abs, diffs)):.0f} (bound {B2:.0f})")
    return diffs


def test_a_group_idle_everywhere_comes_back_at_its_siblings_counter_and_gets_half(redis):
    diffs = lift(redis, "vtc")
    assert max(map(abs, diffs)) <= B2, max(diffs, key=abs)  # measured 168


def test_without_the_lift_the_group_hoards_its_credit(redis):
    # the negative control: LCF, VTC without the lift: org/g takes everything until it caught up org/h's lead
    diffs = lift(redis, "lcf")
    assert max(map(abs, diffs)) > 4 * B2, max(diffs, key=abs)  # measured 3,036


# ---- Redis stopped mid-run and restarted empty ---------------------------------------------------------------------
DOWN, BACK, OUTAGE_STEPS = 300, 800, 2000  # Redis stops before step 300 and starts again (empty) before step 800
TTL_STEPS = round(3.0 / STEP_S)  # the leases' TTL (state_ttl_s, 3 s): down for longer, the replicas are independent
HOLD_S = 0.5  # the gateway's: a Redis that lost its data leases each replica only what it has in flight for this long


@pytest.fixture(scope="module")
def outage():
    def one(back: int | None) -> Stepped:
        with redis_server() as own:  # NOTE: a Redis of its own: the run stops it
            config = cfg(["alice", "bob"], own.url)
            stepped = Stepped(config, 3, THREE, PROMPT, OUTPUT, STEP_S, EVERY, HOLD_S, own, (DOWN, back))
            return asyncio.run(stepped.run(OUTAGE_STEPS))

    return {"back": one(BACK), "never": one(None)}


def after_the_outage(r: Stepped) -> tuple[float, int, float, int]:
    """The service gap (alice - bob) when Redis is back (or would be: step BACK); the step from which VTC has paid
    it back: the hold, one request's output (what was admitted before ends), then the gap at the full service rate
    (the replicas ahead defer to the one behind, which takes every slot); the largest gap from there to the end, in
    the tally and as every replica's ledger reads it; and the most requests on a backend from one request's output
    after the step Redis was back."""
    at = r.rejoined if r.rejoined is not None else BACK
    g = [h["alice"] - h["bob"] for h in r.history]
    paid = at + round(HOLD_S / STEP_S) + OUTPUT + math.ceil(abs(g[at]) / (S * STEP_S))
    assert paid < OUTAGE_STEPS - 500, paid  # NOTE: and a long stretch after it
    worst = max(max(abs(x) for x in g[paid:]), max(abs(v["alice"] - v["bob"]) for vs in r.views[paid:] for v in vs))
    busiest = max(max(n[at + OUTPUT :]) for n in r.running.values())
    return g[at], paid, worst, busiest


def test_after_redis_restarts_empty_nothing_is_lost_and_the_gap_is_back_within_the_bound(outage):
    r = outage["back"]
    assert r.rejoined is not None and r.rejoined <= BACK + EVERY, r.rejoined  # every replica back within a round
    assert len(gaps(r, node("alice"), node("bob"))) == OUTAGE_STEPS  # both backlogged throughout
    # nothing lost, nothing charged twice: every replica's shared service is what the backends served
    assert all(f["alice"] == r.history[-1]["alice"] and f["bob"] == r.history[-1]["bob"] for f in r.final), r.final
    # within the bound until Redis stopped; the outage made it uneven, by more than the bound (until the TTL each
    # replica serves on the leases it held, then each takes max(1, LIMIT // 3) of each backend: bob, on two, 2/3)
    assert max(abs(h["alice"] - h["bob"]) for h in r.history[:DOWN]) <= B3
    gap, paid, worst, busiest = after_the_outage(r)
    print(
        f"gap {gap:.0f} when Redis was back (step {r.rejoined}); from step {paid} at most {worst:.0f} (bound {B3:.0f})"
    )
    assert abs(gap) > B3, gap  # measured 1,936
    assert worst <= B3, worst  # measured 200
    # the backends' limit: within it while each replica had its lease (until the TTL), and again from when what was
    # admitted while the replicas were independent has ended
    running = r.running.values()
    assert max(max(n[: DOWN + TTL_STEPS]) for n in running) <= LIMIT
    assert busiest <= LIMIT, busiest  # measured 2 (3 until 6 steps after Redis was back)


def test_while_redis_stays_down_the_gap_is_not_back_within_the_bound(outage):
    # the negative control: the same run, Redis never back: the replicas stay independent, the same check fails
    r = outage["never"]
    assert r.rejoined is None
    gap, paid, worst, busiest = after_the_outage(r)
    print(f"gap {gap:.0f} at step {BACK}; from step {paid} up to {worst:.0f} (bound {B3:.0f}); {busiest} on a backend")
    assert worst > 4 * B3, worst  # measured 9,972 (alice's replica's own view; the tally's gap ends at -3,784)
    assert busiest == 3 * max(1, LIMIT // 3), busiest  # each of the three replicas takes max(1, LIMIT // 3)
