"""The simulator's time base (sim/ticks.py): a run of decode steps in closed form is, to the tick, the sum of its
steps one by one, and a run toward a time stops after the first step that reaches it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.sim.latency import LATENCY_MODELS, get_latency_model
from fairserve.sim.ticks import FOREVER, TICKS_PER_S, at_or_after, run_ticks, run_until, seconds, step_ticks, ticks

pytestmark = pytest.mark.unit

line = st.tuples(st.integers(0, 10**12), st.integers(0, 10**7))
lines = st.lists(line, min_size=1, max_size=4)


def one_by_one(lines, n, x, k):
    return [step_ticks(lines, x + n * j) for j in range(k)]


@settings(max_examples=300, deadline=None)
@given(lines, st.integers(1, 300), st.integers(0, 10**6), st.integers(1, 400))
def test_a_run_in_closed_form_is_the_sum_of_its_steps(lines, n, x, k):
    assert run_ticks(lines, n, x, k) == sum(one_by_one(lines, n, x, k))


@settings(max_examples=300, deadline=None)
@given(lines, st.integers(1, 300), st.integers(0, 10**6), st.integers(1, 400), st.integers(-(10**9), 10**15))
def test_a_run_toward_a_time_stops_after_the_first_step_that_reaches_it(lines, n, x, k, budget):
    steps = one_by_one(lines, n, x, k)
    sums = [sum(steps[: i + 1]) for i in range(k)]
    reached = [i + 1 for i, s in enumerate(sums) if s >= budget]
    assert run_until(lines, n, x, k, budget) == ((reached[0], sums[reached[0] - 1]) if reached else (k, sums[-1]))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(LATENCY_MODELS), st.integers(1, 300), st.integers(0, 200_000), st.integers(1, 5000), st.data())
def test_every_preset_s_runs_in_closed_form(name, n, x, k, data):
    """The presets' lines, the roofline's two (compute, memory) crossing along the run included."""
    lines = get_latency_model(name).decode_lines(n)
    total = sum(one_by_one(lines, n, x, k))
    assert run_ticks(lines, n, x, k) == total
    budget = data.draw(st.integers(1, total))
    done, spent = run_until(lines, n, x, k, budget)
    assert spent == run_ticks(lines, n, x, done) >= budget > run_ticks(lines, n, x, done - 1)


def test_the_roofline_s_lines_cross_inside_a_run():
    """llama-2-7b on an A10G, 200 requests: compute bound at a small context, memory bound at a large one."""
    lines = get_latency_model("llama-2-7b@a10g").decode_lines(200)
    first, last = (max(range(2), key=lambda i: lines[i][0] + lines[i][1] * x) for x in (0, 10**6))
    assert (first, last) == (0, 1)
    assert run_ticks(lines, 200, 0, 2_000) == sum(one_by_one(lines, 200, 0, 2_000))


def test_a_run_of_steps_that_take_no_time_never_reaches_a_time():
    assert run_until([(0, 0)], 3, 10, 7, 1) == (7, 0)
    assert run_until([(0, 0)], 3, 10, 7, 0) == (1, 0)  # NOTE: at least one step


def test_seconds_and_ticks():
    assert TICKS_PER_S == 2**64
    for t in (0.0, 0.1, 1 / 3, 12.345, 600.0, 86_400.5):
        assert seconds(at_or_after(t)) == t  # NOTE: every float from 2^-12 s on is a whole number of ticks
        assert seconds(ticks(t)) == t
    assert at_or_after(1e-30) == 1 and ticks(1e-30) == 0
    assert at_or_after(math.inf) == FOREVER and seconds(FOREVER) == 2.0**64
    with pytest.raises(OverflowError):
        ticks(math.inf)
