"""Fairness-triggered preemption and the per-tenant running-memory cap (sim/preempt.py, docs/preemption.md): the
event engine equals the step-by-step oracle with them on, in both modes; no workload livelocks, no request is lost
or charged twice; the options parse with one clear error each."""

from dataclasses import replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.oracle import StepEngine

from fairserve.core import Ledger, check_policy, make_policy
from fairserve.sim import EngineConfig, SimEngine, SimRequest, simulate
from fairserve.sim.latency import ConstantLatency, get_latency_model
from fairserve.workloads import Arrival, Workload

pytestmark = pytest.mark.unit

CLIENTS = ["a", "b", "c", "d"]
LATENCIES = [get_latency_model("a10g-llama2-7b"), ConstantLatency(prefill_s_per_token=1e-4, decode_s=0.01)]

arrival = st.builds(
    Arrival, st.floats(0, 4, allow_nan=False), st.sampled_from(CLIENTS), st.integers(1, 400), st.integers(1, 300)
)
workload = st.integers(1, 40).flatmap(lambda n: st.lists(arrival, min_size=n, max_size=n))  # NOTE: sizes spread evenly
setup = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(
            ["vtc", "vtc", "lcf", "vtc-predict:oracle", "fcfs", "drr:100"]
        ),  # the cap only for the last two
        "weights": st.one_of(st.none(), st.dictionaries(st.sampled_from(CLIENTS), st.sampled_from([0.5, 2, 3]))),
        "tree": st.sampled_from([False, False, True]),  # b to d as the group g's tenants
        "cost": st.sampled_from([None, None, "profiled"]),
        "latency": st.sampled_from(range(len(LATENCIES))),
        "config": st.builds(
            EngineConfig,
            kv_tokens=st.integers(300, 3000),
            max_wait_steps=st.sampled_from([None, 0, 3]),
            mode=st.sampled_from(["reserve", "paged"]),
            prompt_extra_tokens=st.sampled_from([0, 2]),
            reserve_per_client_tokens=st.sampled_from([0, 32]),
            preempt_delta=st.sampled_from([None, 0.0, 0.0, 50.0, 400.0]),
            preempt_max=st.sampled_from([1, 3]),
            running_cap=st.sampled_from([None, None, 400, 1200]),
            preempt_priority=st.sampled_from([False, False, True]),
        ),
        # NOTE: levels for priority that preempts: a best, the others worse (c worst), or one level
        "priorities": st.sampled_from([None, {"a": 0, "b": 1, "c": 2, "d": 1}]),
    }
)


def build(kind, s):
    policy = make_policy(s["policy"], cost=s["cost"])
    cfg = s["config"] if policy.capabilities.shares_counters else replace(s["config"], preempt_delta=None)
    priorities = s["priorities"] if policy.capabilities.tree and not s["tree"] else None
    return kind(Ledger(policy, weights=s["weights"], priorities=priorities), LATENCIES[s["latency"]], cfg)


def named(s, arrivals):
    return [replace(a, client=f"g/{a.client}" if s["tree"] and a.client != "a" else a.client) for a in arrivals]


@settings(max_examples=120, deadline=None)
@given(setup, workload, st.one_of(st.none(), st.floats(0.5, 30)))
def test_preemption_and_the_cap_equal_the_step_by_step_engines(s, arrivals, until):
    arrivals = named(s, arrivals)
    a, b = build(StepEngine, s).run(arrivals, until), build(SimEngine, s).run(arrivals, until)
    assert b.records == a.records
    assert (b.end_s, b.decode_steps, b.prefills, b.preemptions, b.fair_preemptions, b.busy_s) == (
        a.end_s,
        a.decode_steps,
        a.prefills,
        a.preemptions,
        a.fair_preemptions,
        a.busy_s,
    )
    assert b.ledger.service == a.ledger.service and b.ledger.counters == a.ledger.counters
    event(f"preempted for fairness: {b.fair_preemptions > 0}, {s['config'].mode}")


submit = st.tuples(st.just("submit"), st.sampled_from(CLIENTS), st.integers(1, 400), st.integers(1, 300))
operation = st.tuples(
    st.floats(0, 3, allow_nan=False),
    st.one_of(submit, submit, submit, st.tuples(st.just("cancel"), st.integers(0, 10_000))),
)


@settings(max_examples=40, deadline=None)
@given(setup, st.integers(1, 40).flatmap(lambda n: st.lists(operation, min_size=n, max_size=n)))
def test_online_with_preemption_equals_the_step_by_step_engines(s, ops):
    """As the emulator drives it (submit at the clock, advance_to, cancel a queued, running or preempted request)."""
    both = build(StepEngine, s), build(SimEngine, s)
    requests: list[list[SimRequest]] = [[], []]
    for t, op in sorted(ops, key=lambda o: o[0]):
        for eng, reqs in zip(both, requests, strict=True):
            eng.advance_to(t)
            if op[0] == "submit":
                req = SimRequest(id=len(reqs), tenant=op[1], prompt_tokens=op[2], max_tokens=op[3], output_tokens=op[3])
                req.arrival_s = eng.now
                reqs.append(req)
                eng.submit(req)
            elif reqs and not reqs[op[1] % len(reqs)].done:
                eng.cancel(reqs[op[1] % len(reqs)])
        for eng in both:
            eng._sync()
        assert (both[1].now, both[1].step, both[1].kv_used) == (both[0].now, both[0].step, both[0].kv_used)
        assert both[1].ledger.service == both[0].ledger.service
        assert [(r.state, r.generated_at(both[1].step), r.fair_preemptions) for r in requests[1]] == [
            (r.state, r.generated_at(both[0].step), r.fair_preemptions) for r in requests[0]
        ]
    for eng in both:
        eng.advance_to(float("inf"))
    assert [(r.state, r.finish_s) for r in requests[1]] == [(r.state, r.finish_s) for r in requests[0]]


@settings(max_examples=40, deadline=None)
@given(setup, workload)
def test_no_livelock_nothing_lost_nothing_charged_twice(s, arrivals):
    """Run to the end: every request finishes (or was too large to ever run), each tenant is charged exactly the
    service of its requests (the recompute after a preemption is not charged), and no request is preempted for
    fairness more than `preempt_max` times."""
    s = {**s, "cost": None, "policy": "vtc"}
    cfg = s["config"]
    engine = build(SimEngine, s)
    reqs = []

    def observe(e):
        reqs.extend(r for r in e.running if r not in reqs)
        if cfg.running_cap is not None:
            held: dict[str, list[int]] = {}
            for r in e.running:
                held.setdefault(r.tenant, []).append(r.prompt_tokens + cfg.prompt_extra_tokens + r.output_tokens)
            assert all(len(h) == 1 or sum(h) <= cfg.running_cap for h in held.values())

    engine.observer = observe
    result = engine.run(arrivals)
    assert all(r.status in ("finished", "rejected") for r in result.records)
    assert sum(r.status == "finished" for r in result.records) == sum(
        engine.too_large(a.prompt_tokens, a.output_tokens) is None for a in arrivals
    )
    expected: dict[str, float] = {}
    for r in result.records:
        if r.status == "finished":
            assert r.output_tokens == r.max_tokens
            expected[r.client] = expected.get(r.client, 0.0) + r.prompt_tokens + 2 * r.output_tokens
    assert {t: v for t, v in result.ledger.service.items() if v or t in expected} == expected
    assert all(r.fair_preemptions <= cfg.preempt_max for r in reqs)
    assert result.fair_preemptions <= cfg.preempt_max * len(arrivals)
    if cfg.preempt_delta is None and not (cfg.preempt_priority and s["priorities"]):
        assert result.fair_preemptions == 0  # NOTE: counted: preemptions for fairness and for priority


def test_a_tenant_holding_the_pool_is_preempted_for_a_waiting_one():
    """Tenant a's long requests fill the pool; b arrives. Without preemption b waits for one of a's to finish; with
    `preempt=0` the next try after b's arrival preempts a's newest and admits b; a's preempted request runs again
    and finishes (charged once)."""
    lat = ConstantLatency(prefill_s_fixed=0.01, decode_s=0.01)
    arrivals = [Arrival(0.0, "a", 100, 900) for _ in range(2)] + [Arrival(1.0, "b", 100, 900)]
    wl = Workload("fill", arrivals, duration_s=100, kv_tokens=2100)
    plain = simulate(wl, "vtc", latency=lat, drain=True)
    fair = simulate(wl, "vtc:preempt=0", latency=lat, drain=True)
    b_plain, b_fair = plain.records[2], fair.records[2]
    assert b_plain.admit_s > 8 and b_fair.admit_s < 1.2
    assert fair.fair_preemptions == fair.preemptions == 1
    assert all(r.status == "finished" for r in fair.records)
    assert fair.ledger.service == plain.ledger.service == {"a": 2 * (100 + 1800), "b": 100 + 1800}
    high = simulate(wl, "vtc:preempt=100000", latency=lat, drain=True)  # the gap never exceeds DELTA
    assert high.records == plain.records and high.fair_preemptions == 0


def test_a_better_level_preempts_a_worse_one_and_an_equal_one_never_does():
    """`preempt-priority=1` in the simulator: tenant low (level 1) fills the pool; high (level 0) arrives and is
    admitted at the next try, low's newest request preempted for it (and finished later, charged once). Without the
    option high waits for one of low's requests to end; at one level nobody is preempted."""
    lat = ConstantLatency(prefill_s_fixed=0.01, decode_s=0.01)
    arrivals = [Arrival(0.0, "low", 100, 900) for _ in range(2)] + [Arrival(1.0, "high", 100, 900)]
    levels = {"low": 1, "high": 0}
    wl = Workload("fill", arrivals, duration_s=100, kv_tokens=2100, priorities=levels)
    plain = simulate(wl, "vtc", latency=lat, drain=True)
    first = simulate(wl, "vtc:preempt-priority=1", latency=lat, drain=True)
    assert plain.records[2].admit_s > 8 and first.records[2].admit_s < 1.2
    assert first.fair_preemptions == first.preemptions == 1 and all(r.status == "finished" for r in first.records)
    assert first.ledger.service == plain.ledger.service == {"low": 2 * (100 + 1800), "high": 100 + 1800}
    flat = simulate(replace(wl, priorities=None), "vtc:preempt-priority=1", latency=lat, drain=True)
    assert flat.preemptions == 0 and flat.records[2].admit_s > 8


def test_the_cap_holds_a_tenant_to_its_share():
    lat = ConstantLatency(prefill_s_fixed=0.01, decode_s=0.01)
    wl = Workload("cap", [Arrival(0.0, "a", 100, 400) for _ in range(6)], duration_s=100, kv_tokens=5000)
    one_at_a_time = simulate(wl, "vtc:running-cap=500", latency=lat, drain=True)
    starts = sorted(r.admit_s for r in one_at_a_time.records)
    assert len(set(starts)) == 6  # 500 tokens each: one runs at a time
    two = simulate(wl, "vtc:running-cap=1000", latency=lat, drain=True)
    assert len({r.admit_s for r in two.records}) == 3


@pytest.mark.parametrize(
    "spec, message",
    [
        ("vtc:preempt=x", "'x' is not float"),
        ("vtc:preempt=-1", "must be >= 0"),
        ("vtc:running-cap=0", "must be >= 1"),
        ("vtc:swap=1", "unknown engine option 'swap'"),
        ("fcfs:preempt=10", "keeps none; use vtc"),
    ],
)
def test_bad_engine_options_get_one_clear_error(spec, message):
    with pytest.raises(ValueError, match=message):
        check_policy(spec, engine_options=True)


def test_an_engine_refuses_preemption_without_counters_and_bad_settings():
    with pytest.raises(ValueError, match="keeps none"):
        SimEngine(Ledger(make_policy("fcfs")), LATENCIES[1], EngineConfig(preempt_delta=10.0))
    with pytest.raises(ValueError, match="preempt_delta must be >= 0"):
        EngineConfig(preempt_delta=-1.0)
    with pytest.raises(ValueError, match="must be >= 1"):
        EngineConfig(running_cap=0)


def test_engine_options_are_the_simulated_engines_only():
    entry, arg = check_policy("vtc-predict:oracle:preempt=10:preempt-max=2", engine_options=True)
    assert entry.name == "vtc-predict" and arg is not None
    with pytest.raises(ValueError, match="apply to the engines that preempt"):
        check_policy("vtc:preempt=10")  # the gateway, serve, vLLM: no simulated batch to preempt
    with pytest.raises(ValueError, match="apply to the engines that preempt"):
        make_policy("vtc:running-cap=100")


def test_the_lower_bound_construction_holds_back_every_non_preemptive_order():
    """On the construction (reserve mode), every order without preemption lets the hog's backlogged service run
    ahead by more than 0.9·w_q·M (about half of VTC's bound 2·w_q·M): the hog's batch holds the pool while `late`
    waits; with preemption VTC stays below that lower bound."""
    from fairserve.metrics.summary import summarize
    from fairserve.sim import engine_config
    from fairserve.sim.lower_bound import lower_bound_workload

    cfg = engine_config()
    wl = lower_bound_workload(cfg)
    lower = 0.9 * 2 * cfg.kv_tokens

    def diff(spec):
        return summarize(simulate(wl, spec).records, wl.duration_s).max_backlogged_diff

    assert all(diff(spec) > lower for spec in ("vtc", "lcf", "fcfs"))
    assert diff("vtc:preempt=500") < lower / 2
    assert diff("vtc") <= 2 * 2 * cfg.kv_tokens  # VTC's bound still holds


@st.composite
def two_tenants(draw):
    """The lower-bound construction's start (g's long requests fill the pool at time 0, more queued behind them),
    then requests of both tenants at random."""
    kv, k = draw(st.integers(3000, 8000)), draw(st.integers(2, 6))
    hog = [Arrival(0.0, "g", 8, (kv * 9 // 10) // k - 8) for _ in range(2 * k)]
    size = st.sampled_from([30, 300, 1500]).flatmap(lambda hi: st.integers(1, hi))
    later = st.builds(Arrival, st.floats(0.05, 5), st.sampled_from(["f", "g"]), st.integers(1, 300), size)
    return kv, hog + draw(st.lists(later, min_size=1, max_size=40))


@settings(max_examples=40, deadline=None)
@given(
    two_tenants(),
    st.sampled_from(["reserve", "paged"]),
    st.sampled_from([None, 0, 3]),
    st.sampled_from([0.0, 200.0, 1000.0]),
)
def test_the_bound_under_preemption(workload, mode, wait, delta):
    """docs/preemption.md: two tenants backlogged over a stretch in which the policy's next request would fit once the
    other tenant's running requests were gone, with no request preempted `preempt_max` times: their service differs
    by at most 2·(DELTA + w_p·L_in + w_q·N·(W + 1)) over any interval of it (N: the most requests running at once,
    W: the decode steps between admission tries). Without preemption the construction's start breaks it."""
    kv, arrivals = workload
    cfg = EngineConfig(kv_tokens=kv, mode=mode, max_wait_steps=wait, preempt_delta=delta, preempt_max=10**6)
    engine = SimEngine(Ledger(make_policy("vtc")), LATENCIES[1], cfg)
    seen = {"most": 0.0, "hi": 0.0, "lo": 0.0, "on": False, "n": 0}

    def observe(e):
        e._sync()
        seen["n"] = max(seen["n"], len(e.running))
        a = e.ledger.accounts
        head = e.ledger.peek()
        if not ("f" in a and "g" in a and a["f"].queued and a["g"].queued):
            seen["on"] = False
            return
        if not e._fits(head, [r for r in e.running if r.tenant != head.tenant]):
            seen["on"] = False  # NOTE: its own running requests hold the pool: outside the bound's condition
            return
        x = a["f"].service - a["g"].service
        if not seen["on"]:
            seen.update(on=True, hi=x, lo=x)
        seen["hi"], seen["lo"] = max(seen["hi"], x), min(seen["lo"], x)
        seen["most"] = max(seen["most"], seen["hi"] - seen["lo"])

    engine.observer = observe
    engine.run(arrivals)
    longest_prompt = max(a.prompt_tokens for a in arrivals)
    assert seen["most"] <= 2 * (delta + longest_prompt + 2 * seen["n"] * (cfg.wait_steps + 1))


def test_the_emulator_runs_its_engine_with_the_options_and_refuses_bad_ones(monkeypatch, capsys):
    """`fairserve emulate --policy vtc:preempt=500` is the simulated engine with preemption behind HTTP: the options
    reach its engine; a bad one (`fcfs:preempt=`, a typo) exits 2 with one line before it serves anything."""
    import uvicorn

    from fairserve.cli import main
    from fairserve.emulate.config import EmulatorConfig
    from fairserve.emulate.driver import Emulator

    engine = Emulator(EmulatorConfig(policy="vtc:preempt=500:preempt-max=2:running-cap=5000")).engine
    assert (engine.config.preempt_delta, engine.config.preempt_max, engine.config.running_cap) == (500.0, 2, 5000)
    assert engine.ledger.policy.name == "vtc"
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("the emulator started serving"))
    for spec, why in (("fcfs:preempt=5", "keeps none"), ("vtc:prempt=5", "unknown engine option")):
        assert main(["emulate", "--policy", spec, "--listen", "127.0.0.1:18931"]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
