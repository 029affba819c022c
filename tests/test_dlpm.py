"""The policies that order by cached prefix (core/lpm.py, core/dlpm.py): their order given a driver's cache, the
registry's refusal without one, and DLPM's bound (docs/architecture.md, "DLPM's bound") as a property on the
simulator's paged engine with its prefix cache."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, check_policy, describe, make_policy, policy_names
from fairserve.core.dlpm import QUANTUM_REQUESTS
from fairserve.metrics import summarize
from fairserve.sim import EngineConfig, SimEngine, SimOptions, simulate
from fairserve.sim.latency import get_latency_model
from fairserve.workloads import Arrival, Workload

pytestmark = pytest.mark.unit


def ledger_with(spec, cached):
    """A ledger whose driver says request id i has cached[i] tokens (a fake cache, for the order alone)."""
    policy = make_policy(spec)
    policy.cached = lambda req: cached.get(req.id, 0)
    return Ledger(policy)


def test_lpm_admits_the_longest_cached_prefix_first_then_arrival_order():
    ledger = ledger_with("lpm", {2: 64, 3: 64, 4: 16})
    for i, tenant in enumerate("aabbc"):
        ledger.arrive(i, tenant, 100, 10, float(i))
    assert [ledger.pop().id for _ in range(5)] == [2, 3, 4, 0, 1]


def test_dlpm_serves_only_tenants_in_credit_and_refills_every_backlogged_one():
    # tenant a's requests are all cached, b's never: LPM would serve a first until it runs out
    cached = {i: 96 for i in range(0, 20, 2)}
    ledger = ledger_with("dlpm:250", cached)
    for i in range(20):
        ledger.arrive(i, "ab"[i % 2], 100, 1, 0.0)  # each admission costs 100 (w_p = 1)
    order = [ledger.pop().tenant for _ in range(20)]
    # a new tenant starts with one quantum (250): 3 admissions of a (250 -> -50), then b's 3, then refills (+250)
    assert order[:6] == list("aaabbb")
    assert abs(order.count("a") - order.count("b")) == 0
    policy = ledger.policy
    assert policy.refills >= 1
    # deficits stay within [-(w_p·L_in + w_q·M), Q] = [-100, 250] here (no outputs decoded)
    for t in "ab":
        assert -100 <= policy.deficit(ledger.accounts[t]) <= 250


def test_dlpm_a_tenant_back_from_idle_has_at_most_one_quantum():
    ledger = ledger_with("dlpm:100", {})
    ledger.arrive(0, "a", 10, 1, 0.0)
    ledger.arrive(1, "b", 10, 1, 0.0)
    ledger.pop()  # a: 100 - 10
    ledger.pop()  # b
    acct = ledger.accounts["a"]
    ledger.policy.on_charge(acct, -1000.0)  # as if a had been refunded a lot while idle
    ledger.arrive(2, "a", 10, 1, 1.0)
    assert ledger.policy.deficit(acct) == 100.0  # no hoarded credit
    ledger.policy.reset_counters(ledger.accounts.values())
    assert ledger.policy.deficit(acct) == 0.0 and ledger.policy.counter_of(acct) == 0.0


def test_a_small_quantum_approaches_vtc_and_a_large_one_lpm():
    cached = {i: 96 for i in range(0, 40, 2)}
    arrivals = [(i, "ab"[i % 2]) for i in range(40)]

    def order(spec):
        ledger = ledger_with(spec, cached)
        for i, t in arrivals:
            ledger.arrive(i, t, 100, 1, 0.0)
        return [ledger.pop().tenant for _ in range(40)]

    assert order("dlpm:1e9") == order("lpm") == ["a"] * 20 + ["b"] * 20
    small = order("dlpm:1")
    assert max(abs(small[:k].count("a") - small[:k].count("b")) for k in range(41)) <= 1


def test_the_registry_lists_and_accepts_them_only_for_a_driver_with_a_prefix_cache():
    for spec in ("lpm", "dlpm", "dlpm:300"):
        with pytest.raises(ValueError, match="needs a driver with a prefix cache"):
            check_policy(spec)
        assert check_policy(spec, prefix_cache=True)[0].capabilities.uses_prefix_cache
    assert "lpm" not in policy_names() and "dlpm" not in policy_names()
    assert {"lpm", "dlpm"} <= set(policy_names(prefix_cache=True))
    assert "dlpm[:QUANTUM]" in describe(prefix_cache=True) and "lpm" not in describe(engine=True)
    for bad, msg in (("dlpm:0", "> 0"), ("dlpm:x", "not a number"), ("lpm:3", "takes no argument")):
        with pytest.raises(ValueError, match=msg):
            check_policy(bad, prefix_cache=True)
    assert make_policy("dlpm:64").quantum == 64


def dlpm_gap(quantum, arrivals, kv):
    """Largest |W_f - W_g| over stretches in which f and g both stayed backlogged, from the ledger's charges after
    every step; and the most output tokens of the requests running together."""
    ledger = Ledger(make_policy(f"dlpm:{quantum}"))
    samples, batch = [], [0]

    def observe(engine):
        engine._sync()
        f, g = ledger.accounts.get("f"), ledger.accounts.get("g")
        queued = bool(f and g and f.queued and g.queued)
        samples.append((queued, (f.service if f else 0.0) - (g.service if g else 0.0)))
        batch[0] = max(batch[0], sum(r.output_tokens for r in engine.running))

    cfg = EngineConfig(kv_tokens=kv, mode="paged", prefix_cache=True)
    SimEngine(ledger, get_latency_model("a10g-llama2-7b"), cfg, observer=observe).run(arrivals)
    worst, lo, hi = 0.0, None, None
    for queued, d in samples:
        if queued:
            lo, hi = (d, d) if lo is None else (min(lo, d), max(hi, d))
            worst = max(worst, hi - lo)
        else:
            lo = hi = None
    return worst, batch[0]


request = st.tuples(st.sampled_from(["sf", "sg", "doc", None]), st.integers(1, 300), st.integers(1, 200))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("fg"), request), min_size=30, max_size=90),
    st.sampled_from([50.0, 500.0, 3000.0]),
    st.integers(1500, 4000),
)
def test_dlpm_backlogged_difference_within_its_bound(draws, quantum, kv):
    arrivals = []
    for i, (tenant, (prefix, shared, own)) in enumerate(draws):
        segs = ((prefix, shared),) if prefix else ()
        arrivals.append(Arrival(0.001 * i, tenant, shared * bool(prefix) + own, 1 + own % 150, segs))
    gap, outputs = dlpm_gap(quantum, arrivals, kv)
    bound = 2 * (quantum + max(a.prompt_tokens for a in arrivals) + 2 * outputs)
    assert gap <= bound, (gap, bound)


def test_without_its_quantum_the_bound_breaks():
    """The property above can fail: with a quantum too large to matter (LPM), the tenant whose prompts are cached
    is served alone while the other stays backlogged, far past the bound a quantum of 500 gives."""
    arrivals = [Arrival(0.02 * i, "f", 320, 20, (("sf", 300),)) for i in range(200)]
    arrivals += [Arrival(0.001 * i + 0.0005, "g", 320, 20) for i in range(40)]
    gap, outputs = dlpm_gap(1e9, arrivals, 1200)
    assert gap > 10 * 2 * (500 + 320 + 2 * outputs)
    gap, outputs = dlpm_gap(500, arrivals, 1200)
    assert gap <= 2 * (500 + 320 + 2 * outputs)


def test_dlpm_deficits_refills_and_weights_exactly():
    from fairserve.core import LinearCost

    policy = make_policy("dlpm:500")
    assert (policy.name, policy.quantum, policy.refills) == ("dlpm500", 500, 0)
    ledger = ledger_with("dlpm:100", {})
    ledger.set_weight("w", 2.0)
    for i, tenant in enumerate(["a", "a", "w", "w", "a"]):
        ledger.arrive(i, tenant, 150, 1, float(i))
    dlpm, a, w = ledger.policy, ledger.accounts["a"], ledger.accounts["w"]
    assert dlpm.deficit(a) == 100 and dlpm.counter_of(a) == -100  # a new tenant starts with one quantum
    assert ledger.pop().id == 0  # a: 100 -> -50
    assert dlpm.deficit(a) == -50 and dlpm.counter_of(a) == 50
    assert ledger.pop().id == 2  # w pays 150 / 2: 100 -> 25
    assert dlpm.deficit(w) == 25
    assert ledger.pop().id == 3  # w still in credit: 25 -> -50
    assert dlpm.refills == 0
    # nobody in credit: a round for each backlogged tenant (a: -50 -> 50, debt kept, not overwritten); w has
    # nothing queued, so nothing
    assert ledger.pop().id == 1 and (dlpm.refills, dlpm.deficit(a), dlpm.deficit(w)) == (1, -100, -50)
    ledger.arrive(5, "w", 150, 1, 5.0)  # back with its debt
    assert ledger.pop().id == 5  # one round (w -50 -> 50, a -100 -> 0), then w pays 75
    assert (dlpm.refills, dlpm.deficit(a), dlpm.deficit(w)) == (2, 0, -25)
    assert ledger.pop().id == 4 and dlpm.refills == 3 and dlpm.deficit(a) == -50  # a zero deficit is no credit
    two = ledger_with("dlpm:100", {})
    two.arrive(0, "x", 350, 1, 0.0)
    two.arrive(1, "x", 10, 1, 0.0)
    two.pop()  # 100 - 350 = -250: three rounds to credit
    assert two.pop().id == 1 and two.policy.refills == 3 and two.policy.deficit(two.accounts["x"]) == 40
    # back from idle with a debt: the debt is kept (only credit is capped)
    back = ledger_with("dlpm:100", {})
    back.arrive(0, "d", 300, 1, 0.0)
    back.settle(back.pop(), output=1)  # 100 - 300 - 2: idle with a debt of 202
    back.arrive(1, "d", 10, 1, 1.0)
    assert back.policy.deficit(back.accounts["d"]) == -202
    # the policy's own price is the one charged
    priced = Ledger(make_policy("dlpm:100", cost=LinearCost(3.0, 2.0)))
    priced.policy.cached = lambda req: 0
    priced.arrive(0, "p", 10, 1, 0.0)
    priced.pop()
    assert priced.accounts["p"].service == 30.0 and priced.policy.deficit(priced.accounts["p"]) == 70.0


def test_lpm_ties_go_to_arrival_order_also_for_a_request_put_back():
    from fairserve.core import LinearCost

    ledger = ledger_with("lpm", {0: 32, 1: 32})
    ledger.arrive(0, "a", 100, 1, 0.0)
    ledger.arrive(1, "b", 100, 1, 0.0)
    first = ledger.pop()
    assert first.id == 0
    ledger.requeue(first)  # back in the queue, after b in the policy's own order
    assert ledger.pop().id == 0
    priced = Ledger(make_policy("lpm", cost=LinearCost(3.0, 2.0)))
    priced.policy.cached = lambda req: 0
    priced.arrive(0, "p", 10, 1, 0.0)
    priced.pop()
    assert priced.accounts["p"].service == 30.0


def private_prefixes(prefix: int, clients: int = 8, duration_s: int = 60) -> Workload:
    """`clients` clients, each with its own `prefix`-token system prompt, a 64-token question and 32 output tokens,
    one request a second each, staggered; the arrival times are the test's own."""
    arrivals = [
        Arrival(t + c / clients, f"client-{c}", prefix + 64, 32, ((f"system-{c}", prefix),))
        for t in range(duration_s)
        for c in range(clients)
    ]
    return Workload("private-prefixes", arrivals, float(duration_s))


@pytest.mark.parametrize("prefix", [1000, 1500])
def test_dlpm_as_typed_gets_the_locality_gain_where_the_pool_holds_half_the_prefixes(prefix):
    """A quantum below one request's service makes DLPM round-robin (the old default, 500: about 1.1× VTC); the
    derived one (QUANTUM_REQUESTS of the largest request) lets a client run several while its prefix is cached."""
    w = private_prefixes(prefix)
    pool = 4 * (prefix + 64 + 32)  # half of the 8 clients' requests, their prefixes included

    def rate(policy: str) -> float:
        opts = SimOptions(policy=policy, mode="paged", prefix_cache=True, kv_tokens=pool, latency="a10g-llama2-7b")
        return summarize(simulate(w, opts).records, w.duration_s).service_per_s

    vtc = rate("vtc")
    assert rate("dlpm") >= 2.0 * vtc
    assert rate("dlpm:500") < 1.3 * vtc  # what the default was
    policy = make_policy("dlpm")
    assert policy.name == "dlpm" and policy.derived
    ledger = Ledger(policy)
    ledger.arrive(0, "a", prefix + 64, 32, 0.0)
    assert policy.quantum == QUANTUM_REQUESTS * (prefix + 64 + 2 * 32)  # w_p·prompt + w_q·max_tokens
    ledger.arrive(1, "b", 10, 1, 0.0)
    assert policy.quantum == QUANTUM_REQUESTS * (prefix + 64 + 2 * 32)  # a smaller request leaves it
