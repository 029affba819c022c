"""Invariants of the simulated engine on many random workloads (Hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.core import Ledger, make_policy
from fairserve.sim import EngineConfig, SimEngine
from fairserve.sim.latency import get_latency_model
from fairserve.workloads import Arrival

pytestmark = pytest.mark.unit

POLICIES = ["fcfs", "vtc", "lcf", "drr:100", "rpm:30", "vtc-predict:oracle±50", "vtc-predict:moving-average"]

arrival = st.builds(
    Arrival,
    st.floats(0, 30, allow_nan=False),
    st.sampled_from(["a", "b", "c", "d"]),
    st.integers(1, 600),
    st.integers(1, 400),
)
scenario = st.fixed_dictionaries(
    {
        "arrivals": st.lists(arrival, min_size=1, max_size=60),
        "policy": st.sampled_from(POLICIES),
        "mode": st.sampled_from(["reserve", "paged"]),
        "kv": st.integers(300, 4000),
        "until": st.one_of(st.none(), st.floats(0.5, 40)),
    }
)


def simulate(sc):
    seen = {"now": [], "kv_ok": True}
    lat = get_latency_model("a10g-llama2-7b")
    cfg = EngineConfig(kv_tokens=sc["kv"], mode=sc["mode"])

    def observe(engine):
        seen["now"].append(engine.now)
        held = sum(r.prompt_tokens + r.generated_at(engine.step) for r in engine.running)
        seen["kv_ok"] &= (
            held == engine.kv_used
            and engine.kv_used + engine.kv_free == cfg.kv_tokens
            and 0 <= engine.kv_used <= cfg.kv_tokens
        )

    res = SimEngine(Ledger(make_policy(sc["policy"], seed=1)), lat, cfg, observer=observe).run(
        sc["arrivals"], sc["until"]
    )
    return res, seen


@settings(max_examples=150, deadline=None)
@given(scenario)
def test_engine_invariants(sc):
    res, seen = simulate(sc)
    recs = res.records
    assert len(recs) == len(sc["arrivals"])
    assert seen["kv_ok"]
    assert all(b >= a for a, b in zip(seen["now"], seen["now"][1:], strict=False))  # the clock never goes back
    for r in recs:
        assert r.status in ("finished", "rejected", "unfinished")
        if sc["until"] is None:
            assert r.status != "unfinished"  # drained: everything ends
        if r.status == "rejected":
            assert r.admit_s is None and r.output_tokens == 0
        if r.admit_s is not None:
            assert r.arrival_s <= r.admit_s <= r.first_token_s
        if r.status == "finished":
            assert r.first_token_s <= r.finish_s and r.output_tokens == r.max_tokens
        else:
            assert r.finish_s is None
        assert 0 <= r.output_tokens <= r.max_tokens
    if sc["until"] is None:
        # charged exactly once for what was served, preemptions and predictions included
        for client, service in res.ledger.service.items():
            served = sum(
                r.prompt_tokens + 2 * r.output_tokens for r in recs if r.client == client and r.status == "finished"
            )
            assert abs(service - served) < 1e-6


@settings(max_examples=25, deadline=None)
@given(scenario)
def test_same_seed_same_result(sc):
    assert simulate(sc)[0].records == simulate(sc)[0].records
