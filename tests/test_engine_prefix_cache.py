"""The paged engine's prefix cache (sim/cached.py) against the step-by-step oracle's plain cache
(tests/support/oracle.py): the same cached tokens per request, records, clock and charges, on workloads whose
clients share prefixes, under policies that ignore the cache and those that order by it; and what the cache changes
(prefill time, hits, the cached-prefix policies' refusal without one). Charges are compared with cached prompt
tokens at the paper's price and at their own (`w_cached`)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.oracle import StepEngine

from fairserve.core import Ledger, make_policy
from fairserve.core.policy import PolicyError
from fairserve.sim import EngineConfig, SimEngine, simulate
from fairserve.sim.latency import ConstantLatency, LinearLatency, get_latency_model, prefill_cached_s
from fairserve.workloads import Arrival, Workload

pytestmark = pytest.mark.unit

POLICIES = ["fcfs", "vtc", "drr:200", "lpm", "dlpm:200", "dlpm:5000"]
LATENCIES = [get_latency_model("a10g-llama2-7b"), get_latency_model("llama-2-7b@a10g")]


@st.composite
def shared_prefix_workload(draw):
    """Clients a-d, each request's prompt a prefix (one of a few system prompts or documents, possibly chained into
    a longer one, as a conversation's turns) and then its own tokens, possibly continued as a segment that later
    prompts declare (a conversation's answer)."""
    n = draw(st.integers(1, 40))
    out = []
    for _ in range(n):
        t = draw(st.floats(0, 8, allow_nan=False))
        client = draw(st.sampled_from("abcd"))
        first = draw(st.sampled_from(["s1", "s2", "s3", None]))
        prefix, continued_as = (), None
        if first is not None:
            prefix = ((first, draw(st.integers(1, 300))),)
            if draw(st.booleans()):
                prefix += ((f"{first}+{draw(st.sampled_from('xy'))}", draw(st.integers(1, 100))),)
            else:  # its own tokens and answer named as the segment others declare (a conversation's next turn)
                continued_as = draw(st.sampled_from([None, f"{first}+x"]))
        own = draw(st.integers(0, 120))
        prompt = max(1, sum(k for _, k in prefix) + own)
        out.append(Arrival(t, client, prompt, draw(st.integers(1, 120)), prefix, continued_as))
    return out


config = st.builds(
    EngineConfig,
    kv_tokens=st.integers(700, 4000),
    mode=st.just("paged"),
    prompt_extra_tokens=st.sampled_from([0, 2]),
    prefix_cache=st.just(True),
    block_tokens=st.sampled_from([16, 32, 7]),
    max_wait_steps=st.sampled_from([None, 2]),
)


def run_both(policy, cfg, latency, arrivals, until=None, w_cached=None):
    results = []
    for kind in (StepEngine, SimEngine):
        results.append(kind(Ledger(make_policy(policy, w_cached=w_cached)), latency, cfg).run(arrivals, until))
    return results


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(POLICIES),
    config,
    st.sampled_from(range(len(LATENCIES))),
    shared_prefix_workload(),
    st.one_of(st.none(), st.floats(0.5, 30)),
    st.sampled_from([None, 0.25]),
)
def test_cached_tokens_and_records_equal_the_step_by_step_engines(policy, cfg, latency, arrivals, until, w_cached):
    oracle, engine = run_both(policy, cfg, LATENCIES[latency], arrivals, until, w_cached)
    assert engine.cached_tokens == oracle.cached_tokens
    assert engine.records == oracle.records
    assert (engine.end_s, engine.decode_steps, engine.prefills, engine.preemptions, engine.busy_s) == (
        oracle.end_s,
        oracle.decode_steps,
        oracle.prefills,
        oracle.preemptions,
        oracle.busy_s,
    )
    assert engine.ledger.service == oracle.ledger.service and engine.ledger.counters == oracle.ledger.counters


def test_the_oracle_comparison_sees_hits_and_evictions():
    """The cases above are not all trivial: with a pool too small for every prefix, some requests hit and the
    engines agree on which."""
    arrivals = [Arrival(0.01 * i, "abcd"[i % 4], 420, 30, ((f"sys{i % 4}", 400),)) for i in range(60)]
    cfg = EngineConfig(kv_tokens=1400, mode="paged", prefix_cache=True)
    oracle, engine = run_both("vtc", cfg, LATENCIES[0], arrivals)
    assert engine.cached_tokens == oracle.cached_tokens
    hits = [c for c in engine.cached_tokens if c]
    assert 0 < len(hits) < len(arrivals) and max(hits) == 400  # 25 full blocks of the 400-token system prompt


def test_a_cached_prefix_shortens_the_prefill_by_the_attention_term():
    lin = get_latency_model("a10g-llama2-7b")
    assert isinstance(lin, LinearLatency)
    # u new tokens after c cached: Σu in the per-token term, Σu·(c+u) in the attention term
    assert prefill_cached_s(lin, [100, 40], [0, 0]) == lin.prefill_s([100, 40])
    expect = lin._pre0 + lin.prefill_per_token_s * 140 + lin.prefill_per_sq_token_s * (100 * 500 + 40 * 40)
    assert prefill_cached_s(lin, [100, 40], [400, 0]) == pytest.approx(expect)
    assert prefill_cached_s(lin, [100], [400]) < lin.prefill_s([500])
    roof = get_latency_model("llama-2-7b@a10g")
    assert prefill_cached_s(roof, [100], [0]) == roof.prefill_s([100])
    assert prefill_cached_s(roof, [100], [4000]) < roof.prefill_s([4100])
    assert prefill_cached_s(ConstantLatency(prefill_s_per_token=1.0), [3], [10]) == 3.0


def shared_workload(clients=4, n=80, prompt=520, prefix=500):
    arrivals = [Arrival(0.02 * i, f"c{i % clients}", prompt, 20, ((f"sys{i % clients}", prefix),)) for i in range(n)]
    return Workload("shared", arrivals, 30.0)


def test_the_cache_serves_a_repeated_system_prompt_and_speeds_the_run_up():
    w = shared_workload()
    plain = simulate(w, "vtc", mode="paged", kv_tokens=6000, drain=True)
    cached = simulate(w, "vtc", mode="paged", kv_tokens=6000, drain=True, prefix_cache=True)
    assert plain.cached_tokens is None
    # each client's first request misses; later ones find the 500-token prompt's 31 full blocks (496 tokens)
    assert sorted(set(cached.cached_tokens)) == [0, 496]
    assert cached.cached_tokens.count(0) == 4
    assert cached.busy_s < plain.busy_s


def test_policies_that_order_by_cached_prefix_need_a_prefix_cache():
    w = shared_workload()
    for policy in ("lpm", "dlpm", "dlpm:100"):
        with pytest.raises(ValueError, match="prefix cache"):
            simulate(w, policy, mode="paged")
        with pytest.raises(ValueError, match="prefix cache"):
            SimEngine(Ledger(make_policy(policy)), LATENCIES[0], EngineConfig(mode="paged"))
    with pytest.raises(PolicyError, match="prefix cache"):
        ledger = Ledger(make_policy("lpm"))  # a driver that does not install Policy.cached
        ledger.arrive(1, "a", 10, 5, 0.0)
        ledger.peek()
    with pytest.raises(ValueError, match="paged"):
        EngineConfig(prefix_cache=True)
    with pytest.raises(ValueError, match="preempt"):
        EngineConfig(mode="paged", prefix_cache=True, preempt_delta=10)


def test_simulate_reports_hit_rates_per_client_and_writes_them_to_json(tmp_path, capsys):
    from fairserve.cli import main

    out = tmp_path / "run.json"
    argv = ["simulate", "--workload", "prefix-mix", "--duration", "10", "--engine-mode", "paged", "--prefix-cache"]
    assert main([*argv, "--policy", "dlpm:3000", "--kv-tokens", "20000", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prefix cache (16-token blocks):" in text and "client-7" in text.split("prefix cache")[1]
    doc = json.loads(out.read_text())
    cache = doc["summary"]["prefix_cache"]
    assert cache["block_tokens"] == 16 and 0 < cache["hit_rate"] < 1
    by_client = cache["hit_rate_by_client"]
    assert by_client["client-0"] > 0.5 and by_client["client-1"] == 0  # the even clients share a system prompt
    assert {r["cached_tokens"] for r in doc["requests"]} >= {0, 992}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "lpm"], "orders by cached prefix and needs the prefix cache: --engine-mode paged --prefix-cache"),
        (["--policy", "dlpm:10", "--engine-mode", "paged"], "prefix cache: --engine-mode paged --prefix-cache"),
        (["--prefix-cache"], "--prefix-cache needs --engine-mode paged"),
    ],
)
def test_simulate_refuses_what_needs_a_prefix_cache_in_one_line(args, message, capsys):
    from fairserve.cli import main

    assert main(["simulate", "--workload", "document", "--duration", "5", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mode_cache", [("paged", True), ("paged", False)])
def test_a_preempted_request_longer_than_the_prefill_budget_runs_again_alone(mode_cache):
    """A request preempted for memory recomputes its prompt and the output it had: 3,066 + its output tokens are more
    than the engine prefills at once (3,072), so it could never be admitted again ("nothing fits an empty engine").
    It now prefills alone, with nothing running, in both engines, and every request finishes."""
    mode, cache = mode_cache
    arrivals = [Arrival(0.125 * i, f"c{i % 8}", 3064, 200, ((f"sys{i % 8}", 3000),)) for i in range(64)]
    cfg = EngineConfig(kv_tokens=4 * 3096, mode=mode, prefix_cache=cache)
    oracle, engine = run_both("dlpm:5000" if cache else "vtc", cfg, get_latency_model("a10g-llama2-7b"), arrivals)
    assert engine.preemptions > 0 and len(engine.records) == len(arrivals)
    assert engine.records == oracle.records and engine.preemptions == oracle.preemptions
