"""The tenant tree and priority levels in the core: each group its share however many tenants it has, weights on
groups, the lift among siblings, charges up the tree, priorities served strictly; checked by hand and against a
brute-force descent of the tree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, Request, make_policy

pytestmark = pytest.mark.unit


def tree(**kw) -> Ledger:
    return Ledger(make_policy(kw.pop("spec", "vtc")), **kw)


def backlog(led: Ledger, tenants: list[str], n: int, prompt: int = 10, start: int = 0) -> int:
    for _ in range(n):
        for t in tenants:
            led.arrive(start, t, prompt)
            start += 1
    return start


def test_each_group_gets_its_share_however_many_tenants_it_opens():
    led = tree()
    many = [f"org-a/user-{i}" for i in range(10)]
    start = backlog(led, many, 20)
    backlog(led, ["org-b/solo"], 200, start=start)
    served = [led.pop().tenant for _ in range(200)]
    a = [t for t in served if t.startswith("org-a/")]
    assert len(a) == 100 and served.count("org-b/solo") == 100  # each organisation half
    assert all(a.count(u) == 10 for u in many)  # each of the ten users a tenth of that
    assert led.groups["org-a"].service == led.groups["org-b"].service == 1000  # charges reach the groups


def test_weights_on_groups_and_on_members():
    led = tree(weights={"a": 3, "b": 1, "a/y": 2})
    backlog(led, ["a/x", "a/y", "b/z"], 200)
    served = [led.pop().tenant for _ in range(240)]
    assert sum(t.startswith("a/") for t in served) == 180  # 3:1 between the groups
    assert served.count("a/y") == 120 and served.count("a/x") == 60  # 2:1 inside a
    assert led.counter_of("a/y") == pytest.approx(led.accounts["a/y"].service / 2)
    assert led.groups["a"].counter == pytest.approx(led.groups["a"].service / 3)


def test_the_lift_applies_among_siblings():
    led = tree()
    led.arrive(1, "a/x", 100)
    led.arrive(2, "b/y", 100)
    led.pop(), led.pop()  # a: 100, b: 100, nothing queued
    backlog(led, ["b/y"], 3, start=10)
    led.pop()  # b: 110, still backlogged
    led.arrive(20, "a/new", 5)  # a returns from idle: lifted to b's 110 (its sibling with something queued)
    assert led.groups["a"].counter == 110.0
    assert led.counter_of("a/new") == 0.0  # nothing else queued in a: a/new keeps its own
    led.arrive(21, "a/x", 5)  # a/x was idle; its sibling a/new is queued (0): max(100, 0) stays 100
    assert led.counter_of("a/x") == 100.0


def test_priorities_are_strict_and_the_tree_decides_within_a_level():
    led = tree(priorities={"premium": 0, "free": 1})
    backlog(led, ["free/f1", "free/f2"], 5)
    backlog(led, ["premium/p1", "premium/p2"], 2, start=100)
    first = [led.pop().tenant for _ in range(4)]
    assert sorted(first) == ["premium/p1", "premium/p1", "premium/p2", "premium/p2"]
    assert first[:2] in (["premium/p1", "premium/p2"], ["premium/p2", "premium/p1"])  # VTC inside the level
    assert led.pop().tenant.startswith("free/")
    led.arrive(200, "premium/p1", 10)  # a later premium request overtakes the free backlog
    assert led.pop().tenant == "premium/p1"


def test_a_request_runs_at_an_allowed_priority_it_names_or_else_its_tenants():
    led = tree(priorities={"pro": 1}, allowed={"pro/a": [0, 1]})
    assert led.allowed_priorities("pro/a") == {0, 1} and led.allowed_priorities("pro/b") == {1}
    ok = Request(id=1, tenant="pro/a", prompt_tokens=1, priority=0)
    refused = Request(id=2, tenant="pro/b", prompt_tokens=1, priority=0)  # may not raise itself above its tier
    plain = Request(id=3, tenant="x", prompt_tokens=1)
    for r in (ok, refused, plain):
        led.add(r)
    assert (ok.priority, refused.priority, plain.priority) == (0, 1, 0)
    with pytest.raises(ValueError, match="integer"):
        tree(priorities={"pro": "high"})


def test_service_counts_once_whatever_level_it_was_served_at():
    led = tree(allowed={"a": [0, 1]})
    led.add(Request(id=1, tenant="a", prompt_tokens=100, priority=1))
    led.add(Request(id=2, tenant="a", prompt_tokens=100, priority=0))
    led.arrive(3, "b", 150)
    assert [led.pop().id for _ in range(3)] == [2, 3, 1]  # a's level-0 first; then b (150) vs a (100 +100 = 200)
    assert led.counter_of("a") == 200.0


def test_refunds_resets_and_remote_counters_reorder_the_tree():
    led = tree()
    backlog(led, ["g/a", "g/b", "h/c"], 2)
    r = led.pop()  # g/a: 10, g: 10
    led.settle(r, prompt=0, output=0, cancelled=True)  # refund: g and g/a back to 0
    assert led.groups["g"].counter == 0.0 and led.groups["g"].service == 0.0
    assert led.pop().tenant == "g/a"  # counters 0 everywhere again: the first seen
    led.reset()
    assert all(v == 0.0 for v in led.counters.values()) and led.groups["g"].counter == 0.0
    led.apply_remote("h/c", 0.0, 40.0)
    assert led.groups["h"].service == 40.0  # a group's service follows its tenants'


def test_a_remote_charge_moves_every_group_above_as_a_charge_here_would():
    led = Ledger(make_policy("vtc"), ["org/team/a", "org/b"], {"org": 2.0, "org/team": 4.0})
    led.apply_remote("org/team/a", 3.0, 12.0)  # another replica charged org/team/a 12
    team, org = led.node("org/team"), led.node("org")
    assert team is led.groups["org/team"] and org is led.groups["org"]
    assert (team.service, team.counter, org.service, org.counter) == (12.0, 3.0, 12.0, 6.0)
    led.apply_remote("org/team/a", 5.0, 20.0)  # 8 more
    assert (team.service, team.counter, org.service, org.counter) == (20.0, 5.0, 20.0, 10.0)
    assert led.accounts["org/b"].service == 0.0


def test_names_cannot_be_a_tenant_and_a_group():
    led = tree(tenants=["acme"], weights={"org": 3})
    led.arrive(1, "acme", 10)
    with pytest.raises(ValueError, match="'acme' is a tenant"):
        led.account("acme/bob")  # acme has had a request: it stays a tenant
    led.arrive(2, "org/bob", 10)  # configured, never used: org was a group all along, and keeps its weight
    assert "org" not in led.accounts and led.groups["org"].weight == 3.0 and led.pop().tenant == "acme"
    led.account("org/bob")
    with pytest.raises(ValueError, match="'org' is a group"):
        led.account("org")


@pytest.mark.parametrize(
    "kw", [{"priorities": {"pro/acme": "1"}}, {"priorities": {"pro/acme": True}}, {"allowed": {"pro/acme": [0, 1.5]}}]
)
def test_a_priority_that_is_not_an_integer_is_refused_naming_its_node(kw):
    with pytest.raises(ValueError, match=r"priority of 'pro/acme' must be an integer"):
        tree(**kw)


def test_groups_show_in_the_view():
    led = tree(weights={"org": 2})
    led.arrive(1, "org/a", 10)
    led.arrive(2, "org/b", 10)
    led.pop()
    view = led.view()
    assert set(view.tenants) == {"org/a", "org/b"} and set(view.groups) == {"org"}
    g = view.groups["org"]
    assert (g.weight, g.service, g.counter, g.queued, g.running) == (2.0, 10.0, 5.0, 1, 1)


# ---- against a brute-force descent -----------------------------------------------------------------------------
def reference(led: Ledger, place: dict[int, int]) -> Request | None:
    """The request the tree's rule admits, found by looking at everything: the best level with anything queued;
    from the top down, the child (smallest counter, then first seen) with something queued at that level; then the
    tenant's first request there (`place`: arrival order, a put-back request in front)."""
    queued = led.queued()
    if not queued:
        return None
    level = min(r.priority for r in queued)
    queued = [r for r in queued if r.priority == level]
    parent = None
    while True:
        children = {}
        for r in queued:
            node = r.account
            while node.parent is not parent:
                node = node.parent
            children.setdefault(node.tenant, node)
        best = min(children.values(), key=lambda n: (n.counter, n.rank))
        if best.tenant in led.accounts:
            return min((r for r in queued if r.account is best), key=lambda r: place[r.id])
        queued = [r for r in queued if _under(r.account, best)]
        parent = best


def _under(acct, group) -> bool:
    node = acct.parent
    while node is not None and node is not group:
        node = node.parent
    return node is group


TENANTS = ["a", "g/x", "g/y", "g/h/p", "g/h/q", "k/z"]
ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "pop", "finish", "cancel", "requeue"]),
        st.integers(0, len(TENANTS) - 1),
        st.integers(1, 60),
        st.integers(0, 1),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from(["vtc", "lcf"]))
def test_the_heaps_pick_what_a_brute_force_descent_picks(script, spec):
    led = tree(spec=spec, weights={"g": 2, "g/h/q": 3}, allowed={t: [0, 1] for t in TENANTS})
    running: list[Request] = []
    place: dict[int, int] = {}
    for n, (op, t, size, level) in enumerate(script):
        if op == "arrive":
            led.add(Request(id=n, tenant=TENANTS[t], prompt_tokens=size, priority=level))
            place[n] = n
        elif op == "pop" and led.num_queued:
            want = reference(led, place)
            got = led.pop()
            assert got is want
            led.output(got, size % 7)
            running.append(got)
        elif running and op in ("finish", "cancel", "requeue"):
            r = running.pop(size % len(running))
            if op == "requeue":
                led.requeue(r)
                place[r.id] = -n  # to the front, before earlier put-backs
            else:
                led.settle(r, cancelled=op == "cancel")
        for group in led.groups.values():  # a group's numbers are its subtree's
            below = [a for a in led.accounts.values() if _under(a, group)]
            assert group.service == pytest.approx(sum(a.service for a in below))
            assert group.queued == sum(a.queued for a in below) and group.running == sum(a.running for a in below)


def test_the_view_shows_each_nodes_level_its_own_or_its_nearest_groups():
    led = Ledger(make_policy("vtc"), ["premium/a", "free/b", "free/c"], priorities={"free": 1, "free/c": 2})
    view = led.view()
    assert {t: v.priority for t, v in view.tenants.items()} == {"premium/a": 0, "free/b": 1, "free/c": 2}
    assert {g: v.priority for g, v in view.groups.items()} == {"premium": 0, "free": 1}


def test_a_charge_and_a_refund_reach_every_level_and_a_refund_reorders_at_once():
    led = tree(tenants=["o/t/a", "o/t/b", "o/u", "x"], weights={"o/t": 2.0})
    backlog(led, ["o/t/a", "o/t/b", "o/u", "x"], 2, prompt=8)
    first = led.pop()  # o/t/a: 8 at every level above it
    assert first.tenant == "o/t/a"
    assert (led.node("o/t/a").counter, led.node("o/t").counter, led.node("o").counter) == (8.0, 4.0, 8.0)
    # x (0 < o's 8); a tie at 8 goes to o, first seen, and within o to o/u (0 < o/t's 4); then x (8 < o's 16)
    assert [led.pop().tenant for _ in range(3)] == ["x", "o/u", "x"]
    led.settle(first, prompt=0, output=0, cancelled=True)  # refunded: 8 off o/t/a, 4 off o/t, 8 off o
    assert (led.node("o/t/a").counter, led.node("o/t").counter, led.node("o").counter) == (0.0, 0.0, 8.0)
    assert led.pop().tenant == "o/t/a"  # o (8) below x (16); o/t (0) below o/u (8); o/t/a (0) below o/t/b (0), first
