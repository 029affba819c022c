"""VTC by hand: admission order, charging, counter lift, weights, ties, LCF."""

import pytest

from fairserve.core import VTC, Ledger, Request, RequestState, make_policy

pytestmark = pytest.mark.unit


def req(i, client, prompt=10, max_tokens=5, **kw):
    return Request(id=i, tenant=client, prompt_tokens=prompt, max_tokens=max_tokens, **kw)


def test_admits_smallest_counter_and_charges_prompt_at_admission():
    p = Ledger(VTC())
    a1, a2, b1 = req(1, "a", 100), req(2, "a", 100), req(3, "b", 10)
    for r in (a1, a2, b1):
        p.add(r)
    assert p.pop() is a1  # tie at 0: the client seen first
    assert p.counters == {"a": 100.0, "b": 0.0}
    assert p.pop() is b1  # b now has the smaller counter
    assert p.counters["b"] == 10.0
    assert p.pop() is a2
    assert p.counters["a"] == 200.0
    assert p.peek() is None


def test_output_tokens_charged_as_decoded_with_w_q():
    p = Ledger(VTC())
    r = req(1, "a", prompt=7)
    p.add(r)
    p.pop()
    p.output(r, 1)
    p.output(r, 3)
    assert p.counters["a"] == 7 + 2 * 4
    p.settle(r)
    assert p.counters["a"] == 7 + 2 * 4
    assert p.service["a"] == 15
    assert r.state is RequestState.FINISHED


def test_custom_linear_weights():
    p = Ledger(make_policy("vtc", w_p=0.5, w_q=3))
    r = req(1, "a", prompt=10)
    p.add(r)
    p.pop()
    p.output(r, 2)
    assert p.counters["a"] == 5 + 6


def test_lift_to_min_of_other_queued_clients():
    p = Ledger(VTC())
    a = [req(i, "a", prompt=100) for i in range(3)]
    c = req(9, "c", prompt=1)
    for r in a:
        p.add(r)
    p.add(c)
    p.pop()  # a: 100
    p.pop()  # c: 1 ... then c's queue is empty
    assert p.counters == {"a": 100.0, "c": 1.0}
    b = req(5, "b")
    p.add(b)  # b is new, idle -> lifted to min over queued (only a queued: 100)
    assert p.counters["b"] == 100.0
    p.add(req(6, "c"))  # c returns: max(1, min(a=100, b=100)) = 100
    assert p.counters["c"] == 100.0


def test_lift_never_lowers_and_no_other_queued_keeps_counter():
    p = Ledger(VTC())
    r = req(1, "a", prompt=50)
    p.add(r)
    p.pop()
    p.add(req(2, "a"))  # nobody else queued: counter stays
    assert p.counters["a"] == 50.0
    p.add(req(3, "b"))  # b lifted to 50
    assert p.counters["b"] == 50.0
    p.pop()  # a (tie, seen first): 60
    q = Ledger(VTC())
    q.add(req(1, "x", prompt=5))
    q.add(req(2, "y", prompt=500))
    q.pop(), q.pop()  # x: 5, y: 500
    q.add(req(3, "x"))
    q.add(req(4, "y"))  # y queued again; x is the only other queued, its counter 5 < 500: keep
    assert q.counters["y"] == 500.0


def test_no_lift_while_already_queued():
    p = Ledger(VTC())
    p.add(req(1, "a", prompt=100))
    p.add(req(2, "a"))
    p.pop()  # a: 100, still has a queued request
    p.add(req(3, "b"))  # b lifted to 100
    p.add(req(4, "b"))  # second request: no change
    assert p.counters["b"] == 100.0


def test_lcf_has_no_lift():
    p = Ledger(make_policy("lcf"))
    p.add(req(1, "a", prompt=100))
    p.pop()
    p.add(req(2, "a"))
    p.add(req(3, "b"))
    assert p.counters["b"] == 0.0
    assert p.peek().tenant == "b"


def test_weighted_counters_divide_by_weight():
    p = Ledger(make_policy("vtc"), weights={"a": 1, "b": 2})
    ra, rb = req(1, "a", prompt=100), req(2, "b", prompt=100)
    p.add(ra), p.add(rb)
    p.pop(), p.pop()
    assert p.counters == {"a": 100.0, "b": 50.0}
    assert p.service == {"a": 100.0, "b": 100.0}
    p.set_weight("a", 4)
    p.output(ra, 2)
    assert p.counters["a"] == 101.0


def test_weighted_vtc_splits_service_by_weight():
    p = Ledger(make_policy("vtc"), weights={"a": 1, "b": 3})
    admitted = {"a": 0, "b": 0}
    for i in range(400):
        p.add(req(2 * i, "a", prompt=10))
        p.add(req(2 * i + 1, "b", prompt=10))
    for _ in range(400):
        admitted[p.pop().tenant] += 1
    assert admitted == {"a": 100, "b": 300}


def test_requeue_keeps_charges_and_goes_to_the_front_without_lift():
    p = Ledger(VTC())
    r1, r2 = req(1, "a", prompt=30), req(2, "a", prompt=30)
    p.add(r1), p.add(r2)
    p.pop()
    p.output(r1, 2)
    p.pop()
    p.add(req(3, "b", prompt=1000))
    p.pop()  # b: 0 + 1000 (lifted to nothing: a has nothing queued)
    assert p.counters == {"a": 30 + 4 + 30, "b": 1000.0}
    p.add(req(4, "b", prompt=1))  # b queued with counter 1000
    p.requeue(r1)  # preempted: a's queue goes 0 -> 1, but this is no arrival
    assert r1.state is RequestState.QUEUED
    assert p.counters["a"] == 64.0  # no lift (to b's 1000), no refund
    assert p.pop() is r1
    assert p.counters["a"] == 64.0  # not charged again for its prompt
    p.output(r1, 1)
    p.settle(r1)
    assert p.counters["a"] == 66.0


def test_abort_queued_and_running():
    p = Ledger(VTC())
    r1, r2, r3 = req(1, "a", prompt=10), req(2, "a"), req(3, "b")
    for r in (r1, r2, r3):
        p.add(r)
    p.settle(r2, cancelled=True)
    assert r2.state is RequestState.ABORTED and p.num_queued == 2
    p.pop()  # r1
    p.output(r1, 3)
    p.settle(r1, cancelled=True)
    assert p.counters["a"] == 16.0  # only what was produced
    assert p.pop() is r3 and p.peek() is None
    p.settle(r1, cancelled=True)  # idempotent on a finished request
    assert p.counters["a"] == 16.0


def test_admit_stops_at_first_request_that_does_not_fit():
    p = Ledger(VTC())
    big, small = req(1, "a", prompt=500), req(2, "b", prompt=5)
    p.add(big), p.add(small)
    got = p.admit(lambda r: r.prompt_tokens < 100)
    assert got == []  # the policy's order is strict: big (a, seen first) blocks
    assert p.admit(lambda r: True) == [big, small]


def test_profiled_cost_charges_differences():
    from fairserve.core import profiled_a10g_llama2_7b as h

    p = Ledger(make_policy("vtc", cost="profiled"))
    r = req(1, "a", prompt=100)
    p.add(r)
    p.pop()
    assert p.counters["a"] == pytest.approx(h(100, 0))
    p.output(r, 1)
    p.output(r, 4)
    assert p.counters["a"] == pytest.approx(h(100, 5))


def test_user_callable_cost():
    p = Ledger(make_policy("vtc", cost=lambda x, y: x * x + y))
    r = req(1, "a", prompt=3)
    p.add(r)
    p.pop()
    p.output(r, 2)
    assert p.counters["a"] == 11


def test_heap_selection_matches_brute_force_with_many_clients():
    import random

    rng = random.Random(1)
    p = Ledger(VTC())
    reqs = {}
    n = 0
    for c in range(300):
        for _ in range(2):
            n += 1
            reqs[n] = req(n, f"c{c}", prompt=rng.randint(1, 50))
            p.add(reqs[n])
    running = []
    for _step in range(3000):
        r = p.peek()
        queued = p.backlogged()
        counters = p.counters
        best = min(counters[c] for c in queued)
        assert counters[r.tenant] == best
        running.append(p.pop())
        for x in running[-5:]:
            p.output(x, rng.randint(0, 3))
        if rng.random() < 0.5:
            done = running.pop(rng.randrange(len(running)))
            p.settle(done)
        n += 1
        p.add(req(n, f"c{rng.randrange(400)}", prompt=rng.randint(1, 50)))


def test_selection_correct_with_20k_clients():
    import random

    rng = random.Random(5)
    p = Ledger(VTC())
    n = 0
    for c in range(20_000):
        for _ in range(2):
            n += 1
            p.add(req(n, f"c{c}", prompt=rng.randint(1, 1000)))
    for k in range(2000):
        if k % 250 == 0:
            counters = p.counters
            expected = min(counters[c] for c in p.backlogged())
            assert counters[p.peek().tenant] == expected
        r = p.pop()
        p.output(r, rng.randint(1, 50))
        p.settle(r)
        n += 1
        p.add(req(n, r.tenant, prompt=rng.randint(1, 1000)))


@pytest.mark.parametrize("a, b", [("a", "b"), ("org/a", "x"), ("org/a", "org/b")])
def test_a_counter_that_goes_down_reorders_the_queue_at_once(a, b):
    """Another replica's lower counter (apply_remote), a negative correction or a reset moves a tenant ahead of one
    with a smaller counter than its old one: its queued requests are found under the new counter, at every level of
    the tree."""
    p = Ledger(VTC(), [a, b])
    for i in range(3):
        p.add(req(i, a, prompt=100))
    p.add(req(9, b, prompt=50))
    p.pop()  # a: 100, b: 0
    assert p.peek().tenant == b
    p.apply_remote(a, 0.0, 0.0)  # charges undone elsewhere: a (and its group) back below b
    assert p.peek().tenant == a
    p.pop()  # a: 100
    p.pop()  # b: 50
    p.reset()
    p.add(req(10, b, prompt=1))
    assert p.counters[a] == 0.0 and p.peek().tenant == a  # after a reset the tie goes to the one seen first
