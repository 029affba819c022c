"""The ledger: per-tenant state owned once; settle exactly once; admin changes that mean the same for every policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    Ledger,
    PolicyError,
    Request,
    RequestState,
    Unsupported,
    check_weight,
    jain_index,
    make_policy,
    profiled_a10g_llama2_7b,
    theorem_bound,
)

pytestmark = pytest.mark.unit


def ledger(spec: str = "vtc", tenants=("a", "b"), **kw) -> Ledger:
    return Ledger(make_policy(spec, **kw), tenants)


def test_configured_tenants_show_from_the_start():
    view = ledger().view()
    assert list(view.tenants) == ["a", "b"] and view.policy == "vtc"
    assert all(t.service == t.counter == t.queued == t.running == 0 for t in view.tenants.values())


def test_counts_follow_the_life_cycle_and_settle_is_once():
    led = ledger()
    r1 = led.arrive(1, "a", 10, item="ticket-1")
    r2 = led.arrive(2, "a", 10)
    assert r1.item == "ticket-1" and led.get(1) is r1
    assert (led.view().tenants["a"].queued, led.view().tenants["a"].running) == (2, 0)
    assert led.pop() is r1
    assert (led.view().tenants["a"].queued, led.view().tenants["a"].running) == (1, 1)
    led.output(r1, 3)
    assert led.settle(r1) and not led.settle(r1)  # the second settle does nothing
    assert led.view().tenants["a"].service == 10 + 2 * 3 and led.get(1) is None
    assert led.settle(r2, cancelled=True)  # queued: dropped, never charged
    a = led.view().tenants["a"]
    assert (a.queued, a.running, a.service) == (0, 0, 16) and r2.state is RequestState.ABORTED
    with pytest.raises(ValueError, match="already"):
        led.arrive(3, "a", 1) and led.arrive(3, "a", 1)


def test_pop_of_the_head_the_driver_holds_is_pop():
    views = []
    for hand_over in (False, True):
        led = Ledger(make_policy("vtc"), ("a", "g/b"))
        reqs = [led.arrive(1, "a", 10), led.arrive(2, "g/b", 20), led.arrive(3, "g/b", 5)]
        popped = []
        while (head := led.peek()) is not None:
            popped.append(led.pop(head if hand_over else None))
            if len(popped) == 2:
                view = led.view()
                assert (view.groups["g"].queued, view.groups["g"].running) == (1, 1)
                assert (view.tenants["a"].queued, view.tenants["a"].running) == (0, 1)
        assert popped == [reqs[0], reqs[1], reqs[2]] and all(r.state is RequestState.RUNNING for r in reqs)
        for r in reqs:
            led.settle(r)
        views.append(led.view())
    assert views[0] == views[1] and views[1].tenants["g/b"].service == 25
    assert all(
        (v.queued, v.running) == (0, 0) for v in [*views[1].tenants.values(), *views[1].groups.values()]
    )  # NOTE: settled, also through the group
    with pytest.raises(PolicyError):
        led.pop()
    with pytest.raises(PolicyError, match="not queued"):
        led.pop(reqs[0])  # settled: a head kept too long


def test_settle_reconciles_usage_and_refunds():
    led = ledger()
    r = led.arrive(1, "a", 10)
    led.pop()
    led.output(r, 5)
    assert led.settle(r, prompt=12, output=4)  # the backend's usage wins
    assert led.view().tenants["a"].service == 12 + 2 * 4
    r = led.arrive(2, "b", 50)
    led.pop()
    led.output(r, 2)
    led.settle(r, prompt=0, output=0, cancelled=True)  # a refund of everything
    assert led.view().tenants["b"].service == 0
    r = led.arrive(3, "b", 50)
    led.pop()
    led.settle(r, prompt=20, output=0, cancelled=True)  # cancelled mid-prefill: 20 prompt tokens processed
    assert led.view().tenants["b"].service == 20


def test_requeue_keeps_charges_and_swaps_the_item():
    led = ledger()
    r = led.arrive(1, "a", 10, item="old")
    assert not led.requeue(r)  # not running
    led.pop()
    led.output(r, 1)
    assert led.requeue(r, item="new") and r.item == "new"
    assert led.view().tenants["a"].queued == 1 and led.pop() is r
    assert led.view().tenants["a"].service == 12  # not charged again


def test_rejected_requests_never_enter_the_ledger():
    led = ledger("rpm:1")
    assert led.arrive(1, "a", 1) is not None and led.arrive(2, "a", 1) is None
    assert len(led) == 1 and led.view().tenants["a"].queued == 1


@pytest.mark.parametrize("spec", ["vtc", "lcf", "drr:100", "vtc-predict:oracle"])
def test_reset_puts_every_counter_to_zero(spec):
    led = ledger(spec)
    for i, tenant in enumerate("ab"):
        r = led.arrive(i, tenant, 100 * (i + 1))
        led.arrive(10 + i, tenant, 5)
        assert led.pop() is not None
        led.output(r, 3)
    assert any(t.counter != 0 for t in led.view().tenants.values())
    service = {t: v.service for t, v in led.view().tenants.items()}
    led.reset()
    view = led.view()
    assert all(t.counter == 0 for t in view.tenants.values())
    assert {t: v.service for t, v in view.tenants.items()} == service  # service received is history: kept


@pytest.mark.parametrize("spec", ["fcfs", "rpm:5"])
def test_policies_without_counters_refuse_reset_and_weights(spec):
    led = ledger(spec)
    with pytest.raises(Unsupported, match="no counters"):
        led.reset()
    with pytest.raises(Unsupported, match="ignores weights"):
        led.set_weight("a", 2)


def test_live_weight_changes_future_charges_only():
    led = ledger()
    r = led.arrive(1, "a", 10)
    led.pop()
    led.set_weight("a", 2)
    led.output(r, 5)
    a = led.view().tenants["a"]
    assert a.weight == 2 and a.counter == 10 + 10 / 2 and a.service == 20


@pytest.mark.parametrize(
    "bad", [0, -1, 5e-324, 1e-300, MIN_WEIGHT / 2, MAX_WEIGHT * 2, math.inf, math.nan, True, "2", None, 10**400]
)
def test_weights_that_would_overflow_the_accounts_are_refused(bad):
    with pytest.raises(ValueError, match="weight of 'a' must be"):
        check_weight("a", bad)
    with pytest.raises(ValueError):
        ledger().set_weight("a", bad)


def test_view_spread_and_jain_cover_backlogged_tenants_only():
    led = ledger(tenants=("a", "b", "c"))
    first = [led.arrive(i, tenant, 10 * (i + 1)) for i, tenant in enumerate("abc")]
    for r in led.admit(lambda r: True):
        led.settle(r)
    for i, tenant in enumerate("ab"):
        led.arrive(10 + i, tenant, 1)  # a and b backlogged again; c idle
    view = led.view()
    assert all(r.done for r in first) and view.tenants["c"].service == 30
    assert [t.tenant for t in view.backlogged] == ["a", "b"]
    counters = [view.tenants[t].counter for t in "ab"]
    assert view.counter_spread == max(counters) - min(counters)
    assert view.jain == pytest.approx(jain_index([view.tenants[t].service for t in "ab"]))


def test_jain_and_the_bound():
    assert jain_index([]) == jain_index([5]) == jain_index([0, 0]) == 1.0
    assert jain_index([1, 1, 1]) == 1.0 and jain_index([1, 0]) == pytest.approx(0.5)
    assert theorem_bound(256, 10_000) == 40_000 and theorem_bound(30_000, 10_000) == 60_000
    assert theorem_bound(100, 10, w_p=1, w_q=3) == 200


# ---- state in one place: the counts always equal what the requests say -----------------------------------------------
ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "pop", "output", "settle", "cancel", "requeue", "prompt"]),
        st.sampled_from("abc"),
        st.integers(0, 40),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(
    spec=st.sampled_from(["vtc", "fcfs", "drr:50", "lcf", "vtc-predict:oracle±50"]),
    script=ops,
    weights=st.dictionaries(st.sampled_from("abc"), st.floats(MIN_WEIGHT, MAX_WEIGHT)),
)
def test_counts_and_charges_stay_consistent(spec, script, weights):
    led = Ledger(make_policy(spec), "abc", weights)
    live: list = []
    for n, (op, tenant, k) in enumerate(script):
        if op == "arrive":
            live.append(led.arrive(n, tenant, k + 1, max_tokens=40))
        elif op == "pop" and led.peek() is not None:
            led.pop()
        elif live:
            req = live[k % len(live)]
            if op == "output":
                led.output(req, k % 5)
            elif op == "settle":
                led.settle(req, output=k if k % 2 else None)
            elif op == "cancel":
                led.settle(req, prompt=k % 3 or None, cancelled=True)
            elif op == "requeue":
                led.requeue(req)
            elif op == "prompt":
                led.prompt(req, k + 1)
        view = led.view()
        for tenant in "abc":
            mine = [r for r in live if r.tenant == tenant and not r.done]
            t = view.tenants[tenant]
            assert t.queued == sum(r.state is RequestState.QUEUED for r in mine)
            assert t.running == sum(r.state is RequestState.RUNNING for r in mine)
            assert t.service == pytest.approx(sum(r.charged for r in live if r.tenant == tenant), abs=1e-6)
            assert math.isfinite(t.counter) and math.isfinite(t.service)
        assert len(led) == sum(not r.done for r in live)
        assert led.num_queued == sum(t.queued for t in view.tenants.values())


def test_boundary_weights_are_accepted_and_errors_name_the_tenant():
    assert check_weight("a", MIN_WEIGHT) == MIN_WEIGHT and check_weight("a", MAX_WEIGHT) == MAX_WEIGHT
    with pytest.raises(ValueError, match="weight of 'bob'"):
        ledger().set_weight("bob", 0)


def test_arrive_keeps_what_the_driver_said_and_rate_limits_see_its_clock():
    led = ledger("rpm:1")
    r = led.arrive(1, "a", 7, max_tokens=9, now=3.5)
    assert (r.max_tokens, r.arrival_s, r.prompt_tokens) == (9, 3.5, 7)
    assert led.arrive(9, "b", 1).arrival_s == 0.0  # a driver without a clock
    assert led.arrive(2, "a", 1, now=30.0) is None  # within the 60 s window of the first
    assert led.arrive(3, "a", 1, now=64.0) is not None  # a minute after it


def test_admit_limit_output_default_and_live_prompt_growth():
    led = ledger()
    reqs = [led.arrive(i, "a", 10) for i in range(3)]
    assert led.admit(lambda r: True, limit=2) == reqs[:2]
    led.output(reqs[0])  # one token by default
    assert led.view().tenants["a"].service == 10 + 10 + 2
    led.prompt(reqs[0], 15)  # a session's next turn: 5 more prompt tokens
    assert led.view().tenants["a"].service == 10 + 10 + 2 + 5
    led.settle(reqs[0])
    led.prompt(reqs[0], 100)  # settled: nothing changes any more
    assert led.view().tenants["a"].service == 27


def test_settle_finishes_unless_cancelled():
    led = ledger()
    done, cut = led.arrive(1, "a", 10), led.arrive(2, "b", 10)
    led.admit(lambda r: True)
    led.output(done, 4)
    led.output(cut, 4)
    led.settle(done, output=4)
    led.settle(cut, output=4, cancelled=True)
    assert done.state is RequestState.FINISHED and cut.state is RequestState.ABORTED


def test_queued_lookup_settle_all_and_admin_rows():
    led = ledger()
    running, waiting = led.arrive(1, "a", 10), led.arrive(2, "b", 10, item="w")
    led.pop()
    led.output(running, 2)
    assert led.queued() == [waiting]
    assert led.settle_all() == 2 and len(led) == 0
    assert running.state is waiting.state is RequestState.ABORTED
    assert led.view().tenants["a"].row() == {
        "name": "a",
        "weight": 1.0,
        "priority": 0,
        "counter": 14.0,
        "service": 14.0,
        "queue_length": 0,
        "in_flight": 0,
    }


def test_unpop_is_as_if_never_popped():
    led = ledger("vtc-predict:oracle")
    a1, a2 = led.arrive(1, "a", 10, max_tokens=5), led.arrive(2, "a", 10, max_tokens=5)
    a1.predicted_output = 5
    assert led.pop() is a1 and led.view().tenants["a"].service == 10 + 2 * 5  # prompt + predicted output
    assert led.unpop(a1, item="again") and a1.item == "again"
    a = led.view().tenants["a"]
    assert (a.service, a.counter, a.queued, a.running) == (0, 0, 2, 0) and not a1.admitted
    assert led.peek() is a1 and led.pop() is a1  # still first, charged again
    assert led.view().tenants["a"].service == 20 and a2.state is RequestState.QUEUED
    assert not led.unpop(a2)  # not running


def test_unpop_after_a_preemption_keeps_the_charges():
    led = ledger()
    r = led.arrive(1, "a", 10)
    led.pop()
    led.output(r, 3)
    led.requeue(r)
    led.pop()  # re-admitted: not charged again
    led.unpop(r)
    assert r.admitted and led.view().tenants["a"].service == 16 and led.view().tenants["a"].queued == 1


def test_ties_go_to_the_tenant_seen_first_whenever_it_became_backlogged():
    led = ledger(tenants=("a", "b"))  # a is seen first
    led.arrive(1, "b", 10)
    led.arrive(2, "a", 10)  # queued after b, both at counter 0
    assert led.pop().tenant == "a"


def test_a_rate_limit_reads_the_time_the_driver_gives():
    led = ledger("rpm:1")
    assert led.arrive(1, "a", 1, now=0.0) and led.arrive(2, "a", 1, now=61.0)
    req = Request(id=3, tenant="a", prompt_tokens=1, arrival_s=200.0)
    assert not led.add(req, now=62.0)  # within 60 s of the one at 61, by `now` (its arrival_s says 200)


def test_a_bad_configured_weight_names_its_tenant():
    with pytest.raises(ValueError, match="weight of 'alice'"):
        Ledger(make_policy("vtc"), weights={"alice": 0})


def test_pop_with_nothing_queued_says_so():
    with pytest.raises(PolicyError, match="nothing queued"):
        ledger().pop()


def test_predicted_output_under_a_non_linear_cost():
    h = profiled_a10g_llama2_7b
    led = Ledger(make_policy("vtc-predict:oracle", cost="profiled"))
    req = Request(id=1, tenant="a", prompt_tokens=100, max_tokens=50, predicted_output=20)
    led.add(req)
    led.pop()
    assert led.service["a"] == pytest.approx(h(100, 0) + h(100, 20) - h(100, 0))  # the prediction, at admission
    led.output(req, 25)  # 5 beyond the prediction: h(x, 25) - h(x, 20)
    assert led.service["a"] == pytest.approx(h(100, 25))
    led.output(req, 5)
    assert led.service["a"] == pytest.approx(h(100, 30))


class FakePeers:
    def __init__(self, floor):
        self.floor, self.asked, self.ledger = floor, [], None

    def attach(self, ledger):
        self.ledger = ledger

    def lift_floor(self, acct, local_floor):
        self.asked.append((acct.tenant, local_floor))
        return self.floor


def test_peers_attach_and_give_the_lift_its_floor():
    peers = FakePeers(floor=None)
    led = Ledger(make_policy("vtc"), ("a", "b"), peers=peers)
    assert peers.ledger is led
    led.arrive(1, "a", 100)
    led.pop()  # a: 100, nothing queued
    peers.floor = 500.0
    led.arrive(2, "a", 10)
    assert peers.asked == [("a", None), ("a", None)]  # nobody else queued here
    assert led.counter_of("a") == 500.0  # lifted to the floor from elsewhere
    led.arrive(3, "b", 10)
    assert peers.asked[-1] == ("b", 500.0) and led.counter_of("b") == 500.0  # the local floor passed on
    peers.floor = None
    led.arrive(4, "b", 10)  # b already queued: no lift, not asked
    assert len(peers.asked) == 3


def test_apply_remote_sets_counter_service_and_weight_within_the_range():
    led = ledger()
    led.apply_remote("a", 42.0, 84.0, weight=2.0)
    assert (led.counter_of("a"), led.service["a"], led.weights["a"]) == (42.0, 84.0, 2.0)
    led.arrive(1, "a", 10)
    led.arrive(2, "b", 10)
    led.apply_remote("b", 50.0, 0.0)
    assert led.pop().tenant == "a"  # 42 < 50
    with pytest.raises(ValueError, match="weight of 'a'"):
        led.apply_remote("a", 1.0, 1.0, weight=0.0)
    for spec in ("fcfs", "drr"):
        with pytest.raises(Unsupported, match="cannot share"):
            ledger(spec).apply_remote("a", 1.0, 1.0)


def test_counts_of_several_requests_of_one_tenant():
    led = ledger()
    for i in range(3):
        led.arrive(i, "a", 10)
    r0, r1 = led.pop(), led.pop()
    assert (led.accounts["a"].queued, led.accounts["a"].running, led.num_queued) == (1, 2, 1)
    led.requeue(r0)
    led.requeue(r1)
    assert (led.accounts["a"].queued, led.accounts["a"].running, led.num_queued) == (3, 0, 3)
    assert led.counter_of("nobody") == 0.0


def test_a_request_with_its_own_price_is_charged_at_it_token_by_token():
    """The gateway's per-model prices: a request's own cost replaces the policy's, on the fast linear path and on a
    general cost alike."""
    from fairserve.core import LinearCost, Request
    from fairserve.core.cost import make_cost

    led = Ledger(make_policy("vtc"))
    profiled = make_cost("profiled")
    for rid, cost in (("lin", LinearCost(1.0, 5.0)), ("prof", profiled)):
        led.add(Request(id=rid, tenant=rid, prompt_tokens=10, max_tokens=8, cost=cost))
        req = led.pop()
        led.output(req, 3)
        led.output(req, 2)
        assert req.charged == pytest.approx(cost.total(10, 5))
    assert led.accounts["lin"].service == 10 + 5 * 5
