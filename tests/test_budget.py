"""The reserve-admission index agrees with LightLLM's formula, written plainly, as requests start and end; its
first-fit search agrees with trying every step; an admission round admits what the plain formula admits."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.sim.budget import ReserveBudget, ReserveIndex, reserve_peak
from fairserve.sim.requests import SimRequest

pytestmark = pytest.mark.unit

running = st.lists(st.tuples(st.integers(1, 500), st.integers(1, 400), st.integers(0, 399)), max_size=25)


def entries_at(step, reqs):
    """A running request (prompt p, output o, g tokens generated) as the formula's (held, left) and as the index's
    (end step, prompt + output)."""
    cache, entries = [], []
    for p, o, g in reqs:
        g = min(g, o - 1)
        cache.append((p + g, o - g - 1))
        entries.append((step + (o - g), p + o))
    return cache, entries


@settings(max_examples=300, deadline=None)
@given(running, st.integers(0, 1000), st.integers(1, 500), st.integers(1, 400), st.lists(st.integers(0, 30)))
def test_index_matches_formula_as_requests_start_and_end(reqs, step, prompt, out, ends):
    cache, entries = entries_at(step, reqs)
    index = ReserveIndex()
    for e in entries:
        index.add(*e)
    held, left = prompt + 1, out - 1
    assert index.peak_with(held, left, step) == reserve_peak(cache + [(held, left)])
    candidate = (step + left + 1, held + left + 1)  # as an admission round enters it
    assert index.peak_with_entries([candidate, (step + 8, 11)]) == reserve_peak(cache + [(held, left), (3, 7)])
    for k in ends:  # requests end (the fewest to go first, as they finish, or any, as they are cancelled)
        if not entries:
            break
        i = -1 if k % 3 else k % len(entries)
        index.remove(*entries.pop(i))
        cache.pop(i)
        assert index.peak_with_entries([candidate]) == reserve_peak(cache + [(held, left)])  # before a repair
        assert index.peak_with(held, left, step) == reserve_peak(cache + [(held, left)])


@settings(max_examples=300, deadline=None)
@given(running, st.integers(0, 300), st.integers(1, 300), st.integers(0, 300), st.integers(100, 6000))
def test_first_fit_is_the_first_step_that_fits(reqs, step, held, left, limit):
    _, entries = entries_at(step, reqs)
    index = ReserveIndex(entries)
    hi = min([e for e, _ in entries], default=step + 50)  # the running set stays the same up to its first finish
    brute = next((g for g in range(step, hi) if index.peak_with(held, left, g) < limit), None)
    assert index.first_fit(held, left, limit, step, hi) == brute


@settings(max_examples=200, deadline=None)
@given(running, st.integers(0, 300), st.lists(st.tuples(st.integers(1, 500), st.integers(1, 400)), max_size=8))
def test_a_round_admits_what_the_formula_admits(reqs, step, candidates):
    cache, entries = entries_at(step, reqs)
    index = ReserveIndex(entries)
    budget = ReserveBudget(index, step, kv_tokens=4000, prefill_tokens=10_000, running_max=1000)
    admitted, expected = [], []
    for i, (p, o) in enumerate(candidates):
        req = SimRequest(id=i, tenant="t", prompt_tokens=p, max_tokens=o, output_tokens=o)
        if budget.try_add(req):
            admitted.append(i)
        if reserve_peak(cache + [(p + 1, o - 1)]) < 4000 and (not expected or expected[-1] == i - 1):
            cache.append((p + 1, o - 1))
            expected.append(i)
        else:
            break
    assert admitted == expected
    budget.close()  # admitted, they are running: one token fewer to go each, as the index counts running ones
    assert len(index) == len(entries) + len(admitted)
