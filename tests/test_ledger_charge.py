"""The ledger's one charge: the single charge (`output`), the bulk charge (`outputs`) and the prompt's reconciliation
(`prompt`) reach the tenant and every group above it the same way; observers hear each change through the ledger's
listener (core/listener.py), before it, with the values it changes; and `set_node` is the one way to configure a
node, forgetting what the tree looked up (a demotion holds for the next request)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, LinearCost, Listener, PolicyError, make_policy

pytestmark = pytest.mark.unit

# NOTE: tenant paths drawn from a small tree (depth up to 3), so that tenants share groups
PATHS = ["a", "b", "org/a", "org/b", "org/team/x", "org/team/y", "lab/p/q"]


def nodes(ledger: Ledger) -> dict[str, tuple[float, float]]:
    """Every node's (service, counter): tenants and groups."""
    c = ledger.policy.counter_of
    return {p: (a.service, c(a)) for p, a in [*ledger.accounts.items(), *ledger.groups.items()]}


def running(ledger: Ledger, tenant: str, n: int, prompt: int) -> list:
    for i in range(n):
        ledger.arrive(f"{tenant}#{i}", tenant, prompt, max_tokens=16)
    return [ledger.pop(ledger.get(f"{tenant}#{i}")) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(
    tenants=st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True),
    prices=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    weights=st.dictionaries(
        st.sampled_from(["a", "org", "org/a", "org/team", "org/team/x", "lab"]), st.sampled_from([0.5, 1.0, 2.0, 4.0])
    ),
    predicted=st.booleans(),
    steps=st.lists(st.tuples(st.integers(0, 3), st.integers(-3, 12)), min_size=1, max_size=12),
    prompts=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), max_size=3),
    policy=st.sampled_from(["vtc", "lcf", "fcfs"]),
)
def test_bulk_and_single_charges_leave_every_node_alike(tenants, prices, weights, predicted, steps, prompts, policy):
    # exact in floating point (integral prices, power-of-two weights): every sum equals, whatever the grouping
    cost = LinearCost(*prices)
    build = lambda: make_policy(  # noqa: E731
        "vtc-predict:oracle" if predicted and policy == "vtc" else policy, cost=cost
    )
    known = {w: x for w, x in weights.items() if any(t == w or t.startswith(w + "/") for t in tenants)}
    bulk, each = (Ledger(build(), tenants, weights=known) for _ in range(2))
    reqs = {t: (running(bulk, t, 2, 10 + k), running(each, t, 2, 10 + k)) for k, t in enumerate(tenants)}
    for k, tokens in steps:
        mine, theirs = reqs[tenants[k % len(tenants)]]
        done = [r.output_done for r in mine]
        tokens = max(tokens, -min(done))  # NOTE: never below no output
        bulk.outputs(mine, tokens)
        for r in theirs:
            each.output(r, tokens) if tokens >= 0 else each.outputs([r], tokens)
        assert nodes(bulk) == nodes(each)
    for k, size in prompts:  # the prompt's reconciliation charges through the same routine
        mine, theirs = reqs[tenants[k % len(tenants)]]
        bulk.prompt(mine[0], size)
        each.prompt(theirs[0], size)
    assert nodes(bulk) == nodes(each)
    # and every group holds its subtree's service: the charge walked it
    for path, group in bulk.groups.items():
        below = sum(a.service for t, a in bulk.accounts.items() if t.startswith(path + "/"))
        assert group.service == below, path


def test_a_bulk_charge_reaches_the_groups_as_single_ones_do():
    # the drift this guards: outputs() once left the groups at the prompt's charge
    single, bulk = (Ledger(make_policy("vtc"), ["org/a", "org/b"]) for _ in range(2))
    (r1,), (r2,) = running(single, "org/a", 1, 10), running(bulk, "org/a", 1, 10)
    for _ in range(5):
        single.output(r1)
    bulk.outputs([r2], 5)
    assert single.service["org/a"] == bulk.service["org/a"] == 20
    assert single.groups["org"].service == bulk.groups["org"].service == 20
    assert single.counter_of("org/a") == bulk.counter_of("org/a") and nodes(single) == nodes(bulk)


class Recorder(Listener):
    """Every call, with what the observer could read at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def changing(self, acct):
        self.calls.append(("changing", acct.tenant, acct.service, acct.counter))

    def queued(self, req):
        self.calls.append(("queued", req.id, req.account.queued))

    def left(self, req):
        self.calls.append(("left", req.id, req.account.queued))

    def settled(self, req):
        self.calls.append(("settled", req.id, req.charged))


def test_the_listener_hears_each_change_before_it_and_each_queue_change_after_it():
    ledger = Ledger(make_policy("vtc"), ["org/a", "org/b"])
    rec = Recorder()
    ledger.listen(rec)
    ledger.arrive(1, "org/a", 10, max_tokens=5)
    # the lift comes first (the tenant's then its group's subtree had nothing queued), then the arrival
    assert rec.calls == [("changing", "org/a", 0.0, 0.0), ("changing", "org", 0.0, 0.0), ("queued", 1, 1)]
    rec.calls.clear()
    req = ledger.pop()
    assert rec.calls == [("left", 1, 0), ("changing", "org/a", 0.0, 0.0)]  # the prompt's charge: old values
    rec.calls.clear()
    ledger.output(req, 3)
    ledger.outputs([req], 2)
    ledger.prompt(req, 12)
    assert rec.calls == [
        ("changing", "org/a", 10.0, 10.0),
        ("changing", "org/a", 16.0, 16.0),
        ("changing", "org/a", 20.0, 20.0),
    ]
    rec.calls.clear()
    ledger.requeue(req)
    assert rec.calls == [("queued", 1, 1)]  # not a new arrival: no lift
    rec.calls.clear()
    ledger.settle(req, cancelled=True)
    assert rec.calls == [("left", 1, 0), ("settled", 1, 22.0)]
    heard = len(rec.calls)
    assert ledger.settle(req) is False and len(rec.calls) == heard  # exactly once


def test_several_listeners_each_hear_everything_in_the_order_they_registered():
    ledger = Ledger(make_policy("fcfs"))
    order: list[str] = []

    class Named(Listener):
        def __init__(self, name):
            self.name = name

        def queued(self, req):
            order.append(self.name)

    for name in "abc":
        ledger.listen(Named(name))
    ledger.arrive(1, "t", 5)
    assert order == ["a", "b", "c"]


def test_an_unpop_refunds_through_the_one_charge_and_is_heard():
    ledger = Ledger(make_policy("vtc"), ["org/a"])
    rec = Recorder()
    ledger.arrive(1, "org/a", 10)
    req = ledger.pop()
    ledger.listen(rec)
    ledger.unpop(req)
    assert rec.calls == [("changing", "org/a", 10.0, 10.0), ("queued", 1, 1)]
    assert ledger.service["org/a"] == 0 and ledger.groups["org"].service == 0 and req.charged == 0


def test_a_prediction_is_charged_and_corrected_through_the_groups():
    ledger = Ledger(make_policy("vtc-predict:oracle"), ["org/a", "org/b"])
    ledger.arrive(1, "org/a", 10, max_tokens=8)
    req = ledger.pop()
    assert req.predicted == 8 and ledger.groups["org"].service == 10 + 2 * 8  # the prediction, charged up front
    ledger.outputs([req], 5)
    assert ledger.groups["org"].service == 26  # within the prediction: nothing more
    ledger.settle(req)
    assert ledger.service["org/a"] == ledger.groups["org"].service == req.charged == 10 + 2 * 5  # 3 refunded


# ---- set_node: the one way to configure a node --------------------------------------------------------------------
def level(ledger: Ledger, tenant: str) -> int:
    """The level a new request of `tenant` is queued at."""
    req = ledger.arrive(object(), tenant, 1)
    ledger.settle(req, cancelled=True)
    return req.priority or 0


def test_a_demotion_and_a_promotion_hold_for_the_next_request_and_a_queued_one_keeps_its_level():
    ledger = Ledger(make_policy("vtc"), ["vip", "std/u"], priorities={"vip": 0, "std": 1})
    assert level(ledger, "vip") == 0 and level(ledger, "std/u") == 1  # looked up, and remembered
    queued = ledger.arrive("q", "vip", 1)
    ledger.set_node("vip", priority=2)  # demoted
    ledger.set_node("std", priority=0)  # a group promoted: its tenants follow
    assert level(ledger, "vip") == 2 and level(ledger, "std/u") == 0
    assert queued.priority == 0  # queued before: keeps its level
    assert ledger.view().tenants["vip"].priority == 2 and ledger.view().tenants["std/u"].priority == 0
    ledger.set_node("vip", priority=None)  # no level of its own: its parent's (none: 0)
    assert level(ledger, "vip") == 0


def test_a_removed_allowance_can_no_longer_be_named():
    ledger = Ledger(make_policy("vtc"), ["t"], priorities={"t": 1}, allowed={"t": [0, 1]})
    assert ledger.priority_of(ledger.account("t"), 0) == 0
    ledger.set_node("t", allowed=None)
    assert ledger.priority_of(ledger.account("t"), 0) == 1 and ledger.allowed_priorities("t") == {1}
    ledger.set_node("t", allowed=[1, 3])
    assert ledger.priority_of(ledger.account("t"), 3) == 3 and ledger.allowed_priorities("t") == {1, 3}


def test_set_node_refuses_bad_values_whole_and_allowed_on_a_group():
    ledger = Ledger(make_policy("vtc"), ["org/a"], priorities={"org": 1})
    with pytest.raises(ValueError, match="weight of 'org'"):
        ledger.set_node("org", weight=0, priority=3)
    with pytest.raises(ValueError, match="priority of 'org'"):
        ledger.set_node("org", weight=2.0, priority="high")
    with pytest.raises(ValueError, match="is a group"):
        ledger.set_node("org", allowed=[0])
    group = ledger.groups["org"]
    assert (group.weight, group.priority, group.allowed) == (1.0, 1, None)  # nothing changed
    ledger.set_node("org", weight=2.0)
    assert group.weight == 2.0 and group.priority == 1  # the others kept


def test_several_listeners_hear_every_call_with_its_argument():
    heard: list[tuple] = []

    class Echo(Listener):
        def __init__(self, name):
            self.name = name

        def changing(self, acct):
            heard.append((self.name, "changing", acct.tenant))

        def queued(self, req):
            heard.append((self.name, "queued", req.id))

        def left(self, req):
            heard.append((self.name, "left", req.id))

        def settled(self, req):
            heard.append((self.name, "settled", req.id))

    ledger = Ledger(make_policy("fcfs"), ["t"])  # NOTE: fcfs does not lift: only the charge is `changing`
    ledger.listen(Echo("a"))
    ledger.listen(Echo("b"))
    ledger.arrive(7, "t", 3)
    ledger.settle(ledger.pop())
    calls = [("queued", 7), ("left", 7), ("changing", "t"), ("settled", 7)]
    assert heard == [(n, call, arg) for call, arg in calls for n in "ab"]


def test_a_request_unpopped_and_admitted_again_is_charged_every_output_token():
    ledger = Ledger(make_policy("vtc"), ["t"])
    ledger.arrive(1, "t", 10)
    req = ledger.pop()
    ledger.unpop(req)
    assert ledger.pop() is req and ledger.service["t"] == 10  # charged once again, as a new admission
    ledger.output(req, 1)
    ledger.outputs([req], 1)
    assert ledger.service["t"] == req.charged == 10 + 2 * 2


def test_the_bulk_charge_and_pop_refuse_what_they_cannot_charge_in_one_line():
    ledger = Ledger(make_policy("vtc"), ["a", "b"])
    with pytest.raises(PolicyError, match=r"pop\(\) with nothing queued"):
        ledger.pop()
    ledger.arrive(1, "a", 5)
    ledger.arrive(2, "b", 5)
    a, b = ledger.pop(), ledger.pop()
    with pytest.raises(ValueError, match="charges the requests of one tenant"):
        ledger.outputs([a, b], 1)
    a.cost = LinearCost(1, 3)
    with pytest.raises(ValueError, match="at the policy's price: use output"):
        ledger.outputs([a], 1)
