"""The O(log n) reserve-admission index agrees with LightLLM's formula, written plainly."""

from hypothesis import given, settings
from hypothesis import strategies as st

from fairserve.sim.budget import ReserveIndex, reserve_peak

running = st.lists(st.tuples(st.integers(1, 500), st.integers(1, 400), st.integers(0, 399)), max_size=25)


@settings(max_examples=300, deadline=None)
@given(running, st.integers(0, 1000), st.integers(1, 500), st.integers(1, 400))
def test_index_matches_formula(reqs, step, prompt, out):
    # a running request: prompt p, output o, g tokens generated so far (g < o)
    cache, entries = [], []
    for p, o, g in reqs:
        g = min(g, o - 1)
        cache.append((p + g, o - g - 1))
        end = step + (o - g)
        entries.append((end, p + o))
    index = ReserveIndex(entries)
    held, left = prompt + 1, out - 1
    assert index.peak_with(held, left, step) == reserve_peak(cache + [(held, left)])
    bigger = index.with_entry(held, left, step)
    assert bigger.peak_with(3, 7, step) == reserve_peak(cache + [(held, left), (3, 7)])
