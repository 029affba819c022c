"""FCFS, RPM and DRR by hand, and the policy factory."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, Request, RequestState, make_policy, policy_names
from fairserve.core.policy import PolicyError

pytestmark = pytest.mark.unit


def req(i, client, prompt=10, arrival=0.0):
    return Request(id=i, tenant=client, prompt_tokens=prompt, max_tokens=5, arrival_s=arrival)


def test_fcfs_is_arrival_order_and_skips_aborted():
    p = Ledger(make_policy("fcfs"))
    rs = [req(i, c) for i, c in enumerate("abab")]
    for r in rs:
        p.add(r)
    p.settle(rs[1], cancelled=True)
    assert [p.pop() for _ in range(3)] == [rs[0], rs[2], rs[3]]
    assert p.peek() is None and p.num_queued == 0


def test_fcfs_requeue_goes_first():
    p = Ledger(make_policy("fcfs"))
    r1, r2 = req(1, "a"), req(2, "b")
    p.add(r1), p.add(r2)
    p.pop()
    p.requeue(r1)
    assert p.pop() is r1


def test_rpm_rejects_beyond_limit_in_previous_60s():
    p = Ledger(make_policy("rpm:2"))
    times = [0.0, 10.0, 20.0, 59.9, 60.0, 61.0, 70.0]
    got = [p.add(req(i, "a", arrival=t)) for i, t in enumerate(times)]
    # accepted at 0 and 10; at 60.0 the one from 0.0 has left the window; at 70.0 the one from 10.0 has
    assert got == [True, True, False, False, True, False, True]
    assert p.add(req(99, "b", arrival=20.0))  # limits are per client
    rejected = Request(id=100, tenant="a", prompt_tokens=1, arrival_s=71.0)
    assert not p.add(rejected) and rejected.state is RequestState.REJECTED


def test_rpm_serves_accepted_fcfs():
    p = Ledger(make_policy("rpm:1"))
    a, b, a2 = req(1, "a", arrival=0), req(2, "b", arrival=1), req(3, "a", arrival=2)
    assert p.add(a) and p.add(b) and not p.add(a2)
    assert [p.pop(), p.pop()] == [a, b]


def test_drr_alternates_with_equal_requests_and_keeps_debt():
    p = Ledger(make_policy("drr:100"))
    for i in range(6):
        p.add(req(i, "ab"[i % 2], prompt=100))
    order = [p.pop().tenant for _ in range(6)]
    assert order == ["a", "b", "a", "b", "a", "b"]


def test_drr_heavy_prompt_client_waits_for_quanta():
    p = Ledger(make_policy("drr:50"))
    big = [req(i, "big", prompt=400) for i in range(3)]
    small = [req(10 + i, "small", prompt=50) for i in range(10)]
    for r in big + small:
        p.add(r)
    order = [p.pop().tenant for _ in range(8)]
    # big's 400-token prompt costs 8 quanta of debt; small pays 1 quantum per request
    assert order[0] == "big"
    assert order[1:8] == ["small"] * 7


def test_drr_peek_is_pure():
    p = Ledger(make_policy("drr:10"))
    for i in range(4):
        p.add(req(i, "ab"[i % 2], prompt=35))
    p.pop()
    before = p.counters
    first = p.peek()
    assert all(p.peek() is first for _ in range(5))
    assert p.counters == before
    assert p.pop() is first


def test_drr_tiny_quantum_behaves_like_vtc():
    import random

    rng = random.Random(3)
    prompts = [rng.randint(1, 300) for _ in range(300)]
    orders = {}
    for spec in ("vtc", "drr:0.01", "drr:1000"):
        p = Ledger(make_policy(spec))
        for i, x in enumerate(prompts):
            p.add(req(i, f"c{i % 3}", prompt=x))
        orders[spec] = [p.pop().id for _ in range(len(prompts))]
    assert orders["drr:0.01"] == orders["vtc"]
    assert orders["drr:1000"] != orders["vtc"]  # a coarse quantum does not


def test_factory_names_and_errors():
    for name in policy_names():
        assert make_policy(name).peek() is None
    assert make_policy("rpm:7").limit == 7
    assert make_policy("drr:64").quantum == 64
    for bad, msg in [
        ("nope", "unknown policy"),
        ("rpm:x", "not a number"),
        ("vtc:3", "takes no argument"),
        ("rpm:0", ">= 1"),
        ("drr:-1", "> 0"),
        ("vtc-predict:psychic", "unknown predictor"),
    ]:
        with pytest.raises(ValueError, match=msg):
            make_policy(bad)
    with pytest.raises(ValueError, match="weight"):
        Ledger(make_policy("vtc"), weights={"a": 0})


def test_protocol_errors():
    p = Ledger(make_policy("vtc"))
    r = req(1, "a")
    assert not p.settle(r)  # never in the ledger: nothing to end
    p.add(r)
    with pytest.raises(ValueError, match="already"):
        p.add(r)
    assert p.pop() is r
    with pytest.raises(PolicyError):
        p.pop()  # nothing queued


class RingDRR:
    """The walk, for reference: clients sit in the ring in the order they joined; the client under the pointer is
    served while its deficit is positive, otherwise the pointer moves to the next client, which gets a quantum."""

    def __init__(self, q):
        self.q, self.pos, self.d, self.queues, self.at, self.joined = q, {}, {}, {}, 0, 0

    def add(self, r):
        q = self.queues.setdefault(r.tenant, [])
        if not q:
            self.d[r.tenant] = min(self.d.get(r.tenant, 0.0), 0.0)  # no credit kept from before
            self.joined += 1
            self.pos[r.tenant] = self.joined
        q.append(r)

    def pop(self):
        by_pos = {p: c for c, p in self.pos.items()}
        while not (self.at in by_pos and self.d[by_pos[self.at]] > 0):
            later = [p for p in by_pos if p > self.at]
            self.at = min(later) if later else min(by_pos)
            self.d[by_pos[self.at]] += self.q
        c = by_pos[self.at]
        r = self.queues[c].pop(0)
        self.d[c] -= r.prompt_tokens
        if not self.queues[c]:
            del self.pos[c]
        return r

    def charge(self, client, amount):
        self.d[client] -= amount


ops = st.lists(
    st.tuples(st.sampled_from(["add", "pop", "out"]), st.integers(0, 5), st.integers(1, 400)), min_size=1, max_size=200
)


@settings(max_examples=200, deadline=None)
@given(ops, st.sampled_from([1.0, 37.0, 500.0]))
def test_drr_heap_matches_the_ring_walk(seq, quantum):
    fast, ref = Ledger(make_policy(f"drr:{quantum}")), RingDRR(quantum)
    running, n = [], 0
    for op, c, x in seq:
        if op == "add":
            n += 1
            fast.add(req(n, f"c{c}", prompt=x))
            ref.add(req(n, f"c{c}", prompt=x))
        elif op == "pop" and fast.num_queued:
            a, b = fast.pop(), ref.pop()
            assert (a.id, a.tenant) == (b.id, b.tenant)
            running.append(a)
        elif op == "out" and running:
            r = running[x % len(running)]
            fast.output(r, c + 1)
            ref.charge(r.tenant, 2 * (c + 1))
    for client, c in fast.counters.items():
        assert -c == pytest.approx(ref.d[client])
