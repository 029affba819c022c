"""A price for prompt tokens served from a prefix cache (`w_cached`, core/cost.py): charged at admission, kept by
every reconciliation and the one settle, the default (w_cached = w_p) the paper's charges exactly, and the metrics
measuring service from records in the same unit."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, LinearCost, make_cost, make_policy
from fairserve.metrics import summarize
from fairserve.sim import simulate
from fairserve.workloads import Arrival, Workload

pytestmark = pytest.mark.unit

ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "pop", "output", "prompt", "settle", "cancel", "refund", "requeue"]),
        st.sampled_from("ab"),
        st.integers(0, 40),
    ),
    max_size=60,
)


def formula(cost: LinearCost, r) -> float:
    """What a request's charge must be: w_p·(x − c) + w_cached·c + w_q·y, c at most the prompt; 0 if never admitted."""
    c = min(r.cached_tokens, r.prompt_tokens)
    price = cost.w_p if cost.w_cached is None else cost.w_cached
    return cost.w_p * (r.prompt_tokens - c) + price * c + cost.w_q * r.output_done if r.admitted else 0.0


@settings(max_examples=120, deadline=None)
@given(script=ops, spec=st.sampled_from(["vtc", "dlpm:30", "fcfs"]))
def test_every_charge_follows_the_cached_price_and_the_default_is_the_papers(script, spec):
    costs = [LinearCost(), LinearCost(w_cached=1.0), LinearCost(w_cached=0.25), LinearCost(0.5, 1.0, w_cached=3.0)]
    ledgers = [Ledger(make_policy(spec, cost=c), "ab") for c in costs]
    for led in ledgers:
        if led.policy.capabilities.uses_prefix_cache:
            led.policy.cached = lambda r: r.cached_tokens
    live: list[list] = [[] for _ in ledgers]
    for n, (op, tenant, k) in enumerate(script):
        for led, mine in zip(ledgers, live, strict=True):
            if op == "arrive":
                req = led.arrive(n, tenant, k + 1, max_tokens=40)
                req.cached_tokens = 3 * k  # the driver's count, set before pop (may exceed the prompt: clamped)
                mine.append(req)
            elif op == "pop" and led.peek() is not None:
                led.pop()
            elif mine:
                req = mine[k % len(mine)]
                if op == "output":
                    led.output(req, k % 5)
                elif op == "prompt":
                    led.prompt(req, k + 1)
                elif op == "settle":
                    led.settle(req, output=k if k % 2 else None)
                elif op == "cancel":
                    led.settle(req, prompt=k % 7 or None, cancelled=True)
                elif op == "refund":
                    led.settle(req, prompt=0, output=0, cancelled=True)
                elif op == "requeue":
                    led.requeue(req)
        for cost, led, mine in zip(costs, ledgers, live, strict=True):
            for r in mine:
                assert r.charged == pytest.approx(formula(cost, r), abs=1e-9)
            for t in "ab":
                assert led.service[t] == pytest.approx(sum(r.charged for r in mine if r.tenant == t), abs=1e-9)
    paper, same = live[0], live[1]
    for a, b in zip(paper, same, strict=True):  # the default: w_p × every prompt token, cached or not, bit for bit
        assert a.charged == b.charged == (a.prompt_tokens + 2 * a.output_done if a.admitted else 0.0)


def test_unpop_refunds_the_priced_admission_and_the_next_pop_prices_anew():
    led = Ledger(make_policy("vtc", cost=LinearCost(w_cached=0.0)), "a")
    req = led.arrive(1, "a", 100, max_tokens=10)
    req.cached_tokens = 64
    assert led.pop() is req and req.charged == req.admission == 36.0 and led.service["a"] == 36.0
    led.unpop(req)
    assert req.charged == 0.0 and led.service["a"] == 0.0
    req.cached_tokens = 0  # the cache lost it meanwhile
    led.pop()
    led.output(req, 10)
    assert led.settle(req) and req.charged == led.service["a"] == 100.0 + 20.0


def test_a_prompt_cut_below_its_cached_tokens_is_charged_at_the_cached_price():
    led = Ledger(make_policy("vtc", cost=LinearCost(w_cached=0.5)), "a")
    req = led.arrive(1, "a", 100, max_tokens=10)
    req.cached_tokens = 64
    led.pop()
    assert req.charged == 36.0 + 32.0
    led.prompt(req, 40)  # NOTE: the backend's usage: all 40 were cached
    assert req.charged == led.service["a"] == 20.0
    led.prompt(req, 80)
    assert req.charged == led.service["a"] == 16.0 + 32.0


def test_the_cost_names_its_cached_price_and_refuses_one_it_cannot_apply():
    assert LinearCost().name == LinearCost(w_cached=None).name == "linear(1,2)"
    assert make_cost("linear", 1.0, 2.0, 0.1) == LinearCost(1.0, 2.0, 0.1)
    assert make_cost("linear", 1.0, 2.0, 0.1).name == "linear(1,2,cached=0.1)"
    assert LinearCost(w_cached=0.5).cached(100, 40) == -20.0 and LinearCost(w_cached=0.5).cached(10, 40) == -5.0
    assert LinearCost().cached(100, 40) == 0.0
    profiled = make_cost("profiled")
    assert profiled.cached(100, 40) == 0.0  # h(x, y) has no price of its own for cached tokens
    with pytest.raises(ValueError, match="w_cached=-1"):
        make_cost("linear", 1.0, 2.0, -1.0)
    with pytest.raises(ValueError, match="needs the linear cost"):
        make_cost("profiled", w_cached=0.5)


def shared(n=40, clients=4):
    arrivals = [Arrival(0.05 * i, f"c{i % clients}", 520, 20, ((f"sys{i % clients}", 500),)) for i in range(n)]
    return Workload("shared", arrivals, 30.0)


@pytest.mark.parametrize("policy", ["vtc", "dlpm:2000"])
def test_the_engines_charges_and_the_metrics_agree_in_the_cached_unit(policy):
    w = shared()
    paper = simulate(w, policy, mode="paged", kv_tokens=6000, drain=True, prefix_cache=True)
    cheap = simulate(w, policy, mode="paged", kv_tokens=6000, drain=True, prefix_cache=True, w_cached=0.25)
    assert cheap.ledger.cost == LinearCost(w_cached=0.25)
    assert [r.cached_tokens for r in cheap.records] == cheap.cached_tokens and max(cheap.cached_tokens) == 496
    cost = cheap.ledger.cost
    stats = summarize(cheap.records, cheap.end_s, cost=cost).clients
    for t, service in cheap.ledger.service.items():
        mine = [r for r in cheap.records if r.client == t]
        expect = sum(r.prompt_tokens - 0.75 * r.cached_tokens + 2 * r.output_tokens for r in mine)
        assert service == pytest.approx(expect) and stats[t].service == pytest.approx(expect)
        assert service < paper.ledger.service[t]  # every client's later requests hit its system prompt
    assert summarize(cheap.records, cheap.end_s).clients["c0"].service == pytest.approx(paper.ledger.service["c0"])


def test_simulate_takes_w_cached_and_refuses_it_without_the_linear_cost(tmp_path, capsys):
    from fairserve.cli import main

    out = tmp_path / "run.json"
    argv = ["simulate", "--workload", "system-prompts", "--duration", "5", "--engine-mode", "paged", "--prefix-cache"]
    assert main([*argv, "--policy", "vtc", "--w-cached", "0.25", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["cost"] == "linear(1,2,cached=0.25)"
    service = sum(c["service"] for c in doc["summary"]["clients"].values())
    reqs = [r for r in doc["requests"] if r["first_token_s"] is not None]
    assert any(r["cached_tokens"] for r in reqs)
    expect = sum(r["prompt_tokens"] - 0.75 * r["cached_tokens"] + 2 * r["output_tokens"] for r in reqs)
    assert service == pytest.approx(expect)
    capsys.readouterr()
    assert main([*argv, "--policy", "vtc", "--w-cached", "0.5", "--cost", "profiled"]) == 2
    err = capsys.readouterr().err
    assert "needs the linear cost" in err and len(err.strip().splitlines()) == 1


def test_a_request_with_its_own_price_pays_its_own_cached_price():
    led = Ledger(make_policy("vtc"), "a")  # the policy's price: the paper's
    req = led.arrive(1, "a", 100, max_tokens=10)
    req.cost, req.cached_tokens = LinearCost(2.0, 4.0, w_cached=0.5), 64
    led.pop()
    assert req.charged == 2.0 * 36 + 0.5 * 64
    led.output(req, 3)
    assert led.settle(req, prompt=80) and req.charged == led.service["a"] == 2.0 * 16 + 0.5 * 64 + 4.0 * 3
