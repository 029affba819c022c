"""Fairness of the gateway's own scheduler and dispatch, proven where the test owns the clock: the `Scheduler` the
gateway runs (its admission pass, its capacity check, its charges as tokens stream) with an injected clock, in
front of a backend the test plays step by step (each running request gets one token per 10 ms step). No HTTP, no
sleep: the result is the same on any machine, however loaded.

Two tenants, both backlogged from the start, the heavy one's 40 requests queued before the light one's 40. The
expected allocation is equal service while both are backlogged; the margin is Theorem 4.4's bound 2·max(w_p·L_in,
w_q·M), with M the output tokens in flight (4 slots of 20). The negative control: FCFS, the same check, fails."""

from __future__ import annotations

import asyncio

import pytest
from support.gateway import config

from fairserve.core import theorem_bound
from fairserve.gateway.prometheus import GatewayMetrics
from fairserve.gateway.scheduler import Ending, Scheduler

pytestmark = pytest.mark.unit

SLOTS, PROMPT, OUTPUT, EACH = 4, 10, 20, 40
STEP_S = 0.01
BOUND = theorem_bound(PROMPT, SLOTS * OUTPUT)  # 2·max(1·10, 2·80) = 320


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(policy: str) -> tuple[list[float], dict[str, float], float]:
    """The service difference (heavy - light) at every step while both tenants are backlogged, each tenant's
    service then, and the clock's time at the end."""

    async def go() -> tuple[list[float], dict[str, float], float]:
        clock = Clock()
        cfg = config([{"url": "http://b", "max_inflight_requests": SLOTS}], policy=policy)
        metrics = GatewayMetrics()
        sched = Scheduler(cfg, metrics, clock=clock)
        metrics.bind(sched)
        tickets = [sched.new_ticket(t, PROMPT, OUTPUT) for t in ("alice",) * EACH + ("bob",) * EACH]
        for t in tickets:
            assert sched.submit(t) is None
        made: dict[int, int] = {}  # ticket -> tokens the backend produced for it
        gaps: list[float] = []
        while any(t.outcome is None for t in tickets):
            clock.now += STEP_S
            running = [t for t in tickets if t.admitted.done() and t.outcome is None]
            assert len(running) <= SLOTS  # the capacity holds
            for t in running:
                made[id(t)] = made.get(id(t), 0) + 1
                sched.output(t, 1)
                if made[id(t)] == OUTPUT:
                    sched.close(t, Ending("ok", prompt=PROMPT, output=OUTPUT))  # frees the slot: dispatch runs
            view = sched.view().tenants
            if view["alice"].queued and view["bob"].queued:
                gaps.append(view["alice"].service - view["bob"].service)
        view = sched.view().tenants
        return gaps, {t: v.service for t, v in view.items()}, clock.now

    return asyncio.run(go())


def test_vtc_gives_two_backlogged_tenants_equal_service_within_the_bound():
    gaps, service, end = run("vtc")
    assert len(gaps) > 100  # both were backlogged for most of the run
    assert max(abs(g) for g in gaps) <= BOUND, max(gaps, key=abs)
    # nothing lost, nothing charged twice: each tenant's service is its requests' whole cost
    assert service == {"alice": EACH * (PROMPT + 2 * OUTPUT), "bob": EACH * (PROMPT + 2 * OUTPUT)}
    # work-conserving: every step served SLOTS requests (80 requests of 20 tokens on 4 slots: 400 steps)
    assert end == pytest.approx(100.0 + 2 * EACH * OUTPUT / SLOTS * STEP_S)


def test_fcfs_serves_the_first_comer_and_breaks_the_bound():
    # the negative control: the same check, which FCFS must fail
    gaps, service, _ = run("fcfs")
    assert max(abs(g) for g in gaps) > 4 * BOUND, max(gaps, key=abs)
    assert service["alice"] == service["bob"]  # in the end each got its own, but the light one waited throughout
