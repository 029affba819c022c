"""Fairness of the gateway's own scheduler and dispatch, proven where the test owns the clock: the `Scheduler` the
gateway runs (its admission pass, its capacity check, its charges as tokens stream) with an injected clock, in
front of a backend the test plays step by step (each running request gets one token per 10 ms step). No HTTP, no
sleep: the result is the same on any machine, however loaded. Each claim is checked against its expected allocation
with a stated margin, and a negative control must fail the same check:

- two backlogged tenants get equal service within Theorem 4.4's bound 2·max(w_p·L_in, w_q·M), M the output tokens
  in flight (4 slots of 20); FCFS breaks it;
- two organisations, one of 10 users and one of 1, get equal service within the same bound; the same users without
  the organisations (flat VTC: ten shares of eleven to the first) break it;
- tenants weighted 1 and 2 get service 1 to 2 (service / weight equal) within the bound divided by the smaller
  weight, with VTC and VTC with prediction; the same tenants unweighted break it; four tenants weighted 1:2:3:4
  get service 1:2:3:4 within the same bound; the same four unweighted break it;
- a priority-0 request arriving into a priority-1 backlog is dispatched at the first free slot; at one level it
  waits behind the backlog."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from support.gateway import config

from fairserve.core import LedgerView, theorem_bound
from fairserve.gateway.admission.footprint import Footprint
from fairserve.gateway.admission.scheduler import Scheduler
from fairserve.gateway.admission.ticket import Ending, Ticket
from fairserve.gateway.metrics.prometheus import GatewayMetrics

pytestmark = pytest.mark.unit

SLOTS, PROMPT, OUTPUT, EACH = 4, 10, 20, 40
STEP_S = 0.01
BOUND = theorem_bound(PROMPT, SLOTS * OUTPUT)  # 2·max(1·10, 2·80) = 320
COST = PROMPT + 2 * OUTPUT  # one request's service


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


Measure = Callable[[LedgerView], "tuple[float, float] | None"]


def pair(x: str, y: str) -> Measure:
    """The service of nodes `x` and `y` (tenants or groups) while both have something queued."""

    def measure(view: LedgerView) -> tuple[float, float] | None:
        rows = {**view.tenants, **view.groups}
        return (rows[x].service, rows[y].service) if rows[x].queued and rows[y].queued else None

    return measure


@dataclass
class Run:
    gaps: list[float]  # the measured difference at every step where the measure applied
    service: dict[str, float]  # each tenant's, at the end
    order: list[int]  # arrival indices, in the order they were dispatched
    end_s: float  # the clock at the end, from the start


def run(policy: str, arrivals: list[tuple[float, str]], measure: Measure, **cfg: object) -> Run:
    """`arrivals` (time from the start, tenant) through one gateway scheduler with SLOTS slots, on the test's clock."""

    async def go() -> Run:
        clock = Clock()
        start = clock.now
        metrics = GatewayMetrics()
        backends = [{"url": "http://b", "max_inflight_requests": SLOTS}]
        sched = Scheduler(config(backends, policy=policy, **cfg), metrics, clock)
        metrics.bind(sched)
        pending = sorted(enumerate(arrivals), key=lambda x: (x[1][0], x[0]))
        tickets: dict[int, Ticket] = {}
        made: dict[int, int] = {}  # arrival index -> tokens the backend produced for it
        out = Run([], {}, [], 0.0)

        def note_dispatched() -> None:
            out.order += [k for k, t in tickets.items() if t.admitted.done() and k not in out.order]

        while pending or any(t.outcome is None for t in tickets.values()):
            while pending and pending[0][1][0] <= clock.now - start:
                k, (_, tenant) = pending.pop(0)
                tickets[k] = sched.new_ticket(tenant, Footprint(PROMPT, OUTPUT))
                assert sched.submit(tickets[k]) is None
                note_dispatched()
            clock.now += STEP_S
            running = [k for k, t in tickets.items() if t.admitted.done() and t.outcome is None]
            assert len(running) <= SLOTS  # the capacity holds
            for k in running:
                made[k] = made.get(k, 0) + 1
                sched.output(tickets[k], 1)
                if made[k] == OUTPUT:
                    sched.close(tickets[k], Ending("ok", prompt=PROMPT, output=OUTPUT))  # a slot frees: dispatch
                    note_dispatched()
            got = measure(sched.view())
            if got is not None:
                out.gaps.append(got[0] - got[1])
        out.service = {t: v.service for t, v in sched.view().tenants.items()}
        out.end_s = clock.now - start
        return out

    return asyncio.run(go())


# ---- two tenants --------------------------------------------------------------------------------------------------
TWO = [(0.0, "alice")] * EACH + [(0.0, "bob")] * EACH  # alice's requests queued first


def test_vtc_gives_two_backlogged_tenants_equal_service_within_the_bound():
    r = run("vtc", TWO, pair("alice", "bob"))
    assert len(r.gaps) > 100  # both were backlogged for most of the run
    assert max(abs(g) for g in r.gaps) <= BOUND, max(r.gaps, key=abs)
    # nothing lost, nothing charged twice: each tenant's service is its requests' whole cost
    assert r.service == {"alice": EACH * COST, "bob": EACH * COST}
    # work-conserving: every step served SLOTS requests (80 requests of 20 tokens on 4 slots: 400 steps)
    assert r.end_s == pytest.approx(2 * EACH * OUTPUT / SLOTS * STEP_S)


def test_fcfs_serves_the_first_comer_and_breaks_the_bound():
    # the negative control: the same check, which FCFS must fail
    r = run("fcfs", TWO, pair("alice", "bob"))
    assert max(abs(g) for g in r.gaps) > 4 * BOUND, max(r.gaps, key=abs)
    assert r.service["alice"] == r.service["bob"]  # in the end each got its own; the light one waited throughout


# ---- two organisations --------------------------------------------------------------------------------------------
USERS, PER_ORG = 10, 80
TREE = [(0.0, f"org-a/u{i % USERS}") for i in range(PER_ORG)] + [(0.0, "org-b/solo")] * PER_ORG


def tenants(arrivals: list[tuple[float, str]]) -> dict:
    return {"tenants": [{"name": t, "api_keys": [f"key-{t}"]} for t in sorted({t for _, t in arrivals})]}


def test_two_organisations_get_equal_service_however_many_users_each_has():
    r = run("vtc", TREE, pair("org-a", "org-b"), **tenants(TREE))
    assert len(r.gaps) > 100 and max(abs(g) for g in r.gaps) <= BOUND, max(r.gaps, key=abs)


def test_without_the_organisations_the_ten_users_take_ten_shares_of_eleven():
    # the negative control: the same users as flat tenants, the same check on the two organisations' sums
    flat = [(at, t.replace("/", "-")) for at, t in TREE]

    def orgs(view: LedgerView) -> tuple[float, float] | None:
        a = [v for t, v in view.tenants.items() if t.startswith("org-a-")]
        b = view.tenants["org-b-solo"]
        return (sum(v.service for v in a), b.service) if any(v.queued for v in a) and b.queued else None

    r = run("vtc", flat, orgs, **tenants(flat))
    assert max(abs(g) for g in r.gaps) > 4 * BOUND, max(r.gaps, key=abs)


# ---- weights ------------------------------------------------------------------------------------------------------
WEIGHTS = {"alice": 1.0, "bob": 2.0}
WEIGHTED = {"tenants": [{"name": t, "api_keys": [f"key-{t}"], "weight": w} for t, w in WEIGHTS.items()]}


def per_weight(view: LedgerView) -> tuple[float, float] | None:
    """alice's and bob's service divided by the weights 1 and 2, while both have something queued."""
    a, b = view.tenants["alice"], view.tenants["bob"]
    return (a.service / WEIGHTS["alice"], b.service / WEIGHTS["bob"]) if a.queued and b.queued else None


@pytest.mark.parametrize("policy", ["vtc", "vtc-predict"])
def test_weights_one_to_two_give_service_one_to_two_within_the_bound(policy):
    # NOTE: weighted VTC's bound on service / weight is Theorem 4.4's divided by the smaller weight (1 here)
    r = run(policy, TWO, per_weight, **WEIGHTED)
    assert len(r.gaps) > 50 and max(abs(g) for g in r.gaps) <= BOUND / min(WEIGHTS.values()), max(r.gaps, key=abs)


def test_without_the_weights_bob_gets_one_share_of_two_and_breaks_it():
    # the negative control: the same check on the same tenants with equal weights
    r = run("vtc", TWO, per_weight)
    assert max(abs(g) for g in r.gaps) > 2 * BOUND, max(r.gaps, key=abs)


FOUR = {f"t{w}": float(w) for w in (1, 2, 3, 4)}
SPLIT = [(0.0, t) for t in FOUR for _ in range(EACH)]  # t1's requests queued first, t4's last


def per_weight_spread(view: LedgerView) -> tuple[float, float] | None:
    """The largest and smallest service / weight among the four tenants, while all four have something queued."""
    rows = [view.tenants[t] for t in FOUR]
    if not all(r.queued for r in rows):
        return None
    shares = [r.service / FOUR[t] for t, r in zip(FOUR, rows, strict=True)]
    return max(shares), min(shares)


def weighted(weights: dict[str, float]) -> dict:
    return {"tenants": [{"name": t, "api_keys": [f"key-{t}"], "weight": w} for t, w in weights.items()]}


def test_weights_one_two_three_four_split_service_one_two_three_four_within_the_bound():
    r = run("vtc", SPLIT, per_weight_spread, **weighted(FOUR))
    # NOTE: every pair's service / weight within Theorem 4.4's bound divided by the smaller weight (1 here)
    assert len(r.gaps) > 50 and max(r.gaps) <= BOUND / min(FOUR.values()), max(r.gaps)
    assert r.service == {t: EACH * COST for t in FOUR}  # nothing lost: each got its own in the end


def test_the_same_four_tenants_unweighted_get_equal_service_and_break_it():
    # the negative control: the same check with equal weights; t4 gets a quarter, not four tenths
    r = run("vtc", SPLIT, per_weight_spread, **weighted(dict.fromkeys(FOUR, 1.0)))
    assert max(r.gaps) > 2 * BOUND, max(r.gaps)


# ---- priority levels ----------------------------------------------------------------------------------------------
BACKLOG = [(0.0, "std/u")] * 20 + [(0.105, "vip")]  # the vip request arrives mid-request, into a full backlog
VIP = 20  # its arrival index


def nothing(view: LedgerView) -> None:
    return None


def test_a_priority_0_request_is_dispatched_at_the_first_free_slot():
    r = run("vtc", BACKLOG, nothing, groups=[{"name": "std", "priority": 1}], **tenants(BACKLOG))
    assert r.order.index(VIP) == SLOTS  # the 4 first std requests were running; the next slot is the vip's


def test_at_one_level_the_same_request_waits_behind_the_backlog():
    # the negative control: at one level (arrival order) the same check fails: it is dispatched last
    r = run("fcfs", BACKLOG, nothing, **tenants(BACKLOG))
    assert r.order.index(VIP) == len(BACKLOG) - 1
