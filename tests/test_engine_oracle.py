"""The event-driven engine equals the step-by-step oracle (tests/support/oracle.py) bit for bit: every record, the
clock, the step count, every tenant's service and counter, offline and online (submit / advance_to / cancel), with
observers, in both engine modes, under every kind of charging (exact sums charged lazily, inexact ones every step,
orders that ignore charges), with flat tenants and with a group of tenants and priority levels."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.oracle import StepEngine

from fairserve.core import Ledger, make_policy
from fairserve.sim import EngineConfig, SimEngine, SimRequest
from fairserve.sim.charging import Charging
from fairserve.sim.latency import ConstantLatency, decode_lines, get_latency_model
from fairserve.sim.ticks import FOREVER, run_ticks, ticks
from fairserve.workloads import Arrival

pytestmark = pytest.mark.unit

CLIENTS = ["a", "b", "c", "d", "e"]
POLICIES = ["fcfs", "vtc", "lcf", "drr:100", "rpm:30", "vtc-predict:oracle", "vtc-predict:oracle±50", "vtc-predict:ma"]
LATENCIES = [
    get_latency_model("a10g-llama2-7b"),
    get_latency_model("llama-2-7b@a10g"),
    ConstantLatency(prefill_s_per_token=1e-4, prefill_s_fixed=0.02, decode_s=0.01),
]


class StepsOnly:
    """A model with no decode lines: the engine adds its steps one by one."""

    name = "steps-only"

    def prefill_s(self, lens):
        return 0.02 + 1e-4 * sum(lens) if lens else 0.0

    def decode_step_s(self, batch_size, context_tokens):
        return 0.01 + 3e-5 * batch_size + 1e-7 * context_tokens


MODELS = [*LATENCIES, StepsOnly()]

arrival = st.builds(
    Arrival, st.floats(0, 10, allow_nan=False), st.sampled_from(CLIENTS), st.integers(1, 400), st.integers(1, 300)
)
workload = st.integers(1, 40).flatmap(lambda n: st.lists(arrival, min_size=n, max_size=n))  # NOTE: sizes spread evenly
setup = st.fixed_dictionaries(
    {
        "policy": st.sampled_from(POLICIES),
        "weights": st.one_of(st.none(), st.dictionaries(st.sampled_from(CLIENTS), st.sampled_from([0.5, 1, 2, 3]))),
        "tree": st.sampled_from([False, False, True]),  # clients b to e as the group g's tenants g/b to g/e
        "priorities": st.one_of(
            st.none(), st.none(), st.dictionaries(st.sampled_from(["a", "b", "g"]), st.integers(0, 2), max_size=2)
        ),
        "cost": st.sampled_from([None, None, "profiled"]),
        "latency": st.sampled_from(range(len(MODELS))),
        "config": st.builds(
            EngineConfig,
            kv_tokens=st.integers(300, 4000),
            max_wait_steps=st.sampled_from([None, 0, 3]),
            mode=st.sampled_from(["reserve", "paged"]),
            prompt_extra_tokens=st.sampled_from([0, 2]),
            reserve_per_client_tokens=st.sampled_from([0, 32]),
        ),
    }
)


def tenant(s, client):
    return f"g/{client}" if s["tree"] and client != "a" else client


def named(s, arrivals):
    return [replace(a, client=tenant(s, a.client)) for a in arrivals]


def engines(s, observer=None):
    def make(kind):
        policy = make_policy(s["policy"], cost=s["cost"], seed=3)
        ledger = Ledger(policy, weights=s["weights"], priorities=s["priorities"])
        return kind(ledger, MODELS[s["latency"]], s["config"], observer=observer)

    return make(StepEngine), make(SimEngine)


def same_state(oracle, engine):
    assert (engine.now, engine.step, engine.kv_used, engine.busy_s) == (
        oracle.now,
        oracle.step,
        oracle.kv_used,
        oracle.busy_s,
    )
    assert engine.ledger.service == oracle.ledger.service and engine.ledger.counters == oracle.ledger.counters


def same_result(a, b):
    assert b.records == a.records
    assert (b.end_s, b.decode_steps, b.prefills, b.preemptions, b.busy_s) == (
        a.end_s,
        a.decode_steps,
        a.prefills,
        a.preemptions,
        a.busy_s,
    )
    assert b.ledger.service == a.ledger.service and b.ledger.counters == a.ledger.counters


@settings(max_examples=150, deadline=None)
@given(setup, workload, st.one_of(st.none(), st.floats(0.5, 40)))
def test_records_equal_the_step_by_step_engines(s, arrivals, until):
    oracle, engine = engines(s)
    arrivals = named(s, arrivals)
    same_result(oracle.run(arrivals, until), engine.run(arrivals, until))


def test_every_kind_of_charging_is_covered():
    def charging(policy, weights=None, cost=None):
        return SimEngine(Ledger(make_policy(policy, cost=cost), weights=weights), LATENCIES[0])._charging

    assert charging("fcfs") is Charging.AT_END and charging("vtc") is Charging.LAZY
    assert charging("vtc", {"a": 2, "b": 0.5}) is Charging.LAZY
    assert charging("vtc", {"a": 3}) is charging("vtc", cost="profiled") is charging("drr:100") is Charging.EVERY_STEP


@settings(max_examples=40, deadline=None)
@given(setup, workload, st.booleans())
def test_observers_see_every_step_as_step_by_step(s, arrivals, charge):
    """Figures that sample after every step get the same points: the clock, the batch, the pool and (charged first,
    as tests/test_guarantees.py does) every tenant's service."""

    def observe(seen):
        def observer(engine):
            if charge:
                engine._sync()
            running = tuple(sorted((r.id, r.generated_at(engine.step)) for r in engine.running))
            seen.append(
                (engine.now, engine.step, engine.kv_used, running, dict(engine.ledger.service) if charge else 0)
            )

        return observer

    a_seen: list = []
    b_seen: list = []
    oracle, engine = engines(s, observe(a_seen))
    engine.observer = observe(b_seen)
    arrivals = named(s, arrivals)
    same_result(oracle.run(arrivals), engine.run(arrivals))
    assert b_seen == a_seen


operation = st.tuples(
    st.floats(0, 20, allow_nan=False),
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(CLIENTS), st.integers(1, 600), st.integers(1, 400)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("advance")),
    ),
)


@settings(max_examples=100, deadline=None)
@given(setup, st.integers(1, 60).flatmap(lambda n: st.lists(operation, min_size=n, max_size=n)))
def test_online_submit_advance_and_cancel_equal_the_step_by_step_engines(s, ops):
    """As the emulator drives it: advance to a time, then a request arrives at the engine's clock or one is
    cancelled (queued, or running in the middle of a run of decode steps: charged exactly what it produced)."""
    both = engines(s)
    requests: list[list[SimRequest]] = [[], []]
    for t, op in sorted(ops, key=lambda o: o[0]):
        for eng, reqs in zip(both, requests, strict=True):
            eng.advance_to(t)
            if op[0] == "submit":
                _, client, prompt, output = op
                req = SimRequest(
                    id=len(reqs),
                    tenant=tenant(s, client),
                    prompt_tokens=prompt,
                    max_tokens=output,
                    output_tokens=output,
                )
                req.arrival_s = eng.now
                reqs.append(req)
                eng.submit(req)
            elif op[0] == "cancel" and reqs and not reqs[op[1] % len(reqs)].done:
                eng.cancel(reqs[op[1] % len(reqs)])
        oracle, engine = both
        oracle._sync()
        engine._sync()  # NOTE: the engine charges lazily; brought up to date, both must agree
        same_state(oracle, engine)
        assert [r.id for r in engine.just_finished] == [r.id for r in oracle.just_finished]
        assert [(r.state, r.generated_at(engine.step), r.output_done) for r in requests[1]] == [
            (r.state, r.generated_at(oracle.step), r.output_done) for r in requests[0]
        ]
    for eng in both:
        eng.advance_to(float("inf"))
    assert [(r.state, r.finish_s, r.generated) for r in requests[1]] == [
        (r.state, r.finish_s, r.generated) for r in requests[0]
    ]
    assert both[1].ledger.service == both[0].ledger.service


@pytest.mark.parametrize("mode", ["reserve", "paged"])
def test_a_cancel_in_the_middle_of_a_run_of_steps_is_charged_what_was_produced(mode):
    lat = ConstantLatency(prefill_s_fixed=0.1, decode_s=0.01)
    done = []
    for kind in (StepEngine, SimEngine):
        engine = kind(Ledger(make_policy("vtc")), lat, EngineConfig(mode=mode))
        long = SimRequest(id=0, tenant="x", prompt_tokens=10, max_tokens=1000, output_tokens=1000)
        engine.submit(long)
        engine.advance_to(0.1 + 0.01 * 400.5)  # the prefill, then 401 decode steps (the clock passes the target)
        engine.cancel(long)
        done.append((engine.step, long.generated, engine.ledger.service["x"]))
    assert done[1] == done[0] == (401, 402, 10 + 2 * 402)


@pytest.mark.parametrize("latency", range(len(LATENCIES)))
def test_a_run_of_steps_cut_by_an_arrival_ends_where_the_uncut_run_does(latency):
    """A run of decode steps toward a time (an arrival) stops after the first step that ends at or after it, and,
    continued from there, ends at the clock and busy time of the same run uncut, to the tick."""
    ends = []
    for cut in (False, True):
        engine = SimEngine(Ledger(make_policy("vtc")), LATENCIES[latency])
        for i in range(3):
            engine.submit(SimRequest(id=i, tenant=CLIENTS[i], prompt_tokens=50, max_tokens=900, output_tokens=900))
        engine.advance()  # the prefill
        n, start, kv = len(engine.running), engine._t, engine.kv_used
        until = start + ticks(0.4 * engine.latency.decode_step_s(n, kv) * 600) if cut else FOREVER
        done = engine._run_steps(n, 600, until)
        if cut:
            lines = decode_lines(engine.latency, n)
            assert 100 < done < 600 and engine._t >= until > start + run_ticks(lines, n, kv, done - 1)
            engine.step, engine.kv_used = engine.step + done, kv + n * done
            done += engine._run_steps(n, 600 - done, FOREVER)
        ends.append((done, engine._t, engine._busy))
    assert ends[1] == ends[0]
